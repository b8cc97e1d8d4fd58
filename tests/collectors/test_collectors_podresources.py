"""The pod-resources client against a fake kubelet (tests/_kubelet.py: a real gRPC server on a
unix socket serving the upstream v1 messages): GPUs, MIG devices, time-slicing replicas, pods
without NVIDIA devices; an absent, a dead and a slow kubelet."""

from __future__ import annotations

import threading
import time

import pytest
from _kubelet import UP, FakeKubelet

from fusebox.collectors.podresources import PodDevices, PodResourcesClient

pytestmark = pytest.mark.process


def node_answer():
    """A node with 8 GPUs: an engine on two whole GPUs, one on a MIG slice (mixed strategy), one
    on a time-sliced replica, a pod with CPUs and memory only, a DRA claim."""
    r = UP["ListPodResourcesResponse"]()

    def add(ns, name, *devices, cpus=(), dra=False):
        p = r.pod_resources.add(name=name, namespace=ns)
        c = p.containers.add(name="engine")
        c.cpu_ids.extend(cpus)
        c.memory.add(memory_type="memory", size=1 << 30).topology.nodes.add(ID=0)
        for res, ids in devices:
            d = c.devices.add(resource_name=res)
            d.device_ids.extend(ids)
            d.topology.nodes.add(ID=1)
        if dra:
            c.dynamic_resources.add(claim_name="gpu-claim", claim_namespace=ns).claim_resources.add(
                driver_name="gpu.nvidia.com", pool_name="node-a", device_name="gpu-7").cdi_devices.add(
                name="k8s.gpu.nvidia.com/device=gpu-7")
        return p

    add("inference", "vllm-tp2", ("nvidia.com/gpu", ["GPU-aaaa", "GPU-bbbb"]), cpus=[2, 3])
    add("inference", "vllm-mig", ("nvidia.com/mig-1g.10gb", ["MIG-1111"]))
    add("inference", "vllm-shared", ("nvidia.com/gpu", ["GPU-cccc::0", "GPU-cccc::3"]))
    add("kube-system", "coredns", cpus=[0])
    add("inference", "dra-only", dra=True)
    add("inference", "nic-only", ("example.com/nic", ["eth7"]))
    return r


@pytest.fixture
def sock(tmp_path):
    return str(tmp_path / "kubelet.sock")


def test_list_maps_pods_to_gpu_and_mig_uuids(sock):
    k = FakeKubelet(sock, node_answer())
    logs: list[str] = []
    c = PodResourcesClient(sock, timeout_s=5, log=logs.append)
    try:
        got = c.devices()
    finally:
        c.close()
        k.stop()
    assert got == {
        ("inference", "vllm-tp2"): PodDevices(("GPU-aaaa", "GPU-bbbb"), ()),
        ("inference", "vllm-mig"): PodDevices((), ("MIG-1111",)),
        ("inference", "vllm-shared"): PodDevices(("GPU-cccc",), ()),  # time-slicing replicas of one GPU
    }
    assert k.calls == 1 and not c.errors and logs == []


def test_an_absent_an_unreachable_and_a_slow_kubelet_are_counted_never_raised(sock, tmp_path):
    logs: list[str] = []
    c = PodResourcesClient(sock, timeout_s=0.5, log=logs.append)
    assert c.devices() is None and c.devices() is None  # no socket file
    # a socket file nobody listens on (a kubelet that died)
    import socket as socketlib

    dead = socketlib.socket(socketlib.AF_UNIX)
    dead.bind(sock)
    dead.close()
    t0 = time.monotonic()
    assert c.devices() is None
    assert time.monotonic() - t0 < 3
    c.close()
    import os

    os.unlink(sock)
    k = FakeKubelet(sock, node_answer(), delay_s=2.0)  # answers after the deadline
    try:
        t0 = time.monotonic()
        assert c.devices() is None
        assert time.monotonic() - t0 < k.delay_s  # gave up before the kubelet's answer came
        k.delay_s = 0.0
        c.timeout_s = 10.0  # a loaded machine can take over 0.5 s for a prompt answer
        assert c.devices() is not None  # the same client recovers
    finally:
        c.close()
        k.stop()
    assert dict(c.errors) == {"absent": 2, "unavailable": 1, "deadline": 1}
    assert [m.split(": ")[2] for m in logs] == ["absent", "unavailable", "deadline", "ok again"]
    assert all(" -- " in m for m in logs[:3]), logs  # each failure says how to fix it
    assert "--timeout" in logs[2].split(" -- ", 1)[1], logs[2]
    assert ({"endpoint": f"unix://{sock}", "reason": "absent"}, 2) in c.error_readings()
    assert threading.active_count() < 50  # no thread left per call
