"""Where a restored kernel finds the user's own modules: ``sys.path`` as the notebook left
it (``sys.path.append('../src')``), put back before anything is unpickled, and the check, at
save, that every module the image refers to would import in a fresh kernel.

The check runs in a new process started as a restore's kernel is (the kernel's launch
environment, the working directory the image records, the path merged as below), because
only such a process shows what a restore will find: the saving kernel has every module
loaded already, and a forked autosave child is a copy of it. It asks the import system's
path finder for each module's spec, parents included, without running any module code.
Only modules that do not come from the Python installation (its standard library and
site-packages) are checked, so a notebook that uses only installed packages pays nothing.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import sys
import sysconfig
from collections.abc import Iterable
from dataclasses import dataclass
from importlib.machinery import PathFinder
from typing import Any

# seconds a fresh process may take to answer; one that does not answers nothing
CHECK_TIMEOUT = 30.0


def merged_path(saved: list[str], current: list[str]) -> list[str]:
    """The saved ``sys.path`` in its order, then this process's entries it lacks: on
    the same node that is the saved path; on another, whose installation lives elsewhere,
    the saved entries that exist there and this installation's own."""
    return [*saved, *(p for p in current if p not in saved)]


def apply_path(saved: list[str] | None) -> None:
    if saved is not None:
        sys.path[:] = merged_path(saved, sys.path)


@functools.cache
def _installation() -> tuple[str, ...]:
    """Folders whose modules any kernel of this environment finds."""
    keys = ("stdlib", "platstdlib", "purelib", "platlib")
    roots = {sys.base_prefix, sys.prefix}
    # its data module may not import (in a process that changed its user since)
    with contextlib.suppress(Exception):
        roots |= {sysconfig.get_paths()[k] for k in keys}
    return tuple(os.path.join(os.path.realpath(r), "") for r in roots)


def _origin(module: Any) -> str | None:
    spec = getattr(module, "__spec__", None)
    origin = getattr(spec, "origin", None) or getattr(module, "__file__", None)
    return origin if isinstance(origin, str) else None


@functools.cache
def _installed(origin: str) -> bool:
    installed = _installation()
    return origin.startswith(installed) or os.path.realpath(origin).startswith(installed)


def to_check(names: Iterable[str]) -> dict[str, str | None]:
    """Module -> the file it was loaded from (None: from no file), for the loaded modules
    among ``names`` that are not part of the installation."""
    found: dict[str, str | None] = {}
    main = sys.modules.get("__main__")
    for name in sorted(set(names)):
        module = sys.modules.get(name)
        # the notebook's own namespace, under any name (multiprocessing's __mp_main__)
        if module is None or module is main:
            continue
        origin = _origin(module)
        if origin in ("built-in", "frozen") or (origin is not None and _installed(origin)):
            continue
        found[name] = origin
    return found


def find(name: str) -> str | None:
    """Where a fresh import of ``name`` would load it from; raise ImportError if nowhere.
    Parents are looked up, not imported."""
    locations: list[str] | None = None
    spec = None
    for depth in range(name.count(".") + 1):
        prefix = ".".join(name.split(".")[: depth + 1])
        spec = PathFinder.find_spec(prefix, locations)
        if spec is None:
            raise ImportError(f"No module named {prefix!r}")
        locations = list(spec.submodule_search_locations or [])
    return getattr(spec, "origin", None)


@dataclass(frozen=True)
class FreshKernel:
    """How a restore's kernel starts: its launch environment, the working directory it
    moves to, and the ``sys.path`` it merges in."""

    path: list[str]
    env: dict[str, str]
    cwd: str

    def unimportable(self, names: Iterable[str]) -> dict[str, str]:
        """Module -> why such a kernel would not import it as this one did (not found,
        or found elsewhere), among ``names`` that :func:`to_check` selects."""
        modules = to_check(names)
        return _ask(modules, self) if modules else {}


def _ask(modules: dict[str, str | None], kernel: FreshKernel) -> dict[str, str]:
    request = json.dumps({"path": kernel.path, "modules": sorted(modules)})
    try:
        done = subprocess.run(
            # this file as a script: no package of ours to import first
            [sys.executable, __file__],
            input=request,
            capture_output=True,
            text=True,
            env=kernel.env,
            cwd=kernel.cwd,
            timeout=CHECK_TIMEOUT,
            check=True,
        )
        found: dict[str, Any] = json.loads(done.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        return dict.fromkeys(modules, f"a fresh kernel could not be asked: {exc}")
    why = {}
    for name, origin in modules.items():
        answer = found.get(name, {})
        if "error" in answer:
            why[name] = f"a fresh kernel would not find it ({answer['error']})"
        elif origin and answer.get("origin") and not _same_file(origin, answer["origin"]):
            why[name] = f"a fresh kernel would import it from {answer['origin']}, not {origin}"
    return why


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return a == b


def main() -> None:
    if sys.path and sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]  # where this script lies is no folder of the kernel's
    request = json.load(sys.stdin)
    apply_path(request["path"])
    answers: dict[str, dict[str, Any]] = {}
    for name in request["modules"]:
        try:
            answers[name] = {"origin": find(name)}
        except (ImportError, ValueError) as exc:
            answers[name] = {"error": str(exc)}
    json.dump(answers, sys.stdout)


if __name__ == "__main__":
    main()
