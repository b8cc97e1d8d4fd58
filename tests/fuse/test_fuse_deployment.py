"""The fuse service started exactly as the generated Deployment starts it, on PostgreSQL with a
password: two replicas become Ready, share their state in PostgreSQL (and write no state under
``$HOME``), and the password shows in no response and no log line, the database down included.

The pods run natively (tests/_k8s_pods.py: the manifest's args, env from the Secret, mounts,
probes); the store Secret holds ``postgresql://fusebox:PASSWORD@.../fusebox`` for a role that logs
in by SCRAM password. Before the fix, ``fuse serve`` ignored ``FUSEBOX_FUSE_STORE`` (each replica
wrote its own SQLite file under ``$HOME``), and ``/readyz`` answered 503 for good on PostgreSQL,
printing the URL with its password.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
import time

import httpx
import psycopg
import pytest
import yaml
from _fuse_support import alert, payload, wait_for
from _k8s_pods import Pod
from _pg_support import PgServer
from _support import SPEC, yaml_data, yaml_text

from fusebox import conventions as C
from fusebox.generator.outputs import render_all
from fusebox.spec import parse_spec
from fusebox.tooling import free_port

pytestmark = pytest.mark.tools

PASSWORD = "Fz-" + secrets.token_hex(16)  # distinctive: any appearance of it is a leak
TOKEN = secrets.token_urlsafe(32)
SCOPE = {"cluster": "prod-a", "host_name": "gpu-node-7", "hw_id": "GPU-0b8e6e28-6c1f-4c2c-9d3e-7d1c2f0a9e11"}


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    root = tmp_path_factory.mktemp("deploy")
    pg = PgServer()
    pg.start()
    url = pg.create_user("fusebox", PASSWORD)
    gw_log = root / "gateway.jsonl"
    gw_url = f"http://127.0.0.1:{free_port()}"
    gw = subprocess.Popen([sys.executable, "-m", "fusebox.cli", "fuse", "gateway", "--listen",
                           gw_url.removeprefix("http://"), "--log", str(gw_log)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    data = yaml_data(SPEC.read_text())
    data["kubernetes"] = {"namespace": "monitoring", "labels": {"release": "kube-prometheus-stack"},
                          "fuse": {"replicas": 2, "store_secret": {"name": "fusebox-fuse-store", "key": "url"},
                                   "args": ["--gateway-url", gw_url]}}
    outputs = render_all(parse_spec(yaml_text(data, sort_keys=False), "fusebox.yaml"))
    docs = {f"{d['kind']}/{d['metadata']['name']}": d for d in yaml.safe_load_all(outputs["k8s/fuse.yml"]) if d}
    dep = docs[f"Deployment/{C.K8S['fuse']}"]
    cms = {"fusebox-spec": docs["ConfigMap/fusebox-spec"]["data"]}
    secs = {"fusebox-fuse-store": {"url": url}, C.K8S["token_secret"]: {C.K8S["token_key"]: TOKEN + "\n"}}
    pods = [Pod(dep, root / f"fuse-{i}", secrets=secs, configmaps=cms, name=f"fusebox-fuse-{i}").start()
            for i in range(dep["spec"]["replicas"])]
    try:
        wait_for(lambda: _up(gw_url + "/healthz"), 30, 0.1, "the reference gateway")
        yield {"pg": pg, "pods": pods, "gw_log": gw_log, "root": root}
    finally:
        for p in pods:
            p.stop(10)
        gw.terminate()
        gw.wait(10)
        pg.close()


def _up(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code < 500
    except httpx.HTTPError:
        return False


def _rows(pg: PgServer, sql: str) -> list[tuple]:
    with psycopg.connect(pg.url("fusebox"), autocommit=True) as c:
        return c.execute(sql).fetchall()


def test_the_generated_deployment_has_two_replicas_that_become_ready_on_postgresql(deployed):
    pods = deployed["pods"]
    assert len(pods) == 2
    for p in pods:
        # the probe as the kubelet sends it, at a tenth of its period to keep the test short
        p.wait_ready(timeout=60, period=1.0)
        body = httpx.get(p.url() + "/readyz", timeout=5).json()
        assert body["status"] == "ready" and body["dry_run"] is False
        assert p.probe("livenessProbe")
    # the store is PostgreSQL: the schema is there, and no state was written under HOME (where the
    # SQLite default would go: the image's root file system is read-only) nor anywhere else
    assert _rows(deployed["pg"], "SELECT count(*) FROM schema_version")[0][0] >= 1
    for p in pods:
        assert not (p.home / ".local" / "share" / "fusebox").exists()
        assert not list(p.root.rglob("*.sqlite*"))
        # and the manifest as generated starts without a warning (a Secret volume mounted 0440
        # through the pod's fsGroup is private to the pod)
        assert " WARNING " not in p.output(), p.output()


def test_a_trip_taken_by_one_replica_is_in_postgresql_and_seen_by_the_other(deployed):
    a, b = deployed["pods"]
    a.wait_ready(timeout=60, period=1.0)
    b.wait_ready(timeout=60, period=1.0)
    body = payload(alert("GPUMemoryUtilizationHigh", **SCOPE))
    r = httpx.post(a.url() + "/alertmanager", json=body, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    assert r.status_code == 200, r.text
    # the decision is in the shared database ...
    audit = _rows(deployed["pg"], "SELECT count(*) FROM audit")[0][0]
    assert audit >= 1
    # ... so the other replica reports the same tripped scope, level 1 (freeze_admissions)
    state = httpx.get(b.url() + "/state", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10).json()
    text = str(state)
    assert SCOPE["hw_id"] in text and "freeze_admissions" in text
    # and exactly one call reached the gateway, whichever replica made it
    wait_for(lambda: deployed["gw_log"].exists() and deployed["gw_log"].read_text().count('"trip"') >= 1, 20, 0.1,
             "the gateway call")
    time.sleep(1.0)
    calls = [yaml.safe_load(line) for line in deployed["gw_log"].read_text().splitlines() if line.strip()]
    assert [(c["state"], c["level"]) for c in calls] == [("trip", 1)]


def _every_answer(p: Pod) -> list[str]:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    out = []
    for path, headers in [("/readyz", {}), ("/healthz", {}), ("/metrics", {}), ("/state", auth), ("/", auth),
                          ("/openapi.json", auth), ("/state", {}), ("/", {"Authorization": "Bearer wrong"})]:
        r = httpx.get(p.url() + path, headers=headers, timeout=10)
        out.append(f"{path} {r.status_code} {r.headers} {r.text}")
    r = httpx.post(p.url() + "/alertmanager", content=b"{not json", headers=auth, timeout=10)
    out.append(f"POST {r.status_code} {r.text}")
    return out


def test_the_password_shows_in_no_answer_and_no_log_line_even_with_the_database_down(deployed):
    pg, pods = deployed["pg"], deployed["pods"]
    for p in pods:
        p.wait_ready(timeout=60, period=1.0)
    answers = [a for p in pods for a in _every_answer(p)]
    pg.stop()
    try:
        # the database gone: not Ready (503, saying why), still no password
        for p in pods:
            wait_for(lambda p=p: not p.probe("readinessProbe"), 30, 0.5, f"{p.name} not ready without its database")
            r = httpx.get(p.url() + "/readyz", timeout=10)
            assert r.status_code == 503 and "store" in r.json()["reason"]
            answers += _every_answer(p)
            r = httpx.post(p.url() + "/alertmanager", json=payload(alert("GPUMemoryUtilizationHigh", **SCOPE)),
                           headers={"Authorization": f"Bearer {TOKEN}"}, timeout=15)
            assert r.status_code == 503
            answers.append(r.text)
    finally:
        pg.start()
    for p in pods:
        p.wait_ready(timeout=60, period=1.0)
    leaks = [a[:300] for a in answers if PASSWORD in a]
    assert not leaks
    for p in pods:
        log = p.output()
        assert "fusebox fuse serve: listening" in log and "postgresql://fusebox@" in log  # the URL, shown without it
        assert PASSWORD not in log
