"""A fake kubelet for tests: a real gRPC server on a unix socket serving the pod-resources API
``v1.PodResourcesLister/List`` with the whole upstream v1 message set (k8s.io/kubelet
pkg/apis/podresources/v1/api.proto: cpu_ids, memory, topology, dynamic_resources included),
declared here on its own, field by field from that file, so that the collector's subset
(fusebox.collectors.podresources) is checked against it on the wire. The kubelet is the mock
boundary: there is none on a test machine."""

from __future__ import annotations

import time
from concurrent import futures

import grpc


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


def answer(pods: dict[tuple[str, str], list[tuple[str, list[str]]]]):
    """A ``ListPodResourcesResponse``: ``{(namespace, pod): [(resource name, device ids)]}``, each
    pod with one container that also holds CPUs and memory (fields the collector does not read)."""
    r = UP["ListPodResourcesResponse"]()
    for (ns, name), devices in pods.items():
        c = r.pod_resources.add(name=name, namespace=ns).containers.add(name="engine")
        c.cpu_ids.extend([2, 3])
        c.memory.add(memory_type="memory", size=1 << 30).topology.nodes.add(ID=0)
        for res, ids in devices:
            d = c.devices.add(resource_name=res)
            d.device_ids.extend(ids)
            d.topology.nodes.add(ID=1)
    return r
