"""What GPUs a node has and how much GPU memory a kernel holds (NVML via ``pynvml``).

The probe never raises on a node without NVIDIA hardware: NVML failing to load or
initialize is logged once and every question then answers "no GPU". All NVML access goes
through one module-like object (``pynvml`` by default), the single seam a test replaces
when the machine has no GPU; ``benchmarks/gpu_suspend.py`` runs the real one.

Memory is attributed to a kernel by its whole process tree (kernels that fork workers or
launch subprocesses still count). Inside containers NVML often reports host PIDs, which
match nothing in our PID namespace; then the probe falls back to ``/proc/<pid>/fd`` links
to ``/dev/nvidia*``, which says *whether* the tree holds a GPU but not how much.
"""

from __future__ import annotations

import importlib
import logging
import os
from dataclasses import dataclass, field
from typing import Any

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
        }


@dataclass
class GpuSnapshot:
    """GPU memory per pid (NVML) and the process tree, taken once."""

    by_pid: dict[int, dict[int, int]]
    children: dict[int, list[int]]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class GpuProbe:
    """NVML questions, answered without raising. ``nvml`` defaults to ``pynvml``."""

    def __init__(self, nvml: Any | None = None, proc_root: str = "/proc") -> None:
        self._nvml = nvml
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

    def children(self) -> dict[int, list[int]]:
        """parent pid -> child pids, from one scan of /proc (empty where there is none)."""
        children: dict[int, list[int]] = {}
        try:
            entries = os.listdir(self.proc_root)
        except OSError:
            return children
        for entry in entries:
            if not entry.isdigit():
                continue
            try:
                with open(f"{self.proc_root}/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            # the command name may hold spaces and parentheses: split after the last ')'
            ppid = int(stat.rpartition(")")[2].split()[1])
            children.setdefault(ppid, []).append(int(entry))
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

    def snapshot(self) -> GpuSnapshot:
        """One NVML query and one /proc scan, shared by every kernel of a monitor tick."""
        return GpuSnapshot(self.memory_by_pid(), self.children())

    def _opens_nvidia_device(self, pid: int) -> bool:
        fd_dir = f"{self.proc_root}/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            return False
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            # /dev/nvidiactl and nvidia-uvm are opened by any CUDA import; a context
            # on a GPU opens /dev/nvidia<N>.
            if target.startswith("/dev/nvidia") and target[len("/dev/nvidia") :].isdigit():
                return True
        return False

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
            return GpuUsage(by_device, "nvml")
        if any(self._opens_nvidia_device(member) for member in tree):
            return GpuUsage({}, "proc-fd")
        return GpuUsage()
