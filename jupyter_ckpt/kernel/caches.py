"""IPython's caches of a kernel's cells, as an uninterrupted kernel still has them: the
input cache (``_i``, ``_ii``, ``_iii``, ``_i<n>``, made again from the input history an
image keeps), the output cache (``Out``, ``_``, ``__``, ``___``, ``_<n>``), the last shell
command's ``_exit_code`` and the ``%cd`` history ``_dh``.

An output is kept as a reference when it is one of the user's variables (``df`` shown by
a cell, the common case: it comes back as that variable, shared as before), and by value
when it is a small plain value (a number, a short string): neither costs any pickling or
can fail a save. Other outputs (a new DataFrame an expression made, a plot's artists) are
not kept: they would add to the image what no variable holds, or drag a figure into it;
their cell can be run again. The caches are IPython's names, never the user's variables.
"""

from __future__ import annotations

import math
from pathlib import Path, PurePath
from typing import Any

from .state import expand_history

# the longest string output kept by value: a long one is a text the user can display again
MAX_TEXT = 10_000
_UNDERS = ("_", "__", "___")


def _plain(value: Any) -> bool:
    kind = type(value)
    if kind in (bool, type(None)):
        return True
    if kind is int:
        return value.bit_length() <= 64 * 8
    if kind is float:
        return math.isfinite(value)  # JSON (the manifest) has no NaN or infinity
    return kind is str and len(value) <= MAX_TEXT


def cache_facts(shell: Any, variables: dict[str, Any]) -> dict[str, Any]:
    """What the caches hold that the input history does not, as the manifest keeps it."""
    names = {id(value): name for name, value in variables.items()}

    def kept(value: Any) -> dict[str, Any] | None:
        if id(value) in names:
            return {"variable": names[id(value)]}
        return {"value": value} if _plain(value) else None

    hook = shell.displayhook
    outputs = {str(n): kept(v) for n, v in shell.history_manager.output_hist.items()}
    exit_code = shell.user_ns.get("_exit_code")
    return {
        "outputs": {n: ref for n, ref in outputs.items() if ref is not None},
        "last": [kept(getattr(hook, under, "")) for under in _UNDERS],
        "exit_code": exit_code if type(exit_code) is int else None,
        # (folder, whether it is a Path): IPython starts the list with one, %cd adds strings
        "dir_history": [
            [str(d), isinstance(d, PurePath)]
            for d in shell.user_ns.get("_dh", [])
            if isinstance(d, (str, PurePath))
        ],
    }


def apply_caches(shell: Any, facts: dict[str, Any], restored: set[str]) -> None:
    """Fill the caches again once the variables are back (``restored``: their names)."""
    history = facts.get("history")
    if history:
        _apply_inputs(shell, expand_history(history)[0])
    caches = facts.get("caches")
    if not caches:
        return
    namespace = shell.user_ns
    missing = object()

    def value(ref: dict[str, Any] | None) -> Any:
        if ref is None:
            return missing
        if "variable" in ref:
            return namespace[ref["variable"]] if ref["variable"] in restored else missing
        return ref["value"]

    outputs = {int(n): value(ref) for n, ref in caches["outputs"].items()}
    outputs = {n: v for n, v in outputs.items() if v is not missing}
    shell.history_manager.output_hist.update(outputs)
    shell.push({f"_{n}": v for n, v in outputs.items()}, interactive=False)
    hook = shell.displayhook
    lasts = [value(ref) for ref in caches["last"]]
    users_own = any(
        under in namespace
        and not (under in shell.user_ns_hidden and shell.user_ns_hidden[under] is namespace[under])
        for under in _UNDERS
    )
    for under, last in zip(_UNDERS, lasts, strict=True):
        setattr(hook, under, "" if last is missing else last)
    if not users_own:  # as IPython: a `_` the user bound stays theirs
        shell.push({u: getattr(hook, u) for u in _UNDERS}, interactive=False)
    if caches.get("exit_code") is not None:
        namespace["_exit_code"] = caches["exit_code"]  # IPython does not hide it either
    namespace.get("_dh", [])[:] = [
        Path(folder) if is_path else folder for folder, is_path in caches.get("dir_history", [])
    ]


def _apply_inputs(shell: Any, raw: list[str]) -> None:
    """``_i<n>`` for every cell, and ``_i``, ``_ii``, ``_iii`` as after the last one."""
    manager = shell.history_manager
    last = [*[""] * 4, *raw[1:]][-4:]  # the last four cells, oldest first, "" before the first
    manager._iii, manager._ii, manager._i, manager._i00 = last
    shell.push(
        {
            **{f"_i{n}": cell for n, cell in enumerate(raw) if n},
            "_i": manager._i,
            "_ii": manager._ii,
            "_iii": manager._iii,
        },
        interactive=False,
    )
