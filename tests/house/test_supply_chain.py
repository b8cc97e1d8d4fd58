"""Supply chain (issue 14, item 10): the venv, CI and the image install from hash-pinned locks;
the Go tools build from committed manifests and sums with -mod=readonly; the Docker build
context leaves secrets out. Static checks of the committed files (no network, no build)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REQ = ROOT / "requirements"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _lock(path: Path) -> dict[str, tuple[str, int]]:
    """{name: (version, number of --hash options)} of a pip-compile/uv lock."""
    out: dict[str, tuple[str, int]] = {}
    current = None
    for line in path.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^ \\]+)", line)
        if m:
            current = _norm(m.group(1))
            out[current] = (m.group(2), 0)
        elif current and line.strip().startswith("--hash=sha256:"):
            v, n = out[current]
            out[current] = (v, n + 1)
        elif line and not line.startswith((" ", "#")):
            raise AssertionError(f"{path.name}: unexpected line {line!r}")
    return out


def _names(reqs: list[str]) -> set[str]:
    return {_norm(re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0]) for r in reqs}


def test_the_locks_pin_every_dependency_with_hashes():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime, test = _lock(REQ / "runtime.lock"), _lock(REQ / "test.lock")
    build = {"setuptools", "wheel"}  # pyproject's [build-system], for --no-build-isolation
    assert _names(project["dependencies"]) | build <= set(runtime)
    assert _names(project["dependencies"]) | _names(project["optional-dependencies"]["test"]) | build <= set(test)
    for name, (version, hashes) in {**runtime, **test}.items():
        assert hashes >= 1, f"{name}=={version} has no hash"
    # the image's lock is the test lock less the test tools, at the same versions
    assert {n: v for n, (v, _) in runtime.items()} == {n: test[n][0] for n in runtime}
    assert "pytest" not in runtime and "pytest" in test


def test_the_venv_rule_and_the_image_install_only_from_the_locks():
    make = (ROOT / "Makefile").read_text()
    rule = make[make.index("$(BIN)/fusebox:"):].split("\n\n", 1)[0]
    assert "LOCK := requirements/test.lock" in make and "$(LOCK)" in rule.splitlines()[0]
    pips = [line.strip() for line in rule.splitlines() if "pip install" in line]
    assert pips == ["$(BIN)/pip install -q --require-hashes -r $(LOCK)",
                    "$(BIN)/pip install -q --no-deps --no-build-isolation -e ."]
    assert re.search(r"^lock: .*## ", make, re.M), "make lock needs a help comment"
    docker = (ROOT / "Dockerfile").read_text()
    runs = [line for line in docker.splitlines() if line.startswith("RUN pip install")]
    assert runs[0] == "RUN pip install --no-cache-dir --require-hashes -r requirements/runtime.lock"
    assert runs[1].startswith("RUN pip install --no-cache-dir --no-deps --no-build-isolation . ")
    assert len(runs) == 2


def test_the_docker_build_context_leaves_secrets_and_the_venv_out():
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {"secrets/", ".env*", ".venv", ".git"} <= ignored


def test_the_otelcol_build_uses_the_committed_manifest_and_module_graph():
    manifest = (ROOT / "tools/otelcol/manifest.yaml").read_text()
    gomod = (ROOT / "tools/otelcol/go.mod").read_text()
    required = dict(re.findall(r"^\t(\S+) (v\S+)(?: // indirect)?$", gomod, re.M))
    components = re.findall(r"gomod: (\S+) (v\S+)", manifest)
    assert len(components) == 15
    # the trace pipeline's parts (issue 35): OTLP out over gRPC and HTTP, span metrics
    assert {"go.opentelemetry.io/collector/exporter/otlpexporter",
            "go.opentelemetry.io/collector/exporter/otlphttpexporter",
            "github.com/open-telemetry/opentelemetry-collector-contrib/connector/spanmetricsconnector"} <= dict(components).keys()
    assert "\nconnectors:\n  - gomod: github.com/open-telemetry/opentelemetry-collector-contrib/connector/spanmetricsconnector " in manifest
    for module, version in components:
        assert required.get(module) == version, module
    gosum = (ROOT / "tools/otelcol/go.sum").read_text()
    for module, version in components:
        assert f"{module} {version} h1:" in gosum, module
    script = (ROOT / "tools/build-otelcol.sh").read_text()
    assert "GOFLAGS=-mod=readonly" in script and "--skip-get-modules" in script
    assert '"$here/otelcol/manifest.yaml"' in script and '"$here/otelcol/go.sum"' in script


def test_the_go_tools_are_hash_checked_and_never_resolved_freely():
    sums = dict(((m, v), h) for m, v, h in re.findall(r"^(\S+) (v\S+) (h1:\S+)$",
                                                       (ROOT / "tools/go-modules.sum").read_text(), re.M))
    otel = (ROOT / "tools/build-otelcol.sh").read_text()
    prom = (ROOT / "tools/build-promtool3.sh").read_text()
    core = re.search(r"^CORE=(v\S+)", otel, re.M).group(1)
    version = re.search(r"^VERSION=(v\S+)", prom, re.M).group(1)
    assert ("go.opentelemetry.io/collector/cmd/builder", core) in sums
    assert ("github.com/prometheus/prometheus", version) in sums
    assert "verified_module_dir go.opentelemetry.io/collector/cmd/builder" in otel
    assert "verified_module_dir github.com/prometheus/prometheus" in prom
    for script in (ROOT / "tools").glob("*.sh"):
        text = script.read_text()
        assert "-mod=mod" not in text, script.name
        for line in text.splitlines():
            if re.search(r"\bgo (build|install)\b", line) and not line.lstrip().startswith("#"):
                assert "GOFLAGS=-mod=readonly" in line, f"{script.name}: {line}"


def test_the_operator_crds_are_fetched_by_a_hash_checked_module_version():
    """tools/build-operator-crds.sh takes the CRDs the k8s tests validate against from a module in
    tools/go-modules.sum, the version the tests read."""
    script = (ROOT / "tools/build-operator-crds.sh").read_text()
    version = re.search(r"^VERSION=(v\S+)", script, re.M).group(1)
    assert re.search(rf"^github.com/prometheus-operator/prometheus-operator {re.escape(version)} h1:\S+$",
                     (ROOT / "tools/go-modules.sum").read_text(), re.M)
    assert "verified_module_dir github.com/prometheus-operator/prometheus-operator" in script
    tests = (ROOT / "tests/k8s/test_k8s_manifests.py").read_text()
    assert f'OPERATOR_VERSION = "{version}"' in tests


def test_the_kube_and_operator_builds_use_committed_module_graphs():
    """kube-apiserver and etcd build from the wrapper module tools/kube/ (k8s.io/kubernetes' staging
    modules mapped to their published versions), the Prometheus Operator from its own module with
    tools/prometheus-operator/go.mod (its go.mod less the replace lines for its nested modules);
    the versions the scripts pin are the ones those go.mod files require and tools/go-modules.sum
    hashes."""
    sums = (ROOT / "tools/go-modules.sum").read_text()
    kube = (ROOT / "tools/build-kube.sh").read_text()
    version = re.search(r"^VERSION=(v\S+)", kube, re.M).group(1)
    etcd = re.search(r"^ETCD_VERSION=(v\S+)", kube, re.M).group(1)
    gomod = (ROOT / "tools/kube/go.mod").read_text()
    gosum = (ROOT / "tools/kube/go.sum").read_text()
    for module, v in (("k8s.io/kubernetes", version), ("go.etcd.io/etcd/server/v3", etcd)):
        assert re.search(rf"^{re.escape(module)} {v} h1:\S+$", sums, re.M), module
        assert f"\t{module} {v}\n" in gomod, module
        assert f"{module} {v} h1:" in gosum, module
        assert f"verified_module_dir {module} " in kube
    staging = "v0." + version.removeprefix("v1.")
    replaces = re.findall(r"^\t(k8s\.io/\S+) => (k8s\.io/\S+) (v\S+)$", gomod, re.M)
    assert len(replaces) > 20
    assert all(left == right and v == staging for left, right, v in replaces)
    for name in ("kube-apiserver", "kube-controller-manager", "etcd"):
        assert "package main" in (ROOT / f"tools/kube/cmd/{name}/main.go").read_text()
    assert "./cmd/kube-apiserver ./cmd/kube-controller-manager ./cmd/etcd" in kube
    # the skip check names every binary the one build makes (a cache from before one was added rebuilds)
    assert '[ -x "$dest/kube-apiserver" ] && [ -x "$dest/kube-controller-manager" ] && [ -x "$dest/etcd" ]' in kube

    operator = (ROOT / "tools/build-prometheus-operator.sh").read_text()
    crds = (ROOT / "tools/build-operator-crds.sh").read_text()
    version = re.search(r"^VERSION=(v\S+)", operator, re.M).group(1)
    assert re.search(r"^VERSION=(v\S+)", crds, re.M).group(1) == version
    opmod = (ROOT / "tools/prometheus-operator/go.mod").read_text()
    opsum = (ROOT / "tools/prometheus-operator/go.sum").read_text()
    root = "github.com/prometheus-operator/prometheus-operator"
    assert opmod.startswith(f"module {root}\n") and "replace" not in opmod
    for module in (root, f"{root}/pkg/apis/monitoring", f"{root}/pkg/client"):
        assert re.search(rf"^{re.escape(module)} {version} h1:\S+$", sums, re.M), module
    for module in (f"{root}/pkg/apis/monitoring", f"{root}/pkg/client"):
        assert f"\t{module} {version}\n" in opmod and f"{module} {version} h1:" in opsum, module
    assert '-modfile="$here/prometheus-operator/go.mod"' in operator


def test_keda_builds_in_its_own_hash_checked_module():
    """KEDA's operator and metrics API server build inside the downloaded module (its go.mod's
    replace directive holds only there), whose h1 hash tools/go-modules.sum pins; its own go.sum
    pins the rest (GOFLAGS=-mod=readonly); the version is the one the scaling tests read."""
    script = (ROOT / "tools/build-keda.sh").read_text()
    version = re.search(r"^VERSION=(v\S+)", script, re.M).group(1)
    assert re.search(rf"^github.com/kedacore/keda/v2 {re.escape(version)} h1:\S+$",
                     (ROOT / "tools/go-modules.sum").read_text(), re.M)
    assert "MODULE=github.com/kedacore/keda/v2" in script and 'verified_module_dir "$MODULE" "$VERSION"' in script
    assert '(cd "$src" && GOWORK=off GOFLAGS=-mod=readonly' in script and "./cmd/operator ./cmd/adapter" in script
    assert f'KEDA_VERSION = "{version}"' in (ROOT / "tests/_scaling_support.py").read_text()


def test_jaeger_builds_in_its_own_hash_checked_module():
    """Jaeger v2's `jaeger` builds inside the downloaded module (its go.mod's replace directive
    holds only there), whose h1 hash tools/go-modules.sum pins; its own go.sum pins the rest
    (GOFLAGS=-mod=readonly); the version is the one fusebox.tooling finds the binary by."""
    from fusebox.tooling import JAEGER_VERSION

    script = (ROOT / "tools/build-jaeger.sh").read_text()
    version = re.search(r"^VERSION=(v\S+)", script, re.M).group(1)
    assert version == JAEGER_VERSION == "v1.75.0"  # the approved version; v1.76.0 is not
    assert re.search(rf"^github.com/jaegertracing/jaeger {re.escape(version)} "
                     r"h1:OWj6uKRJ8QaH\+AVypRwqINGi3Q/WOchbEfp53FJK0Xk=$",
                     (ROOT / "tools/go-modules.sum").read_text(), re.M)
    assert "MODULE=github.com/jaegertracing/jaeger" in script and 'verified_module_dir "$MODULE" "$VERSION"' in script
    assert '(cd "$src" && GOWORK=off GOFLAGS=-mod=readonly CGO_ENABLED=0 go build -trimpath' in script
    assert '-o "$dest.tmp/jaeger"' in script and script.rstrip().endswith('echo "bootstrap: built $dest/jaeger"')
    assert f"`jaeger-{version}/jaeger`" in (ROOT / "tools/README.md").read_text()


def test_the_otelcol_build_folder_is_named_after_the_manifest_it_was_built_from():
    """tools/build-otelcol.sh skips when its folder holds a binary, so the folder's name carries the
    manifest's digest: a manifest change (a component added) builds into a new folder instead of
    taking a cached build of the old one. VERSION, the digest of the committed manifest and the
    version fusebox.tooling finds the binary by agree; the script refuses a stale VERSION."""
    import hashlib

    from fusebox.tooling import OTELCOL_VERSION

    script = (ROOT / "tools/build-otelcol.sh").read_text()
    core = re.search(r"^CORE=(v\S+)", script, re.M).group(1)
    version = re.search(r"^VERSION=(\S+)$", script, re.M).group(1)
    digest = hashlib.sha256((ROOT / "tools/otelcol/manifest.yaml").read_bytes()).hexdigest()[:12]
    assert version == f"$CORE-{digest}" and OTELCOL_VERSION == f"{core}-{digest}"
    assert 'manifest_sum=$(sha256sum "$here/otelcol/manifest.yaml" | cut -c1-12)' in script
    assert 'if [ "$VERSION" != "$CORE-$manifest_sum" ]; then' in script and 'dest="$TOOLS/otelcol-$VERSION"' in script
    assert f"`otelcol-{core}-<digest>/otelcol-fusebox`" in (ROOT / "tools/README.md").read_text()


def test_the_otelcol_build_refuses_a_manifest_its_version_was_not_named_after(tmp_path):
    """A component added to the manifest without a new VERSION: the script stops before building,
    exit 1, naming the VERSION to set; nothing is written to the tools folder."""
    import hashlib
    import shutil
    import subprocess

    (tmp_path / "otelcol").mkdir()
    for name in ("build-otelcol.sh", "go-verify.sh"):
        shutil.copy(ROOT / "tools" / name, tmp_path / name)
    manifest = (ROOT / "tools/otelcol/manifest.yaml").read_text()
    manifest += "  - gomod: go.opentelemetry.io/collector/exporter/nopexporter v0.165.0\n"
    (tmp_path / "otelcol/manifest.yaml").write_text(manifest)
    digest = hashlib.sha256(manifest.encode()).hexdigest()[:12]
    r = subprocess.run(["bash", str(tmp_path / "build-otelcol.sh"), str(tmp_path / "tools")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr == (f"bootstrap: tools/otelcol/manifest.yaml has changed: set VERSION=v0.165.0-{digest} in "
                        "tools/build-otelcol.sh and OTELCOL_VERSION in fusebox/tooling.py (after tools/build-otelcol.sh --refresh)\n")
    assert not (tmp_path / "tools").exists()
