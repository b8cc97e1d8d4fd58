"""The spec's ``connections:`` section: which long-lived TCP connections ``fusebox collect conns``
follows (the gateway's connections to its engines), and its bounds (docs/collectors.md,
"Connections").

```yaml
connections:
  peers:                       # service.peer.name -> how its connections are recognised
    vllm: {ports: [8000]}      # remote port(s) of the engines, as the gateway's node sees them
    smg: {local_ports: [30000], networks: [10.0.0.0/8]}   # or the local port(s) of a server here
  cold_after: 30s              # a use after more idle than this is a cold start (seed: 30 s)
  max_connections: 1000        # followed at most; the rest are counted (over_cap), never followed
  max_peers: 64                # network.peer.address values at most; the rest export as "other"
  deadline: 2s                 # one netlink dump's deadline
```

A connection matches a peer when its remote port is one of ``ports`` or its local port one of
``local_ports``, and (with ``networks``) its remote address lies in one of them. The first
matching peer, in the order written, names it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict

from . import units

Err = Callable[..., None]
Duration = Annotated[str | int, BeforeValidator(units.reject_bool)]
DEFAULT_COLD_AFTER_S = 30.0
DEFAULT_MAX_CONNECTIONS = 1000
DEFAULT_MAX_PEERS = 64
DEFAULT_DEADLINE_S = 2.0


class RawPeer(BaseModel):
    """One entry of ``connections.peers``."""

    model_config = ConfigDict(extra="forbid")

    ports: list[int] = []
    local_ports: list[int] = []
    networks: list[str] = []


class RawConnections(BaseModel):
    """``connections``: the gateway-engine connections the connections collector follows."""

    model_config = ConfigDict(extra="forbid")

    peers: dict[str, RawPeer] = {}
    cold_after: Duration = "30s"
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_peers: int = DEFAULT_MAX_PEERS
    deadline: Duration = "2s"


@dataclass(frozen=True)
class Peer:
    """A peer service: its name (``service.peer.name``), remote ports, local ports, networks."""

    name: str
    ports: frozenset[int] = frozenset()
    local_ports: frozenset[int] = frozenset()
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()


@dataclass(frozen=True)
class Connections:
    """``connections``, normalised: seconds, counts, the peers in the order written."""

    peers: tuple[Peer, ...] = ()
    cold_after_s: float = DEFAULT_COLD_AFTER_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_peers: int = DEFAULT_MAX_PEERS
    deadline_s: float = DEFAULT_DEADLINE_S


def normalise_connections(raw: RawConnections, duration: Callable[[Any, tuple], float], err: Err) -> Connections:
    """Check each peer (a port 1-65535, at least one port or local port, networks in CIDR form),
    the durations (positive) and the caps (>= 1); every problem is reported."""
    peers = []
    for name, p in raw.peers.items():
        path = ("connections", "peers", name)
        if not p.ports and not p.local_ports:
            err(path, f"peer {name!r} names no port", "give the engines' port (ports: [8000]) or a local server port (local_ports: [30000])")
        for key in ("ports", "local_ports"):
            for i, port in enumerate(getattr(p, key)):
                if not 1 <= port <= 65535:
                    err(path + (key, i), f"port {port} is out of range", "a TCP port is 1-65535")
        nets = []
        for i, text in enumerate(p.networks):
            try:
                nets.append(ipaddress.ip_network(text, strict=False))
            except ValueError:
                err(path + ("networks", i), f"{text!r} is not an address range", "write it in CIDR form, e.g. 10.0.0.0/8 or fd00::/8")
        peers.append(Peer(name, frozenset(p.ports), frozenset(p.local_ports), tuple(nets)))
    cold = duration(raw.cold_after, ("connections", "cold_after"))
    deadline = duration(raw.deadline, ("connections", "deadline"))
    for key, value, example in (("cold_after", cold, "30s"), ("deadline", deadline, "2s")):
        if not value > 0:
            err(("connections", key), f"connections.{key} must be positive", f"e.g. {example}")
    for key in ("max_connections", "max_peers"):
        if getattr(raw, key) < 1:
            err(("connections", key), f"connections.{key} must be 1 or more", "e.g. 1000 connections, 64 peers")
    return Connections(tuple(peers), cold, raw.max_connections, raw.max_peers, deadline)
