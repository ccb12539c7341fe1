"""One variable that fails to load costs only itself.

Variables share pickle's memo in the one stream of an image, so the objects that every
notebook function needs (its code's type, the namespace it is bound to, cloudpickle's
constructors) are written with the first variable that reaches them. When that variable
fails to load, functions, lambdas, closures and classes saved after it must still come
back, as must everything saved before it. Each way of failing at load is tried before and
after them: a reducer that raises, a class whose module is gone, a C type that cannot be
rebuilt from what was saved. Then the same in real kernels, with SymPy's ``RR``.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from harness import Kernel, Paths

from jupyter_ckpt import image
from jupyter_ckpt.image.stream import Stream
from jupyter_ckpt.store import ImageStore

# The notebook's own code: saved by value, sharing what all functions need.
NOTEBOOK = """
def helper(x):
    return x + 1
square = lambda x: x * x
def make_counter(start):
    count = [start]
    def step():
        count[0] += 1
        return count[0]
    return step
counter = make_counter(10)
class Point:
    def __init__(self, x):
        self.x = x
    def moved(self):
        return Point(helper(self.x))
p = Point(2)
"""

# Each makes an object that fails at load only, after its variable has written a lambda
# and a class of its own.
FAILING = {
    "reducer": """
import operator
class Divides:
    def __reduce__(self):
        return operator.truediv, (1, 0)
make = Divides
""",
    "vanished-module": """
import vanishing_mod
make = vanishing_mod.Thing
""",
    "c-type": """
import datetime
class BadDate:
    def __reduce__(self):
        return datetime.date, (2024, 13, 1)
make = BadDate
""",
}
REASONS = {
    "reducer": "ZeroDivisionError: division by zero",
    "vanished-module": "ModuleNotFoundError: No module named 'vanishing_mod'",
    "c-type": "ValueError: month must be in 1..12",
}
BAD = """
class Local:
    pass
bad = {"fn": lambda: 0, "cls": Local, "made": Local(), "it": make()}
holds_bad = [bad["it"]]
del make, Local  # so that the first lambda, class and instance are written with `bad`
"""

# What every variable but ``bad`` and ``holds_bad`` must still be, after a restore.
CHECKS = [
    "helper(1) == 2",
    "square(3) == 9",
    "counter() == 11 and counter() == 12",
    "type(p) is Point and p.moved().x == 3 and isinstance(p.moved(), Point)",
]


def notebook(kind: str, first: bool) -> str:
    """The cells: the failing variable first, or after the notebook's code."""
    failing = FAILING[kind] + BAD
    return failing + NOTEBOOK if first else NOTEBOOK + failing


@pytest.fixture
def vanishing(tmp_path: Path) -> Iterator[Callable[[], None]]:
    """An importable module ``vanishing_mod``; calling the fixture's value removes it."""
    (tmp_path / "vanishing_mod.py").write_text("class Thing:\n    pass\n")
    sys.path.insert(0, str(tmp_path))

    def remove() -> None:
        sys.modules.pop("vanishing_mod", None)
        if str(tmp_path) in sys.path:
            sys.path.remove(str(tmp_path))

    yield remove
    remove()


