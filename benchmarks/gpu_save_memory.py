"""Host memory of a GPU save, on a real NVIDIA GPU (DESIGN section 8: bounded by a
configurable buffer, not proportional to the GPU state).

Puts ``--size`` of CUDA tensors in a namespace (as ``gpu_roundtrip.py`` does), then saves
it once per ``--buffer`` and prints the process's peak resident memory during the save over
what it was before (``VmHWM`` after a reset through ``/proc/self/clear_refs``), next to the
GPU state's size and the buffer. Pinned host copies are resident memory, so they show.

    python benchmarks/gpu_save_memory.py --size 8G --buffer 256M --buffer 64M
    python benchmarks/gpu_save_memory.py --cpu --size 256M   # the script's logic, no GPU

Without a GPU it exits with status 2 and says why (``--cpu`` saves CPU tensors, which are
written without host copies, to test the script itself).
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable

from benchlib import human_size, make_store, parse_size, report_figure, table
from gpu_roundtrip import NO_GPU, build_namespace, cuda_device_count, state_bytes

from jupyter_ckpt.image import capture
from jupyter_ckpt.store import CHUNK_SIZE, ImageStore

MiB = 1 << 20
# What a save holds besides its buffer (as tests/test_save_memory.py reckons it): a chunk
# per I/O thread, twice, and the interpreter's own churn.
SLACK = 2 * ImageStore.io_threads.default_value * CHUNK_SIZE + 24 * MiB


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        found = re.search(rf"^{key}:\s+(\d+) kB", f.read(), re.M)
    assert found is not None, f"no {key} in /proc/self/status"
    return int(found.group(1)) * 1024


def peak_over(run: Callable[[], None]) -> tuple[int, float]:
    """(peak RSS during ``run()`` over RSS before it, seconds)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    before = _status("VmRSS")
    started = time.perf_counter()
    run()
    return _status("VmHWM") - before, time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="8G", help="bytes of GPU state in all (8G)")
    parser.add_argument(
        "--buffer", action="append", help="ImageStore.buffer_bytes to try (256M; repeatable)"
    )
    parser.add_argument("--dir", default=None, help="scratch dir on the disk to write to")
    parser.add_argument("--cpu", action="store_true", help="test this script on the CPU")
    args = parser.parse_args(argv)
    import torch

    count = cuda_device_count(torch, "gpu_save_memory", args.cpu)
    if count is None:
        return NO_GPU
    devices = [f"cuda:{i}" for i in range(count)] or ["cpu"]
    ns = build_namespace(torch, devices, parse_size(args.size))
    nbytes = state_bytes(ns, torch)
    base = tempfile.mkdtemp(prefix="ckpt-gpu-mem-", dir=args.dir)
    rows = []
    try:
        for buffer in [parse_size(b) for b in args.buffer or ["256M"]]:
            store = make_store(tempfile.mkdtemp(dir=base))
            try:

                def save(store: ImageStore = store, buffer: int = buffer) -> None:
                    capture(dict(ns), ns, store.writer(), name="gpu", buffer_bytes=buffer)

                extra, seconds = peak_over(save)
            finally:
                store.pool.shutdown()
            report_figure(
                "gpu_save_memory",
                f"peak host RSS over the start, saving {human_size(nbytes)} of GPU state",
                extra / MiB,
                f"buffer {human_size(buffer)} + slack {human_size(SLACK)} (section 8: bounded)",
                (buffer + SLACK) / MiB,
                ("<=", 1.0),
                unit="MiB",
            )
            rows.append(
                [
                    human_size(nbytes),
                    human_size(buffer),
                    human_size(extra),
                    f"{extra / nbytes:.3f}",
                    f"{seconds:.1f}",
                ]
            )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    where = ", ".join(torch.cuda.get_device_name(i) for i in range(count)) or "CPU (--cpu)"
    print(f"\nsave of GPU state on {where}; peak host RSS during the save over RSS before it\n")
    header = ["GPU state", "buffer", "peak host RSS over", "over / state", "save s"]
    print(table(header, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
