"""Host copies of device state, made before an autosave's fork: every device storage found
once, copied whole through the staging buffers, and served to the child, which can use
nothing else. The GPU is the ``fake_devices`` stand-in, in this process.
"""

from __future__ import annotations

import gc
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from fake_devices import FakeDeviceOps, install

from jupyter_ckpt.errors import DeviceUnavailable
from jupyter_ckpt.image import devices, hostcopy
from jupyter_ckpt.image.hostcopy import (
    DEPTH,
    PIECE_ALIGN,
    CopiedDeviceOps,
    copy_to_host,
    device_storages,
)


@pytest.fixture
def gpu() -> Iterator[FakeDeviceOps]:
    real = devices.device_ops
    yield install(gpus=2)
    devices.device_ops = real


def on(gpu: FakeDeviceOps, tensor: Any, device: str) -> Any:
    gpu.pretend(tensor, device)
    return tensor


def test_every_device_storage_is_found_once(gpu: FakeDeviceOps) -> None:
    weights = on(gpu, torch.arange(1000, dtype=torch.float32), "cuda:1")
    model = torch.nn.Linear(4, 2)
    on(gpu, model.weight, "cuda:0")
    held = {"view": weights[10:20], "nested": [[weights.view(10, 100)]], "cpu": torch.ones(3)}
    held["no storage"] = torch.eye(3).to_sparse()  # asking for its storage raises
    found, reason = device_storages(gpu)
    assert reason is None
    addresses = {storage.data_ptr(): device for device, storage in found}
    assert len(found) == len(addresses) == 2, "a storage once, whatever its tensors"
    assert addresses == {
        weights.untyped_storage().data_ptr(): "cuda:1",
        model.weight.untyped_storage().data_ptr(): "cuda:0",
    }
    assert held["cpu"].untyped_storage().data_ptr() not in addresses


def test_gradients_are_found_through_their_tensors(
    gpu: FakeDeviceOps, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = torch.nn.Linear(4, 2)
    model(torch.ones(1, 4)).sum().backward()
    grad = on(gpu, model.weight.grad, "cuda:0")
    # a gradient nobody asked for from Python has no object for the scan to find
    objects = [o for o in gc.get_objects() if o is not grad]
    monkeypatch.setattr(hostcopy.gc, "get_objects", lambda: objects)
    found, reason = device_storages(gpu)
    assert reason is None
    assert grad.untyped_storage().data_ptr() in {s.data_ptr() for _, s in found}


def test_state_that_cannot_be_copied_ahead_says_why(
    gpu: FakeDeviceOps, monkeypatch: pytest.MonkeyPatch
) -> None:
    signal = on(gpu, torch.randn(8, dtype=torch.complex64), "cuda:0")
    conjugated = signal.conj()  # a lazy view: torch's own reduce reads it on the device
    assert device_storages(gpu) == (
        [],
        "a tensor on cuda:0 (torch.strided, torch.complex64) is saved by torch's own reduce, "
        "which reads it on the device",
    )
    del conjugated
    assert len(device_storages(gpu)[0]) == 1
    monkeypatch.setitem(sys.modules, "cupy", types.ModuleType("cupy"))
    assert device_storages(gpu) == ([], "cupy is imported, whose GPU arrays only it can copy")


def test_copies_cross_in_pieces_through_reused_staging_buffers(gpu: FakeDeviceOps) -> None:
    # more pieces than staging buffers, a short last piece, and a storage under a piece
    big = on(gpu, torch.randint(0, 255, (5 * PIECE_ALIGN + 12345,), dtype=torch.uint8), "cuda:0")
    small = on(gpu, torch.arange(300, dtype=torch.int64), "cuda:1")
    storages = [("cuda:0", big.untyped_storage()), ("cuda:1", small.untyped_storage())]
    copies = copy_to_host(storages, gpu, staging_bytes=DEPTH * PIECE_ALIGN)
    assert gpu.copied_ahead == big.nbytes + small.nbytes
    assert bytes(copies[big.untyped_storage().data_ptr()]) == big.numpy().tobytes()
    assert bytes(copies[small.untyped_storage().data_ptr()]) == small.numpy().tobytes()
    assert copy_to_host([], gpu, DEPTH * PIECE_ALIGN) == {}


def test_the_child_sees_only_the_copies(gpu: FakeDeviceOps) -> None:
    weights = on(gpu, torch.arange(256, dtype=torch.int32), "cuda:1")
    storage = weights.untyped_storage()
    child = CopiedDeviceOps(copy_to_host([("cuda:1", storage)], gpu, PIECE_ALIGN), gpu)
    assert child.device_of(weights[5:]) == "cuda:1"
    assert bytes(child.to_host(storage, 16, 32)) == weights[4:8].numpy().tobytes()
    other = on(gpu, torch.ones(4), "cuda:0").untyped_storage()
    with pytest.raises(DeviceUnavailable, match="not copied to the host before the fork"):
        child.to_host(other, 0, 16)
    for call in (
        lambda: child.cuda_device_count(),
        lambda: child.to_device(weights, "cuda:0"),
        lambda: child.synchronize(["cuda:1"]),
        lambda: child.staging(16),
        lambda: child.start_copy(storage, 0, bytearray(16)),
    ):
        with pytest.raises(DeviceUnavailable, match="a forked child cannot use the GPU"):
            call()
