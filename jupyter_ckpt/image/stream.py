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
  the manifest records each variable's ``[start, end, first buffer]`` in the stream;
* a variable that fails to pickle is rewound: the stream and the out-of-band buffers are
  cut back to its start and the memo to the previous probe (one memo copy per failure, in
  C), so it is listed as lost with the reason and the others go on;
* a variable that fails to unpickle is reported with the reason, and the rest of the stream
  still loads: its memo slots are filled with a poison marker (except fully built values
  that carry no identity, such as strings), and a later variable that refers to a poisoned
  slot (found by a scan of the stream's opcodes, made only once something failed) is not
  loaded but reported with the same reason: it cannot come back whole without the failed
  one. The scan runs at Python speed (about 7 MiB of stream a second), so a restore in
  which something fails takes that much longer; one in which nothing fails never scans.

A variable's ``bytes`` are what it added to the image: its part of the stream plus its
out-of-band buffers. An object reached from several variables is counted once, with the
first of them.
"""

from __future__ import annotations

import contextlib
import io
import pickle
import pickletools
import sys
import threading
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..store import CHUNK_SIZE
from . import pickler as _pickler

# Opcodes that read the memo, and the one that writes it (the only one protocol 5 uses).
_GETS = frozenset({"GET", "BINGET", "LONG_BINGET"})
_MEMOIZE = "MEMOIZE"
_LITERALS = frozenset(
    {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE",
     "SHORT_BINBYTES", "BINBYTES", "BINBYTES8"}
)  # fmt: skip
# Values that are whole as soon as they are memoized and whose identity carries no meaning.
_ATOMS = (str, bytes, int, float, complex, bool, type(None), range, types.ModuleType)


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

    def drain(self) -> Iterator[bytearray]:
        """The chunks in order, each let go of here as it is handed out."""
        while self.pieces:
            yield self.pieces.pop(0)


class Stream:
    """Writes variables one after another into one pickle stream."""

    def __init__(self, namespace: dict[str, Any]) -> None:
        self.out = _Spool()
        self.pickler = _pickler.CkptPickler(self.out, namespace, {})
        self.parts: list[list[int]] = []  # per variable: [start, end, first buffer]
        self.devices: set[str] = set()
        self._probe: list[Any] | None = None  # the last variable's probe

    def add(self, value: Any) -> tuple[int, set[str]]:
        """Pickle ``value``; return the bytes it added and the devices it reached. On
        failure the stream is as before and the exception propagates."""
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
        self._probe = probe
        end = self.out.tell()
        self.parts.append([start, end, first])
        self.devices |= p.devices
        return end - start + sum(b.nbytes for b in p.buffers[first:]), set(p.devices)

    def device_bytes(self) -> dict[str, int]:
        """Bytes of the stream's accelerator storages per device: what a restore must fit
        on each GPU (storages of a variable that failed to pickle still count)."""
        per_device: dict[str, int] = {}
        for ref in self.pickler.storages.values():
            if ref.device != "cpu":
                per_device[ref.device] = per_device.get(ref.device, 0) + ref.storage.nbytes()
        return per_device

    def _rewind(self, start: int, first: int, modules: set[str]) -> None:
        p = self.pickler
        memo = p.memo.copy()  # {id: (index, object)}
        keep = memo[id(self._probe)][0] + 1 if self._probe is not None else 0
        p.memo = {k: v for k, v in memo.items() if v[0] < keep}
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


class _Poison:
    """Fills the memo slots of a variable that did not load."""


_POISON = _Poison()


@dataclass(frozen=True)
class _Global:
    """A memo slot filled by an import (``STACK_GLOBAL``): whole wherever it comes from."""

    module: str
    name: str


_UNKNOWN = object()
_FINDER = pickle.Unpickler(io.BytesIO())  # imports as the unpickler would


def _whole(obj: Any) -> bool:
    """Whether a memoized object is complete and carries no identity, so a later variable
    may use it although the variable that made it failed."""
    if isinstance(obj, _ATOMS):
        return True
    return type(obj) in (tuple, frozenset) and all(_whole(item) for item in obj)


@dataclass
class _Salvage:
    """What the stream's opcodes say about each variable's memo slots, read once something
    failed to load: how many slots it fills, which slots it reads, and which slots hold a
    string literal or an import (those a failed variable left unfilled can be refilled)."""

    starts: list[int]
    counts: list[int]
    reads: list[set[int]]
    known: dict[int, Any]
    # memo index -> why it is unusable
    poisoned: dict[int, str] = field(default_factory=dict)

    @classmethod
    def scan(cls, data: memoryview, parts: Sequence[Sequence[int]]) -> _Salvage:
        starts, counts, reads, known = [], [], [], {}
        total = 0
        for start, end, _ in parts:
            stream = io.BytesIO(data[start:end])
            starts.append(total)
            read: set[int] = set()
            while stream.tell() < end - start:  # the variable's pickle, then its probe
                pushed: list[Any] = []  # what the last ops pushed, where known
                for op, arg, _ in pickletools.genops(stream):
                    if op.name == _MEMOIZE:
                        if pushed and pushed[-1] is not _UNKNOWN:
                            known[total] = pushed[-1]
                        total += 1
                        continue
                    if op.name == "FRAME":
                        continue
                    top: Any = _UNKNOWN
                    if op.name in _GETS:
                        read.add(arg)
                        top = known.get(arg, _UNKNOWN)
                    elif op.name in _LITERALS:
                        top = arg
                    elif op.name == "STACK_GLOBAL" and len(pushed) > 1:
                        module, name = pushed[-2:]
                        if isinstance(module, str) and isinstance(name, str):
                            top = _Global(module, name)
                    pushed = [*pushed[-1:], top]
            counts.append(total - starts[-1])
            reads.append(read)
        return cls(starts, counts, reads, known)

    def blocker(self, i: int) -> str | None:
        """Why variable ``i`` cannot load whole, if it reads a poisoned slot."""
        hit = next((j for j in self.reads[i] if j in self.poisoned), None)
        return None if hit is None else self.poisoned[hit]

    def poison(self, i: int, memo: dict[int, Any], reason: str) -> None:
        """Mark variable ``i``'s slots unusable in ``memo``, but those that are whole
        (atoms it made; string literals and imports, made again if it did not get to)."""
        for index in range(self.starts[i], self.starts[i] + self.counts[i]):
            obj, known = memo.get(index, _POISON), self.known.get(index, _UNKNOWN)
            if isinstance(known, _Global):
                with contextlib.suppress(Exception):  # not importable here: unusable
                    memo[index] = _FINDER.find_class(known.module, known.name)
                    continue
            elif obj is _POISON and isinstance(known, (str, bytes)):
                memo[index] = known
                continue
            elif obj is not _POISON and _whole(obj):
                continue
            memo[index] = _POISON
            self.poisoned[index] = reason


class _Refill(pickle.Unpickler):
    """Hands out given objects for persistent ids, to rebuild a memo (below)."""

    def __init__(self, objects: list[Any], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.objects = objects

    def persistent_load(self, pid: Any) -> Any:
        return self.objects[pid]


def _refilled(memo: dict[int, Any], reader: _Reader, feed: _Buffers) -> pickle.Unpickler:
    """A fresh unpickler of the stream whose memo is ``memo`` (dense from 0).

    The C unpickler's ``memo`` setter cannot do this: given a dict it keeps nothing (it
    fills the table it then frees), and it leaves the count that ``MEMOIZE`` numbers new
    entries by at zero. So the memo is rebuilt the way a stream builds it: by loading one
    persistent id per entry, memoized in order.
    """
    objects = [memo[i] for i in range(len(memo))]
    ops = b"".join(b"J" + i.to_bytes(4, "little") + b"Q\x940" for i in range(len(objects)))
    source = reader.data, reader.pos
    reader.data, reader.pos = memoryview(b"\x80\x05" + ops + b"N."), 0
    unpickler = _Refill(objects, reader, buffers=feed)
    try:
        unpickler.load()
    finally:
        reader.data, reader.pos = source
    unpickler.objects = []  # the stream itself has no persistent ids
    return unpickler


def load(
    data: memoryview,
    buffers: Sequence[Any],
    names: Sequence[str],
    parts: Sequence[Sequence[int]],
    namespace: dict[str, Any],
) -> tuple[dict[str, Any], dict[str, str]]:
    """Unpickle every variable of a stream; return the values and, for those that could not
    come back, the reason."""
    reader, feed = _Reader(data), _Buffers(buffers)
    unpickler = pickle.Unpickler(reader, buffers=feed)
    values: dict[str, Any] = {}
    missing: dict[str, str] = {}
    salvage: _Salvage | None = None
    token = _pickler.target_namespace.set(namespace)
    try:
        for i, (name, (start, _, first)) in enumerate(zip(names, parts, strict=True)):
            reason = salvage.blocker(i) if salvage else None
            if reason is None:
                reader.pos, feed.index = start, first
                try:
                    values[name] = unpickler.load()
                    unpickler.load()  # the probe
                    continue
                except Exception as exc:
                    reason = f"{type(exc).__name__}: {exc}"
            missing[name] = reason
            try:
                salvage = salvage or _Salvage.scan(data, parts)
            except Exception:  # a stream that does not parse: nothing after is trusted
                missing.update((later, reason) for later in names[i + 1 :])
                break
            memo = unpickler.memo.copy()
            salvage.poison(i, memo, reason)
            # A fresh unpickler: the failed one may hold the rest of a frame it was reading.
            unpickler = _refilled(memo, reader, feed)
    finally:
        _pickler.target_namespace.reset(token)
    return values, missing
