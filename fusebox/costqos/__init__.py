"""The seed's COST-QoS controller (docs/costqos.md): CostQoSScalingPolicy objects in, a Pareto
frontier of (cost, p95 latency, error rate) per replica count and the replica count chosen on it
out, in each policy's status and as ``fusebox_costqos_desired_replicas`` on its /metrics.

``frontier`` (pure: points, Pareto, choice), ``policy`` (pure: a spec in, a status out), ``prom``
(range queries), ``controller`` (the kopf handlers), ``cli`` (``fusebox costqos run``).
"""
