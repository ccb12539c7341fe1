"""Real notebooks, saved in one kernel and restored in a fresh one, come back whole.

The corpus (tests/corpus: public notebooks, their sources and licences in SOURCES.toml)
runs cell by cell in kernel A, which saves each notebook's state with the kernel API the
server uses (verified: a variable reported saved is one that loads). Kernel B restores
each image and every user name is compared with A's by a type-aware fingerprint
(tests/corpus/probe.py). Each name is then one of:

- equal: back, and equal to what A held, identities and shared memory included;
- reported: not back, and the save or the restore said which and why;
- silent: not back, and nothing said so;
- wrong: back, but not equal.

Silent and wrong names fail the test; so does a notebook's last cells failing when they
run again in B. A negative control plants changes in B after a restore, which the
comparison must catch. With ``CORPUS_DILL=1``, dill's ``dump_module``/``load_module`` of the
same state are timed beside ours (dill loads second, into a kernel whose modules are
imported already): a comparison, not a check, so the suite leaves it out.

Several notebooks share a kernel pair (A resets its namespace between them, B restores
each image into an emptied namespace) to keep the run short; the pairs run concurrently.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from harness import Kernel, KernelError, Paths

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CORPUS = Path(__file__).parent / "corpus"
SOURCES = tomllib.loads((CORPUS / "SOURCES.toml").read_text())
# CORPUS_NOTEBOOKS=a,b runs only those (while working on them)
NOTEBOOKS = sorted(
    n for n in SOURCES["notebook"] if n in os.environ.get("CORPUS_NOTEBOOKS", n).split(",")
)
PAIRS = 2  # kernel pairs run at the same time
RERUN = 2  # the last code cells run again after a restore
DILL = os.environ.get("CORPUS_DILL") == "1"  # CORPUS_DILL=1: timed against dill too
# Planted in B after the control's restore: each must show as wrong, and nothing else.
CONTROL = """
import numpy as np
base = np.arange(12.0)
view = base[2:8]
grid = np.ones((3, 3))
shared = {"k": [1, 2]}
holder_a = [shared]
holder_b = {"s": shared}
def scaled(x, factor=2):
    return x * factor
label = "control"
"""
PLANTED = {
    "grid": "grid[1, 1] = 5.0",  # an element changed
    "label": "label = 'changed'",  # a name rebound
    "holder_b": "holder_b['s'] = {'k': [1, 2]}",  # an identity group split, equal values
    "view": "view = view.copy()",  # a view no longer shares its base's memory
    "scaled": "scaled.__defaults__ = (3,)",  # a function's default changed
}
CAUGHT = {*PLANTED, "base"}  # base: its view no longer shares its memory


@dataclass
class Row:
    """One notebook's outcome."""

    name: str
    names: int = 0
    equal: list[str] = field(default_factory=list)
    reported: dict[str, str] = field(default_factory=dict)
    silent: list[str] = field(default_factory=list)
    wrong: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)  # cells that failed, in A or on rerun
    reruns: list[str | None] = field(default_factory=list)  # how the last cells end in A
    run_s: float = 0.0
    save_s: float = 0.0
    restore_s: float = 0.0
    dill: dict[str, Any] = field(default_factory=dict)
    planted: Row | None = None  # the control's comparison after the planted changes


def code_cells(name: str) -> list[tuple[str, bool]]:
    """The notebook's code cells and whether each is meant to raise."""
    nb = json.loads((CORPUS / "notebooks" / f"{name}.ipynb").read_text())
    return [
        ("".join(c["source"]), "raises-exception" in c["metadata"].get("tags", []))
        for c in nb["cells"]
        if c["cell_type"] == "code"
    ]


def first_difference(a: Any, b: Any, where: str = "") -> str:
    """Where two fingerprints first differ, for the failure message."""
    if type(a) is not type(b) or not isinstance(a, list) or len(a) != len(b):
        return f"{where or 'top'}: {json.dumps(a)[:160]} != {json.dumps(b)[:160]}"
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x != y:
            return first_difference(x, y, f"{where}/{i}")
    return where


