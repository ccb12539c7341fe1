"""Objects that live at module level in a library, saved as references to where they live.

``rc = mpl.rcParams`` or ``environ = os.environ`` binds a name to the library's own object:
writes through the name reach the library. Saved by value, the name would come back as a
copy that the library no longer reads. Saved as "attribute ``rcParams`` of module
``matplotlib``", it is the library's object again after a restore, and the process-state
providers (:mod:`jupyter_ckpt.process`) put back what it held.

Which objects: values at the top level of an installed module (the standard library or
site-packages: not the notebook, not the user's own modules, whose objects hold the user's
data and go by value), of a class of that same package (``RcParams`` in matplotlib,
``_Environ`` in os), and not of a kind pickle already saves by reference (classes,
functions, modules) or by value without loss (numbers, strings, tuples).
"""

from __future__ import annotations

import sys
import types
from typing import Any

from ..process.paths import to_check

_BY_VALUE = (
    type(None), bool, int, float, complex, str, bytes, tuple, frozenset, range,
    type, types.FunctionType, types.BuiltinFunctionType, types.ModuleType,
    types.MethodType, types.MethodWrapperType, types.WrapperDescriptorType,
)  # fmt: skip


def index() -> dict[int, tuple[str, str]]:
    """id -> (module, attribute) for the module-level objects described above. Built once
    per save, from the modules loaded then: a walk of their namespaces (a few ms)."""
    modules = {n: m for n, m in list(sys.modules.items()) if isinstance(m, types.ModuleType)}
    user = to_check(modules)  # modules from outside the installation
    found: dict[int, tuple[str, str]] = {}
    for name, module in modules.items():
        if name in user or name == "__main__":
            continue
        package = name.partition(".")[0]
        try:
            items = list(vars(module).items())
        except TypeError:
            continue
        for attr, value in items:
            kind = type(value)  # not value.__class__: a deprecated alias may warn on it
            if attr.startswith("__") or issubclass(kind, _BY_VALUE):
                continue
            owner = getattr(kind, "__module__", None)
            if isinstance(owner, str) and owner.partition(".")[0] == package:
                found.setdefault(id(value), (name, attr))
    return found


def lookup(module: str, attr: str) -> Any:
    """The object a reference names, in this process."""
    __import__(module)
    return getattr(sys.modules[module], attr)
