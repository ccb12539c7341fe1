"""A restore is all-or-nothing per group, and nothing at all for a corrupt image.

Kernel A saves variables of which some cannot come back in kernel B: an instance of a class
from a module B cannot import, and an object whose ``__setstate__`` raises there. B must get
every other variable and be told, by name, which ones failed and why. A corrupt image must
leave B's namespace exactly as it was.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from harness import Kernel, Paths, chunk_files, write_groups

from jupyter_ckpt.store import ImageStore, chunk_path

GHOST_MODULE = """
class Ghost:
    def __init__(self, v):
        self.v = v
"""

SETUP = """
import os, sys
import numpy as np
os.chdir({gone!r})
sys.path.insert(0, {extmods!r})
import ghost_mod
ghost = ghost_mod.Ghost(1)
ghost_list = [ghost, "more"]
FAIL_ON_LOAD = False
class Fragile:
    def __init__(self, v):
        self.v = v
    def __setstate__(self, state):
        if FAIL_ON_LOAD:
            raise RuntimeError("refusing to come back")
        self.__dict__.update(state)
fragile = Fragile(5)
fine = {{"ok": [1, 2, 3]}}
arr = np.arange(300_000)
alias = fine
"""

# Variables that must come back although others in the image fail.
SURVIVORS = ["fine", "arr", "alias", "sys", "np", "FAIL_ON_LOAD"]

SNAPSHOT = "sorted((k, id(v)) for k, v in globals().items() if not k.startswith('_'))"


@dataclass
class Partial:
    kernel: Kernel
    output: str
    saved_count: int
    gone: str


@pytest.fixture(scope="module")
def partial(start_kernel, ckpt_paths: Paths) -> Partial:
    extmods = ckpt_paths.root / "extmods"
    extmods.mkdir()
    (extmods / "ghost_mod.py").write_text(GHOST_MODULE)
    gone = ckpt_paths.root / "gone"
    gone.mkdir()
    a = start_kernel()
    a.run(SETUP.format(extmods=str(extmods), gone=str(gone)))
    a.ckpt("save partial")
    saved_count = a.last_execution_count
    assert saved_count is not None
    a.run("victim_only = 'makes the packed segment differ'")
    a.ckpt("save victim")
    a.shutdown()
    gone.rmdir()  # the saved working directory no longer exists where B runs
    shutil.rmtree(extmods)  # nor the module folder the image's sys.path names

    b = start_kernel()
    b.run("FAIL_ON_LOAD = True")  # read by Fragile.__setstate__ while the image loads
    return Partial(b, b.ckpt("restore partial"), saved_count, str(gone))


def not_restored(output: str) -> dict[str, str]:
    """name -> reason from the 'Not restored' block of `%ckpt restore` output."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Not restored"))
    pairs = (line.strip().split(": ", 1) for line in lines[start + 1 :] if line.startswith("  "))
    return dict(pairs)


def test_failing_groups_are_named_with_reason(partial: Partial) -> None:
    missing = not_restored(partial.output)
    no_module = "No module named 'ghost_mod'"
    assert missing["ghost"] == f"ModuleNotFoundError: {no_module}"
    # `ghost_list` shares `ghost`, so it cannot come back without it
    assert missing["ghost_list"] == f"ModuleNotFoundError: {no_module}"
    assert missing["ghost_mod"] == f"cannot re-import ghost_mod: {no_module}"
    assert missing["fragile"] == "RuntimeError: refusing to come back"
    assert not set(SURVIVORS) & set(missing)


def test_missing_working_directory_is_a_warning(partial: Partial) -> None:
    warning = f"Warning: working directory {partial.gone} not restored: No such file or directory"
    assert warning in partial.output.splitlines()
    assert partial.kernel.eval("__import__('os').getcwd()") != partial.gone


def test_other_variables_restore(partial: Partial) -> None:
    k = partial.kernel
    k.check(
        "fine == {'ok': [1, 2, 3]}",
        "alias is fine",
        "arr.sum() == sum(range(300_000))",
        "FAIL_ON_LOAD is False",
        "np.__name__ == 'numpy'",
    )
    assert k.falsy("'ghost' in globals()", "'fragile' in globals()") == [
        "'ghost' in globals()",
        "'fragile' in globals()",
    ]


DAMAGES = pytest.mark.parametrize(
    ("damage", "error"),
    [("flip", "was altered (content does not match its hash)"), ("delete", "is missing")],
)


@contextmanager
def damaged(store: ImageStore, chunk: str, damage: str) -> Iterator[None]:
    """One chunk of the store flipped or deleted, and put back afterwards."""
    path = Path(store.backend.root, chunk)
    original = path.read_bytes()
    try:
        if damage == "flip":
            path.write_bytes(bytes([original[0] ^ 1]) + original[1:])
        else:
            path.unlink()
        yield
    finally:
        path.write_bytes(original)


def refused_unchanged(kernel: Kernel, ref: str, error: str) -> None:
    """`%ckpt restore ref` fails with ``error`` and leaves every global as it was."""
    before = dict(kernel.eval(SNAPSHOT))
    out = kernel.ckpt(f"restore {ref}")
    assert out.startswith("%ckpt restore: ") and error in out, out
    assert "Restored" not in out
    after = dict(kernel.eval(SNAPSHOT))
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, f"the refused restore bound or rebound {changed}"


@DAMAGES
def test_corrupt_image_leaves_namespace_untouched(
    partial: Partial, kernel_store: ImageStore, damage: str, error: str
) -> None:
    """The victim image's own chunk is damaged; the restore is refused and changes nothing."""
    k = partial.kernel
    k.run(f"fine['ok'].append({damage!r})")  # a change the refused restore must not undo
    own = chunk_files(kernel_store.open("victim")) - chunk_files(kernel_store.open("partial"))
    assert len(own) == 1, "the packed segment of 'victim' should be its only new chunk"
    with damaged(kernel_store, own.pop(), damage):
        refused_unchanged(k, "victim", error)
    assert k.eval("fine['ok'][-1]") == damage


@DAMAGES
def test_a_bad_chunk_in_a_later_group_leaves_namespace_untouched(
    partial: Partial, kernel_store: ImageStore, damage: str, error: str
) -> None:
    """Images of the earlier format hold one pickle per group and are read group by group:
    when a later group's chunk fails, the groups read before it must not be applied."""
    manifest = write_groups(
        kernel_store,
        [{"fine": f"from the image ({damage})", "first_only": 1}, {"later_only": [2]}],
        name=f"groups-{damage}",
    )
    first, [(later, _)] = (s["chunks"] for s in manifest["segments"])
    assert later not in {digest for digest, _ in first}
    with damaged(kernel_store, chunk_path(later), damage):
        refused_unchanged(partial.kernel, manifest["id"], error)


def test_restore_into_a_busier_kernel_keeps_history_clean(partial: Partial) -> None:
    """The saved execution count is lower than this kernel's: no clash in its history."""
    k = partial.kernel
    for _ in range(6):
        k.run("pass")
    assert k.last_execution_count is not None and k.last_execution_count > partial.saved_count
    k.ckpt("restore partial")
    counts = []
    for n in range(3):
        assert k.run(f"print({n})") == f"{n}\n"
        counts.append(k.last_execution_count)
    first = partial.saved_count + 1
    assert counts == [first, first + 1, first + 2]
