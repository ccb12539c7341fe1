"""All saved variables in one pickle stream, one pickle per variable.

Why one stream: sharing between variables (``b is a``, a model and its optimizer, a view
and its base, a cycle through two variables) is exactly what pickle's memo already tracks,
in C. One :class:`~.pickler.CkptPickler` dumps every variable in turn, keeping its memo, so
an object a later variable reaches again is written as a reference to the earlier one: a
save costs one C-speed pass and nothing per object in Python. (Finding sharing first and
pickling groups of variables afterwards needed a Python-level copy and walk of every
pickler's memo and a second pass: 30x ``pickle.dumps`` on object-heavy state.
``persistent_id`` cross-references would call Python once per object, as would any walk.)

Per-variable boundaries keep the promises of separate pickles:

* each variable is its own ``dump`` (so its own ``load``), followed by the dump of a
  *probe*, a fresh empty list whose memo index marks where the variable's memo entries end;
  the manifest records each variable's ``[start, end, first buffer, slots]`` in the stream
  (``slots``: the memo slots used up to its end);
* a variable that fails to pickle is listed as lost with the reason, and the others go on.
  Most fail in a trial first (pickled alone, up to 64 KiB, bytes thrown away): the cost of
  trying them, and the stream never saw them. One that fails in the stream is rewound: the
  stream and the out-of-band buffers are cut back to its start and the memo to the previous
  probe (one copy of the whole memo);
* a variable that fails to unpickle is reported with the reason, and the rest of the stream
  still loads, with every object the failed variable finished (a class, a function's code,
  a string) and without those it left unfinished: see :mod:`.salvage`. A later variable
  that needs an unfinished one is reported with the same reason. Nothing is scanned
  unless something failed, and then only the failed variables' bytes.

A variable's ``bytes`` are what it added to the image: its part of the stream plus its
out-of-band buffers. An object reached from several variables is counted once, with the
first of them.
"""

from __future__ import annotations

import functools
import gc
import pickle
import pickletools
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any, cast

from ..store import CHUNK_SIZE
from . import pickler as _pickler
from . import salvage
from .module_objects import ModuleObjects

_GETS = frozenset({"GET", "BINGET", "LONG_BINGET"})


