"""A cheap look, after each cell, for variables that cannot be saved.

A save finds them by pickling everything, which takes as long as the state is large: an
autosave minutes after the cell that made a generator or opened a file. Until then the
user would be told the kernel "suspends in 50 s". This look costs microseconds per
variable: it asks only the variables bound or rebound since the last look (by the id of
their value), and only their top-level object, the way the pickler first meets it (a file
is refused, anything else must reduce). Arrays, tensors and frames take the pickler's own
path and are never asked; neither are plain Python values, functions, classes and
modules. What such a value holds (a generator in a list) is still found by the next save.

State, per kernel (:class:`Probe`): name -> (id of the value last looked at, why it cannot
be saved, or None). Each look replaces the table with the variables there are now.
"""

from __future__ import annotations

import copyreg
import io
import types
from typing import Any

import cloudpickle

from ..image.pickler import PROTOCOL

_PLAIN = frozenset(
    {int, float, complex, bool, str, bytes, bytearray, type(None), list, tuple, dict}
    | {set, frozenset, range, slice}
)
_BY_REFERENCE = (
    type,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.ModuleType,
)
# packages whose values the pickler saves by a path of its own (buffers out of band)
_OWN_PATH = frozenset({"numpy", "torch", "pandas", "jax", "cupy"})


def why_unsaveable(value: Any) -> str | None:
    """Why the pickler would refuse ``value`` itself, in its words; None if it would not
    (as far as its top-level object tells)."""
    cls = type(value)
    if cls in _PLAIN or isinstance(value, _BY_REFERENCE):
        return None
    module = getattr(cls, "__module__", None)
    if isinstance(module, str) and module.partition(".")[0] in _OWN_PATH:
        return None
    if isinstance(value, io.IOBase) and not isinstance(value, (io.BytesIO, io.StringIO)):
        # as the pickler says it (see CkptPickler._reduce)
        return f"TypeError: cannot save an open file ({getattr(value, 'name', cls.__name__)!r})"
    if cls in copyreg.dispatch_table or cls in cloudpickle.Pickler._dispatch_table:
        return None
    try:
        value.__reduce_ex__(PROTOCOL)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


class Probe:
    """The variables found unsaveable by the last look, and what it looked at."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[int, str | None]] = {}

    def look(self, variables: dict[str, Any], excluded: set[str]) -> dict[str, str]:
        """name -> why, for the variables (less the ``excluded``) that cannot be saved;
        a value looked at before is not looked at again."""
        seen: dict[str, tuple[int, str | None]] = {}
        for name, value in variables.items():
            if name in excluded:
                continue
            before = self._seen.get(name)
            if before is not None and before[0] == id(value):
                seen[name] = before
            else:
                seen[name] = (id(value), why_unsaveable(value))
        self._seen = seen
        return {name: why for name, (_, why) in seen.items() if why is not None}
