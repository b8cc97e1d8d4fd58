"""Scale-out reaction time on the real scaling path, against ``fusebox budget``'s prediction.

The stack of tests/e2e/test_scaling_keda.py (tests/_scaling_support.py): etcd, kube-apiserver and
kube-controller-manager v1.37.2 (HPA sync period 1 s), KEDA v2.21.0's operator and metrics API
server, Debian's Prometheus running what ``fusebox generate`` writes for the shipped spec at the
demo's 1 s intervals with a ``scaling:`` section of one workload driven by KV growth (1 to 5
replicas, no scale-up stabilization, 5 s scale-down stabilization, KEDA polling 1 s).

Each step: the played load goes from 1 engine (load 0.75: 1 replica) to 5 engines growing at
6.9 MB/s each (load 3.75: 4 replicas) at once; the time from that moment until the engine
Deployment's ``spec.replicas`` is 4 (the HPA controller's write, read back from the API server
every 0.1 s) is the reaction time. Then back to 1 engine and 1 replica (about a minute: the
record's ``deriv(...[1m])`` keeps a series that left while it has samples in its window).

The prediction is ``fusebox budget``'s scale-out row for the workload (generator/budget.py:
scrape + evaluation + cross-group record staleness + HPA sync + scale-up
stabilization + pod start), printed with its terms. Its ``pod_start`` term (1 s in this spec: the
spec wants it positive) is NOT part of what is measured: there is no kubelet, so no pod starts and
the measured time stops at the new replica count; the bench prints the prediction without it too.
Also outside the prediction: a new engine's KV growth needs two scrapes before ``deriv`` has a
slope (one scrape interval more than a changed value would), and the HPA controller's own work.
KEDA's ``pollingInterval`` is not on this path, and the budget no longer counts it here: above
zero replicas the HPA controller asks KEDA's metrics API server, which has the operator run the
Prometheus query there and then (a trigger's ``useCachedMetrics`` is off by default); the polling
loop only activates a workload from zero, and the spec refuses ``replicas.min: 0``.

    python bench/bench_scaling.py [--steps 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

NS, MON, WORKLOAD, DEPLOYMENT, MODEL = "inference", "monitoring", "llava-7b", "vllm-llava", "llava-hf/llava-1.5-7b-hf"
PER_ENGINE_BPS = 0.75 * 9.2e6  # kv_cache_growth_rate's safe level 9.2 MB/s: 0.75 of it per engine


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3, help="load steps 1 -> 5 engines measured (default 3)")
    args = ap.parse_args()

    from _kube_support import wait_until
    from _scaling_support import HPA_SYNC_PERIOD_S, KVEngines, ScalingStack, generate, scaling_section, spec_with_scaling, yaml_docs

    from fusebox.demo.spec import Timing
    from fusebox.generator.budget import scaling_rows

    timing = Timing(scrape_interval="1s", evaluation_interval="1s", warning_for="10s", critical_for="10s", keep_firing_for="5s")
    with tempfile.TemporaryDirectory(prefix="bench-scaling-") as tmp:
        root = Path(tmp)
        spec = generate(spec_with_scaling(scaling_section(WORKLOAD, DEPLOYMENT, NS, MODEL, (1, 5), HPA_SYNC_PERIOD_S, 5, MON),
                                          timing), root)
        (row,) = [r for r in scaling_rows(spec) if r.workload == WORKLOAD]
        (scaled_object,) = yaml_docs(root / "gen" / "k8s" / "scaling.yml")
        engines = KVEngines(NS, DEPLOYMENT, MODEL, PER_ENGINE_BPS)
        engines.set(1)
        st = ScalingStack(root, root / "gen" / "rules" / "fusebox.rules.yml", engines, hpa_sync_period_s=HPA_SYNC_PERIOD_S,
                          prometheus_namespace=MON)
        t_start = time.monotonic()
        try:
            st.start(scaled_object)
            up_s = time.monotonic() - t_start
            wait_until(lambda: st.replicas() == 1 and abs(st.load(WORKLOAD) - 0.75) < 0.01, 120, "1 replica at load 0.75",
                       step=0.2, alive=st.check, why=st.why)
            reactions = []
            for i in range(args.steps):
                engines.set(5)
                t0 = time.monotonic()
                wait_until(lambda: st.replicas() == 4, 120, "4 replicas", step=0.1, alive=st.check, why=st.why)
                reactions.append(time.monotonic() - t0)
                print(f"step {i + 1}: 1 -> 5 engines (load 0.75 -> 3.75): spec.replicas 4 after {reactions[-1]:.2f} s", flush=True)
                engines.set(1)
                wait_until(lambda: st.replicas() == 1, 180, "back to 1 replica", step=0.2, alive=st.check, why=st.why)
        finally:
            st.close()
            engines.stop()
    terms = ", ".join(f"{k} {v:g}" for k, v in row.terms.items())
    without = row.path_s - row.terms["pod_start"]
    print(f"stack up (API server, KEDA, kube-controller-manager, the first HPA): {up_s:.1f} s")
    print(f"reaction, load step to the new replica count ({args.steps} steps): median {statistics.median(reactions):.2f} s, "
          f"min {min(reactions):.2f} s, max {max(reactions):.2f} s")
    print(f"fusebox budget's scale-out: {row.path_s:g} s ({terms}); without pod_start (no kubelet here): {without:g} s")
    print(f"measured / predicted without pod_start: {statistics.median(reactions) / without:.2f}x (median)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
