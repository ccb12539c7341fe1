"""The pickler: cloudpickle (notebook functions and classes by value) plus reducers that
keep large buffers out of band and shared memory shared.

* numpy views are saved as (base, offset, shape, strides), so a view and its base share
  memory again after restore, and the base's bytes go out of band once;
* torch tensors are saved as (storage, offset, size, stride); each storage is one object,
  so tensors sharing a storage (a model's parameters and their views) share it again, and
  its bytes go out of band without the ``torch.save`` round trip;
* numpy and torch sharing memory (``torch.from_numpy``, ``tensor.numpy()``): the one
  saved second is saved as a view of the other's memory;
* functions defined in the notebook keep the *kernel's* namespace as their globals instead
  of the private copy cloudpickle would give them, so they see later changes as before;
  ``lru_cache`` wrappers of them are saved by value too, and anything else that would be
  saved as a mere reference to the notebook is refused (restore could not resolve it).

Why cloudpickle over dill: it is the faster of the two on the notebook-function case
(it pickles code by value and everything else with the C pickler), and it is what
joblib/dask/ray ship, so its behaviour on notebook objects is well trodden. Its Python
hook (``reducer_override``) runs once per object of a non-builtin class; it answers from
a per-class cache after the first instance.
"""

from __future__ import annotations

import contextvars
import copyreg
import functools
import io
import pickle
import sys
import types
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import cloudpickle
from cloudpickle import cloudpickle as _cp

from . import devices, module_objects

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

PROTOCOL = 5
# Buffers smaller than this stay inside the pickle stream: a chunk per tiny array would
# cost more in file operations than it saves in copies.
OUT_OF_BAND_MIN = 64 << 10

# The namespace functions are bound to while an image is being unpickled.
target_namespace: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar(
    "jupyter_ckpt_namespace"
)


class _NamespaceRef:
    """Stands for the kernel's namespace inside a pickle."""

    def __reduce__(self) -> tuple[Callable[[], dict[str, Any]], tuple[()]]:
        return _namespace, ()


_NAMESPACE_REF = _NamespaceRef()


def _namespace() -> dict[str, Any]:
    return target_namespace.get()


def _set_function_state(func: types.FunctionType, state: tuple[dict, dict]) -> None:
    """cloudpickle's function setstate, minus writing into the (shared) globals."""
    attrs, slots = state
    func.__dict__.update(attrs)
    slots = dict(slots)
    slots.pop("__globals__", None)
    slots.pop("_cloudpickle_submodules", None)
    # Images written before closures kept their cells (see _cell_reduce) made each
    # function with cells of its own, filled from these.
    closure = slots.pop("__closure__", None)
    if closure is not None:
        for cell, saved in zip(func.__closure__ or (), closure, strict=False):
            try:
                cell.cell_contents = saved.cell_contents
            except ValueError:  # an empty cell
                continue
    for key, value in slots.items():
        setattr(func, key, value)


def _cell_reduce(cell: types.CellType) -> Any:
    """A closure cell, made empty and filled afterwards: pickle's memo then hands the same
    cell to every function that shares it (two closures over one ``nonlocal``), and a
    cell that holds its own function (a recursive closure) is memoized before its
    contents are saved."""
    try:
        contents = cell.cell_contents
    except ValueError:
        return _cp._make_empty_cell, ()
    return _cp._make_empty_cell, (), (contents,), None, None, _fill_cell


def _fill_cell(cell: types.CellType, state: tuple[Any]) -> None:
    cell.cell_contents = state[0]


def _with_slots(reduced: Any, cls: type) -> Any:
    """cloudpickle's reduce of a class defined in the notebook, made with its
    ``__slots__``: cloudpickle makes the class first and sets its attributes afterwards,
    when ``__slots__`` no longer has an effect (instances would get a ``__dict__``)."""
    func, (constructor, name, bases, kwargs, *rest), *state = reduced
    slots = vars(cls)["__slots__"]
    return (func, (constructor, name, bases, {**kwargs, "__slots__": slots}, *rest), *state)