def run_cells(code: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(code, namespace)
    return namespace


@pytest.mark.parametrize("first", [True, False], ids=["failing-first", "failing-last"])
@pytest.mark.parametrize("kind", list(FAILING))
def test_a_variable_that_fails_to_load_costs_only_itself(
    store: ImageStore, vanishing: Callable[[], None], kind: str, first: bool
) -> None:
    namespace = run_cells(notebook(kind, first))
    variables = {k: v for k, v in namespace.items() if not k.startswith("__")}
    manifest = image.capture(variables, namespace, store.writer(), name=kind)
    assert {v["status"] for v in manifest["variables"]} <= {"saved", "imported"}
    vanishing()

    restored: dict[str, Any] = {"__name__": "__main__"}
    report = image.restore(manifest, store.read_segments(manifest), restored)
    reason = REASONS[kind]
    expected = dict.fromkeys(["bad", "holds_bad"], reason)
    if kind == "vanished-module":
        gone = f"cannot re-import vanishing_mod: {reason.split(': ')[1]}"
        expected["vanishing_mod"] = gone
    assert report.missing == expected
    failed = [check for check in CHECKS if not eval(check, restored)]
    assert not failed, failed
    # what the failed variable made and others use came back whole: the class and its
    # instances, the notebook's functions bound to the namespace they are restored into
    assert restored["helper"].__globals__ is restored
    assert restored["Point"].moved.__globals__ is restored


SYMPY = """
from sympy import RR
f = lambda: 1
def g(x):
    return f() + x
domain = {"field": RR, "g": g}
"""


@pytest.fixture(scope="module")
def kernels(start_kernel: Callable[..., Kernel], ckpt_paths: Paths) -> tuple[Kernel, str, str, int]:
    """Kernel A runs every failing kind and SymPy's ``RR`` before the notebook's code, and
    saves; a fresh kernel B restores the image. Returns B, both outputs, and the number of
    the cell that made ``bad_reducer``."""
    modules = ckpt_paths.root / "modules"
    modules.mkdir()
    (modules / "vanishing_mod.py").write_text("class Thing:\n    pass\n")
    a = start_kernel()
    a.run(f"import sys\nsys.path.insert(0, {str(modules)!r})")
    a.run(SYMPY)
    for kind in FAILING:
        a.run(FAILING[kind] + BAD + f"bad_{kind.replace('-', '_')} = bad\ndel bad, holds_bad")
    a.run(NOTEBOOK)
    cell = a.eval("[n for n, c in enumerate(In) if 'bad_reducer = bad' in c][0]")
    verified = a.ckpt("save --verify checked")
    assert "bad_reducer: saved, but would not load: ZeroDivisionError" in verified, verified
    assert f"In [{cell}] for bad_reducer" in verified.splitlines()[-1], verified
    saved = a.ckpt("save isolation")
    a.shutdown()
    (modules / "vanishing_mod.py").unlink()
    b = start_kernel()
    return b, saved, b.ckpt("restore isolation"), cell


def test_a_restore_into_a_fresh_kernel_loses_only_what_failed(
    kernels: tuple[Kernel, str, str, int],
) -> None:
    kernel, saved, restored, cell = kernels
    assert "Not saved" not in saved, saved
    missing = {line.split(":", 1)[0].strip() for line in restored.splitlines() if line[:2] == "  "}
    failed = {"bad_reducer", "bad_vanished_module", "bad_c_type", "vanishing_mod"}
    assert failed <= missing <= failed | {"RR", "domain"}, restored
    kernel.check(*CHECKS, "f() == 1", "g(1) == 2")
    assert f"In [{cell}] for bad_reducer" in restored.splitlines()[-1], restored


def test_a_verified_save_reports_what_would_not_load(store: ImageStore) -> None:
    """With ``verify``, the image is loaded back before it is committed: a variable that
    would not load is reported at save time, not saved, and the others are unchanged."""
    namespace = run_cells(
        FAILING["reducer"] + BAD + NOTEBOOK + "import numpy as np\nbig = np.ones(1 << 20)\n"
    )
    variables = {k: v for k, v in namespace.items() if not k.startswith("__")}
    manifest = image.capture(variables, namespace, store.writer(), name="verified", verify=True)
    lost = {v["name"]: v["reason"] for v in manifest["variables"] if v["status"] == "lost"}
    reason = f"saved, but would not load: {REASONS['reducer']}"
    assert lost == {"bad": reason, "holds_bad": reason}
    assert manifest["verify_seconds"] is not None
    # loading back left the kernel's own classes and functions as they were
    assert namespace["Point"].moved.__globals__ is namespace

    restored: dict[str, Any] = {"__name__": "__main__"}
    report = image.restore(manifest, store.read_segments(manifest), restored)
    assert report.missing == {name: f"not saved: {why}" for name, why in lost.items()}
    assert not [check for check in CHECKS if not eval(check, restored)]
    assert restored["big"].sum() == 1 << 20


class HoldsLock:
    """Fails to pickle after its class and state have begun to be written."""

    def __init__(self) -> None:
        self.name = "worker"
        self.lock = threading.Lock()


def test_a_variable_that_fails_to_pickle_costs_what_trying_it_cost(monkeypatch) -> None:
    """Object-heavy state first, then variables that cannot be pickled: each fails in its
    trial pickle, so cutting it out never copies the memo of everything saved before it
    (the rewind's cost; bench_objects.py measures the time against pickle)."""
    rows = [{"id": i, "tags": [str(i)]} for i in range(200_000)]
    stream = Stream({})
    stream.add(rows)
    rewinds: list[int] = []
    rewind = Stream._rewind
    monkeypatch.setattr(
        Stream, "_rewind", lambda self, *args: rewinds.append(1) or rewind(self, *args)
    )
    for value in [threading.Lock(), HoldsLock(), {"k": [1, 2], "lock": threading.Lock()}] * 3:
        with pytest.raises(TypeError):
            stream.add(value)
    assert rewinds == [], "a variable that failed its trial rewound the whole stream"
    stream.add(rows[0])  # the stream goes on where it was
    assert len(stream.parts) == 2