def compare(
    row: Row, before: dict[str, Any], after: dict[str, Any], reported: dict[str, str]
) -> None:
    """Sort each name A held into equal, reported, silent or wrong."""
    shared_lost = {tuple(p) for p in before["shared"]} ^ {tuple(p) for p in after["shared"]}
    broken = {path.split("[")[0].split(".")[0] for pair in shared_lost for path in pair}
    row.names = len(before["names"])
    for name, print_a in before["names"].items():
        print_b = after["names"].get(name)
        if name not in after["names"]:
            if name in reported:
                row.reported[name] = reported[name]
            else:
                row.silent.append(name)
        elif print_a != print_b:
            row.wrong[name] = first_difference(print_a, print_b)
        elif name in broken:
            row.wrong[name] = f"shares memory differently: {sorted(shared_lost)[:3]}"
        else:
            row.equal.append(name)
    for name in after["names"].keys() - before["names"].keys():
        row.wrong[name] = "in the restored kernel only"


class Pair:
    """Kernel A runs and saves notebooks; kernel B restores them, fresh at first."""

    def __init__(self, paths: Paths, work: Path) -> None:
        self.paths, self.work = paths, work
        self.a = self.b = None

    def start(self) -> None:
        self.a = _kernel(self.paths)
        self.b = _kernel(self.paths)

    def stop(self) -> None:
        for kernel in (self.a, self.b):
            if kernel is not None and kernel.manager.has_kernel:
                kernel.shutdown()

    def save(self, name: str, cells: list[tuple[str, bool]], first: bool) -> Row:
        a, row = self.a, Row(name)
        assert a is not None
        ref = name.replace("/", "--")
        directory = self.work / Path(name).parent
        if not first:
            _empty(a)
        a.run(f"__import__('os').chdir({str(directory)!r})")
        started = time.perf_counter()
        for code, raises in cells:
            try:
                a.run(code)
            except KernelError as exc:
                if not raises:
                    row.errors.append(f"in A: {str(exc)[-600:]}")
        row.run_s = time.perf_counter() - started
        saved = call(a, f"__import__('jupyter_ckpt.kernel', fromlist=['_']).checkpoint({ref!r})")
        assert "error" not in saved, saved
        row.save_s = saved["seconds"]
        row.reported = dict(saved["lost"])
        call(a, f"__import__('probe').write_snapshot({str(self.work / (ref + '.a.json'))!r})")
        row.dill = {"dump": {}}
        if DILL:
            dump = f"__import__('probe').dill_dump({str(self.work / ref)!r})"
            row.dill["dump"] = call(a, dump)
        row.reruns = [outcome(a, code) for code in last_cells(cells)]
        return row

    def restore(self, row: Row, cells: list[tuple[str, bool]], first: bool) -> None:
        b = self.b
        assert b is not None
        ref = row.name.replace("/", "--")
        if not first:
            _empty(b)
        result = call(b, f"__import__('jupyter_ckpt.kernel', fromlist=['_']).restore({ref!r})")
        row.restore_s = result["seconds"]
        reported = {**row.reported, **result["missing"]}
        call(b, f"__import__('probe').write_snapshot({str(self.work / (ref + '.b.json'))!r})")
        before = json.loads((self.work / f"{ref}.a.json").read_text())
        after = json.loads((self.work / f"{ref}.b.json").read_text())
        row.reported = {}  # now: the reported names that are not back
        compare(row, before, after, reported)
        for code, in_a in zip(last_cells(cells), row.reruns, strict=True):
            in_b = outcome(b, code)
            if in_b != in_a and not any(f"'{name}'" in (in_b or "") for name in row.reported):
                row.errors.append(f"run again: {in_a or 'ran'} in A, {in_b or 'ran'} in B")

    def dill_load(self, row: Row) -> None:
        """dill's restore of the same state, into B emptied, after the comparisons and the
        control's plants: a load_module leaves IPython's own names (In, Out, _i3) looking
        like the user's in the cells after it."""
        b = self.b
        assert b is not None
        if "seconds" in row.dill["dump"]:
            _empty(b)
            ref = str(self.work / row.name.replace("/", "--"))
            row.dill["load"] = call(b, f"__import__('probe').dill_load({ref!r})")


