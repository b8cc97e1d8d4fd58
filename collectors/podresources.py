"""The kubelet's pod-resources API (``PodResourcesLister`` v1 ``List``): which devices each pod
on this node holds, over the kubelet's unix socket (the one dcgm-exporter reads,
``/var/lib/kubelet/pod-resources/kubelet.sock``).

The messages are those of ``k8s.io/kubelet/pkg/apis/podresources/v1/api.proto`` (proto3,
package ``v1``), built on first use with protobuf's descriptor API (:func:`messages`) rather
than generated code, so no generated module has to match the protobuf runtime's version. Only
the fields fusebox reads are declared, with their numbers in that file; protobuf keeps every
other field the kubelet sends (cpu_ids, memory, dynamic_resources ...) as unknown fields, so a
newer kubelet answers the same. To check them against upstream: ``ListPodResourcesResponse``
1 pod_resources; ``PodResources`` 1 name, 2 namespace, 3 containers; ``ContainerResources`` 1
name, 2 devices; ``ContainerDevices`` 1 resource_name, 2 device_ids, 3 topology;
``TopologyInfo`` 1 nodes; ``NUMANode`` 1 ID.

Device ids as the NVIDIA device plugin reports them: ``nvidia.com/gpu`` -> GPU UUIDs
(``GPU-...``; with time-slicing a replica ``GPU-...::N``, whose suffix is dropped), the MIG
resources ``nvidia.com/mig-<profile>`` (mixed strategy) -> MIG device UUIDs (``MIG-...``).
Either is the ``hw.id`` the GPU collector exports for that device.

Bounded: one deadline per call; an absent or unreachable socket, a deadline, or any gRPC error
is counted in :attr:`PodResourcesClient.errors` (by reason) and said once per change of state,
and :meth:`PodResourcesClient.devices` returns None (the caller keeps running without hw ids).
"""

from __future__ import annotations

import functools
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SERVICE = "v1.PodResourcesLister"
LIST_METHOD = f"/{SERVICE}/List"
DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
# the kubelet caps a List answer at 16 MiB by default (podresources server MaxRecvMsgSize)
MAX_MESSAGE_BYTES = 16 << 20


@functools.cache
def messages() -> dict[str, Any]:
    """Message classes of the subset of podresources/v1 described in the module docstring (built
    once, on first use: the ``fusebox`` command does not import protobuf to start)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="fusebox/podresources/v1/api.proto", package="v1", syntax="proto3")

    def msg(name: str, *fields: tuple[str, int, int, int, str]) -> None:
        m = fdp.message_type.add(name=name)
        for fname, num, ftype, label, tname in fields:
            f = m.field.add(name=fname, number=num, type=ftype, label=label)
            if tname:
                f.type_name = f".v1.{tname}"

    OPT, REP = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    msg("ListPodResourcesRequest")
    msg("NUMANode", ("ID", 1, F.TYPE_INT64, OPT, ""))
    msg("TopologyInfo", ("nodes", 1, F.TYPE_MESSAGE, REP, "NUMANode"))
    msg("ContainerDevices", ("resource_name", 1, F.TYPE_STRING, OPT, ""), ("device_ids", 2, F.TYPE_STRING, REP, ""),
        ("topology", 3, F.TYPE_MESSAGE, OPT, "TopologyInfo"))
    msg("ContainerResources", ("name", 1, F.TYPE_STRING, OPT, ""),
        ("devices", 2, F.TYPE_MESSAGE, REP, "ContainerDevices"))
    msg("PodResources", ("name", 1, F.TYPE_STRING, OPT, ""), ("namespace", 2, F.TYPE_STRING, OPT, ""),
        ("containers", 3, F.TYPE_MESSAGE, REP, "ContainerResources"))
    msg("ListPodResourcesResponse", ("pod_resources", 1, F.TYPE_MESSAGE, REP, "PodResources"))
    svc = fdp.service.add(name="PodResourcesLister")
    svc.method.add(name="List", input_type=".v1.ListPodResourcesRequest", output_type=".v1.ListPodResourcesResponse")
    pool = descriptor_pool.DescriptorPool()  # private: never clashes with another module's "v1" package
    fd = pool.Add(fdp)
    return {m.name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"v1.{m.name}"))
            for m in fdp.message_type} | {"_file": fd}



@dataclass(frozen=True)
class PodDevices:
    """The devices one pod holds (all its containers): ``gpus`` GPU UUIDs (``nvidia.com/gpu``),
    ``migs`` MIG device UUIDs (``nvidia.com/mig-*``), each sorted and without duplicates."""

    gpus: tuple[str, ...] = ()
    migs: tuple[str, ...] = ()

    @property
    def hw_ids(self) -> tuple[str, ...]:
        """Every device id, the ``hw.id`` values of this pod's KV series (GPUs, then MIG devices)."""
        return self.gpus + self.migs


