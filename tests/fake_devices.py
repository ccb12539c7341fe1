"""A stand-in for GPU hardware (DESIGN section 9: the only stand-in allowed).

It replaces :data:`jupyter_ckpt.image.devices.device_ops`, the library's single seam to the
accelerator: chosen CPU tensors report a CUDA device, and every storage the restore sends
to a device is recorded instead of copied. Imported inside test kernels.
"""

from __future__ import annotations

from typing import Any

from jupyter_ckpt.image import devices


class FakeDeviceOps(devices.DeviceOps):
    def __init__(self, gpus: int) -> None:
        self.gpus = gpus
        self.placed: dict[int, str] = {}  # storage address -> pretended device
        self.sent: list[tuple[str, int]] = []  # (device, bytes) per storage sent to a GPU
        self.to_host_calls = 0

    def pretend(self, tensor: Any, device: str) -> None:
        """From now on ``tensor`` (and every tensor on its storage) is on ``device``."""
        self.placed[tensor.untyped_storage().data_ptr()] = device

    def cuda_device_count(self) -> int:
        return self.gpus

    def cuda_initialized(self) -> bool:
        return bool(self.placed)  # a tensor on a device: a CUDA context exists

    def device_of(self, tensor: Any) -> str:
        return self.placed.get(tensor.untyped_storage().data_ptr(), str(tensor.device))

    def to_host(self, u8: Any) -> Any:
        self.to_host_calls += 1
        return u8.clone()

    def to_device(self, u8: Any, device: str) -> Any:
        self.sent.append((device, u8.numel()))
        return u8


current: FakeDeviceOps | None = None


def install(gpus: int) -> FakeDeviceOps:
    """Make this process look like a node with ``gpus`` GPUs (kept out of the namespace)."""
    global current
    current = devices.device_ops = FakeDeviceOps(gpus)
    return current
