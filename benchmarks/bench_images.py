"""Image save/restore against a plain write/read and dill, side by side (DESIGN section 8).

Every contender handles the same state in the same process, to the same disk, in
interleaved rounds (the order rotates each round), and the median round is reported, so a
noisy neighbour on a shared machine hits all contenders alike:

* plain: the state's bytes written sequentially to one file (fsync'd when the store
  fsyncs) and read back into fresh memory: the disk's speed, the ceiling;
* dill: ``dill.dump_module`` / ``dill.load_module`` of a module holding the state;
* ckpt: ``jupyter_ckpt.image.capture`` into an ``ImageStore`` and ``store.open`` +
  ``read_segments`` + ``image.restore`` into a fresh namespace;
* ckpt-verify (with ``--verify``): ckpt whose saves load the image back before they
  commit it (``capture(..., verify=True)``, as suspends and autosaves do);
* ckpt-aes (with ``--encryption``): the same through a store with
  ``ImageStore.encryption = "aes-256-gcm"``, against ckpt (target: 0.8x its throughput).

Reads start from a cold page cache where the machine allows it, and memory is prefaulted
before each operation (see ``benchlib.Conditions``). Then the dedupe check: change 1% of
the data (a contiguous slice of the largest array), save again into the same store, and
compare the bytes written with the logical size.

    python benchmarks/bench_images.py --sizes 256M,2G --rounds 3
    python benchmarks/bench_images.py --quick
    python benchmarks/bench_images.py --sizes 1G --no-mixed --no-dill --encryption
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import dill
import numpy as np
from benchlib import (
    GB,
    Conditions,
    Timings,
    fsync_dir,
    human_size,
    make_store,
    parse_size,
    table,
    timed,
    verdict,
)

from jupyter_ckpt.image import capture, restore
from jupyter_ckpt.store import ImageStore

# DESIGN section 8, for large-array state: (label, numerator, denominator, target). Each
# ratio is "how many times faster" (time of the slower reference / time of ckpt).
RATIOS = [
    ("save / plain write throughput", ("plain", "save"), ("ckpt", "save"), 0.8),
    ("restore / plain read throughput", ("plain", "load"), ("ckpt", "load"), 0.8),
    ("dill save time / ckpt save time", ("dill", "save"), ("ckpt", "save"), 2.5),
    ("dill load time / ckpt restore time", ("dill", "load"), ("ckpt", "load"), 8.0),
    # encryption at rest costs at most a fifth of the throughput (issue 11)
    ("encrypted / plain save throughput", ("ckpt", "save"), ("ckpt-aes", "save"), 0.8),
    ("encrypted / plain restore throughput", ("ckpt", "load"), ("ckpt-aes", "load"), 0.8),
    # loading the image back before it is committed (--verify): what the check costs
    ("save / save loaded back (verify)", ("ckpt", "save"), ("ckpt-verify", "save"), 0.8),
]
DEDUPE_TARGET = 0.05
MODULE_NAME = "ckpt_bench_state"


@dataclass
class Workload:
    """A namespace, plus the raw bytes the plain contender writes for it."""

    name: str
    namespace: dict[str, Any]
    payload: list[memoryview]
    large_array: bool  # the section 8 targets are stated for large-array state

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.payload)


def numeric_state(nbytes: int, rng: np.random.Generator) -> dict[str, Any]:
    """A few float32/float64 arrays of random values (random, so no chunk dedupes by
    accident) adding up to ``nbytes``."""
    shares: list[tuple[str, type[np.float32 | np.float64], float]]
    shares = [("weights", np.float64, 0.4), ("activations", np.float32, 0.3)]
    shares += [("grads", np.float64, 0.2), ("embeddings", np.float32, 0.1)]
    state: dict[str, Any] = {}
    for name, dtype, share in shares:
        count = int(nbytes * share) // np.dtype(dtype).itemsize // 1024 * 1024
        state[name] = rng.random(count, dtype=dtype).reshape(-1, 1024)
    return state


def mixed_state(array_bytes: int, rng: np.random.Generator) -> dict[str, Any]:
    """~200 variables: thousands of small dicts, lists and strings, plus some arrays, as a
    data-wrangling notebook holds."""
    state: dict[str, Any] = {}
    words = [f"w{i:04d}" for i in range(5000)]
    for v in range(120):
        state[f"records_{v}"] = [
            {
                "id": v * 1000 + i,
                "name": f"item-{v}-{i}",
                "score": float(rng.random()),
                "tags": [words[int(t)] for t in rng.integers(0, len(words), 4)],
            }
            for i in range(50)
        ]
    for v in range(40):
        state[f"text_{v}"] = " ".join(words[int(t)] for t in rng.integers(0, len(words), 1500))
    for v in range(20):
        state[f"index_{v}"] = {words[int(t)]: list(range(int(t) % 17)) for t in range(300)}
    for v in range(16):
        state[f"small_array_{v}"] = rng.random(1 << (10 + v % 8))
    big = max(array_bytes // 4 // 8, 1024)
    for v in range(4):
        state[f"array_{v}"] = rng.random(big)
    return state


def image_payload(namespace: dict[str, Any], where: str) -> list[memoryview]:
    """The bytes an image of ``namespace`` holds (what a plain write of it must write)."""
    store = make_store(where, fsync=False)
    try:
        manifest = capture(dict(namespace), namespace, store.writer(), name="payload")
        return list(store.read_segments(manifest))  # segments are read on first use
    finally:
        store.pool.shutdown()
        shutil.rmtree(where)


def same(a: Any, b: Any) -> bool:
    """Deep equality that treats arrays by value."""
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(same, a, b))
    return bool(a == b)


class Contender:
    """Saves a workload under a directory and loads it back; subclasses say how."""

    name = ""

    def __init__(self, fsync: bool) -> None:
        self.fsync = fsync

    def save(self, work: Workload, where: str) -> Any:
        raise NotImplementedError

    def load(self, work: Workload, where: str) -> dict[str, Any] | None:
        """The restored namespace, or None where there is none to compare (plain)."""
        raise NotImplementedError

    def close(self, where: str) -> None:
        """Let go of anything kept open for ``where`` before it is removed."""

    @contextlib.contextmanager
    def scratch(self, base: str, prefix: str = "") -> Iterator[str]:
        """A fresh directory under ``base`` for one save and load, removed afterwards."""
        where = tempfile.mkdtemp(prefix=f"{prefix or self.name}-", dir=base)
        try:
            yield where
        finally:
            self.close(where)
            shutil.rmtree(where)

    def _write(self, path: str, fill: Callable[[int], None]) -> None:
        """Create ``path``, let ``fill`` write to the fd, fsync as the store does."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            fill(fd)
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        if self.fsync:
            fsync_dir(os.path.dirname(path))


