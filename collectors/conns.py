"""Idle time and cold starts of the long-lived connections between gateway and engines, from the
kernel's own TCP_INFO over sock_diag netlink (no eBPF, no privilege beyond the network namespace).

Each poll dumps the namespace's established TCP sockets (IPv4 and IPv6) with ``INET_DIAG_INFO``,
keeps those the spec's ``connections.peers`` select (:mod:`fusebox.spec.connections`) and reads
per socket ``tcpi_last_data_recv`` and ``tcpi_last_data_sent`` (milliseconds since data last
arrived / left; ``tcpi_last_ack_recv`` moves with keep-alive probes too, so data idle ignores it):

* idle time now = min(last_data_recv, last_data_sent), published per peer service and address as
  the longest among its connections (``fusebox.connection.idle_time``, seconds);
* a *use*: data moved on the connection since the previous poll (``tcpi_data_segs_in`` +
  ``tcpi_data_segs_out`` changed; keep-alive probes carry no data). Its idle time before the
  use is the idle time read at the previous poll (a lower bound, short by at most one poll
  interval; the seed's "from > 30 s to about 0 between polls"), recorded in the histogram
  ``fusebox.connection.idle_before_use`` (seconds; its count is the uses seen, at most one per
  connection and poll, so a lower bound of the requests);
* a *cold start*: a use after more than ``connections.cold_after`` of idle
  (``fusebox.connection.cold_starts``). The rules take the share of uses over the threshold from
  the histogram's bucket at it, so ``cold_after`` is one of the signal's buckets.

Bounds: ``max_connections`` connections followed (the rest counted per round, ``over_cap``),
``max_peers`` distinct peer addresses (the rest export as ``other``), one deadline per dump
(``deadline``: counted, the round skipped). A connection that closes is forgotten.

Why not pyroute2: its ``DiagSocket.get_sock_stats`` (0.9.7) does return TCP_INFO, but it decodes
every field of every socket of the namespace into Python objects (about 65 us per socket here,
1,000 followed connections = 2,000 sockets on loopback: 0.13 s CPU per dump, 2.6 % of a core at
a 5 s interval, over the collectors' 1 % budget), takes no deadline, and its docstring says its
signature will change. The code below reads the three fields it needs at their fixed offsets.

Layouts (Linux UAPI headers): ``struct nlmsghdr`` (linux/netlink.h), ``struct inet_diag_req_v2``,
``struct inet_diag_sockid``, ``struct inet_diag_msg`` and ``INET_DIAG_INFO`` = 2
(linux/inet_diag.h), ``SOCK_DIAG_BY_FAMILY`` = 20 (linux/sock_diag.h), ``struct tcp_info``
(linux/tcp.h: eight ``__u8`` then ``__u32`` fields; ``tcpi_last_data_sent`` at byte 44,
``tcpi_last_data_recv`` at 52, ``tcpi_last_ack_recv`` at 56, ``tcpi_data_segs_in`` / ``_out`` at
152 / 156).
"""

from __future__ import annotations

import ipaddress
import socket
import struct
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from fusebox import conventions as C
from fusebox.spec.connections import Connections, Peer

from ._model import Reading

A = C.ATTR
NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
INET_DIAG_INFO = 2
TCP_ESTABLISHED = 1
_NLH = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_REQ = struct.Struct("=BBBBI HH16s16sI8s")  # family, protocol, ext, pad, states, sockid
_ATTR = struct.Struct("=HH")
_MSG_LEN = 72  # sizeof(struct inet_diag_msg)
_TCPI = struct.Struct("=I4xII")  # last_data_sent @44, (last_ack_sent), last_data_recv @52, last_ack_recv @56
_TCPI_OFF = 44
_SEGS = struct.Struct("=II")  # tcpi_data_segs_in @152, tcpi_data_segs_out @156 (Linux 4.6+)
_SEGS_OFF = 152
_RECV_BYTES = 1 << 20
OTHER_PEER = "other"
# A use: the connection's data segments (in + out) changed since the previous poll. On kernels
# before 4.6 (no tcpi_data_segs_*), last data at least this much later than at the previous poll:
# the kernel counts in jiffies (1-10 ms) and the poll's own clock reading is a few ms off the dump.
USE_TOLERANCE_S = 0.05


class DumpError(Exception):
    """The netlink dump failed; ``reason`` is ``deadline`` or ``netlink``."""

    def __init__(self, reason: str, what: str):
        super().__init__(what)
        self.reason = reason


