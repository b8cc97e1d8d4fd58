"""fusebox: one YAML spec to the rules, tests, dashboards, collector config, runbooks and
fuse (circuit breaker) that guard multimodal LLM inference on shared GPUs."""

__version__ = "0.1.0"
__all__ = ["__version__"]
