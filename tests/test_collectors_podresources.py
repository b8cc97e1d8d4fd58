"""The pod-resources client against a fake kubelet: a real gRPC server on a unix socket serving
``v1.PodResourcesLister/List`` with the whole upstream v1 message set (k8s.io/kubelet
pkg/apis/podresources/v1/api.proto: cpu_ids, memory, topology, dynamic_resources included),
declared here on its own, field by field from that file, so the client's subset is checked
against it on the wire. The kubelet is the mock boundary: there is none on this machine."""

from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc
import pytest

from fusebox.collectors.podresources import PodDevices, PodResourcesClient

pytestmark = pytest.mark.process


def _upstream_messages():
    """podresources/v1's messages as upstream declares them (the List part of the service)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="test/podresources/v1/api.proto", package="v1", syntax="proto3")
    S, I64, U64, M = F.TYPE_STRING, F.TYPE_INT64, F.TYPE_UINT64, F.TYPE_MESSAGE
    O, R = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    spec = {
        "ListPodResourcesRequest": [],
        "ListPodResourcesResponse": [("pod_resources", 1, M, R, "PodResources")],
        "PodResources": [("name", 1, S, O, ""), ("namespace", 2, S, O, ""), ("containers", 3, M, R, "ContainerResources")],
        "ContainerResources": [("name", 1, S, O, ""), ("devices", 2, M, R, "ContainerDevices"), ("cpu_ids", 3, I64, R, ""),
                               ("memory", 4, M, R, "ContainerMemory"), ("dynamic_resources", 5, M, R, "DynamicResource")],
        "ContainerMemory": [("memory_type", 1, S, O, ""), ("size", 2, U64, O, ""), ("topology", 3, M, O, "TopologyInfo")],
        "ContainerDevices": [("resource_name", 1, S, O, ""), ("device_ids", 2, S, R, ""), ("topology", 3, M, O, "TopologyInfo")],
        "TopologyInfo": [("nodes", 1, M, R, "NUMANode")],
        "NUMANode": [("ID", 1, I64, O, "")],
        "DynamicResource": [("claim_name", 2, S, O, ""), ("claim_namespace", 3, S, O, ""),
                            ("claim_resources", 4, M, R, "ClaimResource")],
        "ClaimResource": [("cdi_devices", 1, M, R, "CDIDevice"), ("driver_name", 2, S, O, ""), ("pool_name", 3, S, O, ""),
                          ("device_name", 4, S, O, "")],
        "CDIDevice": [("name", 1, S, O, "")],
    }
    for name, fields in spec.items():
        m = fdp.message_type.add(name=name)
        for fname, num, ftype, label, tname in fields:
            f = m.field.add(name=fname, number=num, type=ftype, label=label)
            if tname:
                f.type_name = f".v1.{tname}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return {n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"v1.{n}")) for n in spec}


UP = _upstream_messages()


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


class FakeKubelet:
    """A gRPC server on a unix socket answering List (after ``delay_s``)."""

    def __init__(self, path, answer, delay_s=0.0):
        self.calls = 0
        self.answer, self.delay_s = answer, delay_s

        def list_(request, context):
            self.calls += 1
            time.sleep(self.delay_s)
            return self.answer

        handler = grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
            "List": grpc.unary_unary_rpc_method_handler(
                list_, request_deserializer=UP["ListPodResourcesRequest"].FromString,
                response_serializer=lambda m: m.SerializeToString())})
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=[handler])
        assert self.server.add_insecure_port(f"unix://{path}") == 1
        self.server.start()

    def stop(self):
        self.server.stop(0).wait()


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
        assert time.monotonic() - t0 < 1.5
        k.delay_s = 0.0
        assert c.devices() is not None  # the same client recovers
    finally:
        c.close()
        k.stop()
    assert dict(c.errors) == {"absent": 2, "unavailable": 1, "deadline": 1}
    assert [m.split(": ")[2] for m in logs] == ["absent", "unavailable", "deadline", "ok again"]
    assert ({"endpoint": f"unix://{sock}", "reason": "absent"}, 2) in c.error_readings()
    assert threading.active_count() < 50  # no thread left per call
