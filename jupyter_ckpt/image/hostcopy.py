"""Host copies of a kernel's device state, for an image written by a forked child.

A forked child cannot use CUDA. So before the fork, while the kernel is held (the
autosave's silent call), every storage a Python tensor holds on a GPU is copied to host
memory; the child writes those copies and sees the device only through
:class:`CopiedDeviceOps`, which serves them and refuses everything else. The image is the
one a save in the kernel would write: each storage keeps its device, and a restore puts
it back there.

The copy runs at about the bus's speed: each storage crosses in pieces into a few pinned
staging buffers, and worker threads move each landed piece into its host copy (plain
memory, which the fork hands to the child) while the next pieces cross. Host memory: the
copies, as large as the device state, plus the staging buffers (``staging_bytes``);
:mod:`jupyter_ckpt.kernel.background` checks that they fit before it copies.
"""

from __future__ import annotations

import gc
import itertools
import os
import sys
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ..errors import DeviceUnavailable
from . import devices
from .pickler import saved_as_storage

# Frameworks whose device arrays only their own code can read: with one of them imported,
# the device state may be more than torch's tensors, and is saved in the kernel.
OTHER_FRAMEWORKS = ("cupy", "jax", "tensorflow", "numba.cuda")
# Pieces in flight at once, one staging buffer and one worker thread each: as many as the
# cores allow, up to 8 (moving a piece into fresh host memory runs at a few GB/s a core,
# a device-to-host copy at tens of GB/s).
DEPTH = max(2, min(8, os.cpu_count() or 2))
# Staging buffers are whole MiB.
PIECE_ALIGN = 1 << 20


def device_storages(ops: devices.DeviceOps) -> tuple[list[tuple[str, Any]], str | None]:
    """Every storage that a Python tensor holds on a GPU, once, as ``(device, storage)``;
    or, with an empty list, why the device state cannot be copied ahead.

    Tensors are found among all the objects the garbage collector tracks, reached from
    the namespace or not: a pass over the process's objects at C speed, with a Python
    check only per distinct type (``isinstance`` on every object would run properties
    of lazy modules).
    """
    others = [name for name in OTHER_FRAMEWORKS if name in sys.modules]
    if others:
        return [], f"{', '.join(others)} is imported, whose GPU arrays only it can copy"
    torch = sys.modules.get("torch")
    if torch is None:
        return [], None
    objects = gc.get_objects()
    kinds = list(map(type, objects))
    tensor_kinds = {kind for kind in set(kinds) if issubclass(kind, torch.Tensor)}
    found: dict[int, tuple[str, Any]] = {}
    tensors = itertools.compress(objects, map(tensor_kinds.__contains__, kinds))
    for tensor in _with_gradients(tensors):
        # any tensor of the process, a library's too: an odd one must not fail the save
        try:
            device = ops.device_of(tensor)
            if not device.startswith("cuda"):
                continue
            if not saved_as_storage(tensor):
                return [], (
                    f"a tensor on {device} ({tensor.layout}, {tensor.dtype}) is saved by "
                    "torch's own reduce, which reads it on the device"
                )
            storage = tensor.untyped_storage()
            address = storage.data_ptr()
        except (RuntimeError, NotImplementedError, TypeError, AttributeError):
            continue  # no memory of its own (a wrapper or fake tensor): nothing to copy
        if address:  # 0: empty, or on the meta device
            found.setdefault(address, (device, storage))
    return list(found.values()), None


def _with_gradients(tensors: Iterable[Any]) -> Iterator[Any]:
    """The tensors and their gradients, which images save with them: a gradient has no
    Python object, so the scan misses it, until someone asks for it."""
    for tensor in tensors:
        yield tensor
        try:
            grad = tensor.grad if tensor.is_leaf else None  # non-leaf .grad warns
        except (RuntimeError, NotImplementedError, TypeError, AttributeError):
            continue
        if grad is not None:
            yield grad


def copy_to_host(
    storages: list[tuple[str, Any]], ops: devices.DeviceOps, staging_bytes: int
) -> dict[int, Any]:
    """Host copies (numpy, uint8) of ``storages``, by storage address. Piece ``i`` lands
    in staging buffer ``i % DEPTH``, which is reused once its worker moved it on."""
    if not storages:  # numpy is not imported for nothing: importing it changes warnings
        return {}
    import numpy as np

    piece = max(PIECE_ALIGN, staging_bytes // DEPTH // PIECE_ALIGN * PIECE_ALIGN)
    ops.synchronize(sorted({device for device, _ in storages}))
    staging = [ops.staging(piece) for _ in range(DEPTH)]
    landing: list[Future[None] | None] = [None] * DEPTH
    copies: dict[int, Any] = {}

    def land(started: Any, source: Any, target: Any) -> None:
        ops.wait(started)
        np.copyto(target, source)  # without the GIL: the workers run side by side

    # the workers are gone when this returns: a fork keeps only the thread that forks
    with ThreadPoolExecutor(DEPTH, thread_name_prefix="ckpt-host-copy") as workers:
        pieces = (
            (storage, start, min(piece, storage.nbytes() - start))
            for _, storage in storages
            for start in range(0, storage.nbytes(), piece)
        )
        for i, (storage, start, size) in enumerate(pieces):
            slot = i % DEPTH
            if (waiting := landing[slot]) is not None:
                waiting.result()
            address = storage.data_ptr()
            if address not in copies:
                copies[address] = np.empty(storage.nbytes(), dtype=np.uint8)
            buffer = staging[slot][:size]
            started = ops.start_copy(storage, start, buffer)
            target = copies[address][start : start + size]
            landing[slot] = workers.submit(land, started, buffer, target)
        for done in landing:
            if done is not None:
                done.result()
    return copies


class CopiedDeviceOps(devices.DeviceOps):
    """The device as a forked child sees it: the host copies made before the fork. What
    a tensor says of itself (its device) is asked of the kernel's own operations; every
    operation on a device is refused, as CUDA would refuse it in a forked child."""

    def __init__(self, copies: dict[int, Any], kernel_ops: devices.DeviceOps) -> None:
        self.copies = copies
        self.kernel_ops = kernel_ops

    def device_of(self, tensor: Any) -> str:
        return self.kernel_ops.device_of(tensor)

    def to_host(self, storage: Any, start: int, stop: int) -> Any:
        copy = self.copies.get(storage.data_ptr())
        if copy is None or len(copy) != storage.nbytes():
            raise DeviceUnavailable("a device storage was not copied to the host before the fork")
        return copy[start:stop]

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise DeviceUnavailable("a forked child cannot use the GPU")

    cuda_device_count = to_device = synchronize = staging = start_copy = wait = _refuse