def _lru_cache(func: Any, maxsize: int | None, typed: bool) -> Any:
    return functools.lru_cache(maxsize=maxsize, typed=typed)(func)


def _rebuild_view(
    base: Any, offset: int, shape: tuple, strides: tuple, dtype: Any, writeable: bool = True
) -> Any:
    import numpy as np

    # An F-ordered base exports its buffer through its (C-ordered) transpose: same memory.
    buffer = base if base.flags.c_contiguous else base.T
    view = np.ndarray(shape, dtype=dtype, buffer=buffer, offset=offset, strides=strides)
    if not writeable:  # e.g. broadcast_to and diagonal views: writes must keep failing
        view.flags.writeable = False
    return view


def _rebuild_subclass_view(view: tuple, cls: type, attributes: dict[str, Any]) -> Any:
    rebuilt = _rebuild_view(*view).view(cls)
    rebuilt.__dict__.update(attributes)
    return rebuilt


class DeviceBuffer:
    """The bytes of one device storage, copied to the host only piece by piece as they
    are written (:meth:`host_parts`), so a save never holds a whole GPU state in RAM."""

    def __init__(self, storage: Any) -> None:
        self.storage = storage
        self.nbytes = storage.nbytes()

    def host_parts(self, size: int) -> Iterator[Any]:
        """Host copies of consecutive pieces of at most ``size`` bytes; each piece is only
        referenced here until the next one is asked for."""
        for start in range(0, self.nbytes, size):
            yield devices.device_ops.to_host(self.storage, start, min(start + size, self.nbytes))


class _DeviceSlot(bytearray):
    """An empty stand-in for a device storage's bytes: it takes the buffer's place in the
    stream, and the pickler hands on its :class:`DeviceBuffer`. Writable, so the stream
    marks no read-only buffer."""

    source: DeviceBuffer


class _StorageRef:
    """One torch storage; pickle's memo makes every tensor on it share the rebuilt one."""

    def __init__(self, storage: Any, device: str, array: Any = None, copy: bool = True) -> None:
        self.storage = storage
        self.device = device
        self.address = storage.data_ptr()
        self.array = array  # the numpy array whose memory this (CPU) storage is
        self._buffer: Any = None if copy else b""  # a trial pickle copies no device data

    def __reduce__(self) -> tuple[Any, tuple]:
        if self.array is not None:
            return _storage_on_array, (self.array, self.storage.nbytes())
        if self._buffer is None:
            slot = self._out_of_band()  # an empty bytearray: test it against None
            self._buffer = self._host_copy() if slot is None else slot
        return _rebuild_storage, (pickle.PickleBuffer(self._buffer), self.device)

    def _out_of_band(self) -> _DeviceSlot | None:
        """A large device storage is copied later, in bounded pieces, as it is written."""
        if self.device == "cpu" or self.storage.nbytes() < OUT_OF_BAND_MIN:
            return None
        slot = _DeviceSlot()
        slot.source = DeviceBuffer(self.storage)
        return slot

    def _host_copy(self) -> Any:
        import torch

        nbytes = self.storage.nbytes()
        if not nbytes:
            return b""
        if self.device != "cpu":
            return devices.device_ops.to_host(self.storage, 0, nbytes)  # small: in the stream
        return torch.empty(0, dtype=torch.uint8, device="cpu").set_(self.storage).numpy()


def _rebuild_storage(buffer: Any, device: str) -> Any:
    import torch

    view = memoryview(buffer)
    u8 = (
        torch.frombuffer(view, dtype=torch.uint8)
        if view.nbytes
        else torch.empty(0, dtype=torch.uint8)
    )
    mapper = devices.current_mapper.get()
    target = mapper.resolve(device) if mapper else device
    if target != "cpu":
        u8 = devices.device_ops.to_device(u8, target)
    return u8.untyped_storage()


