"""The spec's fuse.adapters against the REAL gateways on loopback (SGLang Model Gateway, vLLM
router, HAProxy with the generated haproxy/fusebox.cfg), the generic HTTP action, the level check
at start-up, and hostile label values.

Assertions read each gateway's OWN state (GET /workers, GET /list_workers, HAProxy's `show servers
state` and `show map`, which backend answered through HAProxy), not fusebox's log.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import yaml
from _fuse_support import SPEC, TOKEN, LiveService, alert, payload, wait_for
from _gateways import StandInEngine, sglang_gateway, sglang_workers, vllm_router, vllm_workers
from _support import yaml_data, yaml_text

from fusebox import conventions as C
from fusebox.fuse.adapters import build_adapters, targets_for
from fusebox.fuse.adapters.protocol import ActionError
from fusebox.fuse.control import ControlCall
from fusebox.spec import load_spec
from fusebox.spec.errors import SpecError

HOSTILE = ["../admin", "a\nshutdown sessions server be/x", "{{ 7*7 }}", "x" * (1 << 20)]


def write_spec(tmp_path: Path, adapters: dict) -> Path:
    data = yaml_data(SPEC.read_text(encoding="utf-8"))
    data["fuse"]["adapters"] = adapters
    p = tmp_path / "fusebox.yaml"
    p.write_text(yaml_text(data, sort_keys=False), encoding="utf-8")
    return p


def live(tmp_path: Path, adapters: dict) -> LiveService:
    spec = load_spec(write_spec(tmp_path, adapters))
    return LiveService(tmp_path / "fuse.sqlite", adapters=build_adapters(spec.adapters), hold_s=0.3)


def failed_audit(svc: LiveService) -> list[dict]:
    return [r for r in svc.service.store.audit_log(50) if r["kind"] == "failed"]


@pytest.fixture
def engines():
    es = [StandInEngine(), StandInEngine()]
    yield es
    for e in es:
        e.stop()


@pytest.fixture
def sglang(engines, tmp_path):
    gw = sglang_gateway([e.url for e in engines], tmp_path / "sglang.log")
    yield gw
    gw.stop()


def sglang_spec(gw, engines, actions=("freeze_admissions", "kv_cache_eviction")) -> dict:
    return {"sglang": {"kind": "sglang_gateway", "url": gw.url, "actions": list(actions), "timeout": "2s",
                       "targets": [{"match": {"engine": f"engine-{i}"}, "worker_url": e.url} for i, e in enumerate(engines)]}}


def test_sglang_trip_takes_the_worker_out_and_release_puts_it_back_with_its_settings(sglang, engines, tmp_path):
    e0, e1 = engines[0].url, engines[1].url
    # give engine-0 settings of its own, through the gateway's API, so the release must restore them
    w = sglang_workers(sglang.url)[e0]
    assert httpx.delete(f"{sglang.url}/workers/{w['id']}", timeout=5).status_code == 202
    wait_for(lambda: e0 not in sglang_workers(sglang.url), 10, what="engine-0 removed")
    assert httpx.post(f"{sglang.url}/workers", json={"url": e0, "priority": 7, "cost": 2.5}, timeout=5).status_code == 202
    wait_for(lambda: e0 in sglang_workers(sglang.url), 10, what="engine-0 back")

    with live(tmp_path, sglang_spec(sglang, engines)) as svc:
        r = svc.post(payload(alert("GPUMemoryUtilizationHigh", engine="engine-0")))
        assert r.status_code == 200
        wait_for(lambda: e0 not in sglang_workers(sglang.url), 10, what="engine-0 out of the gateway's rotation")
        assert e1 in sglang_workers(sglang.url)  # the other engine keeps serving
        svc.post(payload(alert("GPUMemoryUtilizationHigh", "resolved", engine="engine-0")))
        back = wait_for(lambda: sglang_workers(sglang.url).get(e0), 15, what="engine-0 back in rotation")
        assert (back["priority"], back["cost"]) == (7, 2.5)
        text = httpx.get(svc.url + "/metrics", timeout=5).text
        assert 'fusebox_fuse_adapter_calls_total{adapter="sglang",outcome="ok"} 2.0' in text
        assert 'fusebox_fuse_adapter_call_duration_seconds_count{adapter="sglang"} 2.0' in text


def test_sglang_a_worker_stays_out_while_another_level_still_holds_it(sglang, engines, tmp_path):
    e0 = engines[0].url
    with live(tmp_path, sglang_spec(sglang, engines)) as svc:
        svc.post(payload(alert("GPUMemoryUtilizationHigh", engine="engine-0"), alert("KVCacheGrowthRateHigh", engine="engine-0")))
        wait_for(lambda: e0 not in sglang_workers(sglang.url), 10, what="engine-0 out")
        svc.post(payload(alert("KVCacheGrowthRateHigh", "resolved", engine="engine-0"),
                         alert("GPUMemoryUtilizationHigh", engine="engine-0")))
        wait_for(lambda: svc.service.store.pending_count() == 0 and any(
            r["kind"] == "applied" and r["action"] == "kv_cache_eviction" and "release" in r["reason"]
            for r in svc.service.store.audit_log(50)), 15, what="the level-3 release applied")
        assert e0 not in sglang_workers(sglang.url)  # level 1 still holds it


def direct(adapter, value: str, state: str = "trip") -> ActionError:
    """Apply ``adapter`` to a decision on scope {engine: value} without the service (whose webhook
    refuses a 1 MB body with 413 before any decision); returns the refusal."""
    p = ControlCall.from_json({"action": "freeze_admissions", "level": 1, "state": state, "reason": "r",
                               "scope": {"engine": value}, "decision_id": "d" * 32})
    with pytest.raises(ActionError) as e:
        adapter.apply(p)
    return e.value


@pytest.mark.parametrize("value", HOSTILE, ids=["dotdot", "newline", "jinja", "1MB"])
def test_sglang_hostile_label_values_are_refused_and_never_reach_the_gateway(sglang, engines, tmp_path, value):
    before = sglang_workers(sglang.url)
    with live(tmp_path, sglang_spec(sglang, engines)) as svc:
        r = svc.post(payload(alert("GPUMemoryUtilizationHigh", engine=value)))
        if r.status_code == 413:  # the 1 MB value: the webhook refuses the body itself
            assert len(value) == 1 << 20
        else:
            assert r.status_code == 200
            rows = wait_for(lambda: failed_audit(svc), 10, what="the refusal audited")
            assert "scope not mapped" in rows[0]["reason"]
            assert value not in rows[0]["reason"] and value not in rows[0]["detail"]["error"]
        for state in ("trip", "release"):
            e = direct(svc.service.adapters["sglang_gateway:sglang"], value, state)
            assert e.permanent and value not in str(e)
    assert {u: w["id"] for u, w in sglang_workers(sglang.url).items()} == {u: w["id"] for u, w in before.items()}


@pytest.fixture
def router(engines, tmp_path):
    """The vLLM router in front of ``engines``; the fuse's spec takes engine-1 out on a level-1 trip."""
    gw = vllm_router([e.url for e in engines], tmp_path / "vllm.log")
    yield gw, {"router": {"kind": "vllm_router", "url": gw.url, "actions": ["freeze_admissions"],
                          "targets": [{"match": {"engine": "engine-1"}, "worker_url": engines[1].url}]}}
    gw.stop()


