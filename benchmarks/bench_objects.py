"""Object-heavy state (many small Python objects) through an image, against pickle.

Every contender handles the same objects in the same process, to the same disk, in
interleaved rounds (the order rotates each round); the median round is reported:

* pickle: ``pickle.dumps`` of all the variables (one tuple, protocol 5) + a write of the
  bytes to one file, fsync'd as the store fsyncs; restore: a read of the file +
  ``pickle.loads``;
* ckpt: ``jupyter_ckpt.image.capture`` into an ``ImageStore``; restore: ``store.open`` +
  ``read_segments`` + ``image.restore`` into a fresh namespace;
* ckpt-verify (with ``--verify``): ckpt whose save loads the image back before it commits
  it, as suspends and autosaves do.

Workloads: *records* is 300,000 dicts ``{'id', 'name', 'tags', 'score'}`` plus an index
dict over them (the same dicts); *tokens* is 20,000 lists of 50 short strings plus a
vocabulary dict and a graph of 50,000 small class instances linking to each other;
*unsaveable* is *records* with five variables that cannot be pickled among its two (a
lock, an open file, a generator, a profiler and an instance holding a lock), as most
real notebooks hold some: pickle gets only the picklable variables, ckpt gets them all
and must list the five as not saved.

Then peak memory (Linux): each contender saves records state of ``--memory`` pickled bytes
in a fresh subprocess; the kernel's RSS high-water mark during the save, over the RSS
before it, is printed against the pickled size.

    python benchmarks/bench_objects.py --rounds 3 --memory 256M
    python benchmarks/bench_objects.py --quick
    python benchmarks/bench_objects.py --workloads unsaveable --rounds 5 --memory 0
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pickle
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from benchlib import Timings, fsync_dir, human_size, make_store, parse_size, table, timed

from jupyter_ckpt import image

# (label, contender op, baseline op, target): ckpt time / pickle time, lower is better.
RATIOS = [
    ("save / (pickle.dumps + write)", ("ckpt", "save"), ("pickle", "save"), 1.5),
    ("restore / (read + pickle.loads)", ("ckpt", "load"), ("pickle", "load"), 1.5),
]
# With --verify: what loading the image back before the commit costs.
VERIFY_RATIO = ("verified save / save", ("ckpt-verify", "save"), ("ckpt", "save"), 2.5)
# A variable that cannot be saved may cost what trying it costs, no more.
TARGETS = {("unsaveable", "save / (pickle.dumps + write)"): 1.2}


def records(n: int) -> dict[str, Any]:
    rows = [
        {"id": i, "name": f"user-{i}", "tags": ["a", f"t{i % 97}"], "score": i * 0.25}
        for i in range(n)
    ]
    return {"rows": rows, "index": {row["id"]: row for row in rows}}


class Node:
    def __init__(self, key: int) -> None:
        self.key = key
        self.links: list[Node] = []


def tokens(n: int) -> dict[str, Any]:
    words = [f"w{i}" for i in range(5_000)]
    docs = [[words[(d * 31 + j * 7) % len(words)] for j in range(50)] for d in range(n)]
    nodes = [Node(i) for i in range(n * 5 // 2)]
    for i, node in enumerate(nodes):
        node.links = [nodes[i // 2], nodes[i // 3]]  # a shallow graph: pickle recurses
    return {"docs": docs, "vocab": {w: i for i, w in enumerate(words)}, "graph": nodes}


class Holder:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = 0


def unsaveable(n: int) -> dict[str, Any]:
    state = records(n)
    return {
        "lock": threading.Lock(),
        "rows": state["rows"],
        "log": open(os.devnull),
        "gen": (i for i in range(3)),
        "index": state["index"],
        "profiler": cProfile.Profile(),
        "holder": Holder(),
    }


UNSAVEABLE = {"lock", "log", "gen", "profiler", "holder"}
WORKLOADS: dict[str, Callable[[int], dict[str, Any]]] = {
    "records": records,
    "tokens": tokens,
    "unsaveable": unsaveable,
}
SIZES = {"records": 300_000, "tokens": 20_000, "unsaveable": 300_000}


def pickle_save(state: dict[str, Any], path: str) -> None:
    picklable = (v for k, v in state.items() if k not in UNSAVEABLE)
    data = pickle.dumps(tuple(picklable), protocol=5)
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(os.path.dirname(path))


def pickle_load(path: str) -> Any:
    with open(path, "rb") as f:
        return pickle.loads(f.read())


def ckpt_save(state: dict[str, Any], store: Any, name: str, verify: bool = False) -> dict[str, Any]:
    namespace = dict(state)
    return image.capture(namespace, namespace, store.writer(), name=name, verify=verify)


def ckpt_load(store: Any, name: str) -> dict[str, Any]:
    manifest = store.open(name)
    namespace: dict[str, Any] = {}
    report = image.restore(manifest, store.read_segments(manifest), namespace)
    assert set(report.missing) <= UNSAVEABLE, report.missing
    return namespace


def run_rounds(
    workload: str, n: int, rounds: int, where: str, timings: Timings, verify: bool = False
) -> None:
    state = WORKLOADS[workload](n)
    store = make_store(os.path.join(where, workload))
    path = os.path.join(where, f"{workload}.pickle")
    # untimed warm-up: imports and the package index capture builds once per process
    ckpt_load(store, ckpt_save(state, store, "warm")["id"])
    pickle_save(state, path)
    timings.nbytes[workload] = os.path.getsize(path)
    contenders = {
        "pickle": (lambda: pickle_save(state, path), lambda: pickle_load(path)),
        "ckpt": (lambda: ckpt_save(state, store, workload), lambda: ckpt_load(store, workload)),
    }
    if verify:
        contenders["ckpt-verify"] = (
            lambda: ckpt_save(state, store, workload, verify=True),
            lambda: ckpt_load(store, workload),
        )
    order = list(contenders)
    for r in range(rounds):
        for contender in order[r % len(order) :] + order[: r % len(order)]:
            save, load = contenders[contender]
            timings.add(workload, contender, "save", timed(save)[0])
            seconds, loaded = timed(load)
            timings.add(workload, contender, "load", seconds)
            del loaded


def peak_extra(contender: str, nbytes: int) -> dict[str, int]:
    """In a fresh process: build records state of about ``nbytes`` pickled, then save it,
    sampling RSS; the extra peak over the RSS before the save."""
    code = f"import bench_objects as b; b.memory_child({contender!r}, {nbytes})"
    here = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env, cwd=here
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        line = next(line for line in f if line.startswith(field + ":"))
    return int(line.split()[1]) * 1024


def memory_child(contender: str, nbytes: int) -> None:
    """Linux: the kernel's high-water mark of RSS (VmHWM), reset after the state is built
    (``clear_refs``), so a long C call holding the GIL cannot hide a peak from a sampler."""
    state = records(max(1, nbytes // 60))  # about 60 pickled bytes per record here
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _status("VmRSS")
    with tempfile.TemporaryDirectory() as where:
        if contender == "pickle":
            pickle_save(state, os.path.join(where, "state.pickle"))
            pickled = os.path.getsize(os.path.join(where, "state.pickle"))
        else:
            manifest = ckpt_save(state, make_store(where), "memory")
            pickled = manifest["sizes"]["logical"]
    extra = _status("VmHWM") - before
    print(json.dumps({"pickled": pickled, "extra": max(0, extra), "before": before}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies the object counts")
    parser.add_argument("--memory", type=parse_size, default=parse_size("256M"))
    parser.add_argument("--dir", default=None, help="scratch directory on the measured disk")
    parser.add_argument("--quick", action="store_true", help="1 round, 1/10 scale, 32M")
    parser.add_argument(
        "--verify", action="store_true", help="add ckpt-verify: saves loaded back first"
    )
    parser.add_argument(
        "--workloads", default=",".join(SIZES), help=f"comma separated, of {', '.join(SIZES)}"
    )
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.scale, args.memory = 1, 0.1, parse_size("32M")

    workloads = args.workloads.split(",")
    timings = Timings()
    with tempfile.TemporaryDirectory(dir=args.dir) as where:
        for workload in workloads:
            n = SIZES[workload]
            size = max(1, int(n * args.scale))
            run_rounds(workload, size, args.rounds, where, timings, args.verify)
    print(f"{args.rounds} rounds, median; warm page cache for every contender\n")
    header = ["workload", "contender", "op", "median s", "range s", "GB/s of pickle"]
    print(table(header, timings.rows()))
    print()
    rows = []
    for workload in workloads:
        for label, ours, base, target in [*RATIOS, *([VERIFY_RATIO] if args.verify else [])]:
            ratio = timings.median(workload, *ours) / timings.median(workload, *base)
            target = TARGETS.get((workload, label), target)
            rows.append([workload, label, f"{ratio:.2f}", f"<= {target}", _verdict(ratio, target)])
    print(table(["workload", "ratio", "value", "target", ""], rows))

    if not args.memory:  # --memory 0: no memory measurement
        return
    print(f"\npeak extra memory while saving records state of about {human_size(args.memory)}")
    rows = []
    for contender in ("pickle", "ckpt"):
        started = time.perf_counter()
        m = peak_extra(contender, args.memory)
        rows.append(
            [
                contender,
                human_size(m["pickled"]),
                human_size(m["before"]),
                human_size(m["extra"]),
                f"{m['extra'] / m['pickled']:.2f}",
                f"{time.perf_counter() - started:.1f}",
            ]
        )
    header = ["contender", "pickled", "RSS before", "extra peak", "extra / pickled", "s"]
    print(table(header, rows))


def _verdict(ratio: float, target: float) -> str:
    return f"{'PASS' if ratio <= target else 'MISS'}"


if __name__ == "__main__":
    main()
