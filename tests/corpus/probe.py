"""Type-aware fingerprints of a kernel's variables, to compare a saved and a restored kernel.

Runs inside the kernels (the test process never unpickles their objects). Two kernels
hold equal variables when their fingerprints are equal:

- arrays by class, dtype, shape and the exact bytes (object arrays element by element),
  tensors likewise and by dtype, shape, strides and offset; frames and series by dtypes,
  index and values, as ``.equals`` compares them, with column and index names;
- functions by code (bytecode, constants, names), defaults, closure contents and
  attributes, and whether they still read the namespace they live in; classes of the
  notebook by their methods; library classes, functions and modules by name;
- SymPy objects by ``srepr``; figures by what they show (axes, titles, limits, data);
- other objects by class and state (``__dict__``, slots, or what they pickle to).

Identity is part of a fingerprint: the second time an object is reached (through any
variable) it is written as ``["ref", path]`` to where it was first seen, so a restore
that splits an identity group or merges two equal objects changes a fingerprint. Arrays
and tensors that share memory are listed as pairs of paths.
"""

from __future__ import annotations

import hashlib
import sys
import types
from typing import Any

MAX_NODES = 20_000  # per variable; beyond it a fingerprint says only "truncated"
MAX_DEPTH = 40
_ATOMS = (type(None), bool, int, float, complex)
_CODE_ATTRS = ("co_code", "co_names", "co_varnames", "co_freevars", "co_argcount")


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=12).hexdigest()


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__name__)}"