def test_vllm_router_trip_and_release_change_its_own_worker_list(router, engines, tmp_path):
    gw, spec = router
    with live(tmp_path, spec) as svc:
        svc.post(payload(alert("GPUMemoryUtilizationHigh", engine="engine-1")))
        wait_for(lambda: vllm_workers(gw.url) == [engines[0].url], 10, what="engine-1 removed")
        svc.post(payload(alert("GPUMemoryUtilizationHigh", "resolved", engine="engine-1")))
        wait_for(lambda: sorted(vllm_workers(gw.url)) == sorted(e.url for e in engines), 15, what="engine-1 back")


class Capture:
    """A stand-in HTTP control API that records (method, raw path, headers, body)."""

    def __init__(self):
        self.calls: list[tuple[str, str, dict, bytes]] = []
        cap = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _any(self):
                n = int(self.headers.get("Content-Length") or 0)
                cap.calls.append((self.command, self.path, dict(self.headers), self.rfile.read(n)))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_POST = do_PUT = do_DELETE = do_GET = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def capture():
    c = Capture()
    yield c
    c.stop()


def http_spec(capture, tmp_path, **over) -> dict:
    auth = tmp_path / "dynamo.auth"
    auth.write_text("Bearer dynamo-secret\n")
    base = f"http://127.0.0.1:{capture.port}"
    a = {"kind": "http", "actions": ["freeze_admissions"], "hosts": [f"127.0.0.1:{capture.port}"],
         "headers_files": {"Authorization": str(auth)},
         "targets": [{"match": {"engine": "engine-0"}, "vars": {"model": "llama/3 8b?x=1"}},
                     {"match": {"cluster": "c1"}, "vars": {"model": "{{ 6*6 }}"}}],
         "trip": {"method": "POST", "url": base + "/busy_threshold/{{ target.model }}",
                  "body": {"model": "{{ target.model }}", "active_decode_blocks_threshold": 0.0, "scope": "{{ scope.engine }}"}},
         "release": {"method": "DELETE", "url": base + "/busy_threshold/{{ target.model }}"}}
    a.update(over)
    return {"dynamo": a}


def test_http_templates_render_in_the_sandbox_with_values_url_encoded(capture, tmp_path):
    with live(tmp_path, http_spec(capture, tmp_path)) as svc:
        svc.post(payload(alert("GPUMemoryUtilizationHigh", engine="engine-0")))
        wait_for(lambda: capture.calls, 10, what="the trip call")
        method, path, headers, body = capture.calls[0]
        assert (method, path) == ("POST", "/busy_threshold/llama%2F3%208b%3Fx%3D1")
        assert headers["Authorization"] == "Bearer dynamo-secret"
        assert yaml.safe_load(body) == {"model": "llama/3 8b?x=1", "active_decode_blocks_threshold": 0.0, "scope": "engine-0"}
        svc.post(payload(alert("GPUMemoryUtilizationHigh", "resolved", engine="engine-0")))
        wait_for(lambda: len(capture.calls) == 2, 10, what="the release call")
        assert capture.calls[1][:2] == ("DELETE", "/busy_threshold/llama%2F3%208b%3Fx%3D1")


