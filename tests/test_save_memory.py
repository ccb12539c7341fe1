"""Host memory of a save: bounded by ``ImageStore.buffer_bytes`` whatever the GPU state's
size, and all of it released when a save fails. GPU tensors are the ``fake_devices``
stand-in, whose host copies are real allocations; the kernels and stores are real, and
memory is the kernel process's own peak RSS (``VmHWM``, reset through ``clear_refs``).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fake_devices import install
from harness import Kernel, Paths, load_namespace, tmpfs

from jupyter_ckpt.image import capture, devices
from jupyter_ckpt.store import CHUNK_SIZE, ImageStore

MiB = 1 << 20
BUFFER = 64 * MiB
TENSORS = 8  # device state: TENSORS x BUFFER
# What a save holds besides its copy buffer: the private copy of a chunk per I/O thread,
# counted twice since the allocator keeps freed ones per thread, and the interpreter's own
# churn (pickles, the manifest, thread stacks). Without the buffer, a save of this state
# takes over 512 MiB.
SLACK = 2 * ImageStore.io_threads.default_value * CHUNK_SIZE + 24 * MiB

SETUP = f"""
import fake_devices, torch
_ops = fake_devices.install(gpus=1)
_n = {BUFFER // 4}
gpu = [torch.arange(_n, dtype=torch.int32).add_(i * _n) for i in range({TENSORS})]
for _t in gpu:
    _ops.pretend(_t, "cuda:0")
del _ops, _t, _n, fake_devices
"""
CHECK = f"all(int(t[-1]) == (i + 1) * {BUFFER // 4} - 1 for i, t in enumerate(gpu))"


def _status(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(rf"^{key}:\s+(\d+) kB", f.read(), re.M).group(1)) * 1024


def reset_peak(pid: int) -> int:
    """Start a new peak RSS measurement for ``pid``; return its RSS now."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")
    return _status(pid, "VmRSS")


class _BufferPaths(Paths):
    def env(self) -> dict[str, str]:
        return {**super().env(), "JUPYTER_CKPT_BUFFER_BYTES": str(BUFFER)}


def start(paths: Paths) -> Kernel:
    kernel = Kernel(paths)
    kernel.run("%load_ext jupyter_ckpt")
    kernel.run(SETUP)
    return kernel


@pytest.fixture
def read_only_store(tmp_path: Path) -> Iterator[_BufferPaths]:
    """A store on a file system that turned read-only (as after a disk error)."""
    paths = _BufferPaths(tmp_path)
    paths.store.mkdir()
    with tmpfs(paths.store, "16m"):
        subprocess.run(["mount", "-o", "remount,ro", str(paths.store)], check=True)
        yield paths


def test_peak_host_memory_is_bounded_by_the_buffer(tmp_path: Path) -> None:
    kernel = start(_BufferPaths(tmp_path))
    try:
        before = reset_peak(kernel.pid)
        out = kernel.ckpt("save big")
        extra = _status(kernel.pid, "VmHWM") - before
    finally:
        kernel.shutdown()
    print(
        f"\nsave of {TENSORS * BUFFER // MiB} MiB of device data, buffer {BUFFER // MiB} MiB: "
        f"peak host memory +{extra / MiB:.0f} MiB"
    )
    assert out.startswith("Saved "), out
    assert extra < BUFFER + SLACK, f"+{extra / MiB:.0f} MiB over the state during the save"
    manifest = _BufferPaths(tmp_path).open_store().verify("big")
    sizes = sorted(s["size"] for s in manifest["segments"])
    assert sizes.count(BUFFER) == TENSORS, "each device storage is one segment"


def test_a_failed_save_releases_its_copies_and_leaves_no_exception(read_only_store) -> None:
    kernel = start(read_only_store)
    try:
        before = _status(kernel.pid, "VmRSS")
        out = kernel.ckpt("save big")
        after = _status(kernel.pid, "VmRSS")
        kernel.check("not hasattr(__import__('sys'), 'last_value')", CHECK)
    finally:
        kernel.shutdown()
    assert out.startswith("%ckpt save: ") and "Read-only file system" in out, out
    assert "nothing was saved" in out
    assert after - before < BUFFER + SLACK, f"+{(after - before) / MiB:.0f} MiB kept"


# -- in process: parts of a device storage make one segment that restores exactly ---------


@pytest.fixture
def fake_gpu() -> Iterator[Any]:
    real = devices.device_ops
    yield install(gpus=1)
    devices.device_ops = real


def test_device_storage_written_in_parts_restores(store: ImageStore, fake_gpu: Any) -> None:
    odd = 3 * CHUNK_SIZE + 12345  # parts of CHUNK_SIZE and a short tail
    big = torch.randint(0, 255, (odd,), dtype=torch.uint8)
    fake_gpu.pretend(big, "cuda:0")
    view = big[100:200]
    namespace = {"big": big, "view": view, "small": torch.ones(3)}
    # a buffer of two chunks: written a chunk at a time
    manifest = capture(namespace, namespace, store.writer(), name="p", buffer_bytes=2 * CHUNK_SIZE)
    assert fake_gpu.to_host_calls == 4, "one copy per part"
    assert sorted(s["size"] for s in manifest["segments"])[-1] == odd
    fake_gpu.to_host_calls = 0
    back = load_namespace(store, "p")
    assert torch.equal(back["big"], big) and torch.equal(back["view"], view)
    assert back["view"].untyped_storage().data_ptr() == back["big"].untyped_storage().data_ptr()
    assert fake_gpu.sent == [("cuda:0", odd)]