class Plain(Contender):
    name = "plain"

    def save(self, work: Workload, where: str) -> None:
        def fill(fd: int) -> None:
            for buffer in work.payload:
                view = buffer.cast("B")
                while view:
                    view = view[os.write(fd, view) :]

        self._write(os.path.join(where, "plain.bin"), fill)

    def load(self, work: Workload, where: str) -> None:
        out = np.empty(work.nbytes, dtype=np.uint8).data
        with open(os.path.join(where, "plain.bin"), "rb", buffering=0) as f:
            done = 0
            while done < len(out):
                n = f.readinto(out[done:])
                if not n:
                    raise RuntimeError("plain file is short")
                done += n


class Dill(Contender):
    name = "dill"

    def save(self, work: Workload, where: str) -> None:
        module = types.ModuleType(MODULE_NAME)
        module.__dict__.update(work.namespace)
        sys.modules[MODULE_NAME] = module  # dill saves a module it can import again
        try:
            path = os.path.join(where, "state.dill")
            self._write(path, lambda fd: dill.dump_module(_FdFile(fd), module=module))
        finally:
            del sys.modules[MODULE_NAME]

    def load(self, work: Workload, where: str) -> dict[str, Any]:
        fresh = types.ModuleType(MODULE_NAME)
        sys.modules[MODULE_NAME] = fresh  # load_module updates the importable module
        try:
            with open(os.path.join(where, "state.dill"), "rb") as f:
                dill.load_module(f)
        finally:
            del sys.modules[MODULE_NAME]
        return {k: v for k, v in vars(fresh).items() if not k.startswith("__")}


