"""A gateway whose control plane is closed: the adapters' ``credentials_file``.

The process test runs the REAL smg 1.13 (``python -m smg.launch_router``) with
``--control-plane-api-keys`` and asserts on its own worker list (read with the key): an
unauthenticated ``DELETE /workers/{id}`` is refused, the fuse with the key takes exactly the one
worker out and puts it back, and a wrong key changes nothing while ``/state`` says why. The
vLLM router (0.1.17) has no closed control plane to test against (docs/fuse.md, vLLM router): its
adapter sending the key is checked at the HTTP boundary. The rest is pure logic: the spec's
checks at their lines, the key file read again on change, the generated Deployment's mount.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import httpx
import pytest
from _fuse_support import SPEC, LiveService, alert, payload, wait_for
from _gateways import SMG, StandInEngine, sglang_gateway, sglang_workers
from _support import yaml_data, yaml_text

from fusebox import conventions as C
from fusebox.fuse.adapters import SglangGateway, VllmRouter, build_adapters
from fusebox.fuse.adapters.protocol import CredentialRefused
from fusebox.fuse.control import ControlCall
from fusebox.fuse.dispatch.applied import AppliedLevels
from fusebox.fuse.tokens import KeyFile, NoTokens
from fusebox.generator.outputs import adapter_warnings
from fusebox.generator.render_k8s import render_fuse
from fusebox.spec import load_spec
from fusebox.spec.errors import SpecError

KEY = "fuse-control-plane-key-0123456789abcdef"
WRONG = "not-the-control-plane-key-0123456789abc"
KEY_FILE = f"{C.K8S['gateway_key_dir']}/key"


def write_spec(tmp_path: Path, adapters: dict, fuse_k8s: dict | None = None) -> Path:
    data = yaml_data(SPEC.read_text(encoding="utf-8"))
    data["fuse"]["adapters"] = adapters
    if fuse_k8s is not None:
        data.setdefault("kubernetes", {}).setdefault("fuse", {}).update(fuse_k8s)
    p = tmp_path / "fusebox.yaml"
    p.write_text(yaml_text(data, sort_keys=False), encoding="utf-8")
    return p


def gateway_adapter(kind: str, **extra) -> dict:
    return {"kind": kind, "url": "http://127.0.0.1:30000", "actions": ["freeze_admissions"],
            "targets": [{"match": {"engine": "engine-0"}, "worker_url": "http://127.0.0.1:30001"}], **extra}


def line_of(path: Path, needle: str) -> int:
    """The last line holding ``needle`` (the adapters follow the shipped spec's fuse.credentials_file)."""
    return [i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line][-1]


# --- the spec ------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind,value,what", [
    ("sglang_gateway", "", "credentials_file is empty"),
    ("vllm_router", "", "credentials_file is empty"),
    ("sglang_gateway", "secrets/key", "must be an absolute file path"),
    ("vllm_router", "/run/my key", "must be an absolute file path"),
])
def test_a_bad_credentials_file_is_a_spec_error_at_its_line(tmp_path, kind, value, what):
    p = write_spec(tmp_path, {"gw": gateway_adapter(kind, credentials_file=value)})
    with pytest.raises(SpecError) as e:
        load_spec(p)
    assert [(x.line, what in x.what) for x in e.value.problems] == [(line_of(p, "credentials_file:"), True)]
    assert f"{p}:{line_of(p, 'credentials_file:')}:" in str(e.value)


@pytest.mark.parametrize("adapter,fix", [
    ({"kind": "haproxy", "socket": "/run/haproxy/admin.sock", "actions": ["freeze_admissions"],
      "targets": [{"match": {"engine": "engine-0"}, "server": "be/s0"}]}, "remove it from this haproxy adapter"),
    ({"kind": "http", "hosts": ["h:1"], "actions": ["freeze_admissions"], "targets": [{"match": {"engine": "engine-0"}}],
      "trip": {"url": "http://h:1/x"}}, "headers_files: {Authorization: FILE}"),
])
def test_credentials_file_on_a_kind_without_a_control_plane_is_refused(tmp_path, adapter, fix):
    p = write_spec(tmp_path, {"a": {**adapter, "credentials_file": "/run/key"}})
    with pytest.raises(SpecError) as e:
        load_spec(p)
    (problem,) = e.value.problems
    assert problem.line == line_of(p, "credentials_file:") and fix in problem.fix