def _rebuild_tensor(
    storage: Any,
    offset: int,
    size: tuple,
    stride: tuple,
    dtype: Any,
    requires_grad: bool,
    grad: Any = None,
) -> Any:
    import torch

    tensor = torch.empty(0, dtype=dtype, device=storage.device)
    tensor.set_(storage, offset, size, stride)
    if requires_grad:
        tensor.requires_grad_(True)
    if grad is not None:
        tensor.grad = grad
    return tensor


def _with_grad(rebuild: Callable[..., Any], args: tuple, grad: Any) -> Any:
    """A tensor subclass (a Parameter) rebuilt by its own reduce, with its gradient:
    torch's reduce leaves ``.grad`` out, and a training loop reads it."""
    tensor = rebuild(*args)
    tensor.grad = grad
    return tensor


def _sympy_expression(obj: Any) -> bool:
    """A SymPy expression built from others (an atom, such as a symbol, is not: it is
    rebuilt through SymPy's cache, as the same object; nor is a polynomial, which checks
    its generators as it is built)."""
    sympy = sys.modules.get("sympy")
    return sympy is not None and isinstance(obj, sympy.Expr) and not isinstance(obj, sympy.Atom)


def _unevaluated(rebuild: Callable[..., Any], args: tuple) -> Any:
    """A SymPy expression rebuilt from its arguments as it was, not evaluated again: SymPy's
    own reduce calls the class, which turns ``Add(x, x, evaluate=False)`` into ``2*x``."""
    from sympy.core.parameters import evaluate

    try:
        with evaluate(False):
            return rebuild(*args)
    except Exception:  # a class that cannot be built unevaluated: as SymPy rebuilds it
        return rebuild(*args)


def _named_by_its_reduce(obj: Any) -> bool:
    """An object pickle saves by name already (a dtype, an enum member, a singleton)."""
    try:
        return isinstance(obj.__reduce_ex__(PROTOCOL), str)
    except Exception:  # one that cannot reduce itself: the reference is what saves it
        return False


def _typed_tuple(cls: type) -> bool:
    """A ``typing.NamedTuple`` class: made with its (empty) slots, it refuses others."""
    import typing

    return typing.NamedTuple in getattr(cls, "__orig_bases__", ())


def _special(cls: type) -> bool:
    """Whether instances of ``cls`` may reduce differently one from another (by value or
    not, a view or an owner, on a device or not), so the answer for one does not hold
    for its class."""
    return (
        issubclass(cls, (type, types.FunctionType, io.IOBase))
        or issubclass(cls, types.ModuleType)  # recorded in ``modules``, one by one
        or (cls.__module__, cls.__name__) in (("numpy", "ndarray"), ("torch", "Tensor"))
        or _array_subclass(cls)
        or _tensor_class(cls)  # a Parameter with a gradient or without
    )


def _array_subclass(cls: type) -> bool:
    """A subclass of numpy's ndarray (recarray, masked arrays, a user's)."""
    numpy = sys.modules.get("numpy")
    return numpy is not None and issubclass(cls, numpy.ndarray) and cls is not numpy.ndarray


def _array_root(arr: Any) -> Any:
    """The array at the end of ``arr``'s chain of bases: the one that owns the memory (or
    holds foreign memory)."""
    import numpy as np

    while isinstance(arr.base, np.ndarray):
        arr = arr.base
    return arr


