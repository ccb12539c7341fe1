"""Time to first result after a suspend, through a real jupyter server (DESIGN section 8).

A kernel holding SIZE of numpy arrays is suspended through the server's API; then a cell
runs on it over a fresh websocket, which restores the kernel: the time from sending that
cell to its reply is the user's wait. It is split into its parts, each measured in the
same run on fresh kernels of the same server:

- kernel start: a new kernel's first cell (``pass``), from POST /api/kernels to the reply;
- imports: ``import numpy, jupyter_ckpt.kernel`` in that fresh kernel;
- read + unpickle: ``jupyter_ckpt.kernel.restore(image)`` in another fresh kernel, page
  cache evicted first;
- plain read: the image's chunk files read sequentially into memory, page cache evicted.

The baseline is a fresh kernel start plus a plain read of the same bytes: the least any
restore of this state can cost. The ratio printed is the first result's time over it.

    python benchmarks/bench_first_result.py --size 1G --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from benchlib import GB, Conditions, human_size, parse_size, table, timed
from gpu_suspend import Server

SETUP = """
import numpy as np
arrays = [np.random.default_rng(i).random({size} // 4 // 8) for i in range(4)]
print(float(sum(a.sum() for a in arrays)))
"""
CHECK = "print(float(sum(a.sum() for a in arrays)))"
IMPORTS = """
import time
_t = time.perf_counter()
import numpy, jupyter_ckpt.kernel
print(time.perf_counter() - _t)
"""
RESTORE = """
import json, time, jupyter_ckpt.kernel
_t = time.perf_counter()
_r = jupyter_ckpt.kernel.restore({image!r})
print(json.dumps({{"seconds": time.perf_counter() - _t, "missing": _r.get("missing")}}))
"""


def plain_read(files: list[Path]) -> int:
    """Read every file into fresh memory, as a restore must at the least."""
    total = 0
    for file in files:
        total += len(file.read_bytes())
    return total


async def one_round(server: Server, size: int, store: Path, conditions: Conditions) -> dict:
    new_kernel = {"name": "python3"}
    kernel_id = (await server.api("POST", "kernels", new_kernel))["id"]
    _, out = await server.execute(kernel_id, SETUP.format(size=size))
    checksum = float(out.split()[-1])
    image = await server.api("POST", f"ckpt/kernels/{kernel_id}/suspend", {})
    chunks = sorted(p for p in store.rglob("chunks/*/*") if p.is_file())

    conditions.ready(image["bytes"], evict=[str(store)])
    first, out = await server.execute(kernel_id, CHECK)
    assert abs(float(out.split()[-1]) - checksum) <= 1e-9 * abs(checksum), "state changed"

    started = time.perf_counter()
    fresh = (await server.api("POST", "kernels", new_kernel))["id"]
    await server.execute(fresh, "pass")
    kernel_start = time.perf_counter() - started
    _, out = await server.execute(fresh, IMPORTS)
    imports = float(out.split()[-1])

    other = (await server.api("POST", "kernels", new_kernel))["id"]
    await server.execute(other, "pass")
    conditions.ready(image["bytes"], evict=[str(store)])
    _, out = await server.execute(other, RESTORE.format(image=image["id"]))
    restored = json.loads(out.strip().splitlines()[-1])
    assert not restored["missing"], restored

    read, nbytes = timed(lambda: plain_read(chunks), lambda: conditions.ready(0, [str(store)]))
    for k in (kernel_id, fresh, other):
        await server.api("DELETE", f"kernels/{k}")
    return {
        "first result": first,
        "kernel start": kernel_start,
        "imports": imports,
        "read + unpickle": restored["seconds"],
        "plain read": read,
        "bytes": nbytes,
    }


async def run(size: int, rounds: int, tmp: Path) -> None:
    server = Server(tmp, "cpu")
    conditions = Conditions()
    try:
        await server.wait_ready()
        results = [await one_round(server, size, tmp / "store", conditions) for _ in range(rounds)]
    finally:
        server.stop()
    median = {k: statistics.median(r[k] for r in results) for k in results[0]}
    baseline = median["kernel start"] + median["plain read"]
    print(f"state {human_size(size)} of numpy arrays; {rounds} rounds (median)")
    print(conditions.describe())
    rows = [
        (
            name,
            f"{median[name]:.3f}",
            f"{min(r[name] for r in results):.3f}-{max(r[name] for r in results):.3f}",
        )
        for name in ("first result", "kernel start", "imports", "read + unpickle", "plain read")
    ]
    print(table(("part", "median s", "range s"), rows))
    overhead = median["first result"] - median["kernel start"] - median["read + unpickle"]
    print(f"plain read: {median['bytes'] / median['plain read'] / GB:.2f} GB/s")
    print(f"first result - kernel start - read + unpickle (server, hand-over): {overhead:.3f} s")
    print(
        f"first result / (fresh kernel start + plain read) = "
        f"{median['first result'] / baseline:.2f} (1.00 would be the least possible)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=parse_size, default=parse_size("1G"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None, help="scratch dir on the disk to measure")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        asyncio.run(run(args.size, args.rounds, Path(tmp)))


if __name__ == "__main__":
    main()
