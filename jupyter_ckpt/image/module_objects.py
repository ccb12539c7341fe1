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


# The interpreter's own objects a notebook may bind (``p = sys.path``, ``out =
# sys.stdout``): the process's, whatever their class; a copy of one would be a list the
# interpreter no longer reads, or an open stream that cannot be saved. Their contents are
# the process state's (:mod:`jupyter_ckpt.process`).
_INTERPRETER_OBJECTS = {
    "sys": ("path", "modules", "argv", "meta_path", "path_hooks", "path_importer_cache",
            "stdin", "stdout", "stderr", "__stdin__", "__stdout__", "__stderr__",
            "displayhook", "excepthook"),
    "warnings": ("filters",),
}  # fmt: skip


class ModuleObjects:
    """Finds the library objects described above, for one save. A package's modules are
    walked the first time an object of one of its classes is met (numpy's once, for all
    its arrays): a state made of plain Python values walks none, and one that holds some
    arrays and an ``rcParams`` walks numpy's and matplotlib's."""

    def __init__(self) -> None:
        self._tables: dict[str, dict[int, tuple[str, str]]] = {}
        self._users: dict[int, tuple[str, str]] | None = None
        self._packages: dict[str, list[tuple[str, types.ModuleType]]] | None = None
        present = {
            (module, attr): getattr(sys.modules.get(module), attr, None)
            for module, attrs in _INTERPRETER_OBJECTS.items()
            for attr in attrs
        }
        found = {where: value for where, value in present.items() if value is not None}
        self.interpreter = {id(value): where for where, value in found.items()}
        # the classes of the objects found: an instance of any other class is never one
        self._kinds: set[type] = {type(value) for value in found.values()}

    def has_instances(self, cls: type) -> bool:
        """Whether some object found is of ``cls`` (after :meth:`find` met one of its
        instances): else the pickler may answer for the whole class at once."""
        return cls in self._kinds

    def find(self, obj: Any) -> tuple[str, str] | None:
        """(module, attribute) where ``obj`` lives, if it is such an object."""
        where = self.interpreter.get(id(obj))
        if where is not None:
            return where
        owner = getattr(type(obj), "__module__", None)
        if not isinstance(owner, str):
            return None
        package = owner.partition(".")[0]
        if package in ("__main__", "builtins"):
            return None
        table = self._tables.get(package)
        if table is None:
            try:
                table = self._walk(package)
            except Exception:  # objects are then saved by value, as they always could be
                table = {}
            self._tables[package] = table
        return table.get(id(obj))

    def of_users_modules(self) -> dict[int, tuple[str, str]]:
        """id -> (module, attribute) of the objects at the top level of the user's own
        modules (from outside the installation). Such an object holds the user's data, so
        it is saved by value; a restore binds the module's name to it again (see
        :func:`rebind`), so that the module and the notebook share it as before."""
        if self._users is None:
            self._users = {}
            modules = {n: m for n, m in list(sys.modules.items()) if n != "__main__"}
            for name in to_check(modules):
                for attr, value in _items(modules[name]):
                    if not attr.startswith("__") and not issubclass(type(value), _BY_VALUE):
                        self._users.setdefault(id(value), (name, attr))
        return self._users

    def _walk(self, package: str) -> dict[int, tuple[str, str]]:
        if self._packages is None:
            self._packages = {}
            for name, module in list(sys.modules.items()):
                if isinstance(module, types.ModuleType):
                    self._packages.setdefault(name.partition(".")[0], []).append((name, module))
        modules = dict(self._packages.get(package, []))
        user = to_check(modules)  # modules from outside the installation
        found: dict[int, tuple[str, str]] = {}
        for name, module in modules.items():
            if name in user:
                continue
            for attr, value in _items(module):
                kind = type(value)  # not value.__class__: a deprecated alias may warn on it
                if attr.startswith("__") or issubclass(kind, _BY_VALUE):
                    continue
                owner = getattr(kind, "__module__", None)
                if isinstance(owner, str) and owner.partition(".")[0] == package:
                    found.setdefault(id(value), (name, attr))
                    self._kinds.add(kind)
        return found


def _items(module: Any) -> list[tuple[str, Any]]:
    try:
        return list(vars(module).items())
    except TypeError:  # a module object without a namespace
        return []


def rebind(module: str, attr: str, value: Any) -> None:
    """Bind ``module.attr`` to ``value`` again, as it was when the image was saved."""
    __import__(module)
    setattr(sys.modules[module], attr, value)


def lookup(module: str, attr: str) -> Any:
    """The object a reference names, in this process."""
    __import__(module)
    return getattr(sys.modules[module], attr)
