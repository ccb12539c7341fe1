"""Helpers shared by the benchmark scripts: sizes, timing, page-cache control, tables.

They live here so every script measures and reports the same way (same clock, same GB,
same table layout), and a number in one table can be compared with one in another.
"""

from __future__ import annotations

import gc
import json
import os
import re
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

GB = 1e9  # throughput is reported in decimal GB/s, as disks and PCIe are rated
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """'256M' -> 268435456: binary units, so sizes match what the arrays allocate."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not match:
        raise ValueError(f"not a size: {text!r} (use e.g. 256M or 2G)")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def human_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def timed(fn: Callable[[], T], prepare: Callable[[], None] | None = None) -> tuple[float, T]:
    """Seconds one call takes; ``prepare`` (cache eviction, syncs) runs outside the clock.

    A full collection first, so a collection owed by the previous contender is not
    billed to this one.
    """
    if prepare is not None:
        prepare()
    gc.collect()
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


class Conditions:
    """Puts the machine in the same state before every timed operation.

    * page cache: reads should measure the disk, not memory. The global ``drop_caches``
      is tried first (it needs root and a writable /proc/sys, which many containers lack);
      failing that, the files under the given paths are evicted with
      ``posix_fadvise(DONTNEED)``, which any owner may do for clean pages;
    * memory: in a VM the host may take back guest memory a process freed and fault it in
      again, far below memory speed, on the next first touch. Whichever contender
      allocated at the wrong moment would pay for it. Touching the memory the operation
      will allocate just before the clock starts gives every contender the same footing.

    ``describe()`` says which of these worked, for the report.
    """

    def __init__(self, evict: bool = True, prefault_factor: float = 2.0) -> None:
        self.evict_enabled = evict
        self.prefault_factor = prefault_factor
        self.cache_mode = "warm (eviction disabled)" if not evict else "not evicted yet"

    def ready(self, nbytes: int, evict: Iterable[str] = ()) -> None:
        """Sync, evict ``evict`` (paths) from the page cache, and prefault memory."""
        os.sync()  # dirty pages cannot be dropped, and a neighbour's flush is not ours
        if self.evict_enabled and evict:
            self._evict(evict)
        if self.prefault_factor > 0 and nbytes:
            prefault(int(nbytes * self.prefault_factor) + (64 << 20))

    def describe(self) -> str:
        memory = (
            f"{self.prefault_factor:g}x the state prefaulted before each operation"
            if self.prefault_factor > 0
            else "memory not prefaulted"
        )
        return f"page cache: {self.cache_mode}; {memory}"

    def _evict(self, paths: Iterable[str]) -> None:
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
            self.cache_mode = "cold (drop_caches before every read)"
            return
        except OSError:
            pass
        if not hasattr(os, "posix_fadvise"):
            self.cache_mode = "warm (no drop_caches, no posix_fadvise): alike for all"
            return
        for path in paths:
            for file in _files(path):
                try:
                    fd = os.open(file, os.O_RDONLY)
                except OSError:
                    continue
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
        self.cache_mode = "cold (posix_fadvise DONTNEED of the files before every read)"


def _files(path: str) -> Iterable[str]:
    if os.path.isfile(path):
        yield path
        return
    for dirpath, _dirs, names in os.walk(path):
        for name in names:
            yield os.path.join(dirpath, name)


def prefault(nbytes: int) -> float:
    """Touch ``nbytes`` of memory once and free it; returns the seconds it took.

    In a VM the host may back guest memory only when it is first touched, at a fraction
    of normal speed; whichever contender touched fresh memory first would pay for it.
    """
    import numpy as np

    start = time.perf_counter()
    block = np.ones(nbytes, dtype=np.uint8)
    del block
    return time.perf_counter() - start


def make_store(where: str, fsync: bool = True, **options: Any) -> Any:
    """An ImageStore with its own secret under ``where`` (a scratch dir on the measured
    disk), so a benchmark never touches the user's store or key."""
    from jupyter_ckpt.store import ImageStore

    options = {k: v for k, v in options.items() if v is not None}
    return ImageStore(
        url=os.path.join(where, "store"),
        secret_file=os.path.join(where, "secret"),
        fsync=fsync,
        **options,
    )


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Timings:
    """Seconds per (workload, contender, operation) over rounds; reports the median."""

    def __init__(self) -> None:
        self._runs: dict[tuple[str, str, str], list[float]] = defaultdict(list)
        self.nbytes: dict[str, int] = {}

    def add(self, workload: str, contender: str, op: str, seconds: float) -> None:
        self._runs[workload, contender, op].append(seconds)

    def median(self, workload: str, contender: str, op: str) -> float:
        return statistics.median(self._runs[workload, contender, op])

    def has(self, workload: str, contender: str, op: str) -> bool:
        return bool(self._runs.get((workload, contender, op)))

    def rows(self) -> list[list[str]]:
        rows = []
        for (workload, contender, op), runs in self._runs.items():
            median = statistics.median(runs)
            nbytes = self.nbytes.get(workload, 0)
            rows.append(
                [
                    workload,
                    contender,
                    op,
                    f"{median:.3f}",
                    f"{min(runs):.3f}-{max(runs):.3f}",
                    f"{nbytes / median / GB:.2f}" if nbytes and median else "-",
                ]
            )
        return rows


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table in Markdown pipe syntax: readable in a terminal and a README."""
    cells = [[str(c) for c in header], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(cells[0]), rule, *(line(r) for r in cells[1:])])


def verdict(value: float, target: float | None) -> str:
    """'PASS (1.23x of target)' or 'MISS ...'; '-' where the target does not apply."""
    if target is None:
        return "info"
    return f"{'PASS' if value >= target else 'MISS'} ({value / target:.2f}x of target)"


# Where each script appends its figures for the GPU check's summary (gpu_check.sh);
# unset, figures are only printed by the scripts' own tables.
FIGURES_ENV = "CKPT_BENCH_FIGURES"


def report_figure(
    script: str,
    figure: str,
    value: float,
    baseline: str,
    baseline_value: float,
    goal: tuple[str, float] | None = None,
    unit: str = "s",
) -> None:
    """Record one figure against its baseline, measured in the same run: ``goal`` is
    ``("<=", x)`` or ``(">=", x)`` on value / baseline_value, or None where DESIGN.md
    section 8 sets no number (the figure is then for information)."""
    _append(
        {
            "script": script,
            "figure": figure,
            "value": value,
            "unit": unit,
            "baseline": baseline,
            "baseline_value": baseline_value,
            "goal": goal,
        }
    )


def report_check(script: str, check: str, ok: bool) -> None:
    """Record one pass/fail check (a round trip exact, the GPU freed, ...)."""
    _append({"script": script, "figure": check, "ok": ok})


def _append(record: dict[str, Any]) -> None:
    path = os.environ.get(FIGURES_ENV)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")
