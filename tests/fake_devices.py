"""A stand-in for GPU hardware (DESIGN section 9: the only stand-in allowed).

It replaces :data:`jupyter_ckpt.image.devices.device_ops`, the library's single seam to the
accelerator: chosen CPU tensors report a CUDA device, and every storage the restore sends
to a device is recorded instead of copied. Like CUDA, it refuses to work in a forked child
of the process that installed it. Imported inside test kernels.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from jupyter_ckpt.image import devices


class FakeDeviceOps(devices.DeviceOps):
    def __init__(self, gpus: int) -> None:
        self.gpus = gpus
        self.pid = os.getpid()  # the process whose "CUDA context" this is
        self.placed: dict[int, str] = {}  # storage address -> pretended device
        self.sent: list[tuple[str, int]] = []  # (device, bytes) per storage sent to a GPU
        self.to_host_calls = 0
        self.copied_ahead = 0  # bytes staged by start_copy

    def pretend(self, tensor: Any, device: str) -> None:
        """From now on ``tensor`` (and every tensor on its storage) is on ``device``."""
        self.placed[tensor.untyped_storage().data_ptr()] = device

    def _use(self) -> None:
        if os.getpid() != self.pid:
            raise RuntimeError("CUDA error: initialization error (used in a forked child)")

    def cuda_device_count(self) -> int:
        self._use()
        return self.gpus

    def cuda_initialized(self) -> bool:
        return bool(self.placed)  # a tensor on a device: a CUDA context exists

    def device_of(self, tensor: Any) -> str:
        return self.placed.get(tensor.untyped_storage().data_ptr(), str(tensor.device))

    def to_host(self, storage: Any, start: int, stop: int) -> Any:
        self._use()
        self.to_host_calls += 1
        return _bytes(storage)[start:stop].numpy().copy()

    def to_device(self, u8: Any, device: str) -> Any:
        self._use()
        self.sent.append((device, u8.numel()))
        return u8

    def synchronize(self, devices: list[str]) -> None:
        self._use()

    def staging(self, nbytes: int) -> Any:
        self._use()
        return np.empty(nbytes, dtype=np.uint8)

    def start_copy(self, storage: Any, start: int, host: Any) -> Any:
        self._use()
        host[:] = _bytes(storage)[start : start + len(host)].numpy()
        self.copied_ahead += len(host)

    def wait(self, started: Any) -> None:
        self._use()


def _bytes(storage: Any) -> Any:
    return torch.empty(0, dtype=torch.uint8).set_(storage)


current: FakeDeviceOps | None = None


def install(gpus: int) -> FakeDeviceOps:
    """Make this process look like a node with ``gpus`` GPUs (kept out of the namespace)."""
    global current
    current = devices.device_ops = FakeDeviceOps(gpus)
    return current
