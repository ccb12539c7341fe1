"""What GPUs a node has, and how much GPU memory a kernel holds and how busy it keeps
them (NVML via ``pynvml``).

The probe never raises on a node without NVIDIA hardware: NVML failing to load or
initialize is logged once and every question then answers "no GPU". All NVML access goes
through one module-like object (``pynvml`` by default), the single seam a test replaces
when the machine has no GPU; ``benchmarks/gpu_suspend.py`` runs the real one.

Memory and utilization are attributed to a kernel by its whole process tree, from psutil
(kernels that fork workers or launch subprocesses still count). Inside containers NVML
often reports host PIDs, which match nothing in our PID namespace; then the probe falls
back to the tree's open ``/dev/nvidia<N>`` devices, which says *whether* the tree holds a
GPU but not how much. (psutil's ``open_files`` lists regular files only, so the device
links are read from ``/proc/<pid>/fd`` for that one question.)
"""

from __future__ import annotations

import importlib
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import psutil

log = logging.getLogger(__name__)

# Newest first: drivers older than 470 lack the _v3 entry points, very old ones the _v2.
_PROCESS_CALLS = (
    ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v3"),
    ("nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetGraphicsRunningProcesses_v2"),
    ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"),
)


@dataclass
class GpuUsage:
    """GPU memory held by one process tree.

    ``source`` is ``"nvml"`` (bytes per device; 0 where the driver cannot tell, as under
    MIG), ``"proc-fd"`` (the tree has /dev/nvidia* open but NVML cannot attribute bytes to
    it, so ``by_device`` is empty) or ``"none"``.
    """

    by_device: dict[int, int] = field(default_factory=dict)
    source: str = "none"
    # device index -> SM utilization (%) the tree caused since the last snapshot
    busy: dict[int, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.by_device.values())

    @property
    def holds_gpu(self) -> bool:
        return self.source != "none"

    def to_json(self) -> dict[str, Any]:
        return {
            "bytes": self.total,
            "by_device": {str(k): v for k, v in self.by_device.items()},
            "source": self.source,
            "holds_gpu": self.holds_gpu,
            "busy": {str(k): v for k, v in self.busy.items()},
        }


@dataclass
class GpuSnapshot:
    """GPU memory and utilization per pid (NVML) and the process tree, taken once."""

    by_pid: dict[int, dict[int, int]]
    children: dict[int, list[int]]
    # pid -> {device: SM %} from per-process samples since the previous snapshot
    util_by_pid: dict[int, dict[int, int]] = field(default_factory=dict)
    # device -> SM % of the whole device, where per-process samples are not available
    device_util: dict[int, int] = field(default_factory=dict)


