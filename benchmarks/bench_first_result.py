"""Time to first result after a suspend, where the user waits (DESIGN section 8).

Through a real jupyter server with the extension: a kernel holding SIZE of numpy arrays
is suspended through the server's API, the page cache is dropped, and a cell is sent on
the suspended kernel's websocket, as a notebook sends it when the user clicks Run. The
user's wait is from that ``execute_request`` to its ``execute_reply``. Two cells, one
after the other:

- first result: ``print(1 + 1)``, touching none of the arrays: the hand-over itself;
- touch all: a sum over every array right after it, which must read the whole state.

Against, in the same run and with the page cache dropped the same way before each:

- fresh kernel: a new kernel's first reply, from POST /api/kernels to the reply of
  ``print(1 + 1)`` on a new websocket;
- plain read: the image's chunk files read sequentially into memory.

The baseline is fresh kernel + plain read; ``first result / baseline`` must be at most
1.0, and with mapped buffers ``first result / fresh kernel`` at most 2.0 whatever the
size. The touching cell is reported against the plain read (the disk's speed).

The server's restore event carries the hand-over's timeline; it is printed per round.
The page cache is dropped with /proc/sys/vm/drop_caches where permitted (root), else the
store's files and the Python environment's files are evicted for every contender alike.

    python benchmarks/bench_first_result.py --size 1G --rounds 3
    python benchmarks/bench_first_result.py --size 1G --rounds 3 --no-map   # read, not mapped
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from benchlib import GB, Conditions, human_size, parse_size, table
from benchserver import Server

SETUP = """
import numpy as np
arrays = [np.random.default_rng(i).random({size} // 4 // 8) for i in range(4)]
print(float(sum(a.sum() for a in arrays)))
"""
FIRST = "print(1 + 1)"
TOUCH = "print(float(sum(a.sum() for a in arrays)))"


def plain_read(files: list[Path]) -> int:
    """Read every file into fresh memory, as a restore must at the least."""
    total = 0
    for file in files:
        total += len(file.read_bytes())
    return total


def python_files() -> list[str]:
    """Where the kernels' and the server's Python modules are read from: evicted too
    where the page cache cannot be dropped, so no contender starts Python warm."""
    paths = {sys.prefix, sysconfig.get_paths()["stdlib"]}
    return sorted(p for p in paths if os.path.isdir(p))


async def one_round(server: Server, size: int, store: Path, conditions: Conditions) -> dict:
    evict = [str(store), *python_files()]
    kernel_id = (await server.api("POST", "kernels", {"name": "python3"}))["id"]
    ws = await server.connect(kernel_id)
    _, out = await server.execute(ws, SETUP.format(size=size))
    ws.close()
    checksum = float(out.split()[-1])
    while (await server.api("GET", f"kernels/{kernel_id}"))["execution_state"] != "idle":
        await asyncio.sleep(0.05)  # the server sees the kernel idle a moment after we do
    image = await server.api("POST", f"ckpt/kernels/{kernel_id}/suspend", {})
    chunks = sorted(p for p in store.rglob("chunks/*/*") if p.is_file())

    # the user comes back: the page cache holds nothing of the kernel, nor of Python
    conditions.ready(0, evict)
    ws = await server.connect(kernel_id)
    first, out = await server.execute(ws, FIRST)
    assert out.strip() == "2", out
    touch, out = await server.execute(ws, TOUCH)
    assert abs(float(out.split()[-1]) - checksum) <= 1e-9 * abs(checksum), "state changed"
    ws.close()
    event = await server.restore_event(kernel_id)

    conditions.ready(0, evict)
    started = time.perf_counter()
    fresh = (await server.api("POST", "kernels", {"name": "python3"}))["id"]
    ws = await server.connect(fresh)
    await server.execute(ws, FIRST)
    fresh_kernel = time.perf_counter() - started
    ws.close()

    conditions.ready(size, evict)
    started = time.perf_counter()
    nbytes = plain_read(chunks)
    read = time.perf_counter() - started

    for k in (kernel_id, fresh):
        await server.api("DELETE", f"kernels/{k}")
    await server.api("DELETE", f"ckpt/images/{image['id']}")
    return {
        "first result": first,
        "touch all (after it)": touch,
        "fresh kernel": fresh_kernel,
        "plain read": read,
        "bytes": nbytes,
        "mapped": event.get("mapped_bytes", 0),
        "timeline": event.get("timeline", []),
    }


async def run(size: int, rounds: int, tmp: Path, map_buffers: bool, standby: bool) -> None:
    server = Server(
        tmp,
        "c.SuspendPolicy.autosave_interval = 0\n"
        f"c.ImageStore.map_buffers = {map_buffers}\nc.CkptManager.standby_kernel = {standby}\n",
    )
    conditions = Conditions(prefault_factor=1.0)
    results = []
    try:
        await server.wait_ready()
        for i in range(rounds):
            results.append(await one_round(server, size, tmp / "store", conditions))
            print(
                f"round {i + 1}: first result {results[-1]['first result']:.3f} s, fresh "
                f"kernel {results[-1]['fresh kernel']:.3f} s; hand-over timeline (server's "
                "restore event):"
            )
            steps = [
                (t["step"], f"{t['at']:.3f}", f"{t['seconds']:.3f}")
                for t in results[-1]["timeline"]
            ]
            print(table(("step", "ends at s", "took s"), steps))
    finally:
        server.stop()
    parts = ("first result", "touch all (after it)", "fresh kernel", "plain read")
    median = {k: statistics.median(r[k] for r in results) for k in (*parts, "bytes")}
    baseline = median["fresh kernel"] + median["plain read"]
    mapped = statistics.median(r["mapped"] for r in results)
    print()
    print(
        f"state {human_size(size)} of numpy arrays ({human_size(median['bytes'])} in chunks, "
        f"{human_size(mapped)} mapped); {rounds} rounds (median); map_buffers={map_buffers}, "
        f"standby_kernel={standby}"
    )
    print(conditions.describe())
    rows = [
        (
            name,
            f"{median[name]:.3f}",
            f"{min(r[name] for r in results):.3f}-{max(r[name] for r in results):.3f}",
        )
        for name in parts
    ]
    print(table(("part", "median s", "range s"), rows))
    print(f"plain read: {median['bytes'] / median['plain read'] / GB:.2f} GB/s")
    print(
        f"first result / (fresh kernel + plain read) = {median['first result'] / baseline:.2f}"
        " (goal: at most 1.00)"
    )
    print(
        f"first result / fresh kernel = {median['first result'] / median['fresh kernel']:.2f}"
        " (goal with mapped buffers: at most 2.00, whatever the size)"
    )
    print(
        f"touch all / plain read = {median['touch all (after it)'] / median['plain read']:.2f}"
        " (the cell reads and sums the whole state; 1.00 is the disk's speed)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=parse_size, default=parse_size("1G"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None, help="scratch dir on the disk to measure")
    parser.add_argument(
        "--no-map", action="store_true", help="ImageStore.map_buffers = False: read the state"
    )
    parser.add_argument(
        "--no-standby",
        action="store_true",
        help="CkptManager.standby_kernel = False: the restore starts its kernel",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        asyncio.run(run(args.size, args.rounds, Path(tmp), not args.no_map, not args.no_standby))


if __name__ == "__main__":
    main()