class Fingerprinter:
    """Walks variables in name order; remembers what it saw, for identities and sharing."""

    def __init__(self, namespace: dict[str, Any]) -> None:
        self.namespace = namespace
        self.seen: dict[int, str] = {}
        self.keep: list[Any] = []  # so that ids stay unique while walking
        self.memory: list[tuple[str, int, int]] = []  # (path, low, high) of array data
        self.nodes = 0

    def variable(self, name: str, value: Any) -> Any:
        self.nodes = 0
        try:
            return self.fp(value, name, 0)
        except Exception as exc:  # a fingerprint that fails is still compared
            return ["unfingerprintable", type(value).__qualname__, type(exc).__name__]

    def fp(self, obj: Any, path: str, depth: int) -> Any:
        self.nodes += 1
        if self.nodes > MAX_NODES or depth > MAX_DEPTH:
            return ["truncated", type(obj).__qualname__]
        t = type(obj)
        if t in _ATOMS:
            return [t.__name__, repr(obj)]
        if t is str:
            return ["str", obj if len(obj) < 200 else _digest(obj.encode("utf-8", "replace"))]
        if t in (bytes, bytearray) and t is bytes:
            return ["bytes", _digest(obj)]
        if isinstance(obj, types.ModuleType):
            return ["module", obj.__name__]
        if isinstance(obj, (types.BuiltinFunctionType, types.MethodWrapperType)):
            return ["builtin", _qualname(obj), self.fp(getattr(obj, "__self__", None), path, depth)]
        if t is tuple:
            return ["tuple", [self.fp(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(obj)]]
        if isinstance(obj, type) and obj.__module__ != "__main__":
            return ["class", _qualname(obj)]
        if isinstance(obj, types.FunctionType) and _importable(obj):
            return ["function", _qualname(obj)]  # a library's: saved as a reference
        if t.__module__.startswith("sympy."):
            from sympy import Basic, srepr

            if isinstance(obj, Basic):  # immutable, and interned: no identity to keep
                return ["sympy", _qualname(t), srepr(obj)]
        seen = self.seen.get(id(obj))
        if seen is not None:
            return ["ref", seen]
        self.seen[id(obj)] = path
        self.keep.append(obj)
        return self.tracked(obj, t, path, depth + 1)

    def tracked(self, obj: Any, t: type, path: str, depth: int) -> Any:
        mod = t.__module__.partition(".")[0]
        if t is list:
            return ["list", [self.fp(v, f"{path}[{i}]", depth) for i, v in enumerate(obj)]]
        if t is bytearray:
            return ["bytearray", _digest(bytes(obj))]
        if isinstance(obj, dict):
            items = [
                [self.fp(k, f"{path}{{key}}", depth), self.fp(v, f"{path}[{k!r:.40}]", depth)]
                for k, v in obj.items()
            ]
            extra = self.fp(self.attributes(obj, t), f"{path}.__dict__", depth)
            return [
                _qualname(t),
                items,
                self.fp(getattr(obj, "default_factory", None), path, depth),
                extra,
            ]
        if isinstance(obj, (set, frozenset)):
            elements = sorted((self.fp(v, f"{path}{{}}", depth) for v in obj), key=repr)
            return [_qualname(t), elements]
        if mod == "numpy":
            import numpy as np

            if isinstance(obj, np.ndarray):
                return self.ndarray(obj, path, depth)
            if isinstance(obj, np.generic):
                return ["npscalar", obj.dtype.str, _digest(obj.tobytes())]
            if isinstance(obj, np.dtype):
                return ["dtype", obj.str, repr(obj)]
        if isinstance(obj, types.FunctionType):
            return self.function(obj, path, depth)
        if isinstance(obj, types.MethodType):
            return [
                "method",
                obj.__func__.__qualname__,
                self.fp(obj.__self__, f"{path}.__self__", depth),
            ]
        if isinstance(obj, (staticmethod, classmethod)):
            return [_qualname(t), self.fp(obj.__func__, f"{path}.__func__", depth)]
        if isinstance(obj, property):
            parts = (obj.fget, obj.fset, obj.fdel)
            return ["property", [self.fp(f, f"{path}.fget", depth) for f in parts]]
        if isinstance(obj, type):  # the notebook's own class, its attributes in any order
            skip = ("__dict__", "__weakref__", "__slotnames__")  # copyreg's cache
            attrs = {k: v for k, v in sorted(vars(obj).items()) if k not in skip}
            bases = [self.fp(b, f"{path}.__bases__", depth) for b in obj.__bases__]
            return ["class", obj.__qualname__, bases, self.fp(attrs, f"{path}.__dict__", depth)]
        if mod == "torch":
            return self.torch(obj, t, path, depth)
        if mod == "pandas":
            return self.pandas(obj, t, path, depth)
        if mod == "sympy":
            from sympy import Basic, srepr
            from sympy.matrices import MatrixBase

            if isinstance(obj, (Basic, MatrixBase)):
                return ["sympy", _qualname(t), srepr(obj)]
        if mod in ("matplotlib", "mpl_toolkits"):
            summary = self.matplotlib(obj, path, depth)
            if summary is not None:
                return summary
        if isinstance(obj, types.CodeType):
            return self.code(obj, path, depth)
        if isinstance(obj, (types.GeneratorType, types.CoroutineType, types.FrameType)):
            return ["opaque", _qualname(t)]
        return self.instance(obj, t, path, depth)

    def attributes(self, obj: Any, t: type) -> dict[str, Any]:
        """An instance's attributes; a library's without its private ones."""
        attrs = dict(vars(obj)) if isinstance(getattr(obj, "__dict__", None), dict) else {}
        if t.__module__ != "__main__":
            attrs = {k: v for k, v in attrs.items() if not k.startswith("_")}
        return attrs

    def instance(self, obj: Any, t: type, path: str, depth: int) -> Any:
        """The notebook's objects by all their attributes; a library's by the public part
        of the state its class declares for pickling (``__getstate__``): what it leaves
        out, or rebuilds, on purpose is its own business."""
        state: list[Any] = []
        if t.__module__ != "__main__" and hasattr(obj, "__getstate__"):
            try:
                declared = obj.__getstate__()
            except Exception:
                declared = None
            if isinstance(declared, tuple) and len(declared) == 2:  # (__dict__, slots)
                declared = {**(declared[0] or {}), **(declared[1] or {})}
            if isinstance(declared, dict):
                public = {k: v for k, v in declared.items() if not str(k).startswith("_")}
                return ["object", _qualname(t), [self.fp(public, f"{path}.__dict__", depth)]]
        if hasattr(obj, "__dict__") and isinstance(vars(obj), dict):
            state.append(self.fp(dict(vars(obj)), f"{path}.__dict__", depth))
        slots = [s for c in t.__mro__ for s in getattr(c, "__slots__", ()) if isinstance(s, str)]
        for slot in slots:
            if slot not in ("__dict__", "__weakref__") and hasattr(obj, slot):
                state.append([slot, self.fp(getattr(obj, slot), f"{path}.{slot}", depth)])
        if not state:
            try:
                reduced = obj.__reduce_ex__(4)
            except Exception:
                reduced = None
            if isinstance(reduced, tuple) and len(reduced) > 1:
                state.append(self.fp(reduced[1:3], f"{path}.__reduce__", depth))
            else:
                text = repr(obj)
                state.append(text if " at 0x" not in text else "opaque")
        return ["object", _qualname(t), state]

    def function(self, fn: types.FunctionType, path: str, depth: int) -> Any:
        closure = [
            self.fp(cell.cell_contents, f"{path}.__closure__[{i}]", depth)
            if _filled(cell)
            else "empty"
            for i, cell in enumerate(fn.__closure__ or ())
        ]
        return [
            "function",
            fn.__module__,
            fn.__qualname__,
            self.code(fn.__code__, path, depth),
            self.fp(fn.__defaults__, f"{path}.__defaults__", depth),
            self.fp(fn.__kwdefaults__, f"{path}.__kwdefaults__", depth),
            closure,
            self.fp(dict(vars(fn)), f"{path}.__dict__", depth),
            # a notebook function reads the kernel's namespace, not a copy
            fn.__module__ != "__main__" or fn.__globals__ is self.namespace,
        ]

    def code(self, code: types.CodeType, path: str, depth: int) -> Any:
        consts = [
            self.code(c, path, depth)
            if isinstance(c, types.CodeType)
            else repr(sorted(c, key=repr) if isinstance(c, frozenset) else c)
            for c in code.co_consts
        ]
        return ["code", [repr(getattr(code, a)) for a in _CODE_ATTRS], consts]

    def ndarray(self, a: Any, path: str, depth: int) -> Any:
        import numpy as np

        head = [_qualname(type(a)), a.dtype.str, repr(a.dtype), list(a.shape)]
        if isinstance(a, np.ma.MaskedArray):
            head.append(self.fp(np.ma.getmaskarray(a).copy(), f"{path}.mask", depth))
            head.append(repr(a.fill_value))
        if a.dtype.hasobject:
            items = [self.fp(v, f"{path}.flat[{i}]", depth) for i, v in enumerate(a.flat)]
            return [*head, items]
        if a.size and a.nbytes:
            self.memory.append((path, *_bounds(a)))
        return [*head, _digest(np.ascontiguousarray(a).view(np.uint8).tobytes())]

    def torch(self, obj: Any, t: type, path: str, depth: int) -> Any:
        import torch

        if isinstance(obj, torch.Tensor):
            head = [
                _qualname(t),
                str(obj.dtype),
                str(obj.device),
                list(obj.shape),
                list(obj.stride()),
                obj.storage_offset(),
                obj.requires_grad,
            ]
            data = obj.detach().cpu().contiguous()
            if data.dtype.is_floating_point or data.dtype.is_complex:
                data = data.view(torch.uint8) if data.numel() else data
            head.append(_digest(data.numpy().tobytes()) if data.numel() else "empty")
            grad = obj.grad
            head.append(self.fp(grad, f"{path}.grad", depth) if grad is not None else None)
            storage = obj.untyped_storage()
            if storage.nbytes():
                self.memory.append(
                    (path, storage.data_ptr(), storage.data_ptr() + storage.nbytes())
                )
            return head
        if isinstance(obj, torch.nn.Module):
            state = {k: self.fp(v, f"{path}.{k}", depth) for k, v in obj.state_dict().items()}
            children = [[n, self.fp(m, f"{path}.{n}", depth)] for n, m in obj.named_children()]
            return ["module", _qualname(t), repr(obj), state, children, obj.training]
        if isinstance(obj, torch.optim.Optimizer):
            return ["optimizer", _qualname(t), self.fp(obj.state_dict(), f"{path}.state", depth)]
        if isinstance(obj, (torch.dtype, torch.device, torch.Size)):
            return [_qualname(t), repr(obj)]
        return self.instance(obj, t, path, depth)

    def pandas(self, obj: Any, t: type, path: str, depth: int) -> Any:
        import pandas as pd

        if isinstance(obj, pd.DataFrame):
            columns = [
                [self.fp(c, path, depth), self.series(obj.iloc[:, i], f"{path}[{c!r:.40}]", depth)]
                for i, c in enumerate(obj.columns)
            ]
            return ["DataFrame", self.index(obj.index, path, depth), columns]
        if isinstance(obj, pd.Series):
            return ["Series", self.fp(obj.name, path, depth), self.series(obj, path, depth)]
        if isinstance(obj, pd.Index):
            return self.index(obj, path, depth)
        return self.instance(obj, t, path, depth)

    def series(self, s: Any, path: str, depth: int) -> Any:
        values = s.to_numpy(dtype=object) if s.dtype == object else s.to_numpy()
        return [str(s.dtype), self.index(s.index, path, depth), self.values(values, path, depth)]

    def index(self, index: Any, path: str, depth: int) -> Any:
        values = index.to_numpy()
        return [
            _qualname(type(index)),
            list(index.names),
            str(index.dtype),
            self.values(values, path, depth),
        ]

    def values(self, values: Any, path: str, depth: int) -> Any:
        if values.dtype.hasobject:
            return [self.fp(v, path, depth) for v in values.tolist()]
        import numpy as np

        return [
            values.dtype.str,
            list(values.shape),
            _digest(np.ascontiguousarray(values).tobytes()),
        ]

    def matplotlib(self, obj: Any, path: str, depth: int) -> Any:
        """What a figure shows: artists are compared by their visible state."""
        from matplotlib.artist import Artist

        if not isinstance(obj, Artist):
            return None
        from matplotlib.axes import Axes
        from matplotlib.figure import Figure, SubFigure
        from matplotlib.lines import Line2D
        from matplotlib.text import Text

        kind = _qualname(type(obj))
        if isinstance(obj, (Figure, SubFigure)):
            fig = obj if isinstance(obj, Figure) else obj.figure
            axes = [self.fp(ax, f"{path}.axes[{i}]", depth) for i, ax in enumerate(obj.axes)]
            return [kind, list(fig.get_size_inches()), fig.dpi, axes]
        if isinstance(obj, Axes):
            lines = [self.fp(line, f"{path}.lines", depth) for line in obj.get_lines()]
            images = [_digest(repr(im.get_array()).encode()) for im in obj.get_images()]
            return [
                kind,
                obj.get_title(),
                obj.get_xlabel(),
                obj.get_ylabel(),
                [repr(v) for v in (*obj.get_xlim(), *obj.get_ylim())],
                lines,
                images,
                len(obj.collections),
                len(obj.patches),
                [t.get_text() for t in obj.texts],
            ]
        if isinstance(obj, Line2D):
            x, y = obj.get_data()
            return [kind, obj.get_label(), repr(x), repr(y), str(obj.get_color())]
        if isinstance(obj, Text):
            return [kind, obj.get_text(), repr(obj.get_position())]
        return [kind, str(obj.get_label()), obj.get_visible()]

    def shared(self) -> list[list[str]]:
        """Pairs of paths whose array data overlap in memory."""
        spans = sorted(self.memory, key=lambda m: (m[1], m[2]))
        pairs = []
        for i, (path, _, high) in enumerate(spans):
            for other, o_low, _ in spans[i + 1 :]:
                if o_low >= high:
                    break
                pairs.append(sorted([path, other]))
        return sorted(pairs)


def _importable(fn: types.FunctionType) -> bool:
    """A library function that its module hands out under its name."""
    module = sys.modules.get(fn.__module__ or "")
    if module is None or fn.__module__ == "__main__":
        return False
    target: Any = module
    for part in fn.__qualname__.split("."):
        target = getattr(target, part, None)
    return target is fn


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:
        return False
    return True


def _bounds(a: Any) -> tuple[int, int]:
    import numpy as np

    try:
        return np.lib.array_utils.byte_bounds(a)
    except AttributeError:  # numpy < 2
        return np.byte_bounds(a)


def snapshot(names: list[str] | None = None) -> dict[str, Any]:
    """Fingerprints of the user's variables (or ``names``), and the shared-memory pairs."""
    from IPython import get_ipython

    from jupyter_ckpt.kernel.state import user_variables

    shell = get_ipython()
    variables = user_variables(shell)
    chosen = sorted(variables) if names is None else sorted(n for n in names if n in variables)
    walker = Fingerprinter(shell.user_ns)
    prints = {name: walker.variable(name, variables[name]) for name in chosen}
    return {"names": prints, "shared": walker.shared()}


def write_snapshot(path: str) -> int:
    """Write :func:`snapshot` to ``path`` as JSON (it can be large); return the count."""
    import json

    shot = snapshot()
    with open(path, "w") as f:
        json.dump(shot, f)
    return len(shot["names"])


def dill_dump(path: str) -> dict[str, Any]:
    """dill's save of the same state (``dump_module`` of ``__main__``): seconds, or why not."""
    import time

    import dill

    started = time.perf_counter()
    try:
        dill.dump_module(path)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    return {"seconds": time.perf_counter() - started}


def dill_load(path: str) -> dict[str, Any]:
    """dill's restore of what :func:`dill_dump` wrote, into this kernel's ``__main__``."""
    import time

    import dill

    started = time.perf_counter()
    try:
        dill.load_module(path, module=sys.modules["__main__"])
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    return {"seconds": time.perf_counter() - started}