def last_cells(cells: list[tuple[str, bool]]) -> list[str]:
    """The last cells, run again after the save in A and after the restore in B."""
    return [code for code, raises in cells if not raises][-RERUN:]


def outcome(kernel: Kernel, code: str) -> str | None:
    """None when the cell runs, else its error's last line (a cell may fail for reasons of
    its notebook's own, e.g. the next cell deletes what it reads: the same in A and B)."""
    try:
        kernel.run(code)
    except KernelError as exc:
        return [line for line in str(exc).splitlines() if line.strip()][-1][:300]
    return None


MARK = "@@corpus-result@@ "


def call(kernel: Kernel, expr: str) -> Any:
    """The JSON value of ``expr`` in the kernel; other output around it (a notebook's
    hooks may print after every cell) is ignored."""
    out = kernel.run(f"print({MARK!r} + __import__('json').dumps({expr}, default=repr))")
    line = next(line for line in out.splitlines() if line.startswith(MARK))
    return json.loads(line[len(MARK) :])


def _kernel(paths: Paths) -> Kernel:
    kernel = Kernel(paths, paths.root / "cwd")
    kernel.run(f"%load_ext jupyter_ckpt\n__import__('sys').path.append({str(CORPUS)!r})")
    return kernel


def _empty(kernel: Kernel) -> None:
    """Between notebooks: an empty namespace and no open figures, as in a new kernel."""
    kernel.run(
        "%reset -f\n"
        "if 'matplotlib.pyplot' in __import__('sys').modules:\n"
        "    __import__('matplotlib.pyplot').pyplot.close('all')"
    )


def run_batch(pair: Pair, names: list[str], rows: dict[str, Row]) -> None:
    pair.start()
    try:
        cells = {name: code_cells(name) if name != "control" else [(CONTROL, False)]
                 for name in names}  # fmt: skip
        saved = [pair.save(name, cells[name], i == 0) for i, name in enumerate(names)]
        for i, row in enumerate(saved):
            pair.restore(row, cells[row.name], i == 0)
            if row.name == "control":
                plant_and_compare(pair, row)
            pair.dill_load(row)
            rows[row.name] = row
            print(f"corpus: {row.name}: {len(row.equal)}/{row.names} equal", file=sys.stderr)
    finally:
        pair.stop()


def plant_and_compare(pair: Pair, row: Row) -> None:
    """Plant the changes in B and compare again: the control's row shows what was caught."""
    b = pair.b
    assert b is not None
    b.run("\n".join(PLANTED.values()))
    call(b, f"__import__('probe').write_snapshot({str(pair.work / 'control.c.json')!r})")
    before = json.loads((pair.work / "control.a.json").read_text())
    after = json.loads((pair.work / "control.c.json").read_text())
    planted = Row("control (planted)")
    compare(planted, before, after, {})
    row.planted = planted


def batches(names: list[str], count: int) -> list[list[str]]:
    """Round-robin, so that each pair gets a share of the slow notebooks."""
    return [names[i::count] for i in range(count)]


TABLE_HEAD = (
    f"{'notebook':44} {'names':>5} {'equal':>5} {'rep':>4} {'sil':>4} {'wrong':>5} "
    f"{'run s':>6} {'save s':>6} {'rest s':>6} {'dill dump':>9} {'dill load':>9}"
)


def _seconds(result: dict[str, Any] | None) -> str:
    if not result:
        return "-"
    return f"{result['seconds']:.2f}" if "seconds" in result else "failed"


