"""GPU collector: NVML faked at the nvidia-ml-py boundary (the package's SyntheticNvml, the one
NVML fake) with numbers read by hand from the corpus captures, and the replay parsers on every
nvidia-smi capture of the corpus."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pynvml
import pytest

from fusebox.collectors.gpu import GpuCollector, NoGpuError
from fusebox.collectors.replay import DeviceState, ReplayError, SyntheticNvml, load_replay, parse_query_gpu_csv

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "collectors"
MIB = 1_048_576

# netdata_rtx-4090-driver-535_nvidia-smi-q-x.xml, <fb_memory_usage>: total 24564 MiB,
# reserved 346 MiB, used 2 MiB, free 24214 MiB; power_draw 26.84 W; max_link_gen 3, 16x.
RTX4090 = DeviceState(uuid="GPU-71d1acc2-662d-2166-bf9f-65272d2fc437", index=0, name="NVIDIA GeForce RTX 4090",
                      total=24564 * MIB, reserved=346 * MIB, used=2 * MIB, free=24214 * MIB, util_gpu=0, util_mem=0,
                      power_w=26.84, pcie_gen_max=3, pcie_width_max=16, tx_kbps=0, rx_kbps=0)
RTX4090_USAGE_BYTES = 367_001_600  # (24564 - 24214) MiB = 350 MiB x 1,048,576


def fake(*devices: DeviceState, **kw) -> SyntheticNvml:
    """NVML answering ``devices`` (a list given whole is read live, so a test can swap entries)."""
    states = devices[0] if len(devices) == 1 and isinstance(devices[0], list) else list(devices)
    return SyntheticNvml(lambda: states, **kw)


def mib_device(uuid: str, name: str, total: int, free: int, used: int, reserved: int, **kw) -> DeviceState:
    """A DeviceState from MiB figures as nvidia-smi prints them."""
    return DeviceState(uuid=uuid, index=kw.pop("index", 0), name=name, total=total * MIB, free=free * MIB,
                       used=used * MIB, reserved=reserved * MIB, **kw)


def by_key(readings, key, **attrs):
    return [r for r in readings if r.key == key and all(r.attrs.get(k) == v for k, v in attrs.items())]


def one(readings, key, **attrs):
    got = by_key(readings, key, **attrs)
    assert len(got) == 1, (key, attrs, got)
    return got[0].value


def test_rtx4090_usage_is_total_minus_free_in_bytes_from_the_v2_call():
    nv = fake(RTX4090, legacy_bytes=True)  # older bindings answer bytes
    rs = GpuCollector(nv).collect()
    assert one(rs, "gpu_memory_usage") == RTX4090_USAGE_BYTES
    assert one(rs, "gpu_memory_limit") == 24564 * MIB == 25_757_220_864
    assert one(rs, "gpu_memory_reserved") == 346 * MIB
    assert one(rs, "gpu_power") == pytest.approx(26.84)
    assert one(rs, "gpu_up") == 1.0
    assert nv.memory_versions == [pynvml.nvmlMemory_v2]
    attrs = by_key(rs, "gpu_memory_usage")[0].attrs
    assert attrs["hw.id"] == RTX4090.uuid and attrs["hw.name"] == "NVIDIA GeForce RTX 4090" and attrs["hw.gpu.index"] == "0" and "hw.gpu.mig" not in attrs


def test_pitfall_p6_the_ratio_is_0_785_whatever_used_and_reserved_say():
    # docs/pitfalls.md P6: total 80000, reserved 600, used 62200, free 17200 MiB.
    nv = fake(mib_device("GPU-p6", "A100", total=80000, reserved=600, used=62200, free=17200))
    rs = GpuCollector(nv).collect()
    assert one(rs, "gpu_memory_usage") / one(rs, "gpu_memory_limit") == pytest.approx(0.785)
    # the one gauge the rules read: (80000 - 17200) / 80000 MiB, reserved counted as used
    assert one(rs, "gpu_memory_ratio") == 62800 / 80000 == 0.785
    assert by_key(rs, "gpu_memory_ratio")[0].attrs == by_key(rs, "gpu_memory_usage")[0].attrs


def test_a_device_reporting_no_memory_exports_no_ratio():
    # total 0 (a device that answers the memory call with zeros): usage and limit 0, no 0/0 ratio
    rs = GpuCollector(fake(mib_device("GPU-z", "A100", total=0, reserved=0, used=0, free=0))).collect()
    assert one(rs, "gpu_memory_limit") == 0 and not by_key(rs, "gpu_memory_ratio")


def test_nvml_is_initialised_once_and_handles_are_cached():
    nv = fake(RTX4090)
    col = GpuCollector(nv)
    for _ in range(5):
        col.collect()
    assert nv.inits == 1


def test_mig_instances_are_labelled_and_have_no_per_instance_utilization():
    # netdata_a100-sxm4-mig: GPU total 40960 / free 40315 MiB; MIG 1/0 and 2/0: 19968 / 19948.
    migs = tuple(mib_device(f"MIG-GPU-27b94a00/{gi}/0", "A100 MIG 2g.20gb", total=19968, reserved=0, used=19,
                            free=19948) for gi in (1, 2))
    nv = fake(mib_device("GPU-27b94a00", "NVIDIA A100-SXM4-40GB", total=40960, reserved=605, used=38, free=40315,
                         power_w=66.92, mig=migs))
    rs = GpuCollector(nv).collect()
    # in MIG mode the parent's memory is the aggregate of its instances: not exported, so
    # the memory signal (joined with KV pools on the MIG UUIDs) sees only the instances
    assert not by_key(rs, "gpu_memory_usage", **{"hw.id": "GPU-27b94a00"})
    assert not by_key(rs, "gpu_memory_limit", **{"hw.id": "GPU-27b94a00"})
    assert one(rs, "gpu_memory_reserved", **{"hw.id": "GPU-27b94a00"}) == 605 * MIB
    assert one(rs, "gpu_power", **{"hw.id": "GPU-27b94a00"}) == pytest.approx(66.92)
    for gi in (1, 2):
        uuid = f"MIG-GPU-27b94a00/{gi}/0"
        # 19968 - 19948 = 20 MiB although "used" says 19: total - free, not used
        assert one(rs, "gpu_memory_usage", **{"hw.id": uuid}) == 20 * MIB
        a = by_key(rs, "gpu_memory_usage", **{"hw.id": uuid})[0].attrs
        assert a["hw.gpu.mig"] == "true" and a["hw.parent"] == "GPU-27b94a00"
        assert not by_key(rs, "gpu_power", **{"hw.id": uuid})
        assert not by_key(rs, "gpu_utilization", **{"hw.id": uuid})
    assert sorted(r.attrs["hw.id"] for r in by_key(rs, "gpu_up")) == ["GPU-27b94a00", "MIG-GPU-27b94a00/1/0",
                                                                      "MIG-GPU-27b94a00/2/0"]


def test_a_lost_gpu_is_reported_down_drops_its_series_and_the_others_keep_flowing():
    bad = replace(RTX4090, uuid="GPU-bad")
    good = replace(RTX4090, index=1)
    states = [bad, good]
    col = GpuCollector(fake(states))
    assert one(col.collect(), "gpu_up", **{"hw.id": "GPU-bad"}) == 1.0
    states[0] = replace(bad, lost=True)
    rs = col.collect()
    assert one(rs, "gpu_up", **{"hw.id": "GPU-bad"}) == 0.0
    assert [r.key for r in rs if r.attrs["hw.id"] == "GPU-bad"] == ["gpu_up"]
    assert one(rs, "gpu_memory_usage", **{"hw.id": RTX4090.uuid}) == RTX4090_USAGE_BYTES
    assert "GPU is lost" in col.devices[0].last_error
    states[0] = bad  # it comes back
    assert one(col.collect(), "gpu_up", **{"hw.id": "GPU-bad"}) == 1.0


def test_pcie_utilization_is_the_busier_direction_over_the_link_maximum_and_io_is_integrated():
    dev = replace(RTX4090, pcie_gen_max=4, pcie_width_max=16, tx_kbps=1_000_000, rx_kbps=2_000_000)  # KB/s, as NVML
    now = [100.0]
    col = GpuCollector(fake(dev), clock=lambda: now[0])
    col.collect()
    now[0] = 110.0
    rs = col.collect()
    gen4_lane = 16e9 * 128 / 130 / 8  # 16 GT/s, 128b/130b encoding, bytes/s per lane and direction
    assert one(rs, "gpu_pcie_utilization") == pytest.approx(2_000_000 * 1024 / (gen4_lane * 16))
    assert one(rs, "gpu_io", **{"network.io.direction": "transmit"}) == 1_000_000 * 1024 * 10
    assert one(rs, "gpu_io", **{"network.io.direction": "receive"}) == 2_000_000 * 1024 * 10


def test_without_nvml_the_collector_says_so():
    with pytest.raises(NoGpuError, match="NVML"):
        GpuCollector(fake(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)).open()


def test_cli_without_a_gpu_exits_non_zero_with_a_clear_message(monkeypatch, capsys):
    from fusebox.cli import main

    def no_lib():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_lib)
    assert main(["collect", "gpu", "--once"]) == 2
    err = capsys.readouterr().err
    assert "no NVIDIA GPU" in err and "--replay" in err


# ------------------------------------------------------------------------- replay parsers
def _collect(path, **kw):
    return GpuCollector(SyntheticNvml.from_frames(load_replay(FIX / path, **kw))).collect()


def test_replay_of_the_rtx4090_xml_agrees_with_the_hand_read_numbers():
    replayed = _collect("netdata_rtx-4090-driver-535_nvidia-smi-q-x.xml")
    faked = GpuCollector(fake(RTX4090)).collect()
    for key in ("gpu_memory_usage", "gpu_memory_limit", "gpu_memory_reserved", "gpu_power", "gpu_utilization",
                "gpu_memory_bandwidth_utilization", "gpu_pcie_utilization"):
        assert one(replayed, key) == pytest.approx(one(faked, key)), key


@pytest.mark.parametrize(
    "path, uuid, usage_mib, total_mib",
    [
        # hand-read: total - free of the first GPU of each capture
        ("netdata_tesla-p100_nvidia-smi-q-x.xml", "GPU-d3da8716-eaab-75db-efc1-60e88e1cd55e", 16384 - 16280, 16384),
        # the P100 CSV has no memory.total: reserved 103 + used 0 + free 16280 = 16383
        ("netdata_tesla-p100_query-gpu.csv", "GPU-ef1b2c9b-38d8-2090-2bd1-f567a3eb42a6", 103, 16383),
        # first row of the H100 64GB time series: 65247 total, 5303 free
        ("bsc_h100-64gb_nvidia-smi-query-gpu_timeseries_with_time_col.csv", "GPU-31785635-835f-8ea5-0dc3-adb14fd7195f",
         65247 - 5303, 65247),
        # load section: 81559 total, 61263 free (used 19818 + reserved 479 = 20297, one MiB of rounding)
        ("nvidia_gpu_exporter_capture_linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt",
         "GPU-00000000-0000-0000-0000-000000000000", 81559 - 61263, 81559),
    ],
)
def test_replay_memory_of_every_capture(path, uuid, usage_mib, total_mib):
    rs = _collect(path)
    assert one(rs, "gpu_memory_usage", **{"hw.id": uuid}) == usage_mib * MIB
    assert one(rs, "gpu_memory_limit", **{"hw.id": uuid}) == total_mib * MIB
    assert one(rs, "gpu_memory_ratio", **{"hw.id": uuid}) == pytest.approx(usage_mib / total_mib, rel=1e-15)


@pytest.mark.parametrize(
    "path, parent, power_w, mig_id, usage_mib, total_mib",
    [
        # hand-read: <power_draw> 66.92 W; MIG 1/0 <fb_memory_usage> total 19968, free 19948 MiB
        # (the parent's own 40960 total / 40315 free is the aggregate and is not exported)
        ("netdata_a100-sxm4-mig_nvidia-smi-q-x.xml", "GPU-27b94a00-ed54-5c24-b1fd-1054085de32a", 66.92,
         "1/0", 19968 - 19948, 19968),
        # load query-gpu row: power.draw 433.78 W; -q GI 2: total 40448, free 29357 MiB
        ("nvidia_gpu_exporter_capture_linux-x86_64__nvidia-h100-mig__590.48.01.txt",
         "GPU-00000000-0000-0000-0000-000000000000", 433.78, "2/0", 40448 - 29357, 40448),
        # load query-gpu row: power.draw 295.01 W; -q GI 2 / CI 1: total 71424, 16925 used (shared GI)
        ("nvidia_gpu_exporter_capture_linux-x86_64__nvidia-h200-mig__590.48.01.txt",
         "GPU-00000000-0000-0000-0000-000000000000", 295.01, "2/1", 16925, 71424),
    ],
)
def test_a_mig_mode_parent_exports_no_memory_of_its_own(path, parent, power_w, mig_id, usage_mib, total_mib):
    rs = _collect(path)
    for key in ("gpu_memory_usage", "gpu_memory_limit", "gpu_memory_ratio"):
        assert not by_key(rs, key, **{"hw.id": parent}), key
    assert one(rs, "gpu_up", **{"hw.id": parent}) == 1.0
    assert one(rs, "gpu_power", **{"hw.id": parent}) == pytest.approx(power_w)
    mig = f"MIG-{parent}/{mig_id}"
    assert one(rs, "gpu_memory_usage", **{"hw.id": mig}) == usage_mib * MIB
    assert one(rs, "gpu_memory_limit", **{"hw.id": mig}) == total_mib * MIB
    assert one(rs, "gpu_memory_ratio", **{"hw.id": mig}) == pytest.approx(usage_mib / total_mib, rel=1e-15)
    # every memory series left belongs to a MIG instance
    memory = ("gpu_memory_usage", "gpu_memory_limit", "gpu_memory_ratio")
    assert {r.attrs.get("hw.gpu.mig") for r in rs if r.key in memory} == {"true"}


def test_replay_h100_capture_utilization_and_power_from_the_load_section():
    rs = _collect("nvidia_gpu_exporter_capture_linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt")
    assert one(rs, "gpu_utilization") == 1.0  # 100 %
    assert one(rs, "gpu_memory_bandwidth_utilization") == pytest.approx(0.11)  # 11 %
    assert one(rs, "gpu_power") == pytest.approx(631.95)
    idle = _collect("nvidia_gpu_exporter_capture_linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt", section="idle")
    assert one(idle, "gpu_memory_usage") == (81559 - 81081) * MIB


def test_replay_mig_captures_list_each_instance_with_its_own_memory():
    rs = _collect("nvidia_gpu_exporter_capture_linux-x86_64__nvidia-h100-mig__590.48.01.txt")
    parent = "GPU-00000000-0000-0000-0000-000000000000"
    # load :: query (-q): GI 2 total 40448 / free 29357; GI 3 total 20096 / free 20080 MiB
    assert one(rs, "gpu_memory_usage", **{"hw.id": f"MIG-{parent}/2/0"}) == (40448 - 29357) * MIB
    assert one(rs, "gpu_memory_limit", **{"hw.id": f"MIG-{parent}/3/0"}) == 20096 * MIB
    migs = by_key(rs, "gpu_up", **{"hw.gpu.mig": "true"})
    assert len(migs) == 4  # 3g.40gb, 2g.20gb, 2 x 1g.10gb
    h200 = _collect("nvidia_gpu_exporter_capture_linux-x86_64__nvidia-h200-mig__590.48.01.txt")
    # GI 2 has two compute instances sharing its 71424 MiB (16925 used): both report it
    shared = by_key(h200, "gpu_memory_limit", **{"hw.gpu.mig": "true"})
    assert sorted(r.value for r in shared)[-2:] == [71424 * MIB, 71424 * MIB]


def test_a_mig_device_without_memory_figures_in_xml_is_left_out_like_in_q_text(tmp_path):
    # the A100 MIG capture with MIG 1/0's <fb_memory_usage> removed and MIG 2/0's total "N/A":
    # both are left out (it crashed with AttributeError / built a total=None state before)
    xml = (FIX / "netdata_a100-sxm4-mig_nvidia-smi-q-x.xml").read_text()
    first = xml.index("<mig_device>")
    fb_start, fb_end = xml.index("<fb_memory_usage>", first), xml.index("</fb_memory_usage>", first)
    xml = xml[:fb_start] + xml[fb_end + len("</fb_memory_usage>"):]
    second = xml.index("<fb_memory_usage>", xml.index("<mig_device>", first + 1))
    xml = xml[:second] + xml[second:].replace("<total>19968 MiB</total>", "<total>N/A</total>", 1)
    path = tmp_path / "mig.xml"
    path.write_text(xml)
    [[gpu]] = load_replay(path)
    assert gpu.uuid == "GPU-27b94a00-ed54-5c24-b1fd-1054085de32a" and gpu.mig == ()
    assert gpu.total == 40960 * MIB


def test_a_time_series_csv_replays_frame_by_frame():
    frames = load_replay(FIX / "bsc_h100-64gb_nvidia-smi-query-gpu_timeseries_with_time_col.csv")
    assert len(frames) == 134
    nv = SyntheticNvml.from_frames(frames)
    col = GpuCollector(nv)
    col.collect()
    nv.advance()
    rs = col.collect()
    # second data row: 41 % GPU, 42 % memory utilization
    assert one(rs, "gpu_utilization") == pytest.approx(0.41)
    assert one(rs, "gpu_memory_bandwidth_utilization") == pytest.approx(0.42)


def test_a_csv_without_total_or_free_is_refused_with_the_line():
    with pytest.raises(ReplayError, match="line 2: needs memory.total"):
        parse_query_gpu_csv("uuid, memory.used [MiB]\nGPU-1, 5 MiB\n", "x.csv")
    with pytest.raises(ReplayError, match="uuid"):
        parse_query_gpu_csv("name\nfoo\n", "x.csv")


def test_cli_replay_once_prints_final_names(capsys):
    from fusebox.cli import main

    assert main(["collect", "gpu", "--replay", str(FIX / "netdata_rtx-4090-driver-535_nvidia-smi-q-x.xml"),
                 "--once", "--cluster", "lab", "--host-name", "node-1"]) == 0
    out = capsys.readouterr().out
    assert ('hw_gpu_memory_usage_bytes{cluster="lab",host_name="node-1",hw_gpu_index="0",'
            'hw_id="GPU-71d1acc2-662d-2166-bf9f-65272d2fc437",hw_name="NVIDIA GeForce RTX 4090"} 3.670016e+08') in out


def test_collection_errors_are_counted_per_gpu_with_the_nvml_error_as_reason():
    """A lost GPU (NVML_ERROR_GPU_IS_LOST, as SyntheticNvml raises it) counts one error per round,
    labelled with its GPU and the NVML error's name; the healthy GPU counts none."""
    bad = replace(RTX4090, uuid="GPU-bad")
    good = replace(RTX4090, index=1)
    states = [bad, good]
    col = GpuCollector(fake(states))
    col.collect()
    assert list(col.error_readings()) == []
    states[0] = replace(bad, lost=True)
    col.collect()
    col.collect()
    assert list(col.error_readings()) == [({"hw.id": "GPU-bad", "hw.gpu.index": "0", "reason": "gpu_is_lost"}, 2)]
    states[0] = bad  # back: the count stays (a counter), nothing more is added
    col.collect()
    assert list(col.error_readings()) == [({"hw.id": "GPU-bad", "hw.gpu.index": "0", "reason": "gpu_is_lost"}, 2)]