@dataclass(frozen=True)
class TcpConn:
    """One established TCP socket as inet_diag reports it: remote address and port, local port,
    the socket cookie (its identity while it lives) and TCP_INFO's times in milliseconds."""

    family: int
    local_port: int
    peer_address: str
    peer_port: int
    cookie: bytes
    last_data_sent_ms: int
    last_data_recv_ms: int
    last_ack_recv_ms: int
    data_segs: int | None = None  # tcpi_data_segs_in + tcpi_data_segs_out; None on kernels before 4.6

    @property
    def idle_s(self) -> float:
        """Seconds since data last left or arrived."""
        return min(self.last_data_sent_ms, self.last_data_recv_ms) / 1000.0


INET_DIAG_REQ_BYTECODE = 1
INET_DIAG_BC_JMP, INET_DIAG_BC_S_EQ, INET_DIAG_BC_D_EQ = 1, 11, 12
_OP = struct.Struct("=BBH")  # struct inet_diag_bc_op: code, yes, no


def port_filter(remote_ports: Iterable[int], local_ports: Iterable[int]) -> bytes:
    """inet_diag bytecode keeping the sockets whose remote port is one of ``remote_ports`` or whose
    local port is one of ``local_ports``, so the kernel fills TCP_INFO for those alone.

    As iproute2's ``ss`` compiles ``dport = :P or sport = :L``: each test is an op
    (``INET_DIAG_BC_D_EQ`` / ``_S_EQ``, Linux 4.17+) with ``yes`` 8 (go on) and ``no`` 12 (skip
    the test and the jump after it), followed by an op holding the port; between tests a
    ``INET_DIAG_BC_JMP`` whose ``no`` jumps past the rest (accepted: the program ends exactly at
    its end). The last test's ``no`` lands 4 bytes past the end: rejected (net/ipv4/inet_diag.c,
    ``inet_diag_bc_run`` and ``inet_diag_bc_audit``)."""
    tests = [(INET_DIAG_BC_D_EQ, p) for p in sorted(set(remote_ports))] + [(INET_DIAG_BC_S_EQ, p) for p in sorted(set(local_ports))]
    out = b""
    for code, port in reversed(tests):
        test = _OP.pack(code, 8, 12) + _OP.pack(0, 0, port)
        out = test + (_OP.pack(INET_DIAG_BC_JMP, 4, len(out) + 4) + out if out else b"")
    return out