def test_both_gateway_kinds_load_a_credentials_file(tmp_path):
    p = write_spec(tmp_path, {"s": gateway_adapter("sglang_gateway", credentials_file=KEY_FILE),
                              "v": gateway_adapter("vllm_router", credentials_file="/etc/fusebox/router.key")})
    assert [a.credentials_file for a in load_spec(p).adapters] == [KEY_FILE, "/etc/fusebox/router.key"]


def test_the_gateway_secret_and_the_credentials_file_must_agree(tmp_path):
    secret = {"gateway_secret": {"name": "fusebox-gateway-key", "key": "key"}}
    p = write_spec(tmp_path, {"s": gateway_adapter("sglang_gateway", credentials_file="/etc/other/key")}, secret)
    with pytest.raises(SpecError) as e:
        load_spec(p)
    (problem,) = e.value.problems
    assert problem.line == line_of(p, "credentials_file:") and problem.fix == f"credentials_file: {KEY_FILE}"
    (tmp_path / "b").mkdir()
    p = write_spec(tmp_path / "b", {"s": gateway_adapter("sglang_gateway")}, secret)
    with pytest.raises(SpecError) as e:
        load_spec(p)
    (problem,) = e.value.problems
    assert problem.line == line_of(p, "gateway_secret:") and "no fuse.adapters entry reads" in problem.what
    (tmp_path / "c").mkdir()
    p = write_spec(tmp_path / "c", {"s": gateway_adapter("sglang_gateway")}, {"gateway_secret": {"name": "Bad_Name", "key": "k"}})
    with pytest.raises(SpecError) as e:
        load_spec(p)
    assert any("'Bad_Name' is not a Secret name" in x.what for x in e.value.problems)


def test_the_generated_deployment_mounts_the_gateway_key_from_the_secret(tmp_path):
    p = write_spec(tmp_path, {"s": gateway_adapter("sglang_gateway", credentials_file=KEY_FILE)},
                   {"gateway_secret": {"name": "fusebox-gateway-key", "key": "key"}})
    spec = load_spec(p)
    assert adapter_warnings(spec) == [] or not any("gateway_secret" in w for w in adapter_warnings(spec))
    (dep,) = [d for d in render_fuse(spec) if d["kind"] == "Deployment"]
    pod = dep["spec"]["template"]["spec"]
    (vol,) = [v for v in pod["volumes"] if v["name"] == "gateway-key"]
    assert vol["secret"] == {"secretName": "fusebox-gateway-key", "defaultMode": 0o440,
                             "items": [{"key": "key", "path": "key"}]}
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "gateway-key"]
    assert "subPath" not in mount and f"{mount['mountPath']}/{vol['secret']['items'][0]['path']}" == KEY_FILE
    # without the Secret: no volume, and generate warns that the fuse cannot start with the file
    (tmp_path / "b").mkdir()
    spec = load_spec(write_spec(tmp_path / "b", {"s": gateway_adapter("sglang_gateway", credentials_file=KEY_FILE)}))
    (dep,) = [d for d in render_fuse(spec) if d["kind"] == "Deployment"]
    assert [v["name"] for v in dep["spec"]["template"]["spec"]["volumes"]] == ["spec", "token", "state", "tmp"]
    assert any("fuse.adapters.s.credentials_file is set and kubernetes.fuse.gateway_secret is not" in w
               for w in adapter_warnings(spec))


