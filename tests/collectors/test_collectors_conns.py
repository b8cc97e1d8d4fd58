"""`fusebox collect conns`: idle time and cold starts read from the kernel's own TCP_INFO.

Real TCP connections on loopback (a server and clients in the test): some held idle, some used.
What the collector reads from the kernel is checked against what the test did: a connection
left idle while the test slept S seconds is idle for at least S, a connection used after more
than the cold-start threshold counts one cold start, one used at once counts a use and no cold
start, one never used counts nothing. The threshold is small in the first test so it runs in
about a second; the second reads the shipped spec's default (30 s) and the caps.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
import yaml

from fusebox import conventions as C
from fusebox.collectors.conns import ConnCollector, dump_tcp, port_filter
from fusebox.collectors.export import Pipeline
from fusebox.spec import SpecError, load_spec
from fusebox.spec.connections import Connections, Peer

ROOT = Path(__file__).resolve().parents[2]
PEER = "vllm"


class _Loopback:
    """A listening socket and N client connections to it, with the accepted server ends."""

    def __init__(self, n: int):
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(n + 8)
        self.port = self.srv.getsockname()[1]
        self.pairs = []
        for _ in range(n):
            c = socket.create_connection(("127.0.0.1", self.port))
            s, _addr = self.srv.accept()
            self.pairs.append((c, s))

    def request(self, i: int) -> None:
        """One request and its answer on connection i (data both ways, as a gateway's call)."""
        c, s = self.pairs[i]
        c.sendall(b"GET /v1/models\r\n")
        assert s.recv(64)
        s.sendall(b"200\r\n")
        assert c.recv(64)

    def close(self) -> None:
        for c, s in self.pairs:
            c.close()
            s.close()
        self.srv.close()


@pytest.mark.process
def test_idle_time_and_cold_starts_from_the_kernel():
    lo = _Loopback(4)
    try:
        cold_after = 0.6
        cfg = Connections(peers=(Peer(PEER, frozenset({lo.port})),), max_connections=3)
        col = ConnCollector(cfg, cold_after_s=cold_after)
        assert col.poll()
        # 4 client ends match the engines' port; the cap is 3: one is left out, and counted
        assert len(col.followed) == 3 and col.skipped == {"over_cap": 1}
        followed = {f for f in col.followed}
        conns = {c.cookie: c for c in _client_conns(lo.port)}
        idx = {i: cookie for i, cookie in enumerate(_cookies_in_order(lo))}
        busy, cold, idle = (i for i in range(4) if idx[i] in followed)  # the three followed, in connect order
        lo.request(busy)  # used at once: a use after ~0 s idle
        t0 = time.monotonic()
        time.sleep(cold_after + 0.3)
        slept = time.monotonic() - t0
        assert col.poll()
        assert col.skipped == {"over_cap": 2}  # counted each round
        # the kernel says the untouched connections have been idle at least as long as the test slept
        idle_now = {cookie: f.idle_s for cookie, f in col.followed.items()}
        assert idle_now[idx[idle]] >= slept - 0.01 and idle_now[idx[cold]] >= slept - 0.01
        readings = {r.key: r for r in col.readings()}
        assert readings["connection_idle_time"].value >= slept - 0.01
        assert readings["connection_idle_time"].attrs == {C.ATTR["peer_service"]: PEER, C.ATTR["peer_address"]: "127.0.0.1"}
        assert col.uses == {PEER: 1} and col.cold_starts == {PEER: 0}  # the busy one, used right after poll 1
        lo.request(cold)  # used after more than cold_after idle: one cold start
        assert col.poll()
        assert col.uses == {PEER: 2} and col.cold_starts == {PEER: 1}
        (peer, gap), = col.idle_before_use
        assert peer == PEER and gap >= slept - 0.01
        # the kernel's own filter (inet_diag bytecode) keeps exactly the 4 client ends (remote port
        # = the server's) or exactly the 4 server ends (local port), out of every socket here
        clients = list(dump_tcp(_everything, bytecode=port_filter([lo.port], [])))
        servers = list(dump_tcp(_everything, bytecode=port_filter([], [lo.port])))
        assert sorted(c.local_port for c in clients) == sorted(c.getsockname()[1] for c, _s in lo.pairs)
        assert {c.local_port for c in servers} == {lo.port} and len(servers) == 4
        assert len(conns) == 4
    finally:
        lo.close()
    _check_deadline()


@pytest.mark.process
def test_shipped_spec_default_and_the_exported_histogram():
    spec = load_spec(ROOT / "fusebox.yaml")
    raw = yaml.safe_load((ROOT / "fusebox.yaml").read_text())["connections"]
    assert raw["cold_after"] == "30s" and spec.connections.cold_after_s == 30.0
    lo = _Loopback(2)
    try:
        cfg = Connections(peers=(Peer(PEER, frozenset({lo.port})),), cold_after_s=spec.connections.cold_after_s)
        col = ConnCollector(cfg)
        assert col.cold_after_s == 30.0
        buckets = sorted({b for s in spec.signals if s.source.metric == C.PROM["connection_idle_before_use"] for b in s.buckets})
        pipe = Pipeline("conns", ("connection_idle_time", "connection_cold_starts"),
                        histograms={"connection_idle_before_use": buckets}, host="gw-0", instance_id="gw-0/conns")
        col.poll()
        time.sleep(1.1)
        col.poll()
        lo.request(0)  # after about a second idle: a use, far from a cold start at 30 s
        col.poll()
        col.record(pipe.histograms["connection_idle_before_use"])
        pipe.set_readings(col.readings())
        pipe.set_conns(*col.self_counts())
        text = pipe.prometheus_text()
        h = C.PROM["connection_idle_before_use"]
        lab = f'service_peer_name="{PEER}"'
        assert _sample(text, f"{h}_count", lab) == 1  # one use seen
        # 1 <= idle < 5: in the le="5" bucket, not in le="1"; none over 30 s, the cold-start threshold
        assert _sample(text, f"{h}_bucket", 'le="1.0"') == 0 and _sample(text, f"{h}_bucket", 'le="5.0"') == 1
        assert _sample(text, f"{h}_bucket", 'le="30.0"') == 1
        assert _sample(text, C.PROM["connection_cold_starts"], lab) == 0
        _check_peers_and_networks(lo.port)
    finally:
        lo.close()
        pipe.shutdown()


def _check_peers_and_networks(port: int) -> None:
    """Engines on three loopback addresses (127.0.0.1-3, one port): a peer's networks select by
    the remote address, and past max_peers (2) the third address exports as "other"."""
    import ipaddress

    servers, clients = [], []
    try:
        for last in (2, 3):
            srv = socket.socket()
            srv.bind((f"127.0.0.{last}", port))
            srv.listen(2)
            servers.append(srv)
            clients.append(socket.create_connection((f"127.0.0.{last}", port)))
            clients.append(srv.accept()[0])
        only_2 = Connections(peers=(Peer("two", frozenset({port}), networks=(ipaddress.ip_network("127.0.0.2/32"),)),))
        col = ConnCollector(only_2)
        col.poll()
        assert [f.address for f in col.followed.values()] == ["127.0.0.2"]
        col = ConnCollector(Connections(peers=(Peer(PEER, frozenset({port})),), max_peers=2))
        col.poll()  # 127.0.0.1 (the test's 2 connections), .2 and .3
        addrs = [r.attrs[C.ATTR["peer_address"]] for r in col.readings() if r.key == "connection_idle_time"]
        assert len(addrs) == 3 and addrs.count("other") == 1
        assert set(addrs) - {"other"} < {"127.0.0.1", "127.0.0.2", "127.0.0.3"}
    finally:
        for x in clients + servers:
            x.close()


def test_connections_section_errors_name_the_line(tmp_path):
    text = (ROOT / "fusebox.yaml").read_text().replace(
        "    vllm: {ports: [8000]}\n", "    vllm: {ports: [80000], networks: [10.0.0.300/8]}\n    bare: {}\n")
    p = tmp_path / "fusebox.yaml"
    p.write_text(text)
    with pytest.raises(SpecError) as e:
        load_spec(p)
    msg = str(e.value)
    line = text.splitlines().index("    vllm: {ports: [80000], networks: [10.0.0.300/8]}") + 1
    assert f"fusebox.yaml:{line}:" in msg
    assert "port 80000 is out of range" in msg and "'10.0.0.300/8' is not an address range" in msg
    assert "peer 'bare' names no port" in msg


def _everything(*_args) -> bool:
    return True


def _sample(text: str, name: str, contains: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") and contains in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} sample with {contains} in:\n{text}")


def _client_conns(port: int):
    return list(dump_tcp(lambda fam, lport, raw, rport: rport == port))


def _cookies_in_order(lo: _Loopback) -> list[bytes]:
    """The kernel's socket cookie of each client connection, in the order the test made them
    (matched by the client's local port)."""
    by_port = {c.local_port: c.cookie for c in _client_conns(lo.port)}
    return [by_port[c.getsockname()[1]] for c, _s in lo.pairs]


def test_breach_scenario_cold_starts_trip_only_the_cold_start_line():
    """The demo's scenario: its baseline's 25 % of requests after long idle (the YAML's figure)
    reach the connection histogram as uses idle past connections.cold_after but under the P95
    line (45 s), so the cold-start alert fires and the keep-alive one does not."""
    from fusebox.collectors.scenario import load_scenario

    spec = load_spec(ROOT / "fusebox.yaml")
    raw = yaml.safe_load((ROOT / "collectors" / "scenarios" / "breach.yaml").read_text())
    base = raw["phases"][0]
    sc = load_scenario()
    eid = next(iter(base["cold_starts"]))
    cold_after = spec.connections.cold_after_s
    ticks = int(sc.phases[0].duration_s / sc.tick_s)
    obs = [v for k in range(ticks) for v in sc.connection_idle_observations(eid, k, cold_after)]
    cold = [v for v in obs if v > cold_after]
    assert len(obs) == base["alignment_rate"][eid] * ticks
    assert len(cold) / len(obs) == float(base["cold_starts"][eid].rstrip("%")) / 100
    idle_p95 = next(s for s in spec.signals if s.alert == "ConnectionIdleP95High")
    assert all(v < idle_p95.tiers[0].threshold for v in cold)
    # the next phase sets it to 0 %: busy connections
    assert not [v for k in range(ticks, ticks + 10) for v in sc.connection_idle_observations(eid, k, cold_after) if v > cold_after]


def _check_deadline() -> None:
    """The kernel's dump under a deadline it cannot meet raises DumpError('deadline'); the
    collector counts it, keeps what it followed and says so once."""
    from fusebox.collectors.conns import DumpError

    with pytest.raises(DumpError) as e:
        list(dump_tcp(_everything, deadline_s=1e-9))
    assert e.value.reason == "deadline"
    said: list[str] = []
    col = ConnCollector(Connections(peers=(Peer(PEER, frozenset({1})),), deadline_s=1e-9), log=said.append)
    assert not col.poll() and not col.poll()
    assert col.errors == {"deadline": 2} and col.followed == {}
    assert col.self_counts() == ([], [({"reason": "deadline"}, 2)])
    assert len(said) == 1 and "fusebox_collector_conns_errors_total" in said[0]