def dump_tcp(match: Callable[[int, int, bytes, int], bool], *, deadline_s: float = 2.0,
             families: tuple[int, ...] = (socket.AF_INET, socket.AF_INET6), bytecode: bytes = b"") -> Iterator[TcpConn]:
    """Every established TCP socket of this network namespace that ``match(family, local_port,
    raw remote address (16 bytes), remote port)`` accepts, with its TCP_INFO times. ``bytecode``
    (:func:`port_filter`) lets the kernel leave the others out first.

    Raises :class:`DumpError` (``deadline`` when the whole dump takes over ``deadline_s``,
    ``netlink`` when the kernel answers an error or the socket fails)."""
    end = time.monotonic() + deadline_s
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG)
    except OSError as e:
        raise DumpError("netlink", f"cannot open a sock_diag netlink socket: {e}") from None
    buf = bytearray(_RECV_BYTES)
    view = memoryview(buf)
    try:
        for seq, family in enumerate(families, 1):
            req = _REQ.pack(family, socket.IPPROTO_TCP, 1 << (INET_DIAG_INFO - 1), 0, 1 << TCP_ESTABLISHED,
                            0, 0, b"", b"", 0, b"\xff" * 8)
            if bytecode:
                req += _ATTR.pack(_ATTR.size + len(bytecode), INET_DIAG_REQ_BYTECODE) + bytecode
            sock.sendto(_NLH.pack(_NLH.size + len(req), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + req,
                        (0, 0))
            done = False
            while not done:
                left = end - time.monotonic()
                if left <= 0:
                    raise DumpError("deadline", f"the inet_diag dump took over {deadline_s:g} s")
                sock.settimeout(left)
                try:
                    n = sock.recv_into(buf)
                except TimeoutError:
                    raise DumpError("deadline", f"the inet_diag dump took over {deadline_s:g} s") from None
                off = 0
                while off + _NLH.size <= n:
                    length, mtype, _flags, _seq, _pid = _NLH.unpack_from(buf, off)
                    if length < _NLH.size:
                        break
                    if mtype == NLMSG_DONE:
                        done = True
                        break
                    if mtype == NLMSG_ERROR:
                        code = struct.unpack_from("=i", buf, off + _NLH.size)[0]
                        if family == socket.AF_INET6 and code == -97:  # EAFNOSUPPORT: no IPv6 here
                            done = True
                            break
                        raise DumpError("netlink", f"the kernel refused the inet_diag dump (errno {-code})")
                    m = off + _NLH.size
                    fam = buf[m]
                    local_port, remote_port = struct.unpack_from("!HH", buf, m + 4)
                    raw = bytes(view[m + 24:m + 40])
                    if match(fam, local_port, raw, remote_port):
                        conn = _conn(buf, m, length - _NLH.size, fam, local_port, raw, remote_port)
                        if conn is not None:
                            yield conn
                    off += (length + 3) & ~3
    except OSError as e:
        raise DumpError("netlink", f"the inet_diag dump failed: {e}") from None
    finally:
        sock.close()


def _conn(buf: bytearray, m: int, size: int, fam: int, local_port: int, raw: bytes, remote_port: int) -> TcpConn | None:
    """The TcpConn of the inet_diag_msg at ``m`` (``size`` bytes with its attributes), or None
    when it carries no INET_DIAG_INFO."""
    a, end = m + _MSG_LEN, m + size
    while a + _ATTR.size <= end:
        alen, atype = _ATTR.unpack_from(buf, a)
        if alen < _ATTR.size:
            return None
        if atype == INET_DIAG_INFO and alen - _ATTR.size >= _TCPI_OFF + _TCPI.size:
            sent, recv, ack = _TCPI.unpack_from(buf, a + _ATTR.size + _TCPI_OFF)
            segs = sum(_SEGS.unpack_from(buf, a + _ATTR.size + _SEGS_OFF)) if alen - _ATTR.size >= _SEGS_OFF + _SEGS.size else None
            addr = socket.inet_ntop(fam, raw[:4] if fam == socket.AF_INET else raw)
            return TcpConn(fam, local_port, addr, remote_port, bytes(buf[m + 44:m + 52]), sent, recv, ack, segs)
        a += (alen + 3) & ~3
    return None


@dataclass
class _Followed:
    peer: str
    address: str
    last_data: float  # poll clock - idle: when data last moved (seconds, the collector's clock)
    idle_s: float  # idle at the last poll
    data_segs: int | None  # data segments in + out at the last poll


class ConnCollector:
    """Follows the connections ``config`` selects; :meth:`poll` once per round.

    Attributes after each poll: :attr:`uses` and :attr:`cold_starts` per peer service (since
    start), :attr:`skipped` (connections left out, by reason), :attr:`errors` (failed dumps, by
    reason). ``dump`` and ``clock`` are parameters for the benchmark and tests (default: the
    kernel's dump, ``time.monotonic``).
    """

    def __init__(self, config: Connections, *, cold_after_s: float | None = None,
                 dump: Callable[..., Iterator[TcpConn]] = dump_tcp, clock: Callable[[], float] = time.monotonic,
                 log: Callable[[str], None] | None = None):
        self.config = config
        self.cold_after_s = config.cold_after_s if cold_after_s is None else cold_after_s
        self._dump, self._clock, self._log = dump, clock, log
        self.followed: dict[bytes, _Followed] = {}
        self.uses: dict[str, int] = {p.name: 0 for p in config.peers}
        self.cold_starts: dict[str, int] = {p.name: 0 for p in config.peers}
        self.idle_before_use: list[tuple[str, float]] = []  # (peer, seconds) of the last poll
        self.skipped: dict[str, int] = {}
        self.errors: dict[str, int] = {}
        self._said: set[str] = set()
        ports = {p: pe for pe in config.peers for p in pe.ports}
        local = {p: pe for pe in config.peers for p in pe.local_ports}
        self._by_port, self._by_local = ports, local
        self._bytecode = port_filter(ports, local)

    def _peer(self, family: int, local_port: int, raw: bytes, remote_port: int) -> Peer | None:
        """The first peer, in the spec's order, whose ports (or local ports) and networks hold the socket."""
        for peer in self.config.peers:
            if remote_port in peer.ports or local_port in peer.local_ports:
                if not peer.networks:
                    return peer
                addr = ipaddress.ip_address(raw[:4] if family == socket.AF_INET else raw)
                if any(addr in n for n in peer.networks):
                    return peer
        return None

    def _match(self, family: int, local_port: int, raw: bytes, remote_port: int) -> bool:
        p = self._by_port.get(remote_port)
        if p is not None and not p.networks:
            return True
        if p is None and local_port not in self._by_local:
            return False
        return self._peer(family, local_port, raw, remote_port) is not None

    def _say(self, key: str, msg: str) -> None:
        if self._log and key not in self._said:
            self._said.add(key)
            self._log(msg)

    def poll(self) -> bool:
        """One round: dump, update uses, cold starts and idle times. False when the dump failed
        (counted in :attr:`errors`; the followed connections keep their state)."""
        self.idle_before_use = []
        try:
            try:
                conns = list(self._dump(self._match, deadline_s=self.config.deadline_s, bytecode=self._bytecode))
            except DumpError as e:
                if not self._bytecode or e.reason != "netlink":
                    raise
                self._bytecode = b""  # a kernel before 4.17 (no port equality ops): filter here alone
                self._say("bytecode", f"conns: the kernel refused the port filter ({e}); filtering every socket here")
                conns = list(self._dump(self._match, deadline_s=self.config.deadline_s))
        except DumpError as e:
            self.errors[e.reason] = self.errors.get(e.reason, 0) + 1
            self._say(f"error:{e.reason}", f"conns: {e} (counted in fusebox_collector_conns_errors_total; "
                                           "the round is skipped)")
            return False
        now = self._clock()
        seen: dict[bytes, _Followed] = {}
        fresh: list[TcpConn] = []
        for c in conns:  # the connections already followed keep their place under the cap
            f = self.followed.get(c.cookie)
            if f is None:
                fresh.append(c)
                continue
            idle = c.idle_s
            last = now - idle
            moved = (c.data_segs != f.data_segs) if c.data_segs is not None and f.data_segs is not None \
                else last - f.last_data > USE_TOLERANCE_S
            if moved:
                gap = f.idle_s
                self.uses[f.peer] = self.uses.get(f.peer, 0) + 1
                self.idle_before_use.append((f.peer, gap))
                if gap > self.cold_after_s:
                    self.cold_starts[f.peer] = self.cold_starts.get(f.peer, 0) + 1
                f.last_data = last
            f.idle_s, f.data_segs = idle, c.data_segs
            seen[c.cookie] = f
        over = 0
        for c in fresh:
            peer = self._peer(c.family, c.local_port, _raw(c), c.peer_port)
            if peer is None:
                continue
            if len(seen) >= self.config.max_connections:
                over += 1
                continue
            seen[c.cookie] = _Followed(peer.name, c.peer_address, now - c.idle_s, c.idle_s, c.data_segs)
        self.followed = seen
        if over:
            self.skipped["over_cap"] = self.skipped.get("over_cap", 0) + over
            self._say("over_cap", f"conns: {over} connection(s) past connections.max_connections "
                                  f"({self.config.max_connections}) not followed (counted each round as over_cap)")
        return True

    def readings(self) -> list[Reading]:
        """The longest idle time per (peer service, address) and the cold starts per peer service.
        The first ``max_peers`` addresses of the followed connections (the longest followed first)
        get a label of their own, the others share :data:`OTHER_PEER`; an address whose connections
        all closed frees its place."""
        own = set(list(dict.fromkeys(f.address for f in self.followed.values()))[:self.config.max_peers])
        longest: dict[tuple[str, str], float] = {}
        for f in self.followed.values():
            if f.address not in own:
                self._say("max_peers", f"conns: more than connections.max_peers ({self.config.max_peers}) peer "
                                       f"addresses; the others export as network_peer_address=\"{OTHER_PEER}\"")
            k = (f.peer, f.address if f.address in own else OTHER_PEER)
            longest[k] = max(longest.get(k, 0.0), f.idle_s)
        out = [Reading("connection_idle_time", v, {A["peer_service"]: p, A["peer_address"]: a})
               for (p, a), v in sorted(longest.items())]
        out += [Reading("connection_cold_starts", n, {A["peer_service"]: p}) for p, n in sorted(self.cold_starts.items())]
        return out

    def record(self, histogram: Any) -> None:
        """Record the last poll's uses into the ``fusebox.connection.idle_before_use`` histogram."""
        for peer, gap in self.idle_before_use:
            histogram.record(gap, {A["peer_service"]: peer})

    def self_counts(self) -> tuple[list[tuple[dict, int]], list[tuple[dict, int]]]:
        """(skipped by reason, errors by reason) as the pipeline's self-metrics take them."""
        return ([({A["reason"]: r}, n) for r, n in sorted(self.skipped.items())],
                [({A["reason"]: r}, n) for r, n in sorted(self.errors.items())])


def _raw(c: TcpConn) -> bytes:
    return socket.inet_pton(c.family, c.peer_address).ljust(16, b"\0")
