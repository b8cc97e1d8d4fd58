"""PCIe links several GPUs share: the topology read from a real server's sysfs tree
(collectors/scenarios/sysfs-a300-8, see its README), NVML's PCIe counters from the mock NVML, and
the demo scenario's root-complex trip checked with promtool against the generated rules.

Every expected number is worked out by hand from the tree's own files: each link of the tree is
``8 GT/s`` (PCIe gen 3, 128b/130b) x16, i.e. 16 x 8e9 x 128/130 / 8 = 15,753,846,153.8 bytes/s
per direction.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from _support import need
from prometheus_client.parser import text_string_to_metric_families

from fusebox import conventions as C
from fusebox.collectors.export import Pipeline
from fusebox.collectors.gpu import GpuCollector
from fusebox.collectors.pcie import PcieTopology, lane_bytes_per_s, sysfs_bus_id
from fusebox.collectors.replay import DeviceState, SyntheticNvml
from fusebox.collectors.scenario import ScenarioRunner, load_scenario

ROOT = Path(__file__).resolve().parents[2]
TREE = ROOT / "collectors" / "scenarios" / "sysfs-a300-8"
SWITCH_17 = ("1b", "1c", "1d", "1e")  # the four accelerators behind root port 0000:17:00.0
ALONE_3A = "3d"  # one accelerator behind root port 0000:3a:00.0, the only "GPU" there
X16_GEN3 = 16 * 8e9 * 128 / 130 / 8  # bytes/s: 8 GT/s x 16 lanes, 128b/130b, 8 bits a byte
A = C.ATTR


def _gpu(bus: str, *, rx_kbps: float = 0.0, tx_kbps: float = 0.0) -> DeviceState:
    return DeviceState(uuid=f"GPU-{bus}", index=0, name="NVIDIA H100 PCIe", total=80 << 30, free=40 << 30,
                       util_gpu=50, util_mem=20, power_w=300, pcie_gen_max=3, pcie_width_max=16,
                       tx_kbps=tx_kbps, rx_kbps=rx_kbps, pci_bus_id=f"00000000:{bus.upper()}:00.0")


def _collector(states: list[DeviceState], sysfs: Path | str = TREE) -> GpuCollector:
    states = [replace(s, index=i) for i, s in enumerate(states)]
    return GpuCollector(SyntheticNvml(lambda: states), clock=lambda: 0.0, sysfs=str(sysfs)).open()


def _upstream(readings) -> dict[str, float]:
    return {r.attrs[A["pcie_port"]]: r.value for r in readings if r.key == "pcie_upstream_utilization"}


def test_the_tree_says_gen3_x16_everywhere_the_walk_reads():
    """The hand numbers below rest on these files (the kernel wrote "8 GT/s" in 3.10)."""
    for port in ("devices/pci0000:17/0000:17:00.0", "devices/pci0000:17/0000:17:00.0/0000:18:00.0",
                 "devices/pci0000:3a/0000:3a:00.0"):
        assert (TREE / port / "current_link_speed").read_text().strip() == "8 GT/s"
        assert (TREE / port / "current_link_width").read_text().strip() == "16"
    assert lane_bytes_per_s("8 GT/s") * 16 == pytest.approx(X16_GEN3)
    # the kernel's other spellings: "16.0 GT/s PCIe" since 5.x; 2.5 GT/s is 8b/10b
    assert lane_bytes_per_s("16.0 GT/s PCIe") == pytest.approx(16e9 * 128 / 130 / 8)
    assert lane_bytes_per_s("2.5 GT/s PCIe") == pytest.approx(2.5e9 * 8 / 10 / 8)
    assert lane_bytes_per_s("Unknown") is None


@pytest.mark.parametrize(("nvml", "sysfs"), [("00000000:1B:00.0", "0000:1b:00.0"), ("0000:3d:00.0", "0000:3d:00.0"),
                                              ("00000001:01:00.0", "0001:01:00.0"), ("GPU-1", None), ("", None)])
def test_nvml_bus_ids_are_named_as_sysfs_names_them(nvml, sysfs):
    assert sysfs_bus_id(nvml) == sysfs


def test_topology_four_gpus_share_root_port_17_and_one_is_alone_under_3a():
    gpus = {f"GPU-{b}": f"00000000:{b.upper()}:00.0" for b in (*SWITCH_17, ALONE_3A)}
    topo = PcieTopology.read(gpus, TREE)
    assert sorted(topo.links) == ["0000:17:00.0", "0000:3a:00.0"]  # the switches' links; no GPU's own link
    l17, l3a = topo.links["0000:17:00.0"], topo.links["0000:3a:00.0"]
    assert (l17.root_complex, l17.device, l17.numa_node, l17.width) == ("pci0000:17", "0000:18:00.0", "0", 16)
    assert (l3a.root_complex, l3a.device, l3a.numa_node) == ("pci0000:3a", "0000:3b:00.0", "0")
    assert l17.capacity == pytest.approx(X16_GEN3) and l3a.capacity == pytest.approx(X16_GEN3)
    assert topo.gpus_below == {"0000:17:00.0": [f"GPU-{b}" for b in SWITCH_17], "0000:3a:00.0": [f"GPU-{ALONE_3A}"]}
    assert list(topo.skipped()) == []


def test_four_gpus_at_24_percent_of_their_own_link_fill_the_link_they_share():
    rx = 3_700_000  # KB/s each, as NVML reports: 3.79 GB/s, 24.05 % of a gen 3 x16 link
    col = _collector([_gpu(b, rx_kbps=rx, tx_kbps=rx / 4) for b in SWITCH_17] + [_gpu(ALONE_3A, rx_kbps=rx)])
    rs = col.collect()
    own = [r.value for r in rs if r.key == "gpu_pcie_utilization"]
    assert own == pytest.approx([rx * 1024 / X16_GEN3] * 5) and max(own) < 0.25
    up = _upstream(rs)
    assert up == pytest.approx({"0000:17:00.0": 4 * rx * 1024 / X16_GEN3, "0000:3a:00.0": rx * 1024 / X16_GEN3})
    assert up["0000:17:00.0"] > 0.96
    labels = {r.attrs[A["pcie_port"]]: dict(r.attrs) for r in rs if r.key == "pcie_upstream_utilization"}
    assert labels["0000:17:00.0"] == {A["pcie_root_complex"]: "pci0000:17", A["pcie_port"]: "0000:17:00.0",
                                      A["numa_node"]: "0"}


def test_the_shared_link_carries_the_busier_direction_of_the_sums_not_the_sum_of_each_busier_one():
    # two GPUs uploading, two downloading, 2,000,000 KB/s each way in total per direction pair
    col = _collector([_gpu("1b", tx_kbps=3_000_000, rx_kbps=1_000_000), _gpu("1c", tx_kbps=1_000_000, rx_kbps=3_000_000)])
    # max(3e6 + 1e6, 1e6 + 3e6) = 4e6 KB/s, not 3e6 + 3e6
    assert _upstream(col.collect()) == pytest.approx({"0000:17:00.0": 4_000_000 * 1024 / X16_GEN3})


def test_a_lost_gpu_adds_nothing_and_a_link_with_no_gpu_answering_has_no_series():
    states = [_gpu("1b", rx_kbps=1_000_000), replace(_gpu("3d", rx_kbps=1_000_000), lost=True)]
    col = _collector(states)
    assert _upstream(col.collect()) == pytest.approx({"0000:17:00.0": 1_000_000 * 1024 / X16_GEN3})


def test_a_link_trained_below_its_maximum_is_read_as_trained_and_logged_once(tmp_path, caplog):
    tree = tmp_path / "sys"
    shutil.copytree(TREE, tree, symlinks=True)
    # the switch's upstream port trained at x8 (a x16 slot wired x8): both ends are read, the smaller wins
    (tree / "devices/pci0000:17/0000:17:00.0/0000:18:00.0/current_link_width").write_text("8\n")
    with caplog.at_level(logging.WARNING, logger="fusebox.collectors.pcie"):
        col = _collector([_gpu(b, rx_kbps=1_000_000) for b in SWITCH_17], tree)
    assert col.topology.links["0000:17:00.0"].capacity == pytest.approx(X16_GEN3 / 2)
    assert _upstream(col.collect()) == pytest.approx({"0000:17:00.0": 4 * 1_000_000 * 1024 / (X16_GEN3 / 2)})
    assert [r.getMessage() for r in caplog.records].count(
        "PCIe link 0000:17:00.0 -> 0000:18:00.0 trained at 8 GT/s x8, below its 8 GT/s x16: the GPUs behind it "
        "share less than the slot offers") == 1


def test_a_tree_copied_without_its_bus_links_is_walked_alike(tmp_path):
    shutil.copytree(TREE / "devices", tmp_path / "devices")  # cp -r of devices/ only: no bus/pci/devices
    gpus = {f"GPU-{b}": f"00000000:{b.upper()}:00.0" for b in (*SWITCH_17, ALONE_3A)}
    assert PcieTopology.read(gpus, tmp_path).gpus_below == PcieTopology.read(gpus, TREE).gpus_below


def test_gpus_not_followed_are_counted_by_reason_and_each_reason_logged_once(caplog):
    gpus = {"GPU-a": "00000000:1B:00.0", "GPU-b": "00000000:1C:00.0", "GPU-c": "00000000:1D:00.0",
            "GPU-none": None, "GPU-odd": "not-a-bus-id", "GPU-away": "00000000:99:00.0"}
    with caplog.at_level(logging.WARNING, logger="fusebox.collectors.pcie"):
        topo = PcieTopology.read(gpus, TREE, max_gpus=5)
    skipped = {(a[A["gpu_id"]], a[A["reason"]]) for a, n in topo.skipped()}
    assert skipped == {("GPU-none", "no_bus_id"), ("GPU-odd", "no_bus_id"), ("GPU-away", "over_cap")}
    assert sum(1 for r in caplog.records if "no_bus_id" in r.getMessage()) == 1  # once per reason
    topo = PcieTopology.read({"GPU-away": "00000000:99:00.0"}, TREE)
    assert [(a[A["reason"]], n) for a, n in topo.skipped()] == [("not_in_sysfs", 1)]
    # a clock one second further on every read: 0 at the start, then 1, 2, 3, 4 before each GPU, so
    # past a 2.5 s deadline at the third GPU
    ticks = iter(range(100))
    topo = PcieTopology.read({f"GPU-{b}": f"0000:{b}:00.0" for b in SWITCH_17}, TREE, deadline_s=2.5,
                             clock=lambda: float(next(ticks)))
    assert [a[A["reason"]] for a, _n in topo.skipped()] == ["deadline", "deadline"]
    assert topo.gpus_below == {"0000:17:00.0": ["GPU-1b", "GPU-1c"]}


def test_gpu_on_the_root_bus_has_no_shared_link(tmp_path):
    """A passed-through GPU of a virtual machine often sits on the root bus: no root port above it."""
    (tmp_path / "devices/pci0000:00/0000:00:05.0").mkdir(parents=True)
    (tmp_path / "bus/pci/devices").mkdir(parents=True)
    (tmp_path / "bus/pci/devices/0000:00:05.0").symlink_to("../../../devices/pci0000:00/0000:00:05.0")
    topo = PcieTopology.read({"GPU-vm": "00000000:00:05.0"}, tmp_path)
    assert topo.links == {} and [a[A["reason"]] for a, _ in topo.skipped()] == ["no_upstream_link"]


# ------------------------------------------------------------------------- the demo's scenario
def test_breach_scenario_fills_root_port_17_while_each_gpu_link_is_under_half():
    """breach.yaml: two H100s (NVML: gen 3 x16 in this tree) at 48 % of their own link in the
    breach phase, both behind root port 0000:17:00.0: 2 x 0.48 = 0.96 of the shared x16."""
    sc = load_scenario()
    runner = ScenarioRunner(sc, Pipeline("fusebox-scenario", ScenarioRunner.KEYS, histogram_buckets=[1.0]))
    rs = runner.step(150.0)  # the breach phase (105 s - 195 s)
    kb = int(0.48 * X16_GEN3 / 1024)  # NVML's whole KB/s
    assert [r.value for r in rs if r.key == "gpu_pcie_utilization"] == pytest.approx([kb * 1024 / X16_GEN3] * 2)
    assert _upstream(rs) == pytest.approx({"0000:17:00.0": 2 * kb * 1024 / X16_GEN3})
    assert 0.959 < _upstream(rs)["0000:17:00.0"] < 0.961
    rs = runner.step(10.0)  # baseline: 15 % and 10 %
    assert _upstream(rs)["0000:17:00.0"] == pytest.approx(0.25, abs=1e-6)


@pytest.mark.process
def test_promtool_fires_the_root_complex_alert_and_no_per_gpu_pcie_alert_on_the_breach():
    """The breach scenario scraped every 5 s from 100 s (the exporter's own text), fed to promtool
    with the generated alert rules (their annotations dropped: their text is the generator's tests')."""
    spec_rules = yaml.safe_load((ROOT / "rules" / "fusebox.rules.yml").read_text())
    alerts = {}
    for group in spec_rules["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") in ("PCIeRootComplexLinkSaturated", "GPUPCIeLinkSaturated"):
                alerts[rule["alert"]] = {k: v for k, v in rule.items() if k != "annotations"}
    assert set(alerts) == {"PCIeRootComplexLinkSaturated", "GPUPCIeLinkSaturated"}
    sc = load_scenario()
    pipe = Pipeline("fusebox-scenario", ScenarioRunner.KEYS, histogram_buckets=[1.0], host=sc.host, cluster=sc.cluster)
    runner = ScenarioRunner(sc, pipe)
    wanted = (C.PROM["pcie_upstream_utilization"], C.PROM["gpu_pcie_utilization"])
    series: dict[str, list[str]] = {}
    for k in range(19):  # 100 s .. 190 s
        runner.step(100.0 + 5 * k)
        for fam in text_string_to_metric_families(pipe.prometheus_text()):
            for s in fam.samples:
                if s.name in wanted:
                    key = s.name + "{" + ",".join(f'{n}="{v}"' for n, v in sorted(s.labels.items())) + "}"
                    series.setdefault(key, []).append(repr(s.value))
    assert sum(1 for k in series if k.startswith(wanted[0])) == 1 and sum(1 for k in series if k.startswith(wanted[1])) == 2
    tests = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "5s",
        "tests": [{
            "interval": "5s",
            "input_series": [{"series": k, "values": " ".join(v)} for k, v in series.items()],
            "alert_rule_test": [
                # scenario 140 s: the breach (from 105 s) has held far past the 3 s `for`
                {"eval_time": "40s", "alertname": "PCIeRootComplexLinkSaturated", "exp_alerts": [{"exp_labels": {
                    "cluster": "demo", "host_name": "demo-node-0", "pcie_root_complex": "pci0000:17",
                    "pcie_port": "0000:17:00.0", "numa_node": "0", "fusebox": "multimodal-inference",
                    "severity": "critical", "signal": "pcie_root_complex_utilization"}}]},
                {"eval_time": "40s", "alertname": "GPUPCIeLinkSaturated", "exp_alerts": []},
                # scenario 100 s, before the breach: nothing
                {"eval_time": "0s", "alertname": "PCIeRootComplexLinkSaturated", "exp_alerts": []},
            ],
        }],
    }
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        Path(d, "rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "pcie", "interval": "5s",
                                                                     "rules": list(alerts.values())}]}))
        Path(d, "test.yml").write_text(yaml.safe_dump(tests, sort_keys=False))
        out = subprocess.run([need("promtool"), "test", "rules", "test.yml"], cwd=d, capture_output=True, text=True,
                             timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_link_without_speed_or_width_is_counted_unreadable_not_guessed(tmp_path):
    tree = tmp_path / "sys"
    shutil.copytree(TREE, tree, symlinks=True)
    for end in ("devices/pci0000:17/0000:17:00.0", "devices/pci0000:17/0000:17:00.0/0000:18:00.0"):
        (tree / end / "current_link_speed").unlink()
    topo = PcieTopology.read({"GPU-1b": "0000:1b:00.0", "GPU-3d": "0000:3d:00.0"}, tree)
    assert [(a[A["gpu_id"]], a[A["reason"]]) for a, _ in topo.skipped()] == [("GPU-1b", "unreadable")]
    assert list(topo.links) == ["0000:3a:00.0"]
