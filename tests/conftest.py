"""Session fixtures shared by the test modules; helpers live in _support.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from _fuse_support import TOKEN, dry_run_service, free_port, fuse_client, need_tool, wait_ok
from _pg_support import PgServer
from _support import SPEC

# the `unit` marker and its guard: the rule and the hooks live in _unit_rule.py
from _unit_rule import pytest_collection_modifyitems, pytest_configure, pytest_runtest_call, pytest_runtest_setup  # noqa: F401  (pytest finds hooks by name here)

from fusebox.tooling import PORTS_ENV, port_slice

# Under pytest-xdist (`make test`), each worker and the processes it starts draw free ports from
# their own slice, so two workers cannot pick the same port before either binds it.
if os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw"):
    os.environ.setdefault(PORTS_ENV, port_slice(int(os.environ["PYTEST_XDIST_WORKER"][2:]),
                                                int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))


# Tests live in one folder per area (tests/fuse/, tests/spec/, ...; tests/README.md). A few import a
# helper from a test module of another area by its file name (unique across the folders), so every
# area folder is importable, as tests/ itself is for the shared helpers (_support.py, ...).
for _area in sorted(p for p in Path(__file__).resolve().parent.iterdir() if p.is_dir() and any(p.glob("test_*.py"))):
    if str(_area) not in sys.path:
        sys.path.append(str(_area))


pytest_plugins = ("pytester",)

# Modules whose module fixture is a whole run (a demo, a cluster, a Prometheus with the real gateways):
# under pytest-xdist their tests stay on one worker, which sets the run up once. Spread over workers,
# each set it up again (the VictoriaMetrics run twice, 267 s each; four clusters at once).
ONE_WORKER = ("tests/e2e/", "tests/fuse/test_fuse_gpu_discovery.py", "tests/fuse/test_fuse_deployment.py",
              "tests/fuse/test_fuse_oncall.py", "tests/demo/test_backtest.py", "tests/costqos/test_costqos_controller.py")


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: unknown where it is not installed
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup` (``make test``) with the modules of ONE_WORKER as the groups: a test goes to
    whichever worker is free, the tests of such a module to one worker together. (pytest-xdist's own
    ``xdist_group`` mark does not take under pytest 9: xdist 3.8 tags the items through an attribute
    pytest 9 no longer reads.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class ModuleRuns(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module.startswith(ONE_WORKER) else super()._split_scope(nodeid)

    return ModuleRuns(config, log)


@pytest.fixture(scope="session")
def spec():
    from fusebox.spec import load_spec

    return load_spec(SPEC, display_path="fusebox.yaml")


@pytest.fixture(scope="session")
def generated(tmp_path_factory, spec):
    """The shipped spec's outputs, generated once into a temporary directory."""
    from fusebox.generator.outputs import render_all
    from fusebox.generator.writer import write_outputs

    out = tmp_path_factory.mktemp("generated")
    write_outputs(render_all(spec), out)
    return out


@pytest.fixture(scope="session")
def shipped_check(tmp_path_factory, spec) -> subprocess.CompletedProcess:
    """`fusebox check` (every tool: promtool 2.42 and 3, vmalert, vmalert-tool, thanos, amtool) of
    the shipped spec's outputs, run ONCE for the whole session however many xdist workers ask: the
    first takes a file lock beside the workers' temporary folders, generates and checks, and writes
    the result there; the others wait on the lock and read it (one run takes minutes on 2 cores).
    Its ``args`` is the folder checked."""
    import fcntl
    import json

    from fusebox.generator.outputs import render_all
    from fusebox.generator.writer import write_outputs

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    result = shared / "shipped-check.json"
    with open(shared / "shipped-check.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not result.exists():
            out = shared / "shipped-check"
            write_outputs(render_all(spec), out)
            r = subprocess.run([sys.executable, "-m", "fusebox.cli", "check", "--spec", str(SPEC), "--out", str(out)],
                               capture_output=True, text=True, cwd=SPEC.parent, timeout=900)
            result.write_text(json.dumps({"args": str(out), "returncode": r.returncode, "stdout": r.stdout,
                                          "stderr": r.stderr}))
    return subprocess.CompletedProcess(**json.loads(result.read_text()))


@pytest.fixture
def svc(tmp_path):
    """The fuse's service for HTTP-level tests (_fuse_support.dry_run_service), its store closed after."""
    s = dry_run_service(tmp_path)
    yield s
    s.store.close()


@pytest.fixture
def client(svc):
    """A TestClient on ``svc``'s app with the tests' tokens (_fuse_support.fuse_client); a module
    that wants other app options defines its own ``client`` from fuse_client."""
    return fuse_client(svc)


@pytest.fixture
def alertmanager(tmp_path):
    """``start(service_url, config, args=())``: a real Alertmanager on a free port with ``config``
    (_fuse_support.am_config's text: ``{url}`` is ``service_url``, ``{token_file}`` a file holding
    TOKEN), ready; its URL. Each one started is stopped after the test; its log is am.log (debug: each
    notify attempt and why it failed, for a test to print when it waits in vain)."""
    exe = need_tool("prometheus-alertmanager", "alertmanager")
    procs = []

    def start(service_url: str, config: str, args=()) -> str:
        token_file = tmp_path / "am-token"
        token_file.write_text(TOKEN + "\n")
        cfg = tmp_path / "alertmanager.yml"
        cfg.write_text(config.format(url=service_url, token_file=token_file))
        port = free_port()
        p = subprocess.Popen([exe, f"--config.file={cfg}", f"--storage.path={tmp_path / 'am-data'}",
                              f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
                              "--log.level=debug", *args], stdout=subprocess.DEVNULL, stderr=open(tmp_path / "am.log", "wb"))
        procs.append(p)
        url = f"http://127.0.0.1:{port}"
        wait_ok(url + "/-/ready", p)
        return url

    yield start
    for p in procs:
        p.terminate()
        p.wait(10)


@pytest.fixture(scope="module")
def pg():
    """A PostgreSQL server (Debian's, _pg_support.PgServer) for one test module."""
    server = PgServer()
    server.start()
    yield server
    server.close()