class CkptPickler(cloudpickle.Pickler):
    """Pickles an image's variables (one stream: see :mod:`.stream`); records what it saw
    for the manifest."""

    def __init__(
        self,
        file: SupportsWrite[bytes],
        namespace: dict[str, Any],
        storages: dict[tuple[str, int], _StorageRef],
        trial: bool = False,
        library_objects: module_objects.ModuleObjects | None = None,
    ) -> None:
        # a trial (see stream.Stream) only finds out whether a value pickles: device data
        # is not copied to the host for it
        self.trial = trial
        # host buffers (memoryviews) and device storages, in stream order
        self.buffers: list[memoryview | DeviceBuffer] = []
        # cloudpickle's table is a ChainMap: looked up (a Python call and a KeyError) for
        # every instance of a class without a reducer of its own. A dict merged now, the
        # same lookups at C speed; the C pickler reads it in __init__.
        self.dispatch_table = {
            **copyreg.dispatch_table,
            **cloudpickle.Pickler._dispatch_table,
            types.CellType: _cell_reduce,
        }
        super().__init__(file, protocol=PROTOCOL, buffer_callback=self._buffer_callback)
        self.namespace = namespace
        self.storages = storages
        # library objects saved as references (see :mod:`.module_objects`)
        self.library_objects = library_objects or module_objects.ModuleObjects()
        # every module the stream refers to: by its classes, functions and module objects
        self.modules: set[str] = set()
        self.devices: set[str] = set()
        # Arrays that own their memory, by address: tensors on that memory share it.
        self._arrays: dict[int, Any] = {}
        # Classes whose instances take pickle's own path (their module is in ``modules``).
        self._plain: set[type] = set()

    def _buffer_callback(self, buffer: pickle.PickleBuffer) -> bool:
        raw = buffer.raw()
        if isinstance(raw.obj, _DeviceSlot):
            self.buffers.append(raw.obj.source)
            return False
        if raw.nbytes < OUT_OF_BAND_MIN:
            return True  # in band
        self.buffers.append(raw)
        return False

    def reducer_override(self, obj: Any) -> Any:
        cls = type(obj)
        if cls in self._plain:  # called for every instance: the common case goes first
            return NotImplemented
        where = self.library_objects.find(obj)
        if where is not None and not _named_by_its_reduce(obj):
            self.modules.add(where[0])
            return module_objects.lookup, where
        reduced = self._reduce(obj, cls)
        if (
            reduced is NotImplemented
            and not _special(cls)
            and not hasattr(obj, "__qualname__")
            and not self.library_objects.has_instances(cls)
        ):
            self._plain.add(cls)
        return reduced

    def _reduce(self, obj: Any, cls: type) -> Any:
        module = getattr(cls, "__module__", None)
        if module and module != "builtins":
            self.modules.add(module)
        if isinstance(obj, types.ModuleType):
            self.modules.add(obj.__name__)
        elif isinstance(obj, (type, types.FunctionType)) and isinstance(obj.__module__, str):
            self.modules.add(obj.__module__)
        if module == "numpy" and cls.__name__ == "ndarray":
            return self._reduce_ndarray(obj)
        if _array_subclass(cls):
            return self._reduce_subclass_view(obj)
        if module == "torch" and cls.__name__ == "Tensor":
            return self._reduce_tensor(obj)
        if module and module.startswith("sympy.") and _sympy_expression(obj):
            reduced = obj.__reduce_ex__(PROTOCOL)
            if isinstance(reduced, tuple) and len(reduced) >= 2:
                return (_unevaluated, (reduced[0], reduced[1]), *reduced[2:])
        if _is_tensor(obj) and obj.is_leaf and obj.grad is not None:
            reduced = obj.__reduce_ex__(PROTOCOL)
            if isinstance(reduced, tuple) and len(reduced) == 2:
                return _with_grad, (*reduced, obj.grad)
        if module == "__main__" or getattr(obj, "__module__", None) == "__main__":
            by_value = self._reduce_notebook_object(obj)
            if by_value is not None:
                return by_value
        if isinstance(obj, type) and "__slots__" in vars(obj) and not _typed_tuple(obj):
            reduced = super().reducer_override(obj)
            if isinstance(reduced, tuple) and reduced[0] is _cp._make_skeleton_class:
                return _with_slots(reduced, obj)
            return reduced
        if isinstance(obj, io.IOBase) and not isinstance(obj, (io.BytesIO, io.StringIO)):
            # cloudpickle would save a file opened for reading as a StringIO copy of its
            # contents; a restore that hands back something else than a file is worse than
            # saying the file was not saved.
            raise TypeError(f"cannot save an open file ({getattr(obj, 'name', cls.__name__)!r})")
        return super().reducer_override(obj)

    def _reduce_notebook_object(self, obj: Any) -> Any:
        """Objects that name themselves as defined in the notebook (a decorated function)
        would be pickled by reference to ``__main__``, where restore cannot find them: the
        namespace is filled only once everything is loaded. ``lru_cache``/``cache``
        wrappers are saved by value (their function, not their cache); any other is
        refused, so that "saved" always means "comes back"."""
        qualname = getattr(obj, "__qualname__", None)
        if not isinstance(qualname, str) or isinstance(obj, (type, types.FunctionType)):
            return None  # instances, and what cloudpickle saves by value itself
        if type(obj) in self.dispatch_table:
            # a staticmethod or classmethod of a notebook class names its function's
            # module and qualname, and has a reducer of its own in the table
            return None
        if isinstance(obj, functools._lru_cache_wrapper):
            params = obj.cache_parameters()
            return _lru_cache, (obj.__wrapped__, params["maxsize"], params["typed"])
        if isinstance(obj.__reduce_ex__(PROTOCOL), str):
            raise pickle.PicklingError(
                f"{type(obj).__name__} {qualname!r} is saved by reference to the notebook's "
                "namespace, which a restore cannot look into"
            )
        return None

    def _dynamic_function_reduce(self, func: types.FunctionType) -> Any:
        if func.__globals__ is not self.namespace:
            return super()._dynamic_function_reduce(func)
        code, _, name, defaults, closure = self._function_getnewargs(func)
        attrs, slots = _cp._function_getstate(func)
        slots["__globals__"] = {}
        del slots["__closure__"]  # the function is made with its cells
        return (
            _cp._make_function,
            (code, _NAMESPACE_REF, name, defaults, closure),
            (attrs, slots),
            None,
            None,
            _set_function_state,
        )

    def _function_getnewargs(self, func: types.FunctionType) -> Any:
        """cloudpickle's, with the function's own closure cells (see :func:`_cell_reduce`)
        rather than new empty ones, so closures that share a cell share it after a
        restore."""
        code, base_globals, name, defaults, _ = super()._function_getnewargs(func)
        return code, base_globals, name, defaults, func.__closure__

    def _reduce_ndarray(self, arr: Any) -> Any:
        if arr.dtype.hasobject:
            return NotImplemented
        if arr.base is None:
            return self._reduce_owner(arr)
        # The outermost ndarray of the chain: its own base may be foreign memory (a restored
        # array's base is the segment it was read into), which then travels with it.
        base = arr.base
        while type(base) is type(arr) and type(base.base) is type(arr):
            base = base.base
        if _is_tensor(base):  # tensor.numpy(): the tensor's storage, shared
            ref = self._storage_ref(base.detach())
            return _on_storage(ref, arr, arr.__array_interface__["data"][0] - ref.address)
        if type(base) is not type(arr) and _array_subclass(type(base)):
            base = _array_root(base)  # e.g. np.asarray(recarray): its memory is the root's
        if type(base) is not type(arr) and not _array_subclass(type(base)):
            return self._reduce_owner(arr)  # foreign memory: saved as a copy it will own
        if base.dtype.hasobject:
            return NotImplemented
        if not (base.flags.c_contiguous or base.flags.f_contiguous):
            return NotImplemented  # no single buffer to rebuild the view from
        offset = arr.__array_interface__["data"][0] - base.__array_interface__["data"][0]
        args = (base, offset, arr.shape, arr.strides, arr.dtype)
        return _rebuild_view, args if arr.flags.writeable else (*args, False)

    def _reduce_subclass_view(self, arr: Any) -> Any:
        """A view of an ndarray subclass (``data.view(np.recarray)``, a masked array's
        slice, a user's subclass): a view of its root's memory made into its class again,
        with its attributes, so it shares memory with its base after restore as before.
        Owners, and views this cannot rebuild, take the subclass's own reduce (a copy)."""
        if arr.base is None or arr.dtype.hasobject or type(arr).__name__ == "memmap":
            return NotImplemented
        root = _array_root(arr)
        if root is arr or root.dtype.hasobject:
            return NotImplemented
        if not (root.flags.c_contiguous or root.flags.f_contiguous):
            return NotImplemented
        offset = arr.__array_interface__["data"][0] - root.__array_interface__["data"][0]
        view = (root, offset, arr.shape, arr.strides, arr.dtype, arr.flags.writeable)
        return _rebuild_subclass_view, (view, type(arr), dict(vars(arr)))

    def _reduce_tensor(self, tensor: Any) -> Any:
        if not saved_as_storage(tensor):
            return NotImplemented
        requires_grad, grad = tensor.requires_grad, tensor.grad if tensor.is_leaf else None
        tensor = tensor.detach()
        args = (
            self._storage_ref(tensor),
            tensor.storage_offset(),
            tuple(tensor.size()),
            tensor.stride(),
            tensor.dtype,
            requires_grad,
        )
        return _rebuild_tensor, args if grad is None else (*args, grad)

    def _storage_ref(self, tensor: Any) -> _StorageRef:
        """The one :class:`_StorageRef` of ``tensor``'s storage. A CPU storage over the
        memory of a numpy array saved before (``torch.from_numpy``) is saved as that
        array's memory, so the two share it again after restore."""
        device = devices.device_ops.device_of(tensor)
        self.devices.add(device)
        storage = tensor.untyped_storage()
        key = (device, storage.data_ptr())
        ref = self.storages.get(key)
        if ref is None or ref.storage.nbytes() != storage.nbytes():
            owner = self._arrays.get(key[1]) if device == "cpu" else None
            if owner is not None and owner.nbytes < storage.nbytes():
                owner = None
            ref = self.storages[key] = _StorageRef(storage, device, owner, not self.trial)
        return ref

    def _reduce_owner(self, arr: Any) -> Any:
        """An array that owns its memory (or that will, once restored: one over foreign
        memory): numpy's own (out-of-band) reduce, unless a tensor saved before lives on
        that memory (``torch.from_numpy`` with the tensor saved first); then it is saved
        as a view of the tensor's storage."""
        address = arr.__array_interface__["data"][0]
        if arr.nbytes and (arr.flags.c_contiguous or arr.flags.f_contiguous):
            ref = self.storages.get(("cpu", address))
            if ref is not None and ref.storage.nbytes() >= arr.nbytes:
                return _on_storage(ref, arr, 0)
            self._arrays[address] = arr
        return NotImplemented


