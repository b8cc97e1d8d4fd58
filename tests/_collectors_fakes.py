"""A fake nvidia-ml-py module for the collector tests (the only place NVML is faked).

It answers the pynvml calls the GPU collector makes, from per-device dicts whose numbers are
copied by hand from the corpus captures (MiB figures, percent, watts, as nvidia-smi prints
them). It raises pynvml's own NVMLError classes, like the real binding.
"""

from __future__ import annotations

from types import SimpleNamespace

import pynvml

MIB = 1_048_576


class FakeNvml:
    NVMLError = pynvml.NVMLError
    nvmlMemory_v2 = pynvml.nvmlMemory_v2
    NVML_PCIE_UTIL_TX_BYTES = pynvml.NVML_PCIE_UTIL_TX_BYTES
    NVML_PCIE_UTIL_RX_BYTES = pynvml.NVML_PCIE_UTIL_RX_BYTES
    NVML_DEVICE_MIG_ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE
    NVML_ERROR_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_FUNCTION_NOT_FOUND = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND

    def __init__(self, devices, *, init_error=None):
        # devices: list of dicts: uuid, name, total/free/used/reserved (MiB), util, memutil,
        # power_w, gen, width, tx/rx (KB/s), mig (list of dicts), lost (bool)
        self.devices = devices
        self.init_error = init_error
        self.init_calls = 0
        self.memory_versions = []

    def _raise(self, code):
        raise pynvml.NVMLError(code)

    def _d(self, h):
        d = h
        if d.get("lost"):
            self._raise(pynvml.NVML_ERROR_GPU_IS_LOST)
        return d

    def nvmlInit(self):
        self.init_calls += 1
        if self.init_error is not None:
            self._raise(self.init_error)

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i):
        return self.devices[i]

    def nvmlDeviceGetUUID(self, h):
        return h["uuid"].encode()  # older bindings return bytes

    def nvmlDeviceGetName(self, h):
        return h["name"]

    def nvmlDeviceGetMemoryInfo(self, h, version=None):
        d = self._d(h)
        self.memory_versions.append(version)
        if version is None:  # v1 folds reserved into used
            return SimpleNamespace(total=d["total"] * MIB, free=d["free"] * MIB, used=(d["total"] - d["free"]) * MIB)
        return SimpleNamespace(total=d["total"] * MIB, free=d["free"] * MIB, used=d["used"] * MIB,
                               reserved=d["reserved"] * MIB, version=version)

    def nvmlDeviceGetUtilizationRates(self, h):
        d = self._d(h)
        if d.get("util") is None:
            self._raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=d["util"], memory=d["memutil"])

    def nvmlDeviceGetPcieThroughput(self, h, counter):
        d = self._d(h)
        if d.get("tx") is None:
            self._raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return d["tx"] if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else d["rx"]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        if h.get("gen") is None:
            self._raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return h["gen"]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        if h.get("width") is None:
            self._raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return h["width"]

    def nvmlDeviceGetPowerUsage(self, h):
        d = self._d(h)
        if d.get("power_w") is None:
            self._raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(round(d["power_w"] * 1000))

    def nvmlDeviceGetMigMode(self, h):
        if "mig" not in h:
            self._raise(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [1 if h["mig"] else 0, 1 if h["mig"] else 0]

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, j):
        if j >= len(h["mig"]):
            self._raise(pynvml.NVML_ERROR_NOT_FOUND)
        return h["mig"][j]