@pytest.mark.parametrize("value", HOSTILE, ids=["dotdot", "newline", "jinja", "1MB"])
def test_http_hostile_label_values_never_reach_the_api(capture, tmp_path, value):
    spec = load_spec(write_spec(tmp_path, http_spec(capture, tmp_path)))
    (adapter,) = build_adapters(spec.adapters)
    # unmapped: refused, nothing sent
    e = direct(adapter, value)
    assert e.permanent and value not in str(e)
    assert capture.calls == []
    # mapped by its cluster: the call goes out with the spec's values only, the template as text
    adapter.apply(ControlCall.from_json({"action": "freeze_admissions", "level": 1, "state": "trip", "reason": value,
                                         "scope": {"cluster": "c1", "engine": value}, "decision_id": "d" * 32}))
    (method, path, _h, body) = capture.calls[0]
    assert path == "/busy_threshold/%7B%7B%206%2A6%20%7D%7D"  # a spec value, printed as text, not run
    assert yaml.safe_load(body) == {"model": "{{ 6*6 }}", "active_decode_blocks_threshold": 0.0, "scope": ""}
    assert value.encode() not in body and "36" not in path and len(capture.calls) == 1


def test_http_a_url_outside_the_spec_hosts_is_refused(capture, tmp_path):
    spec = http_spec(capture, tmp_path, trip={"url": "http://{{ target.model }}/x"},
                     targets=[{"match": {"engine": "engine-0"}, "vars": {"model": f"127.0.0.1:{capture.port}"}}])
    with live(tmp_path, spec) as svc:
        svc.post(payload(alert("GPUMemoryUtilizationHigh", engine="engine-0")))
        rows = wait_for(lambda: failed_audit(svc), 10, what="the refusal audited")
    assert "outside the spec's hosts" in rows[0]["reason"]
    assert capture.calls == []


def test_targets_match_narrower_and_broader_scopes():
    spec = load_spec(write_spec(Path(__import__("tempfile").mkdtemp()), {"gw": {
        "kind": "sglang_gateway", "url": "http://127.0.0.1:1", "actions": ["freeze_admissions"],
        "targets": [{"match": {"cluster": "c1", "engine": "e0"}, "worker_url": "http://127.0.0.1:2"},
                    {"match": {"cluster": "c1", "engine": "e1"}, "worker_url": "http://127.0.0.1:3"}]}}))
    a = spec.adapters[0]
    assert [t.worker_url for t in targets_for(a, {"cluster": "c1"})] == ["http://127.0.0.1:2", "http://127.0.0.1:3"]
    assert [t.worker_url for t in targets_for(a, {"cluster": "c1", "engine": "e1", "hw_id": "GPU-9"})] == ["http://127.0.0.1:3"]
    assert [t.worker_url for t in targets_for(a, {"engine": "e0"})] == ["http://127.0.0.1:2"]  # broader: e0 in any cluster
    assert targets_for(a, {"cluster": "c2"}) == []
    assert targets_for(a, {}) == []