class _Spool:
    """The stream as whole chunks: no contiguous buffer that grows to the stream's size
    (and is copied as it grows), and each chunk can go once it is written."""

    def __init__(self) -> None:
        self.pieces = [bytearray()]
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            if len(self.pieces[-1]) == CHUNK_SIZE:
                self.pieces.append(bytearray())
            room = CHUNK_SIZE - len(self.pieces[-1])
            self.pieces[-1] += view[done : done + room]
            done += room
        self.size += len(view)
        return len(view)

    def tell(self) -> int:
        return self.size

    def truncate(self, size: int) -> None:
        del self.pieces[size // CHUNK_SIZE + 1 :]
        del self.pieces[-1][size - CHUNK_SIZE * (len(self.pieces) - 1) :]
        self.size = size

    def since(self, start: int) -> bytes:
        """The bytes from ``start`` on (a few, at the end)."""
        index = start // CHUNK_SIZE
        head = bytes(self.pieces[index][start - index * CHUNK_SIZE :])
        return head + b"".join(self.pieces[index + 1 :])

    def drain(self) -> Iterator[bytearray]:
        """The chunks in order, each let go of here as it is handed out."""
        while self.pieces:
            yield self.pieces.pop(0)


class _Capped:
    """Where a trial pickle goes: nowhere, and only up to :data:`TRIAL_BYTES`."""

    def __init__(self) -> None:
        self.size = 0

    def write(self, data: Any) -> int:
        self.size += memoryview(data).nbytes
        if self.size > TRIAL_BYTES:
            raise _TooBig
        return memoryview(data).nbytes


class _TooBig(Exception):
    """A trial pickle went past :data:`TRIAL_BYTES`: it proves nothing either way."""


# A variable is first pickled alone, up to this many bytes (the C pickler hands its output
# on in frames of 64 KiB), so that one that fails (an open file, a lock, an object holding
# one) fails there, at the cost of trying it, and never touches the stream's memo.
TRIAL_BYTES = 1 << 16


class Stream:
    """Writes variables one after another into one pickle stream."""

    def __init__(self, namespace: dict[str, Any]) -> None:
        self.out = _Spool()
        self.namespace = namespace
        self.library_objects = ModuleObjects()  # one walk of each package per save
        self.pickler = _pickler.CkptPickler(
            self.out, namespace, {}, library_objects=self.library_objects
        )
        # per variable: [start, end, first buffer, memo slots used up to its end]
        self.parts: list[list[int]] = []
        self.devices: set[str] = set()
        self.slots = 0  # memo slots used by the variables so far

    def add(self, value: Any) -> tuple[int, set[str]]:
        """Pickle ``value``; return the bytes it added and the devices it reached. On
        failure the stream is as before and the exception propagates."""
        self._trial(value)
        p = self.pickler
        start, first = self.out.tell(), len(p.buffers)
        modules = set(p.modules)
        p.devices = set()
        probe: list[Any] = []
        try:
            try:
                p.dump(value)
            except pickle.PicklingError as exc:
                if not isinstance(exc.__cause__, RecursionError):
                    raise
                self._rewind(start, first, modules)
                _deep(p.dump, value)
            p.dump(probe)
        except BaseException:
            self._rewind(start, first, modules)
            raise
        end = self.out.tell()
        self.slots = self._slot_of(probe) + 1
        self.parts.append([start, end, first, self.slots])
        self.devices |= p.devices
        return end - start + sum(b.nbytes for b in p.buffers[first:]), set(p.devices)

    def _trial(self, value: Any) -> None:
        """Pickle ``value`` alone and throw the bytes away; raise as the stream's pickler
        would if it fails, before it has touched the stream. A value too big or too deep
        for a trial goes on to the stream's pickler, which copes."""
        trial = _pickler.CkptPickler(
            _Capped(), self.namespace, {}, trial=True, library_objects=self.library_objects
        )
        try:
            trial.dump(value)
        except (_TooBig, RecursionError):
            return
        except pickle.PicklingError as exc:
            if not isinstance(exc.__cause__, RecursionError):
                raise

    def _slot_of(self, obj: Any) -> int:
        """The memo slot of ``obj``, pickled before: a second dump of it is a reference to
        its slot, read and cut off again."""
        mark = self.out.tell()
        self.pickler.dump(obj)
        tail = self.out.since(mark)
        self.out.truncate(mark)
        # a GET's argument is the slot number
        return cast(int, next(arg for op, arg, _ in pickletools.genops(tail) if op.name in _GETS))

    def device_bytes(self) -> dict[str, int]:
        """Bytes of the stream's accelerator storages per device: what a restore must fit
        on each GPU (storages of a variable that failed to pickle still count)."""
        per_device: dict[str, int] = {}
        for ref in self.pickler.storages.values():
            if ref.device != "cpu":
                per_device[ref.device] = per_device.get(ref.device, 0) + ref.storage.nbytes()
        return per_device

    def _rewind(self, start: int, first: int, modules: set[str]) -> None:
        """Cut a failed variable out: one copy of the whole memo, so only for a value too
        big for a trial (see :meth:`_trial`)."""
        p = self.pickler
        gc.disable()  # the copy makes a tuple per entry: no collections meanwhile
        try:
            p.memo = {k: v for k, v in p.memo.copy().items() if v[0] < self.slots}
        finally:
            gc.enable()
        self.out.truncate(start)
        del p.buffers[first:]
        p.modules = modules

    @property
    def buffers(self) -> list[Any]:
        return self.pickler.buffers


# Pickling recurses in C, one to three recursion steps per level of nesting. A value
# nested deeper than Python's recursion limit (a long linked list, a parse tree) is pickled
# again in a thread with this recursion limit and a stack with room for it (measured: 1
# GiB holds 1,000,000 steps of lists, dicts and notebook-class instances; deeper values
# fail as "excessively deep recursion", never as a crash).
DEEP_LEVELS = 1_000_000
_DEEP_STACK = 1 << 30  # bytes of (virtual) stack: only the pages used are backed


def _deep(dump: Any, value: Any) -> None:
    """``dump(value)`` with room for :data:`DEEP_LEVELS` recursion steps."""
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            dump(value)
        except BaseException as exc:  # handed to the caller's thread
            outcome.append(exc)

    limit = sys.getrecursionlimit()
    size = threading.stack_size(_DEEP_STACK)
    try:
        sys.setrecursionlimit(max(limit, DEEP_LEVELS))
        worker = threading.Thread(target=run, name="jupyter-ckpt-deep-pickle")
        worker.start()
        worker.join()
    finally:
        threading.stack_size(size)
        sys.setrecursionlimit(limit)
    if outcome:
        raise outcome[0]


class _Reader:
    """A file over a memoryview, for the unpickler, without copying the stream."""

    def __init__(self, data: memoryview) -> None:
        self.data = data
        self.pos = 0

    def read(self, n: int = -1) -> bytes:
        end = len(self.data) if n < 0 else min(self.pos + n, len(self.data))
        chunk = bytes(self.data[self.pos : end])
        self.pos = end
        return chunk

    def readinto(self, buf: Any) -> int:
        target = memoryview(buf).cast("B")
        n = min(len(target), len(self.data) - self.pos)
        target[:n] = self.data[self.pos : self.pos + n]
        self.pos += n
        return n

    def readline(self) -> bytes:
        line = bytearray()
        while self.pos < len(self.data):
            piece = bytes(self.data[self.pos : self.pos + 4096])
            cut = piece.find(b"\n")
            if cut >= 0:
                line += piece[: cut + 1]
                self.pos += cut + 1
                break
            line += piece
            self.pos += len(piece)
        return bytes(line)


class _Buffers:
    """The out-of-band buffers, handed out from a position that can be moved."""

    def __init__(self, buffers: Sequence[Any]) -> None:
        self.buffers = buffers
        self.index = 0

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        if self.index >= len(self.buffers):
            raise StopIteration
        self.index += 1
        return self.buffers[self.index - 1]


# where numpy's reduce of an array that owns its memory names its rebuild (numpy 2, 1)
_NUMPY_NUMERIC = ("numpy._core.numeric", "numpy.core.numeric")


def _owner_frombuffer(
    numpys: Any, buffer: Any, dtype: Any, shape: tuple, order: Any, *more: Any
) -> Any:
    """numpy's ``_frombuffer`` (``numpys``) without its step through a 1-D array: a C- or
    F-ordered array comes back directly over its buffer, as the owner it was saved as.
    numpy's makes it a reshaped view of a 1-D array, which the next save then writes as
    a view of that array: other bytes for the same state, so a save right after a
    restore found the state changed."""
    if order not in ("C", "F"):
        return numpys(buffer, dtype, shape, order, *more)
    import numpy as np

    return np.ndarray(shape, dtype=dtype, buffer=buffer, order=order)


class _Loader(pickle.Unpickler):
    """The stream's unpickler. Persistent ids hand out given objects (the stream itself has
    none), so that short pickles of our own can set memo slots (below)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.objects: list[Any] = []

    def persistent_load(self, pid: Any) -> Any:
        return self.objects[pid]

    def find_class(self, module: str, name: str) -> Any:
        found = super().find_class(module, name)
        if name == "_frombuffer" and module in _NUMPY_NUMERIC:
            return functools.partial(_owner_frombuffer, found)
        return found

    def run(self, reader: _Reader, ops: bytes, objects: list[Any]) -> None:
        """Load the protocol 5 pickle ``ops`` (handed ``objects``) instead of the stream."""
        source = reader.data, reader.pos
        reader.data, reader.pos = memoryview(b"\x80\x05" + ops + b"N."), 0
        self.objects = objects
        try:
            self.load()
        finally:
            reader.data, reader.pos = source
            self.objects = []


def _refilled(memo: dict[int, Any], reader: _Reader, feed: _Buffers) -> _Loader:
    """A fresh unpickler of the stream whose memo is ``memo`` (dense from 0).

    The C unpickler's ``memo`` setter cannot do this: given a dict it keeps nothing (it
    fills the table it then frees), and it leaves the count that ``MEMOIZE`` numbers new
    entries by at zero. So the memo is rebuilt the way a stream builds it: by loading one
    persistent id per entry, memoized in order.
    """
    objects = [memo[i] for i in range(len(memo))]
    unpickler = _Loader(reader, buffers=feed)
    ops = b"".join(b"J" + i.to_bytes(4, "little") + b"Q\x940" for i in range(len(objects)))
    unpickler.run(reader, ops, objects)
    return unpickler


def _poison(unpickler: _Loader, reader: _Reader, slots: set[int], marker: Any) -> None:
    """Put ``marker`` in the memo ``slots`` (filled ones) of an unpickler that is between
    two pickles of the stream."""
    puts = b"".join(b"r" + s.to_bytes(4, "little") for s in sorted(slots))
    unpickler.run(reader, b"J\x00\x00\x00\x00Q" + puts + b"0", [marker])


def load(
    data: memoryview,
    buffers: Sequence[Any],
    names: Sequence[str],
    parts: Sequence[Sequence[int]],
    namespace: dict[str, Any],
) -> tuple[dict[str, Any], dict[str, str]]:
    """Unpickle every variable of a stream; return the values and, for those that could not
    come back, the reason (see :mod:`.salvage` for what a failure leaves usable)."""
    reader, feed = _Reader(data), _Buffers(buffers)
    unpickler = _Loader(reader, buffers=feed)
    values: dict[str, Any] = {}
    missing: dict[str, str] = {}
    damage: salvage.Damage | None = None
    token = _pickler.target_namespace.set(namespace)
    try:
        for i, (name, (start, _, first, *_)) in enumerate(zip(names, parts, strict=True)):
            reader.pos, feed.index = start, first
            before = damage.counts() if damage else []
            try:
                value = unpickler.load()
                unpickler.load()  # the probe
            except Exception as exc:
                # one that took in what an earlier failure left fails for the same reason
                picked = damage.picked_up(before) if damage else None
                missing[name] = picked.reason if picked else f"{type(exc).__name__}: {exc}"
                memo = unpickler.memo.copy()
                try:
                    damage = damage or salvage.Damage(data, parts)
                    damage.failed(i, name, memo, buffers, missing[name])
                except Exception:  # a stream that does not parse: nothing after is trusted
                    missing.update((later, missing[name]) for later in names[i + 1 :])
                    break
                # A fresh unpickler: the failed one may hold the rest of a frame it was reading.
                unpickler = _refilled(memo, reader, feed)
                del memo
                continue
            marker = damage.picked_up(before) if damage else None
            if marker is None:
                values[name] = value
                continue
            del value
            missing[name] = marker.reason
            assert damage is not None
            _poison(unpickler, reader, damage.tainted(i), marker)
    finally:
        _pickler.target_namespace.reset(token)
    return values, missing
