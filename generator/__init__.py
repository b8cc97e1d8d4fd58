"""Spec -> validate -> model -> render -> write. Renderers are pure; only ``writer`` touches disk."""

from .errors import Problem, SpecError
from .spec import Signal, Spec, Tier, load_spec, parse_spec

__all__ = ["Problem", "SpecError", "Signal", "Spec", "Tier", "load_spec", "parse_spec"]
