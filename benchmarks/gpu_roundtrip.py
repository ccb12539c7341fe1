"""GPU state through an image and back, on a real NVIDIA GPU (DESIGN sections 3 and 8).

Puts a few GB of CUDA tensors in a namespace (float32, float16, bfloat16, int64, a view
sharing its base's storage, an ``nn.Module`` with an optimizer that has stepped), saves
it with ``capture``, restores it into a fresh namespace, and checks that every value is
equal, on the same device (device indices are kept when there are several GPUs), and that
sharing survived (the view and its base, the model and its optimizer). Save and restore
throughput are printed next to the host<->device copy bandwidth of pinned memory measured
in the same run, the ceiling for moving these bytes across the bus. The time from the end
of the save to the GPU memory being free again is printed too.

    python benchmarks/gpu_roundtrip.py --size 4G --rounds 3
    python benchmarks/gpu_roundtrip.py --cpu --size 64M   # the script's logic, no GPU

Without a GPU it exits with status 2 and says why (``--cpu`` runs the same checks with
CPU tensors, to test the script itself; it prints no GPU numbers).
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from benchlib import (
    Conditions,
    Timings,
    human_size,
    make_store,
    parse_size,
    report_check,
    report_figure,
    table,
    timed,
)

from jupyter_ckpt.image import capture, restore

DTYPES = ("float32", "float16", "bfloat16", "int64")
WORKLOAD = "gpu"
NO_GPU = 2  # exit status when there is no GPU to measure


def build_namespace(torch: Any, devices: list[str], nbytes: int) -> dict[str, Any]:
    """Tensors of several dtypes spread over ``devices``, a view sharing a storage, and a
    model with its optimizer; about ``nbytes`` in all."""
    ns: dict[str, Any] = {}
    torch.manual_seed(0)  # made on the device: fast, and random, so no chunk dedupes
    per_tensor = nbytes // (len(DTYPES) * len(devices) + 1)
    for d, device in enumerate(devices):
        for name in DTYPES:
            dtype = getattr(torch, name)
            count = per_tensor // torch.empty(0, dtype=dtype).element_size()
            if dtype.is_floating_point:
                ns[f"t_{name}_{d}"] = torch.randn(count, device=device).to(dtype)
            else:
                ns[f"t_{name}_{d}"] = torch.randint(-(2**40), 2**40, (count,), device=device)
    base = torch.randn(per_tensor // 4 // 256 * 256 + 1024, device=devices[-1])
    ns["base"] = base
    ns["view"] = base[1024:].view(-1, 256)[::2]  # strided view into the same storage
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256)
    ).to(devices[0])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(64, 1024, device=devices[0])).square().mean().backward()
    optimizer.step()  # the optimizer now holds state tensors on the GPU
    ns["model"], ns["optimizer"] = model, optimizer
    return ns


def tensors_of(value: Any, torch: Any) -> dict[str, Any]:
    """Every tensor a namespace value holds, by a stable name."""
    if isinstance(value, torch.Tensor):
        return {"": value}
    if isinstance(value, torch.nn.Module):
        return dict(value.state_dict(keep_vars=True))
    if isinstance(value, torch.optim.Optimizer):
        found = {}
        for i, state in enumerate(value.state.values()):
            found.update({f"{i}.{k}": v for k, v in state.items() if torch.is_tensor(v)})
        return found
    return {}


def check(original: dict[str, Any], restored: dict[str, Any], torch: Any) -> list[str]:
    """What differs between the two namespaces (empty when the round trip is exact)."""
    problems = []
    for name, value in original.items():
        if name not in restored:
            problems.append(f"{name}: not restored")
            continue
        before, after = tensors_of(value, torch), tensors_of(restored[name], torch)
        if before.keys() != after.keys():
            problems.append(f"{name}: tensors {sorted(before)} became {sorted(after)}")
            continue
        for key, tensor in before.items():
            back = after[key]
            where = f"{name}{'.' + key if key else ''}"
            if back.device != tensor.device:
                problems.append(f"{where}: on {back.device}, saved on {tensor.device}")
            elif back.dtype != tensor.dtype or not torch.equal(back, tensor):
                problems.append(f"{where}: values or dtype differ")
    if restored["view"].untyped_storage().data_ptr() != (
        restored["base"].untyped_storage().data_ptr()
    ):
        problems.append("view: no longer shares its storage with base")
    params = list(restored["model"].parameters())
    grouped = restored["optimizer"].param_groups[0]["params"]
    if len(params) != len(grouped) or any(p is not q for p, q in zip(params, grouped, strict=True)):
        problems.append("optimizer: its params are no longer the model's parameters")
    return problems


def state_bytes(ns: dict[str, Any], torch: Any) -> int:
    """Bytes of distinct storages: a view adds nothing, as in the image."""
    seen: dict[tuple[str, int], int] = {}
    for value in ns.values():
        for tensor in tensors_of(value, torch).values():
            storage = tensor.untyped_storage()
            seen[str(tensor.device), storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def synchronize(torch: Any, count: int) -> None:
    """Wait for every GPU (``torch.cuda.synchronize()`` alone waits for the current one)."""
    for i in range(count):
        torch.cuda.synchronize(i)


def measure_copies(torch: Any, device: str, nbytes: int, timings: Timings) -> None:
    """Pinned host->device and device->host copies of ``nbytes``: the bus's ceiling."""
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)

    def copy(dst: Any, src: Any) -> Callable[[], None]:
        def run() -> None:
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize(device)

        return run

    copy(dev, host)()  # first use sets up the copy engines
    for label, dst, src in (("host->device", dev, host), ("device->host", host, dev)):
        timings.add(WORKLOAD, "pinned copy", label, timed(copy(dst, src))[0])
    del host, dev
    torch.cuda.empty_cache()


