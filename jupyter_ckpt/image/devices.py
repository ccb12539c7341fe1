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

    def to_host(self, u8: Any) -> Any:
        """A CPU copy of a uint8 device tensor, in pinned memory for a fast copy."""
        import torch

        host = torch.empty(u8.numel(), dtype=torch.uint8, pin_memory=True)
        host.copy_(u8, non_blocking=False)
        return host

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


# The mapper in force while an image is being unpickled (rebuild functions read it).
current_mapper: contextvars.ContextVar[DeviceMapper | None] = contextvars.ContextVar(
    "jupyter_ckpt_mapper", default=None
)
device_ops: DeviceOps = DeviceOps()