def test_generate_names_the_gateway_secret_to_create_with_its_kubectl_command(tmp_path, capsys):
    # without the Secret the fuse pod stays ContainerCreating (its volume cannot mount): generate
    # says so, with the command that creates it in the fuse's namespace, as it does for the people's
    from fusebox.cli import main

    p = write_spec(tmp_path, {"s": gateway_adapter("sglang_gateway", credentials_file=KEY_FILE)},
                   {"gateway_secret": {"name": "fusebox-gateway-key", "key": "key"}})
    ns = load_spec(p).kubernetes.namespace
    capsys.readouterr()
    assert main(["generate", "--spec", str(p), "--out", str(tmp_path / "out")]) == 0
    notes = [ln for ln in capsys.readouterr().err.splitlines() if "fusebox-gateway-key" in ln]
    assert len(notes) == 1 and notes[0].startswith("fusebox generate: note: k8s/fuse.yml"), notes
    assert f"kubectl -n {ns} create secret generic fusebox-gateway-key --from-file=key=" in notes[0]
    assert "ContainerCreating" in notes[0]
    # no gateway_secret: no such note
    (tmp_path / "b").mkdir()
    p = write_spec(tmp_path / "b", {"s": gateway_adapter("sglang_gateway")})
    assert main(["generate", "--spec", str(p), "--out", str(tmp_path / "b" / "out")]) == 0
    assert "gateway_secret" not in "".join(ln for ln in capsys.readouterr().err.splitlines() if "note:" in ln)


# --- the key file ----------------------------------------------------------------------------------

def _replace(path: Path, text: str) -> None:
    """Write ``text`` as a new file renamed over ``path`` (as a Secret volume's update does)."""
    tmp = path.with_suffix(".new")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def test_the_key_file_is_read_again_when_it_changes_and_a_bad_one_keeps_the_last_good_key(tmp_path, caplog):
    f = tmp_path / "key"
    _replace(f, KEY + "\n")
    k = KeyFile(f)
    assert k.value() == KEY
    _replace(f, WRONG)
    assert k.value() == WRONG  # rotated: no restart
    with caplog.at_level(logging.ERROR, "fusebox.fuse"):
        _replace(f, "two\nlines")
        assert k.value() == WRONG and k.value() == WRONG
        f.unlink()
        assert k.value() == WRONG
    assert [r.getMessage().split(": ")[0] for r in caplog.records] == ["key file not read again, the previous key stays in use"] * 2
    assert WRONG not in caplog.text
    for bad, error in (("", NoTokens), ("a b", ValueError)):
        _replace(f, bad)
        with pytest.raises(error):
            KeyFile(f)


def test_a_missing_key_file_names_the_adapter_at_start(tmp_path):
    spec = load_spec(write_spec(tmp_path, {"s": gateway_adapter("sglang_gateway", credentials_file=str(tmp_path / "nope"))}))
    with pytest.raises(ValueError, match=r"fuse\.adapters\.s\.credentials_file: .*nope: no such file"):
        build_adapters(spec.adapters)


def test_fuse_serve_with_a_missing_key_file_says_where_in_the_spec_and_how_to_fix_it(tmp_path, monkeypatch):
    # the start fails as every bad input does: FILE:LINE of credentials_file, what, how to fix; exit 2,
    # no state directory made
    import contextlib
    import io

    import fusebox.fuse.logs
    from fusebox.cli import main

    monkeypatch.setattr(fusebox.fuse.logs, "setup", lambda *a, **k: None)  # leaves the root logger to pytest

    p = write_spec(tmp_path, {"s": gateway_adapter("sglang_gateway", credentials_file=str(tmp_path / "nope"))})
    (tmp_path / "token").write_text("t" * 40)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(["fuse", "serve", "--spec", str(p), "--webhook-token-file", str(tmp_path / "token"),
                   "--state-dir", str(tmp_path / "state"), "--listen", "127.0.0.1:0"])
    msg = err.getvalue().strip()
    assert rc == 2, msg
    line = line_of(p, "credentials_file:")
    assert f"{p}:{line}:" in msg and "fuse.adapters.s.credentials_file" in msg and "nope: no such file" in msg, msg
    fix = msg.split(" -- ", 1)[1]
    assert "control-plane key" in fix and "gateway_secret" in fix, msg
    assert not (tmp_path / "state").exists()