def measure_release(torch: Any, ns: dict[str, Any], count: int, timings: Timings) -> None:
    """Drop the saved namespace and time until the CUDA caching allocator holds nothing,
    the last step of a suspend (within the process; a shut-down kernel frees it all)."""

    def release() -> None:
        ns.clear()
        gc.collect()
        synchronize(torch, count)
        torch.cuda.empty_cache()

    timings.add(f"{WORKLOAD} (free)", "ckpt", "release GPU memory", timed(release)[0])
    left = torch.cuda.memory_reserved()
    if left:
        print(f"warning: {human_size(left)} still reserved after release")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="4G", help="bytes of GPU state in all (4G)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (median reported)")
    parser.add_argument("--dir", default=None, help="scratch dir on the disk to measure")
    parser.add_argument("--cpu", action="store_true", help="test this script on the CPU")
    return parser.parse_args(argv)


def cuda_device_count(torch: Any, script: str, cpu: bool) -> int | None:
    """The CUDA devices to measure (0 with --cpu); None, after saying why, without any."""
    if not cpu and not torch.cuda.is_available():
        print(
            f"{script} needs an NVIDIA GPU: torch {torch.__version__} "
            f"(CUDA build {torch.version.cuda or 'none'}) sees no CUDA device. "
            "Run it on a GPU node, or pass --cpu to test the script itself.",
            file=sys.stderr,
        )
        return None
    return 0 if cpu else torch.cuda.device_count()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    count = cuda_device_count(torch, "gpu_roundtrip", args.cpu)
    if count is None:
        return NO_GPU
    devices = [f"cuda:{i}" for i in range(count)] or ["cpu"]
    size = parse_size(args.size)
    base = tempfile.mkdtemp(prefix="ckpt-gpu-", dir=args.dir)
    conditions = Conditions(prefault_factor=0)  # page cache only: this is about the GPU
    timings = Timings()
    try:
        for i in range(count):
            print(f"cuda:{i}: {torch.cuda.get_device_name(i)}")
        for r in range(args.rounds):
            ns = build_namespace(torch, devices, size)
            timings.nbytes[WORKLOAD] = state_bytes(ns, torch)
            where = tempfile.mkdtemp(dir=base)
            try:
                if not round_trip(torch, ns, where, count, timings, conditions, check_it=r == 0):
                    return 1
            finally:
                shutil.rmtree(where)
            if count:
                measure_release(torch, ns, count, timings)
                measure_copies(torch, devices[0], timings.nbytes[WORKLOAD], timings)
    finally:
        shutil.rmtree(base, ignore_errors=True)

    print(f"\nrounds: {args.rounds} (median reported); {conditions.describe()}\n")
    print(table(["workload", "contender", "op", "median s", "range s", "GB/s"], timings.rows()))
    if not count:
        print("\n(--cpu: the script's logic is checked; without a GPU there are no GPU numbers)")
        return 0
    median = functools.partial(timings.median, WORKLOAD)
    rows = [
        [f"{op} / pinned {copy} copy", f"{median('pinned copy', copy) / median('ckpt', op):.2f}"]
        for op, copy in (("save", "device->host"), ("restore", "host->device"))
    ]
    state = human_size(timings.nbytes[WORKLOAD])
    # section 8 sets these against the bus with no number: for information
    for op, copy in (("save", "device->host"), ("restore", "host->device")):
        report_figure(
            "gpu_roundtrip",
            f"{op} of {state} of GPU state (disk included)",
            median("ckpt", op),
            f"pinned {copy} copy of the same bytes",
            median("pinned copy", copy),
        )
    print()
    print(table(["throughput ratio (1.0 = at the bus's speed)", "measured"], rows))
    return 0


def round_trip(
    torch: Any,
    ns: dict[str, Any],
    where: str,
    count: int,
    timings: Timings,
    conditions: Conditions,
    check_it: bool,
) -> bool:
    """Save ``ns`` and restore it, timed; on ``check_it``, False if anything differs."""
    store = make_store(where)
    restored: dict[str, Any] = {}

    def load() -> None:
        manifest = store.open("gpu")
        restore(manifest, store.read_segments(manifest), restored)
        synchronize(torch, count)

    try:
        seconds, _ = timed(lambda: capture(dict(ns), ns, store.writer(), name="gpu"), os.sync)
        timings.add(WORKLOAD, "ckpt", "save", seconds)
        seconds, _ = timed(load, lambda: conditions.ready(0, evict=[where]))
        timings.add(WORKLOAD, "ckpt", "restore", seconds)
    finally:
        store.pool.shutdown()
    if not check_it:
        return True
    problems = check(ns, restored, torch)
    report_check("gpu_roundtrip", "round trip exact: values, devices, sharing", not problems)
    if problems:
        print("ROUND TRIP FAILED:\n  " + "\n  ".join(problems), file=sys.stderr)
        return False
    devices = sorted({str(t.device) for v in ns.values() for t in tensors_of(v, torch).values()})
    print(f"round trip exact on {', '.join(devices)}: values, devices, sharing")
    return True


if __name__ == "__main__":
    sys.exit(main())