def _line_of(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


def test_a_level_the_adapter_cannot_apply_is_refused_at_start_up_with_the_spec_line(tmp_path):
    p = write_spec(tmp_path, {"sglang": {"kind": "sglang_gateway", "url": "http://127.0.0.1:30000",
                                         "actions": ["freeze_admissions", "text_only_fallback"],
                                         "targets": [{"match": {"engine": "engine-0"}, "worker_url": "http://127.0.0.1:30001"}]}})
    line = _line_of(p, "- text_only_fallback")
    with pytest.raises(SpecError) as e:
        load_spec(p)
    assert [(x.line, "cannot apply fuse level 2") for x in e.value.problems] == [(line, "cannot apply fuse level 2")]
    (tmp_path / "t").write_text(TOKEN)
    r = subprocess.run([sys.executable, "-m", "fusebox.cli", "fuse", "serve", "--spec", str(p), "--token-file",
                        str(tmp_path / "t"), "--state-dir", str(tmp_path / "s")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert f"{p}:{line}:" in r.stderr and "cannot apply fuse level 2 (text_only_fallback)" in r.stderr
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("adapter,fix", [
    ({"kind": "sglang_gateway", "url": "http://h:1", "actions": ["freeze_admissions"],
      "targets": [{"match": {"pod": "x"}, "worker_url": "http://h:2"}]}, "'pod' is not a scope label"),
    ({"kind": "sglang_gateway", "url": "http://h:1", "actions": ["freeze_admissions"],
      "targets": [{"match": {"engine": "e0"}}]}, "needs a worker_url"),
    ({"kind": "http", "actions": ["freeze_admissions"], "hosts": ["h:1"], "targets": [{"match": {"engine": "e0"}}],
      "trip": {"url": "http://h:1/{{ x"}}, "Jinja2 template error"),
    ({"kind": "http", "actions": ["freeze_admissions"], "targets": [{"match": {"engine": "e0"}}],
      "trip": {"url": "http://h:1/"}}, "lists no hosts"),
    ({"kind": "vllm_router", "url": "http://h:1", "actions": ["no_such_action"],
      "targets": [{"match": {"engine": "e0"}, "worker_url": "http://h:2"}]}, "unknown fuse action 'no_such_action'"),
])
def test_bad_adapter_specs_are_refused_with_a_line(tmp_path, adapter, fix):
    p = write_spec(tmp_path, {"a": adapter})
    with pytest.raises(SpecError) as e:
        load_spec(p)
    assert any(fix in x.what and x.line > 1 for x in e.value.problems), str(e.value)


def test_the_docs_adapter_examples_load(tmp_path):
    """Every yaml example of docs/fuse.md's Adapters section is a valid fuse.adapters entry."""
    import re

    doc = (SPEC.parent / "docs" / "fuse.md").read_text(encoding="utf-8")
    section = doc[doc.index("## Adapters"):doc.index("## Delivery order")]
    blocks = re.findall(r"```yaml\n(.*?)```", section, re.S)
    kinds = []
    for i, b in enumerate(blocks):
        text = b if b.startswith("fuse:") else "fuse:\n  adapters:\n" + b
        d = tmp_path / str(i)
        d.mkdir()
        kinds += [a.kind for a in load_spec(write_spec(d, yaml.safe_load(text)["fuse"]["adapters"])).adapters]
    # GPU scopes, then one per kind, the locked gateway after the vLLM router
    assert kinds == ["sglang_gateway", "sglang_gateway", "vllm_router", "sglang_gateway", "haproxy", "http", "http"]


# --- HAProxy (Debian's haproxy, installed by tools/bootstrap.sh) ------------------------------

@pytest.fixture
def haproxy(tmp_path):
    import socket as so
    import time

    from _support import need

    exe = need("haproxy", "run `make tools` (tools/bootstrap.sh installs Debian's haproxy)")
    sock = tmp_path / "admin.sock"
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(f"global\n    stats socket {sock} level admin\ndefaults\n    mode http\n    timeout connect 1s\n"
                   "    timeout client 5s\n    timeout server 5s\nbackend be_llm\n    server engine0 127.0.0.1:9\n"
                   "    server engine1 127.0.0.1:10\n")
    proc = subprocess.Popen([exe, "-f", str(cfg), "-db"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.monotonic() + 10
    while not sock.exists() and time.monotonic() < end:
        time.sleep(0.05)

    def show() -> dict[str, int]:
        """HAProxy's own `show servers state be_llm`: server -> srv_admin_state (0 ready, 8 drain)."""
        with so.socket(so.AF_UNIX) as s:
            s.connect(str(sock))
            s.sendall(b"show servers state be_llm\n")
            out = b""
            while chunk := s.recv(65536):
                out += chunk
        rows = [ln.split() for ln in out.decode().splitlines()[1:] if ln and not ln.startswith("#")]
        return {r[3]: int(r[6]) for r in rows}

    yield sock, show
    proc.terminate()
    proc.wait(10)


def haproxy_cmd(sock: Path, line: str) -> str:
    """Send one runtime-API command to HAProxy's socket (as a person would), return its answer."""
    import socket as so

    with so.socket(so.AF_UNIX) as s:
        s.connect(str(sock))
        s.sendall(line.encode() + b"\n")
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out.decode()


def haproxy_spec(sock) -> dict:
    return {"lb": {"kind": "haproxy", "socket": str(sock), "actions": ["freeze_admissions", "kv_cache_eviction"],
                   "targets": [{"match": {"engine": "engine-0"}, "server": "be_llm/engine0"},
                               {"match": {"engine": "engine-1"}, "server": "be_llm/engine1"}]}}


def test_haproxy_trip_drains_the_server_and_release_makes_it_ready(haproxy, tmp_path):
    sock, show = haproxy
    assert show() == {"engine0": 0, "engine1": 0}
    with live(tmp_path, haproxy_spec(sock)) as svc:
        svc.post(payload(alert("GPUMemoryUtilizationHigh", engine="engine-0")))
        wait_for(lambda: show() == {"engine0": 8, "engine1": 0}, 10, what="engine0 draining")
        svc.post(payload(alert("GPUMemoryUtilizationHigh", "resolved", engine="engine-0")))
        wait_for(lambda: show() == {"engine0": 0, "engine1": 0}, 15, what="engine0 ready again")


@pytest.mark.parametrize("value", HOSTILE, ids=["dotdot", "newline", "jinja", "1MB"])
def test_haproxy_hostile_label_values_add_no_command(haproxy, tmp_path, value):
    sock, show = haproxy
    spec = load_spec(write_spec(tmp_path, haproxy_spec(sock)))
    (adapter,) = build_adapters(spec.adapters)
    e = direct(adapter, value)
    assert e.permanent and value not in str(e)
    assert show() == {"engine0": 0, "engine1": 0}


def test_haproxy_a_server_name_that_could_add_a_command_does_not_load(tmp_path):
    p = write_spec(tmp_path, {"lb": {"kind": "haproxy", "socket": "/run/haproxy/admin.sock", "actions": ["freeze_admissions"],
                                     "targets": [{"match": {"engine": "e0"}, "server": "be/x state ready\nshutdown sessions server be/x"}]}})
    with pytest.raises(SpecError) as e:
        load_spec(p)
    assert "needs a server <backend>/<server>" in str(e.value)


@pytest.mark.parametrize("where", ["server", "backend", "map", "header"])
def test_haproxy_a_name_ending_in_a_newline_does_not_load_and_says_its_line(tmp_path, where):
    """A value ending in a newline (a block scalar ``server: |``, or a quoted one spanning two lines,
    as written here); HAProxy's names cannot hold one (its runtime API reads a newline as the end of
    the command), so the spec is refused at the key's line. (Python's ``$`` matches before a final
    newline: ``re.match`` let these through.)"""
    lb = {"kind": "haproxy", "socket": "/run/haproxy/admin.sock", "actions": ["freeze_admissions", "text_only_fallback"],
          "targets": [{"match": {"engine": "e0"}, "server": "be_llm/engine0"}],
          "text_only": {"map": "/etc/haproxy/fusebox-text-only.map", "backend": "be_llm_text", "header": "X-Fusebox-Multimodal"}}
    if where == "server":
        lb["targets"][0]["server"] += "\n"
    else:
        lb["text_only"][where] += "\n"
    p = write_spec(tmp_path, {"lb": lb})
    with pytest.raises(SpecError) as e:
        load_spec(p)
    line = _line_of(p, f"{where}: '")  # the quoted value, its newline on the next line
    assert [x.line for x in e.value.problems] == [line], str(e.value)
    assert f"{p}:{line}:" in str(e.value)


def test_haproxy_a_command_holding_a_newline_is_a_final_failure_counted_once_and_never_sent(haproxy, tmp_path):
    """An adapter built without the spec check (a name ending in a newline) used to raise ValueError
    in every attempt, which the dispatcher retried forever (every 0.2 s here). Now: one attempt,
    audited failed as permanent, counted once in actions_given_up, not queued again by the
    reconciler; HAProxy's own state unchanged."""
    import dataclasses

    sock, show = haproxy
    spec = load_spec(write_spec(tmp_path, haproxy_spec(sock)))
    (a,) = spec.adapters
    bad = dataclasses.replace(a, targets=(dataclasses.replace(a.targets[0], server="be_llm/engine0\n"), *a.targets[1:]))
    from fusebox.fuse.adapters import build_adapters as build

    with LiveService(tmp_path / "fuse.sqlite", adapters=build((bad,)), hold_s=0.3) as svc:
        reg = svc.service.metrics.registry
        svc.post(payload(alert("GPUMemoryUtilizationHigh", engine="engine-0")))
        wait_for(lambda: failed_audit(svc), 10, what="the trip given up")
        (row,) = failed_audit(svc)
        assert "after 1 attempt(s), permanent failure" in row["reason"], row
        # a window of five backoffs (0.2 s each): no attempt after the first
        time.sleep(1.0)
        assert reg.get_sample_value(C.FUSE_METRICS["action_failures"], {"adapter": "lb"}) == 1.0
        assert reg.get_sample_value(C.FUSE_METRICS["actions_given_up"], {"adapter": "lb", "reason": "permanent"}) == 1.0
        assert len(failed_audit(svc)) == 1
        assert svc.service.reconcile() == 0  # the reconciler (every 30 s in `fuse serve`) does not queue it again
    assert show() == {"engine0": 0, "engine1": 0}


# --- HAProxy text-only fallback (level 2): the generated haproxy/fusebox.cfg + a map entry --------

class _Named(ThreadingHTTPServer):
    """A stand-in backend on loopback that answers every GET with its own name."""

    def __init__(self, name: str):
        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                body = name.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        super().__init__(("127.0.0.1", 0), H)
        self.daemon_threads = True
        threading.Thread(target=self.serve_forever, daemon=True).start()


def text_only_spec(sock, map_path) -> dict:
    return {"lb": {"kind": "haproxy", "socket": str(sock),
                   "actions": ["freeze_admissions", "text_only_fallback", "kv_cache_eviction"],
                   "text_only": {"map": str(map_path), "backend": "be_llm_text"},
                   "targets": [{"match": {"engine": "engine-0"}, "server": "be_llm/engine0"}]}}


@pytest.fixture
def haproxy_text_only(tmp_path):
    """Real haproxy: a frontend holding the GENERATED snippet, backends be_llm (multimodal) and
    be_llm_text, each a stand-in answering its name; yields (spec dict, front URL, show_map, show_servers)."""
    import time

    from _fuse_support import free_port
    from _support import need

    from fusebox.generator.outputs import render_all

    exe = need("haproxy", "run `make tools` (tools/bootstrap.sh installs Debian's haproxy)")
    sock, map_path = tmp_path / "admin.sock", tmp_path / "fusebox-text-only.map"
    map_path.write_text("")  # HAProxy loads it at start: created empty, as the snippet says
    spec_dict = text_only_spec(sock, map_path)
    snippet = render_all(load_spec(write_spec(tmp_path, spec_dict)))["haproxy/fusebox.cfg"]
    mm, text = _Named("multimodal"), _Named("text-only")
    port = free_port()
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(f"global\n    stats socket {sock} level admin\ndefaults\n    mode http\n    timeout connect 1s\n"
                   f"    timeout client 5s\n    timeout server 5s\nfrontend fe\n    bind 127.0.0.1:{port}\n{snippet}"
                   f"    default_backend be_llm\nbackend be_llm\n    server engine0 127.0.0.1:{mm.server_address[1]}\n"
                   f"backend be_llm_text\n    server t0 127.0.0.1:{text.server_address[1]}\n")
    proc = subprocess.Popen([exe, "-f", str(cfg), "-db"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    end = time.monotonic() + 10
    while not sock.exists() and time.monotonic() < end and proc.poll() is None:
        time.sleep(0.05)
    assert sock.exists(), proc.stderr.read().decode() if proc.poll() is not None else "no stats socket"

    def ask(cmd: str) -> list[list[str]]:
        return [ln.split() for ln in haproxy_cmd(sock, cmd).splitlines() if ln and not ln.startswith("#")]

    def show_map() -> dict[str, str]:
        """HAProxy's own `show map <file>`: key -> value (rows are `<ref> <key> <value>`)."""
        return {r[1]: r[2] for r in ask(f"show map {map_path}")}

    def show_servers() -> dict[str, int]:
        return {r[3]: int(r[6]) for r in ask("show servers state be_llm")[1:]}

    yield spec_dict, f"http://127.0.0.1:{port}", show_map, show_servers
    proc.terminate()
    proc.wait(10)
    for s in (mm, text):
        s.shutdown()
        s.server_close()


def _answered(front: str, multimodal: bool) -> str:
    return httpx.get(front + "/v1/chat/completions", timeout=5,
                     headers={"X-Fusebox-Multimodal": "1"} if multimodal else {}).text


def test_haproxy_text_only_fallback_routes_multimodal_requests_through_the_map(haproxy_text_only, tmp_path):
    spec_dict, front, show_map, show_servers = haproxy_text_only
    assert show_map() == {}
    assert (_answered(front, True), _answered(front, False)) == ("multimodal", "multimodal")
    with live(tmp_path, spec_dict) as svc:
        svc.post(payload(alert("AlignmentLatencyP95High", engine="engine-0")))
        wait_for(lambda: show_map() == {"be_llm": "1"}, 10, what="the map entry be_llm 1")
        assert (_answered(front, True), _answered(front, False)) == ("text-only", "multimodal")
        assert show_servers() == {"engine0": 0}  # level 2 leaves the server in rotation
        svc.post(payload(alert("AlignmentLatencyP95High", engine="engine-0")))  # again: idempotent
        svc.post(payload(alert("AlignmentLatencyP95High", "resolved", engine="engine-0")))
        wait_for(lambda: show_map() == {}, 15, what="the map entry deleted")
        wait_for(lambda: svc.service.store.pending_count() == 0, 10, what="the outbox empty")
        assert (_answered(front, True), _answered(front, False)) == ("multimodal", "multimodal")
        assert failed_audit(svc) == []


@pytest.mark.parametrize("value", HOSTILE, ids=["dotdot", "newline", "jinja", "1MB"])
def test_haproxy_text_only_hostile_label_values_set_no_map_entry(haproxy_text_only, tmp_path, value):
    spec_dict, front, show_map, show_servers = haproxy_text_only
    (adapter,) = build_adapters(load_spec(write_spec(tmp_path, spec_dict)).adapters)
    for state in ("trip", "release"):
        with pytest.raises(ActionError) as e:
            adapter.apply(ControlCall.from_json({"action": "text_only_fallback", "level": 2, "state": state,
                                                 "reason": "r", "scope": {"engine": value}, "decision_id": "d" * 32}))
        assert e.value.permanent and value not in str(e.value)
    assert show_map() == {} and show_servers() == {"engine0": 0}
    assert _answered(front, True) == "multimodal"


@pytest.mark.parametrize("text_only,fix", [
    (None, "applies text_only_fallback (level 2) but has no text_only"),
    ({"map": "/etc/haproxy/x.map\nshow map", "backend": "be_text"}, "map must be an absolute file path"),
    ({"map": "/etc/haproxy/x.map", "backend": "be_text; shutdown sessions"}, "backend must be an HAProxy backend name"),
    ({"map": "/etc/haproxy/x.map", "backend": "be_text", "header": "X-A\r\nX-B"}, "header must be an HTTP header name"),
])
def test_haproxy_text_only_spec_is_checked_with_a_line(tmp_path, text_only, fix):
    a = {"kind": "haproxy", "socket": "/run/haproxy/admin.sock", "actions": ["text_only_fallback"],
         "targets": [{"match": {"engine": "e0"}, "server": "be_llm/e0"}]}
    if text_only:
        a["text_only"] = text_only
    with pytest.raises(SpecError) as e:
        load_spec(write_spec(tmp_path, {"lb": a}))
    assert any(fix in x.what and x.line > 1 for x in e.value.problems), str(e.value)


def test_the_shipped_spec_generates_no_haproxy_snippet():
    from fusebox.generator.outputs import render_all

    assert not [p for p in render_all(load_spec(SPEC)) if p.startswith("haproxy/")]


def test_fusebox_generate_writes_the_haproxy_snippet(tmp_path):
    """`fusebox generate` writes haproxy/fusebox.cfg for a spec with a haproxy text_only; its lines
    name the spec's map, backend and header (worked out from text_only_spec, not from the renderer)."""
    import contextlib
    import io

    from fusebox.cli import main

    spec = write_spec(tmp_path, text_only_spec("/run/haproxy/admin.sock", "/etc/haproxy/fusebox-text-only.map"))
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["generate", "--spec", str(spec), "--out", str(tmp_path / "out")]) == 0
    lines = [ln.strip() for ln in (tmp_path / "out" / "haproxy" / "fusebox.cfg").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    assert lines == ["acl fusebox_lb_multimodal req.hdr(X-Fusebox-Multimodal) -m found",
                     "acl fusebox_lb_text_only_be_llm str(be_llm),map(/etc/haproxy/fusebox-text-only.map,0) -m str 1",
                     "use_backend be_llm_text if fusebox_lb_multimodal fusebox_lb_text_only_be_llm"]



def test_haproxy_replicas_sharing_a_postgresql_store_share_their_holds(haproxy, tmp_path):
    """Two fuse replicas (one adapter each) on one real PostgreSQL store, one real HAProxy: a release
    by replica A leaves the server draining while replica B's level-3 hold is in the store."""
    from _pg_support import PgServer

    from fusebox.fuse.store import PgStore

    sock, show = haproxy
    spec = load_spec(write_spec(tmp_path, haproxy_spec(sock)))
    server = PgServer()
    server.start()
    try:
        url = server.create_db("replicas")
        stores = [PgStore(url), PgStore(url)]
        a, b = (build_adapters(spec.adapters)[0] for _ in stores)
        a.attach(stores[0])
        b.attach(stores[1])

        def decide(adapter, action, level, state):
            adapter.apply(ControlCall.from_json({"action": action, "level": level, "state": state, "reason": "r",
                                                 "scope": {"engine": "engine-0"}, "decision_id": "d" * 32}))

        decide(a, "freeze_admissions", 1, "trip")
        decide(b, "kv_cache_eviction", 3, "trip")
        assert show() == {"engine0": 8, "engine1": 0}
        decide(a, "freeze_admissions", 1, "release")
        assert show() == {"engine0": 8, "engine1": 0}  # B's level 3 still holds it, seen through the store
        decide(b, "kv_cache_eviction", 3, "release")
        assert show() == {"engine0": 0, "engine1": 0}
        for st in stores:
            st.close()
    finally:
        server.close()


# --- the reconciler: what the fuse decided against the gateway's own state --------------------

def _reconciled(svc: LiveService, label: str) -> float:
    text = httpx.get(svc.url + "/metrics", timeout=5).text
    want = f'fusebox_fuse_reconciliations_total{{adapter="{label}"}} '
    return float(next((ln.split()[-1] for ln in text.splitlines() if ln.startswith(want)), "0"))


def _drained(svc: LiveService) -> None:
    wait_for(lambda: svc.service.store.pending_count() == 0, 15, what="the outbox drained")


def test_sglang_a_worker_put_back_by_hand_is_taken_out_again_by_the_reconciler(sglang, engines, tmp_path):
    """The trip takes engine-0 out; someone adds it back through the gateway's own API; the fuse
    (still tripped) sees it there on its next reconcile pass, queues the trip again (audited, counted)
    and the gateway's list loses it again. A pass that finds the gateway as decided queues nothing."""
    e0, e1 = engines[0].url, engines[1].url
    with live(tmp_path, sglang_spec(sglang, engines)) as svc:
        assert svc.service.reconcile() == 0  # nothing tripped
        svc.post(payload(alert("GPUMemoryUtilizationHigh", engine="engine-0")))
        wait_for(lambda: e0 not in sglang_workers(sglang.url), 10, what="engine-0 out")
        _drained(svc)
        assert svc.service.reconcile() == 0  # as decided
        assert httpx.post(f"{sglang.url}/workers", json={"url": e0}, timeout=5).status_code == 202
        wait_for(lambda: e0 in sglang_workers(sglang.url), 10, what="engine-0 put back by hand")
        assert svc.service.reconcile() == 1
        wait_for(lambda: e0 not in sglang_workers(sglang.url), 10, what="engine-0 out again")
        _drained(svc)
        assert e1 in sglang_workers(sglang.url)
        assert svc.service.reconcile() == 0
        rows = svc.service.store.audit_log(50)
        assert [r["kind"] for r in rows if r["kind"] == "reconcile"] == ["reconcile"]
        assert sum(r["kind"] == "applied" and r["source"] == "sglang" for r in rows) == 2
        assert _reconciled(svc, "sglang") == 1


def test_haproxy_a_trip_given_up_is_applied_by_the_reconciler_once_haproxy_answers(haproxy, tmp_path):
    """HAProxy's socket is away when the trip comes (max_attempts 1: given up, audited failed) while
    /state says tripped; the socket back, a reconcile pass drains the server. Someone setting it
    ready by hand is drained again by the next pass."""
    sock, show = haproxy
    spec = haproxy_spec(sock)
    spec["lb"]["max_attempts"] = 1
    away = sock.with_name("away.sock")
    with live(tmp_path, spec) as svc:
        sock.rename(away)
        try:
            svc.post(payload(alert("GPUMemoryUtilizationHigh", engine="engine-0")))
            wait_for(lambda: failed_audit(svc), 10, what="the trip given up")
            assert svc.service.reconcile() == 0  # HAProxy cannot be read: nothing concluded
        finally:
            away.rename(sock)
        assert show() == {"engine0": 0, "engine1": 0}
        assert svc.state()["levels"] == {'{engine="engine-0"}': 1}
        level = _level_one(svc)  # tripped, and /state says the call was given up: not applied
        assert (level["applied"], level["applied_by"]) == (False, [])
        assert [n["adapter"] for n in level["not_applied"]] == ["lb"]  # the adapter's label (the spec's name)
        assert svc.service.reconcile() == 1
        wait_for(lambda: show() == {"engine0": 8, "engine1": 0}, 10, what="engine0 drained by the reconciler")
        _drained(svc)
        level = _level_one(svc)  # applied by the reconciler's call: no longer listed as not applied
        assert (level["applied"], level["applied_by"], level["not_applied"]) == (True, ["lb"], [])
        assert svc.service.reconcile() == 0
        haproxy_cmd(sock, "set server be_llm/engine0 state ready")
        assert show() == {"engine0": 0, "engine1": 0}
        assert svc.service.reconcile() == 1
        wait_for(lambda: show() == {"engine0": 8, "engine1": 0}, 10, what="engine0 drained again")
        assert _reconciled(svc, "lb") == 2


def _level_one(svc) -> dict:
    """Level 1 of the one scope /state holds (with its applied, applied_by, not_applied)."""
    (scope,) = svc.state()["scopes"]
    return scope["levels"]["1"]


def test_an_adapter_that_cannot_report_is_not_reconciled(capture, tmp_path):
    """The generic http action has no observe: a reconcile pass calls nothing and queues nothing."""
    with live(tmp_path, http_spec(capture, tmp_path)) as svc:
        svc.post(payload(alert("GPUMemoryUtilizationHigh", engine="engine-0")))
        _drained(svc)
        assert [c[0] for c in capture.calls] == ["POST"]
        assert not hasattr(svc.service.adapters["http:dynamo"], "observe")
        assert svc.service.reconcile() == 0
        assert [c[0] for c in capture.calls] == ["POST"]


def test_vllm_router_a_worker_added_back_by_hand_is_removed_again_by_the_reconciler(router, engines, tmp_path):
    gw, spec = router
    with live(tmp_path, spec) as svc:
        svc.post(payload(alert("GPUMemoryUtilizationHigh", engine="engine-1")))
        wait_for(lambda: vllm_workers(gw.url) == [engines[0].url], 10, what="engine-1 removed")
        _drained(svc)
        assert svc.service.reconcile() == 0
        r = httpx.post(f"{gw.url}/add_worker", params={"url": engines[1].url}, timeout=5)
        assert r.status_code == 200, r.text
        wait_for(lambda: engines[1].url in vllm_workers(gw.url), 10, what="engine-1 added back by hand")
        assert svc.service.reconcile() == 1
        wait_for(lambda: vllm_workers(gw.url) == [engines[0].url], 10, what="engine-1 removed again")
        _drained(svc)
        assert svc.service.reconcile() == 0
        assert _reconciled(svc, "router") == 1


def test_fuse_serve_reconciles_every_reconcile_seconds(haproxy, tmp_path):
    """`fusebox fuse serve --reconcile 0.2` (a subprocess) on a spec with HAProxy: a server set ready
    by hand while its level stays tripped is drained again by the service's own reconcile loop."""
    from _fuse_support import free_port

    sock, show = haproxy
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    p = subprocess.Popen([sys.executable, "-m", "fusebox.cli", "fuse", "serve", "--spec",
                          str(write_spec(tmp_path, haproxy_spec(sock))), "--listen", f"127.0.0.1:{port}",
                          "--state", str(tmp_path / "s.sqlite"), "--token-file", str(token), "--hold", "600",
                          "--reconcile", "0.2", "--log-level", "warning"],
                         stdout=subprocess.DEVNULL, stderr=open(tmp_path / "fuse.log", "wb"))
    try:
        wait_for(lambda: _answers(url), 30, 0.1, "the fuse")
        body = payload(alert("GPUMemoryUtilizationHigh", engine="engine-0"))
        assert httpx.post(url + "/alertmanager", json=body, headers={"Authorization": f"Bearer {TOKEN}"},
                          timeout=10).status_code == 200
        wait_for(lambda: show() == {"engine0": 8, "engine1": 0}, 10, what="engine0 drained")
        haproxy_cmd(sock, "set server be_llm/engine0 state ready")
        wait_for(lambda: show() == {"engine0": 8, "engine1": 0}, 10, what="engine0 drained again by the loop")
        text = httpx.get(url + "/metrics", timeout=5).text
    finally:
        p.terminate()
        p.wait(10)
    assert 'fusebox_fuse_reconciliations_total{adapter="lb"} 1.0' in text
    assert "tripped on" in (tmp_path / "fuse.log").read_text() and "queued again" in (tmp_path / "fuse.log").read_text()


def _answers(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_haproxy_a_release_given_up_is_applied_by_the_reconciler_once_haproxy_answers(haproxy, tmp_path):
    """The trip drains engine0; HAProxy's socket is away when the release comes (max_attempts 1:
    given up, audited failed) while /state says released; the socket back, a reconcile pass makes the
    server ready; the next pass finds it so and queues nothing."""
    sock, show = haproxy
    spec = haproxy_spec(sock)
    spec["lb"]["max_attempts"] = 1
    away = sock.with_name("away.sock")
    with live(tmp_path, spec) as svc:
        svc.post(payload(alert("GPUMemoryUtilizationHigh", engine="engine-0")))
        wait_for(lambda: show() == {"engine0": 8, "engine1": 0}, 10, what="engine0 drained")
        _drained(svc)
        sock.rename(away)
        try:
            svc.post(payload(alert("GPUMemoryUtilizationHigh", "resolved", engine="engine-0")))
            wait_for(lambda: failed_audit(svc), 10, what="the release given up")
            assert svc.service.reconcile() == 0  # HAProxy cannot be read: nothing concluded
        finally:
            away.rename(sock)
        assert show() == {"engine0": 8, "engine1": 0}
        assert svc.state()["levels"] == {}
        assert svc.service.reconcile() == 1
        wait_for(lambda: show() == {"engine0": 0, "engine1": 0}, 10, what="engine0 ready by the reconciler")
        _drained(svc)
        assert svc.service.reconcile() == 0
        assert _reconciled(svc, "lb") == 1
        assert [r["reason"].split(" on ")[0] for r in svc.service.store.audit_log(50) if r["kind"] == "reconcile"] == [
            "level 1 (freeze_admissions) released"]