# --- the adapters at the HTTP boundary (vLLM router 0.1.17 has no closed control plane to run) ----

@pytest.mark.parametrize("cls,kind", [(SglangGateway, "sglang_gateway"), (VllmRouter, "vllm_router")])
def test_both_kinds_send_the_key_as_bearer_and_a_refusal_is_transient_and_logged_once(tmp_path, caplog, cls, kind):
    f = tmp_path / "key"
    _replace(f, KEY)
    spec = load_spec(write_spec(tmp_path, {"gw": gateway_adapter(kind, credentials_file=str(f))})).adapters[0]
    seen: list[str | None] = []

    def gateway(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        if request.headers.get("authorization") != f"Bearer {KEY}":
            return httpx.Response(401, text="Invalid authentication token")
        return httpx.Response(200, json={"workers": [], "urls": []})

    adapter = cls(spec)
    adapter._client = httpx.Client(transport=httpx.MockTransport(gateway))
    p = ControlCall.from_json({"action": "freeze_admissions", "level": 1, "state": "trip", "scope": {"engine": "engine-0"},
                               "decision_id": "d" * 32})
    adapter.apply(p)
    assert seen and set(seen) == {f"Bearer {KEY}"}
    _replace(f, WRONG)
    with caplog.at_level(logging.INFO, "fusebox.fuse"):
        for _ in range(3):
            with pytest.raises(CredentialRefused) as e:
                adapter.apply(p)
            assert not e.value.permanent and e.value.summary == "gateway refused the control-plane credential (HTTP 401)"
        _replace(f, KEY)
        adapter.apply(p)
    # refused once, accepted again once; the key file read again at each of its two changes
    assert [(r.levelname, r.getMessage().split(":")[0]) for r in caplog.records] == [
        ("INFO", f"key file {f} read again"), ("ERROR", "adapter gw"), ("INFO", f"key file {f} read again"), ("INFO", "adapter gw")]
    assert KEY not in caplog.text and WRONG not in caplog.text and WRONG not in str(e.value)


def test_a_refusal_while_retried_shows_not_applied_with_why_until_applied():
    a = AppliedLevels()
    a.decided("k", 1, "trip", "d1", ["sglang"])
    a.retrying("k", 1, "d1", "sglang", "retrying: gateway refused the control-plane credential (HTTP 401)")
    assert a.view("k", 1) == {"applied": False, "applied_by": [], "pending": ["sglang"], "not_applied": [
        {"adapter": "sglang", "why": "retrying: gateway refused the control-plane credential (HTTP 401)"}]}
    assert a.unapplied() == 1
    a.outcome("k", 1, "d1", "sglang", True)
    assert a.view("k", 1) == {"applied": True, "applied_by": ["sglang"], "pending": [], "not_applied": []}


# --- the real smg 1.13 with its control plane closed -----------------------------------------------

@pytest.mark.process
def test_smg_with_a_closed_control_plane_obeys_the_key_and_refuses_everyone_else(tmp_path, caplog):
    engines = [StandInEngine(), StandInEngine()]
    e0, e1 = (e.url for e in engines)
    key_file = tmp_path / "gateway.key"
    _replace(key_file, KEY + "\n")
    gw = sglang_gateway([e0, e1], tmp_path / "smg.log", package=SMG, key=KEY)
    try:
        listed = sglang_workers(gw.url, KEY)
        # the gateway itself: no key, or a wrong one, removes nothing
        for headers in ({}, {"Authorization": f"Bearer {WRONG}"}):
            r = httpx.delete(f"{gw.url}/workers/{listed[e0]['id']}", headers=headers, timeout=5)
            assert r.status_code == 401, r.text
        assert httpx.get(gw.url + "/workers", timeout=5).status_code == 401
        assert {u: w["id"] for u, w in sglang_workers(gw.url, KEY).items()} == {u: w["id"] for u, w in listed.items()}

        adapters = {"smg": {"kind": "sglang_gateway", "url": gw.url, "actions": ["freeze_admissions"], "timeout": "2s",
                            "credentials_file": str(key_file),
                            "targets": [{"match": {"engine": f"engine-{i}"}, "worker_url": u} for i, u in enumerate((e0, e1))]}}
        spec = load_spec(write_spec(tmp_path, adapters))
        with LiveService(tmp_path / "fuse.sqlite", adapters=build_adapters(spec.adapters), hold_s=0.3) as svc, \
                caplog.at_level(logging.DEBUG, "fusebox.fuse"):
            # the key: exactly engine-0 out (smg drains it ~5 s, then drops it), then back
            svc.post(payload(alert("GPUMemoryUtilizationHigh", engine="engine-0")))
            wait_for(lambda: list(sglang_workers(gw.url, KEY)) == [e1], 20, what="engine-0 out, engine-1 kept")
            svc.post(payload(alert("GPUMemoryUtilizationHigh", "resolved", engine="engine-0")))
            wait_for(lambda: set(sglang_workers(gw.url, KEY)) == {e0, e1}, 20, what="engine-0 back")
            # a wrong key (the file rotated under the running fuse): nothing changes, /state says why
            _replace(key_file, WRONG)
            svc.post(payload(alert("GPUMemoryUtilizationHigh", engine="engine-1")))
            why = "retrying: gateway refused the control-plane credential (HTTP 401)"
            lvl = wait_for(lambda: (s := _level(svc, "engine-1"))["not_applied"] and s, 10, what="the refusal in /state")
            assert lvl == {**lvl, "applied": False, "applied_by": [], "pending": ["smg"],
                           "not_applied": [{"adapter": "smg", "why": why}]}
            refusals = wait_for(lambda: _sample(svc, "fusebox_fuse_gateway_credential_refusals_total") >= 2 and
                                _sample(svc, "fusebox_fuse_gateway_credential_refusals_total"), 10, what="retries counted")
            assert set(sglang_workers(gw.url, KEY)) == {e0, e1}
            assert _sample(svc, "fusebox_fuse_unapplied_levels", "") == 1
            # the right key again, without a restart: the retry applies it
            _replace(key_file, KEY)
            # (smg lists a removed worker as draining for ~5 s before it drops it)
            wait_for(lambda: {u: w.get("status") for u, w in sglang_workers(gw.url, KEY).items()}.get(e1, "draining")
                     == "draining", 20, what="engine-1 removed once the key is right")
            assert sglang_workers(gw.url, KEY)[e0].get("status") != "draining"
            lvl = wait_for(lambda: (s := _level(svc, "engine-1"))["applied"] and s, 10, what="applied in /state")
            assert lvl == {**lvl, "applied_by": ["smg"], "pending": [], "not_applied": []}
            state_text = json.dumps(svc.state()) + json.dumps(svc.service.store.audit_log(200))
        refused = [r for r in caplog.records if "refused the control-plane credential" in r.getMessage()]
        assert [r.levelname for r in refused] == ["ERROR"] + ["DEBUG"] * (len(refused) - 1), refusals
        assert KEY not in state_text and WRONG not in state_text
        assert KEY not in caplog.text and WRONG not in caplog.text
    finally:
        gw.stop()
        for e in engines:
            e.stop()


def _level(svc, engine: str) -> dict:
    (scope,) = [s for s in svc.state()["scopes"] if s["labels"].get("engine") == engine and "1" in s["levels"]]
    return scope["levels"]["1"]


def _sample(svc, name: str, labels: str = '{adapter="smg"}') -> float:
    text = httpx.get(svc.url + "/metrics", timeout=5).text
    return next(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(f"{name}{labels} "))