class _FdFile:
    """A write-only file object over an fd, so dill writes where ``_write`` fsyncs."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        total = len(view)
        while view:
            view = view[os.write(self.fd, view) :]
        return total


class Ckpt(Contender):
    def __init__(
        self, fsync: bool, name: str = "ckpt", verify: bool = False, **store_options: Any
    ) -> None:
        super().__init__(fsync)
        self.name = name
        self.verify = verify
        self.store_options = store_options
        self.stores: dict[str, ImageStore] = {}

    def store(self, where: str) -> ImageStore:
        if where not in self.stores:
            self.stores[where] = make_store(where, self.fsync, **self.store_options)
        return self.stores[where]

    def close(self, where: str) -> None:
        store = self.stores.pop(where, None)
        if store is not None:
            store.pool.shutdown()

    def save(self, work: Workload, where: str) -> dict[str, Any]:
        ns = work.namespace
        writer = self.store(where).writer()
        return capture(dict(ns), ns, writer, name=work.name, verify=self.verify)

    def load(self, work: Workload, where: str) -> dict[str, Any]:
        store = self.store(where)
        manifest = store.open(work.name)
        namespace: dict[str, Any] = {}
        report = restore(manifest, store.read_segments(manifest), namespace)
        if report.missing:
            raise RuntimeError(f"restore lost variables: {report.missing}")
        return namespace


def run_rounds(
    workloads: list[Workload],
    contenders: list[Contender],
    rounds: int,
    base: str,
    memory: Conditions,
) -> Timings:
    timings = Timings()
    for work in workloads:
        timings.nbytes[work.name] = work.nbytes
    for r in range(rounds):
        order = contenders[r % len(contenders) :] + contenders[: r % len(contenders)]
        for work in workloads:
            for contender in order:
                with contender.scratch(base) as where:
                    seconds, _ = timed(
                        lambda: contender.save(work, where),  # noqa: B023
                        lambda: memory.ready(work.nbytes),  # noqa: B023
                    )
                    timings.add(work.name, contender.name, "save", seconds)
                    seconds, back = timed(
                        lambda: contender.load(work, where),  # noqa: B023
                        lambda: memory.ready(work.nbytes, evict=[where]),  # noqa: B023
                    )
                    timings.add(work.name, contender.name, "load", seconds)
                    if r == 0 and back is not None and not same(work.namespace, back):
                        raise AssertionError(f"{contender.name} did not restore {work.name}")
                    del back
                print(f"  round {r + 1}/{rounds} {work.name:>12} {contender.name:>5} done")
    return timings


def warm_up(contenders: list[Contender], base: str, rng: np.random.Generator) -> None:
    """One untimed save and load per contender: imports and one-time caches (the package
    index capture builds on its first save) are paid before the clock runs, as in a
    kernel that has saved once."""
    warm = rng.random(1 << 17)
    work = Workload("warm-up", {"warm": warm, "meta": {"k": [1, 2, 3]}}, [warm.data], False)
    for contender in contenders:
        with contender.scratch(base, "warm-up") as where:
            contender.save(work, where)
            contender.load(work, where)


def dedupe_check(work: Workload, ckpt: Ckpt, base: str, memory: Conditions) -> list[str]:
    """Save, change 1% of the data in place (a contiguous slice of the largest array), save
    again; the second save must write under 5% of the logical bytes."""
    with ckpt.scratch(base, "dedupe") as where:
        ckpt.save(work, where)
        arrays = [v for v in work.namespace.values() if isinstance(v, np.ndarray)]
        target = max(arrays, key=lambda a: a.nbytes).reshape(-1)  # a view: contiguous
        count = min(int(work.nbytes * 0.01) // target.itemsize, target.size)
        start = target.size // 3
        saved = target[start : start + count].copy()
        target[start : start + count] += 1
        try:
            seconds, manifest = timed(lambda: ckpt.save(work, where), lambda: memory.ready(0))
        finally:
            target[start : start + count] = saved
    sizes = manifest["sizes"]
    share = sizes["written"] / sizes["logical"]
    return [
        work.name if ckpt.name == "ckpt" else f"{work.name} ({ckpt.name})",
        human_size(count * target.itemsize),
        human_size(sizes["written"]),
        human_size(sizes["logical"]),
        f"{share:.2%}",
        f"{seconds:.3f}",
        "PASS" if share < DEDUPE_TARGET else "MISS",
    ]


def ratio_rows(timings: Timings, workloads: list[Workload]) -> list[list[str]]:
    rows = []
    for work in workloads:
        for label, slow, fast, target in RATIOS:
            if not (timings.has(work.name, *slow) and timings.has(work.name, *fast)):
                continue  # a contender left out of this run
            value = timings.median(work.name, *slow) / timings.median(work.name, *fast)
            goal = target if work.large_array else None
            rows.append([work.name, label, f"{value:.2f}", f">= {target}", verdict(value, goal)])
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="256M,2G", help="numeric state sizes (256M,2G)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median)")
    parser.add_argument("--mixed-arrays", default="64M", help="array bytes in the mixed state")
    parser.add_argument("--no-mixed", action="store_true", help="skip the mixed namespace")
    parser.add_argument("--no-dill", action="store_true", help="leave dill out")
    parser.add_argument(
        "--encryption",
        action="store_true",
        help="add ckpt-aes: the store with ImageStore.encryption = aes-256-gcm",
    )
    parser.add_argument("--quick", action="store_true", help="64M, 1 round, 16M mixed arrays")
    parser.add_argument(
        "--verify", action="store_true", help="add ckpt-verify: saves loaded back before commit"
    )
    parser.add_argument(
        "--dir",
        default=None,
        help="scratch directory on the disk to measure (default: the system temp dir)",
    )
    parser.add_argument("--io-threads", type=int, default=None, help="ImageStore.io_threads")
    parser.add_argument(
        "--no-direct-io", action="store_true", help="ImageStore.direct_io = False (buffered reads)"
    )
    parser.add_argument("--warm", action="store_true", help="do not evict the page cache")
    parser.add_argument(
        "--prefault",
        type=float,
        default=2.0,
        help="touch this many times the state's bytes before each operation (0: off)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.rounds, args.mixed_arrays = "64M", 1, "16M"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    fsync = bool(ImageStore.fsync.default_value)  # plain and dill sync exactly as the store
    base = tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.dir)
    memory = Conditions(evict=not args.warm, prefault_factor=args.prefault)
    rng = np.random.default_rng(0)
    try:
        print(f"scratch dir {base}; fsync={fsync}; cpus={os.cpu_count()}")
        workloads = []
        for size in args.sizes.split(","):
            state = numeric_state(parse_size(size), rng)
            payload = [memoryview(a) for a in state.values()]
            workloads.append(Workload(f"numeric-{size}", state, payload, True))
        if not args.no_mixed:
            state = mixed_state(parse_size(args.mixed_arrays), rng)
            payload = image_payload(state, tempfile.mkdtemp(prefix="payload-", dir=base))
            workloads.append(Workload("mixed", state, payload, False))
        for work in workloads:
            print(f"{work.name}: {len(work.namespace)} variables, {human_size(work.nbytes)}")
        direct_io = False if args.no_direct_io else None  # None: the store's default
        options = {"io_threads": args.io_threads, "direct_io": direct_io}
        ckpts = [Ckpt(fsync, **options)]
        if args.encryption:
            ckpts.append(Ckpt(fsync, "ckpt-aes", encryption="aes-256-gcm", **options))
        contenders: list[Contender] = [Plain(fsync), *([] if args.no_dill else [Dill(fsync)])]
        contenders += ckpts
        if args.verify:
            contenders.append(Ckpt(fsync, "ckpt-verify", verify=True, **options))
        warm_up(contenders, base, rng)
        timings = run_rounds(workloads, contenders, args.rounds, base, memory)
        dedupe = [dedupe_check(w, c, base, memory) for c in ckpts for w in workloads]
    finally:
        shutil.rmtree(base, ignore_errors=True)

    print(f"\nrounds: {args.rounds} (median reported); {memory.describe()}\n")
    header = ["workload", "contender", "op", "median s", "range s", "GB/s"]
    print(table(header, timings.rows()))
    print()
    header = ["workload", "ratio (higher is better)", "measured", "target", "verdict"]
    print(table(header, ratio_rows(timings, workloads)))
    print()
    header = ["workload", "changed", "written", "logical", "written/logical", "save s", "< 5%"]
    print(table(header, dedupe))
    print(f"\n(GB = {GB:.0e} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