def image_device_bytes(manifest: dict[str, Any]) -> dict[str, int]:
    """GPU index (as a string, as usage reports it) -> bytes of the image's tensors that
    lived there: what a restore of it must fit on each GPU."""
    on_devices = manifest.get("gpu", {}).get("device_bytes", {})
    return {
        device.partition(":")[2] or "0": int(n)
        for device, n in on_devices.items()
        if device.startswith("cuda")
    }


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class GpuProbe:
    """NVML questions, answered without raising. ``nvml`` defaults to ``pynvml``."""

    def __init__(self, nvml: Any | None = None, proc_root: str = "/proc") -> None:
        self._nvml: Any = nvml
        self.proc_root = proc_root
        self._ready: bool | None = None
        self.unavailable_reason: str | None = None
        self._process_calls: tuple[str, str] | None = None

    @property
    def available(self) -> bool:
        if self._ready is None:
            try:
                nvml = self._nvml or importlib.import_module("pynvml")
                nvml.nvmlInit()
            except Exception as exc:
                self._ready = False
                self.unavailable_reason = f"NVML is not available ({exc}); assuming no GPU"
                log.info(self.unavailable_reason)
            else:
                self._nvml = nvml
                self._ready = True
        return bool(self._ready)

    def _handles(self) -> list[Any]:
        nvml = self._nvml
        return [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]

    def node(self) -> dict[str, Any]:
        """Driver, CUDA and per-GPU facts (model, UUID, compute capability, memory)."""
        if not self.available:
            return {"available": False, "reason": self.unavailable_reason, "gpus": []}
        nvml = self._nvml
        try:
            cuda = nvml.nvmlSystemGetCudaDriverVersion()
            gpus = []
            for index, handle in enumerate(self._handles()):
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
                gpus.append(
                    {
                        "index": index,
                        "name": _text(nvml.nvmlDeviceGetName(handle)),
                        "uuid": _text(nvml.nvmlDeviceGetUUID(handle)),
                        "compute_capability": f"{major}.{minor}",
                        "memory_total": int(memory.total),
                        "memory_used": int(memory.used),
                    }
                )
            return {
                "available": True,
                "driver": _text(nvml.nvmlSystemGetDriverVersion()),
                "cuda": f"{cuda // 1000}.{cuda % 1000 // 10}",
                "gpus": gpus,
            }
        except Exception as exc:  # a GPU fell off the bus, driver reloaded, ...
            log.warning("NVML query failed: %s", exc)
            return {"available": False, "reason": f"NVML query failed: {exc}", "gpus": []}

    def free_memory(self) -> dict[int, int]:
        """device index -> bytes free now, as the driver counts them: memory held by any
        process (this server's kernels or not) is used. Empty without NVML."""
        if not self.available:
            return {}
        nvml = self._nvml
        try:
            free = {}
            for index, handle in enumerate(self._handles()):
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                free[index] = max(0, int(memory.total) - int(memory.used))
            return free
        except Exception as exc:
            log.warning("NVML memory query failed: %s", exc)
            return {}

    def _device_processes(self, handle: Any) -> list[Any]:
        nvml = self._nvml
        calls = [self._process_calls] if self._process_calls else _PROCESS_CALLS
        not_found = getattr(nvml, "NVMLError_FunctionNotFound", AttributeError)
        for names in calls:
            try:
                procs = [p for name in names for p in getattr(nvml, name)(handle)]
            except (AttributeError, not_found):
                continue
            self._process_calls = names
            return procs
        return []

    def memory_by_pid(self) -> dict[int, dict[int, int]]:
        """pid -> {device index: bytes} for every process NVML sees."""
        if not self.available:
            return {}
        usage: dict[int, dict[int, int]] = {}
        try:
            for index, handle in enumerate(self._handles()):
                for proc in self._device_processes(handle):
                    per_device = usage.setdefault(int(proc.pid), {})
                    # usedGpuMemory is None where the driver cannot tell (WDDM, MIG)
                    per_device[index] = per_device.get(index, 0) + int(proc.usedGpuMemory or 0)
        except Exception as exc:
            log.warning("NVML process query failed: %s", exc)
        return usage

    def utilization(self, window: float = 5) -> tuple[dict[int, dict[int, int]], dict[int, int]]:
        """(pid -> {device: SM %}, device -> SM %): the highest per-process sample of the
        last ``window`` seconds where the driver keeps them, else the device's own figure.
        A window, not "since the last call", so that any caller may ask."""
        if not self.available:
            return {}, {}
        nvml = self._nvml
        by_pid: dict[int, dict[int, int]] = {}
        by_device: dict[int, int] = {}
        try:
            handles = self._handles()
        except Exception as exc:
            log.warning("NVML device query failed: %s", exc)
            return {}, {}
        for index, handle in enumerate(handles):
            since = time.time_ns() // 1000 - int(window * 1e6)  # NVML stamps: epoch us
            try:
                samples = nvml.nvmlDeviceGetProcessUtilization(handle, since)
            except Exception as exc:
                # NOT_FOUND (or SUCCESS with no room needed): no sample since, nothing ran
                if getattr(exc, "value", None) in (0, getattr(nvml, "NVML_ERROR_NOT_FOUND", 6)):
                    continue
                try:  # not supported (MIG, old driver): the device as a whole
                    by_device[index] = int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                except Exception as exc2:
                    log.debug("NVML utilization of GPU %d unavailable: %s", index, exc2)
                continue
            for sample in samples:
                per = by_pid.setdefault(int(sample.pid), {})
                per[index] = max(per.get(index, 0), int(sample.smUtil))
        return by_pid, by_device

    def children(self) -> dict[int, list[int]]:
        """parent pid -> child pids, from one pass over the process table."""
        children: dict[int, list[int]] = {}
        for process in psutil.process_iter():
            try:
                ppid = process.ppid()
            except psutil.Error:  # gone meanwhile
                continue
            children.setdefault(ppid, []).append(process.pid)
        return children

    def process_tree(self, pid: int, children: dict[int, list[int]] | None = None) -> set[int]:
        """``pid`` and all its descendants."""
        if children is None:
            children = self.children()
        tree, todo = set(), [pid]
        while todo:
            current = todo.pop()
            if current not in tree:
                tree.add(current)
                todo.extend(children.get(current, []))
        return tree

    def snapshot(self, window: float = 5) -> GpuSnapshot:
        """One NVML pass and one process-table pass, shared by every kernel of a tick;
        GPU utilization over the last ``window`` seconds."""
        util_by_pid, device_util = self.utilization(window)
        return GpuSnapshot(self.memory_by_pid(), self.children(), util_by_pid, device_util)

    def usage(self, pid: int, snapshot: GpuSnapshot | None = None) -> GpuUsage:
        """GPU memory held by ``pid``'s process tree. Pass a :meth:`snapshot` to share
        its queries among many kernels."""
        if not self.available:
            return GpuUsage()
        if snapshot is None:
            snapshot = self.snapshot()
        by_pid = snapshot.by_pid
        tree = self.process_tree(pid, snapshot.children)
        seen = tree & by_pid.keys()
        if seen:
            by_device: dict[int, int] = {}
            for member in seen:
                for index, used in by_pid[member].items():
                    by_device[index] = by_device.get(index, 0) + used
            return GpuUsage(by_device, "nvml", _busy(tree, by_device, snapshot))
        if any(nvidia_device_open(member, self.proc_root) for member in tree):
            return GpuUsage({}, "proc-fd")
        return GpuUsage()