def table(rows: list[Row], wall: float) -> str:
    lines = [TABLE_HEAD]
    for r in rows:
        lines.append(
            f"{r.name:44.44} {r.names:5} {len(r.equal):5} {len(r.reported):4} "
            f"{len(r.silent):4} {len(r.wrong):5} {r.run_s:6.2f} {r.save_s:6.2f} "
            f"{r.restore_s:6.2f} {_seconds(r.dill.get('dump')):>9} "
            f"{_seconds(r.dill.get('load')):>9}"
        )
    dumped = [r for r in rows if "seconds" in r.dill.get("dump", {})]
    loaded = [r for r in dumped if "seconds" in r.dill.get("load", {})]
    total = (
        f"{'TOTAL (' + str(len(rows)) + ' notebooks)':44} {sum(r.names for r in rows):5} "
        f"{sum(len(r.equal) for r in rows):5} {sum(len(r.reported) for r in rows):4} "
        f"{sum(len(r.silent) for r in rows):4} {sum(len(r.wrong) for r in rows):5} "
        f"{sum(r.run_s for r in rows):6.1f} {sum(r.save_s for r in rows):6.1f} "
        f"{sum(r.restore_s for r in rows):6.1f}"
    )
    lines.append(total)
    if not DILL:
        lines.append(f"dill: not timed (CORPUS_DILL=1 times it); wall time {wall:.0f} s")
    else:
        lines.append(
            f"dill: dump_module failed for {len(rows) - len(dumped)} of {len(rows)} notebooks, "
            f"load_module for {len(dumped) - len(loaded)} of the others; where both worked, "
            f"save {sum(r.save_s for r in loaded):.1f} s (ours, verified) against "
            f"{sum(r.dill['dump']['seconds'] for r in loaded):.1f} s (dill), restore "
            f"{sum(r.restore_s for r in loaded):.1f} s against "
            f"{sum(r.dill['load']['seconds'] for r in loaded):.1f} s; wall time {wall:.0f} s"
        )
    for r in rows:
        for name, why in r.reported.items():
            lines.append(f"  reported {r.name}: {name}: {why[:150]}")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, Row], str]]:
    """Runs the whole corpus once; the rows by notebook, and the table."""
    root = tmp_path_factory.mktemp("corpus")
    work = root / "work"
    shutil.copytree(CORPUS / "notebooks", work)
    paths = Paths(root)
    rows: dict[str, Row] = {}
    errors: list[BaseException] = []
    started = time.perf_counter()

    def run(names: list[str]) -> None:
        try:
            run_batch(Pair(paths, work), names, rows)
        except BaseException as exc:
            errors.append(exc)

    groups = batches(NOTEBOOKS, PAIRS)
    groups[0].insert(0, "control")
    threads = [threading.Thread(target=run, args=(batch,)) for batch in groups]
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MPLBACKEND", "agg")  # figures are compared, not drawn
        for threads_var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env.setenv(threads_var, "1")  # kernels run side by side on few cores
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    if errors:
        raise errors[0]
    wall = time.perf_counter() - started
    ordered = [rows[n] for n in NOTEBOOKS]
    text = table(ordered, wall)
    print("\n" + text)
    yield rows, text


def test_corpus_is_large_enough() -> None:
    assert len(SOURCES["notebook"]) >= 40


def test_every_name_comes_back_or_is_reported(
    corpus: tuple[dict[str, Row], str], record_property: Any
) -> None:
    rows, text = corpus
    record_property("corpus_table", text)
    bad = {
        name: {"silent": row.silent, "wrong": row.wrong, "errors": row.errors}
        for name, row in rows.items()
        if name != "control" and (row.silent or row.wrong or row.errors)
    }
    assert not bad, json.dumps(bad, indent=1)


def test_the_control_comes_back_and_its_planted_changes_are_caught(
    corpus: tuple[dict[str, Row], str],
) -> None:
    control = corpus[0]["control"]
    assert not (control.silent or control.wrong or control.errors or control.reported)
    planted = control.planted
    assert planted is not None
    assert set(planted.wrong) == CAUGHT, planted.wrong
    assert not planted.silent
