"""Where restored tensors go: the saved device, a mapped one, or the CPU on request.

Saved GPU indices are mapped onto this node's GPUs: the same index when it exists, else
the saved devices in order onto the local ones (so an image from cuda:0 and cuda:3 of an
8-GPU node lands on cuda:0 and cuda:1 of a 2-GPU node). With no GPU the restore refuses,
naming the device, unless the user asked for ``map_location="cpu"``.

All access to the accelerator goes through :class:`DeviceOps`, which is the single seam a
test replaces when the machine has no GPU; ``benchmarks/gpu_roundtrip.py`` runs the real
one on an NVIDIA machine.
"""

from __future__ import annotations

import contextvars
import sys
from typing import Any

from ..compat import device_map
from ..errors import DeviceUnavailable


class DeviceOps:
    """The real CUDA operations (torch). Imported lazily: only images with tensors get here."""

    def cuda_device_count(self) -> int:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0

    def device_of(self, tensor: Any) -> str:
        return str(tensor.device)

    def cuda_initialized(self) -> bool:
        """Whether this process has a CUDA context (which a forked child cannot use);
        never imports torch itself."""
        torch = sys.modules.get("torch")
        cuda = getattr(torch, "cuda", None)
        return cuda is not None and cuda.is_initialized()

    def to_host(self, storage: Any, start: int, stop: int) -> Any:
        """A host copy (numpy, uint8) of bytes ``[start, stop)`` of a device storage, in
        pinned memory for a fast copy."""
        import torch

        host = torch.empty(stop - start, dtype=torch.uint8, pin_memory=True)
        host.copy_(_bytes_of(storage)[start:stop], non_blocking=False)
        return host.numpy()

    # -- copies made ahead of a fork (:mod:`.hostcopy`): staged, asynchronous ------------

    def synchronize(self, devices: list[str]) -> None:
        """Wait for the work queued on ``devices``, so that a copy sees its results."""
        import torch

        for device in devices:
            torch.cuda.synchronize(device)

    def staging(self, nbytes: int) -> Any:
        """A host buffer (numpy, uint8) that device copies land in at the bus's speed:
        pinned memory, which torch's host allocator keeps for the next save."""
        import torch

        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).numpy()

    def start_copy(self, storage: Any, start: int, host: Any) -> Any:
        """Start copying ``len(host)`` bytes of a device storage from ``start`` into the
        staging buffer ``host``; returns what :meth:`wait` waits for."""
        import torch

        source = _bytes_of(storage)[start : start + len(host)]
        torch.from_numpy(host).copy_(source, non_blocking=True)
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(source.device))
        return done

    def wait(self, started: Any) -> None:
        """Wait until a copy from :meth:`start_copy` has landed (without the GIL)."""
        started.synchronize()

    def to_device(self, u8: Any, device: str) -> Any:
        return u8.to(device)


class DeviceMapper:
    def __init__(self, ops: DeviceOps, saved_devices: list[str], map_location: str | None) -> None:
        self.ops = ops
        self.map_location = map_location
        self.warnings: list[str] = []
        self._map: dict[str, str] = {}
        saved_cuda = [d for d in saved_devices if d.startswith("cuda")]
        if map_location or not saved_cuda:
            return
        count = ops.cuda_device_count()
        if count == 0:
            return
        # one rule for the restore and for the compatibility check that predicts it
        self._map = {s: f"cuda:{t}" for s, t in device_map(saved_cuda, count).items()}
        moved = ", ".join(f"{s} -> {t}" for s, t in self._map.items() if s != t)
        if moved:
            self.warnings.append(f"this node has {count} GPU(s); mapped {moved}")

    def resolve(self, saved: str) -> str:
        if self.map_location:
            return self.map_location
        if not saved.startswith("cuda"):
            return saved
        if saved not in self._map:
            raise DeviceUnavailable(
                f"a tensor was saved on {saved} and this node has no GPU; "
                "restore with --map-location cpu to load it on the CPU"
            )
        return self._map[saved]


def _bytes_of(storage: Any) -> Any:
    """A storage as a flat uint8 tensor on its own device."""
    import torch

    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


# The mapper in force while an image is being unpickled (rebuild functions read it).
current_mapper: contextvars.ContextVar[DeviceMapper | None] = contextvars.ContextVar(
    "jupyter_ckpt_mapper", default=None
)
device_ops: DeviceOps = DeviceOps()