def devices_by_pod(response: Any) -> dict[tuple[str, str], PodDevices]:
    """``(namespace, pod name) -> PodDevices`` from a ``ListPodResourcesResponse``; pods with no
    NVIDIA device are left out. A time-slicing replica id ``GPU-x::2`` counts as ``GPU-x``."""
    out: dict[tuple[str, str], PodDevices] = {}
    for pod in response.pod_resources:
        gpus: set[str] = set()
        migs: set[str] = set()
        for c in pod.containers:
            for d in c.devices:
                if d.resource_name == GPU_RESOURCE:
                    gpus.update(i.split("::", 1)[0] for i in d.device_ids if i)
                elif d.resource_name.startswith(MIG_RESOURCE_PREFIX):
                    migs.update(i.split("::", 1)[0] for i in d.device_ids if i)
        if gpus or migs:
            out[(pod.namespace, pod.name)] = PodDevices(tuple(sorted(gpus)), tuple(sorted(migs)))
    return out


class PodResourcesClient:
    """``List`` on the kubelet's pod-resources socket, bounded and counted.

    Args:
        socket_path: the kubelet's socket (default :data:`DEFAULT_SOCKET`).
        timeout_s: deadline of one call, seconds (connect included).
        log: hears each change of state (``unreachable``, ``ok again`` ...), once per change.

    :attr:`errors` counts failed calls by reason: ``absent`` (no socket file), ``unavailable``
    (nothing answers on it), ``deadline``, ``rpc_error`` (any other gRPC status, e.g. a kubelet
    without the API, ``UNIMPLEMENTED``); :attr:`calls` counts every call.
    """

    def __init__(self, socket_path: str = DEFAULT_SOCKET, *, timeout_s: float = 2.0,
                 log: Callable[[str], None] | None = None):
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self.log = log
        self.errors: Counter = Counter()
        self.calls = 0
        self._state = "ok"
        self._channel: Any = None
        self._list: Any = None

    def _report(self, state: str, detail: str = "") -> None:
        if state != self._state and self.log:
            self.log(f"pod-resources: {self.socket_path}: {state}{': ' + detail if detail else ''}" if state != "ok"
                     else f"pod-resources: {self.socket_path}: ok again")
        self._state = state

    def _stub(self) -> Any:
        if self._list is None:
            import grpc

            self._channel = grpc.insecure_channel(
                f"unix://{os.path.abspath(self.socket_path)}",
                options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                         ("grpc.enable_retries", 0)])
            self._list = self._channel.unary_unary(
                LIST_METHOD, request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=messages()["ListPodResourcesResponse"].FromString)
        return self._list

    def devices(self) -> dict[tuple[str, str], PodDevices] | None:
        """``(namespace, pod) -> PodDevices`` of every pod on the node holding an NVIDIA device,
        or None when the call failed (counted in :attr:`errors`, said once)."""
        import grpc

        self.calls += 1
        if not os.path.exists(self.socket_path):
            self.errors["absent"] += 1
            self._report("absent", "no such socket -- mount the kubelet's /var/lib/kubelet/pod-resources "
                                   "(hostPath) or pass --pod-resources-socket; KV series carry no hw_id meanwhile")
            return None
        try:
            resp = self._stub()(messages()["ListPodResourcesRequest"](), timeout=self.timeout_s, wait_for_ready=False)
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            reason = {grpc.StatusCode.UNAVAILABLE: "unavailable",
                      grpc.StatusCode.DEADLINE_EXCEEDED: "deadline"}.get(code, "rpc_error")
            self.errors[reason] += 1
            details = e.details() if hasattr(e, "details") else ""
            fix = {"unavailable": "check that the kubelet runs and that this is its pod-resources socket "
                                  "(--pod-resources-socket)",
                   "deadline": f"the kubelet did not answer within --timeout {self.timeout_s:g} s: raise it "
                               "where the kubelet is slow",
                   }.get(reason, "see the kubelet's log for why it refused the List call")
            self._report(reason, f"{getattr(code, 'name', code)} {details}".strip()
                         + f" -- {fix}; KV series carry no hw_id meanwhile")
            return None
        self._report("ok")
        return devices_by_pod(resp)

    def error_readings(self) -> list[tuple[dict, int]]:
        """``({endpoint: socket path, reason}, count)`` per failed-call reason."""
        from fusebox.conventions import ATTR

        return [({ATTR["endpoint"]: f"unix://{self.socket_path}", ATTR["reason"]: r}, n)
                for r, n in sorted(self.errors.items())]

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = self._list = None