def nvidia_device_open(pid: int, proc_root: str = "/proc") -> str | None:
    """The ``/dev/nvidia<N>`` that ``pid`` holds open, if any: a process with a CUDA
    context on a GPU holds one, whichever framework made it (torch, CuPy, JAX, ...)."""
    fd_dir = f"{proc_root}/{pid}/fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return None
    for fd in fds:
        try:
            target = os.readlink(f"{fd_dir}/{fd}")
        except OSError:
            continue
        # /dev/nvidiactl and nvidia-uvm are opened by any CUDA import; a context
        # on a GPU opens /dev/nvidia<N>.
        if target.startswith("/dev/nvidia") and target[len("/dev/nvidia") :].isdigit():
            return target
    return None


def _busy(tree: set[int], devices: dict[int, int], snapshot: GpuSnapshot) -> dict[int, int]:
    """SM % per device caused by ``tree``: its processes' samples, or the device's own
    figure where the tree is the only process NVML lists on that device."""
    busy: dict[int, int] = {}
    for member in tree & snapshot.util_by_pid.keys():
        for index, percent in snapshot.util_by_pid[member].items():
            busy[index] = max(busy.get(index, 0), percent)
    for index, percent in snapshot.device_util.items():
        users = {p for p, per in snapshot.by_pid.items() if index in per}
        if index in devices and index not in busy and users <= tree:
            busy[index] = percent
    return busy