def test_a_gpu_whose_handle_fails_at_start_counts_an_error_each_round():
    class NoHandle(SyntheticNvml):
        def nvmlDeviceGetHandleByIndex(self, i):
            if i == 1:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
            return super().nvmlDeviceGetHandleByIndex(i)

    states = [RTX4090, replace(RTX4090, index=1, uuid="GPU-other")]
    col = GpuCollector(NoHandle(lambda: states))
    for _ in range(3):
        col.collect()
    assert list(col.error_readings()) == [({"hw.id": "unknown-gpu-1", "hw.gpu.index": "1", "reason": "unknown"}, 3)]


def test_gpu_collection_errors_are_exported_under_the_conventions_name():
    from fusebox import conventions as C
    from fusebox.collectors.export import Pipeline

    states = [RTX4090]
    col = GpuCollector(fake(states))
    col.collect()
    states[0] = replace(RTX4090, lost=True)
    col.collect()
    pipe = Pipeline("gpu", ("gpu_up",), host="node-1")
    pipe.set_readings(col.collect())
    pipe.set_gpu_errors(col.error_readings())
    text = pipe.prometheus_text()
    assert C.PROM_SELF["gpu_errors"] == "fusebox_collector_gpu_errors_total"
    line = next(ln for ln in text.splitlines() if ln.startswith("fusebox_collector_gpu_errors_total{"))
    assert f'hw_id="{RTX4090.uuid}"' in line and 'reason="gpu_is_lost"' in line and 'hw_gpu_index="0"' in line
    assert line.endswith(" 2.0")
    pipe.shutdown()