def saved_as_storage(tensor: Any) -> bool:
    """Whether a tensor is saved as its storage and a view of it. The others (sparse,
    quantized, nested; lazy conj/neg views, whose bits only torch's own reduce keeps) take
    torch's reduce, which reads device data through the device."""
    import torch

    return tensor.layout == torch.strided and not (
        tensor.is_quantized or tensor.is_nested or tensor.is_conj() or tensor.is_neg()
    )


def _is_tensor(obj: Any) -> bool:
    return _tensor_class(type(obj))


def _tensor_class(cls: type) -> bool:
    return (cls.__module__ or "").startswith("torch") and any(
        (c.__module__, c.__name__) == ("torch", "Tensor") for c in cls.__mro__
    )


def _on_storage(ref: _StorageRef, arr: Any, offset: int) -> Any:
    args = (ref, offset, arr.shape, arr.strides, arr.dtype)
    return _array_on_storage, args if arr.flags.writeable else (*args, False)


def _array_on_storage(
    storage: Any, offset: int, shape: tuple, strides: tuple, dtype: Any, writeable: bool = True
) -> Any:
    import torch

    u8 = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
    return _rebuild_view(u8.numpy(), offset, shape, strides, dtype, writeable)


def _storage_on_array(array: Any, nbytes: int) -> Any:
    import numpy as np
    import torch

    flat = array if array.flags.c_contiguous else array.T
    u8 = np.ndarray((nbytes,), dtype=np.uint8, buffer=flat)
    return torch.from_numpy(u8).untyped_storage()


def loads(data: memoryview, buffers: list[memoryview], namespace: dict[str, Any]) -> Any:
    token = target_namespace.set(namespace)
    try:
        return pickle.loads(data, buffers=buffers)
    finally:
        target_namespace.reset(token)
