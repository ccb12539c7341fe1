"""What of a stream still loads once one variable in it did not (see :mod:`.stream`).

Variables of one stream share pickle's memo: a later variable refers to an object an
earlier one made by its memo slot. When a variable fails to load, the slots it filled hold
objects in every state: finished ones (a notebook class, a function's code, a string, the
namespace a function refers to) and the ones that were being built when it failed. A later
variable may use the first kind: it gets exactly what it would have got; it must not get
the second kind (a half-built object is a wrong value, never reported).

So the failed variable's opcodes are replayed on a model of the unpickler's stack (at
Python speed, the failed variable's bytes only). An object is *unfinished* when it was on
the stack after the last slot the failed load filled (pickle fills a container, or sets an
object's state, only while it is on the stack), when it is a closure cell of an unfinished
function (cloudpickle fills cells from the function's state, later), when its slot was never
filled, or when it holds or was built from an unfinished object. Unfinished slots get a
:class:`Poison` marker. Strings, numbers and other whole values are never unfinished, and
imports the failed variable did not reach are made again.

A later variable that picks a marker up is found without reading its bytes: it raises the
marker's reference count (each failure has its own marker, for the reason). It is reported
with that reason, and of its own slots, those that hold or were built from a marker get
one too, so what depends on it is traced the same way.
"""

from __future__ import annotations

import io
import pickle
import pickletools
import sys
import types
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

# Values that are whole as soon as they are memoized and whose identity carries no meaning.
_ATOMS = (str, bytes, int, float, complex, bool, type(None), range, types.ModuleType)
_GETS = frozenset({"GET", "BINGET", "LONG_BINGET"})
_PUTS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
# Opcodes that fill or set the state of the object under their arguments on the stack.
_FILLS = frozenset({"APPEND", "APPENDS", "SETITEM", "SETITEMS", "ADDITEMS", "BUILD"})
_TUPLES = frozenset({"TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "EMPTY_TUPLE"})
_FINDER = pickle.Unpickler(io.BytesIO())  # imports as the unpickler would


class Poison:
    """Fills the memo slots of objects that did not come back whole."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason


@dataclass(frozen=True)
class _Global:
    """A slot filled by an import (``STACK_GLOBAL``): whole wherever it comes from."""

    module: str
    name: str


@dataclass(eq=False)
class _Item:
    """One entry of the model stack: its slot once memoized, the slots it holds or was built
    from, its value where an opcode spells it out, and a tuple's members."""

    slot: int | None = None
    deps: set[int] = field(default_factory=set)
    value: Any = None
    members: list[_Item] = field(default_factory=list)

    def take(self, child: _Item) -> None:
        if child.slot is not None:
            self.deps.add(child.slot)
        else:
            self.deps |= child.deps


@dataclass
class Trace:
    """One variable's opcodes, replayed: per slot it fills, the slots it holds or was built
    from; slots whose value is spelled out (strings) or imported."""

    deps: dict[int, set[int]] = field(default_factory=dict)
    known: dict[int, Any] = field(default_factory=dict)


def trace(data: memoryview, first: int) -> Trace:
    """Replay the pickle at the start of ``data`` whose first memo slot is ``first``."""
    out = Trace()
    stack: list[_Item] = []
    marks: list[int] = []
    slot = first

    def memoize(index: int) -> None:
        item = stack[-1]
        if item.slot is None:
            item.slot = index
            out.deps[index] = item.deps
        else:  # the same object again: it stands for the first slot
            out.deps[index] = {item.slot}
        if item.value is not None:
            out.known[index] = item.value

    arg: Any  # the memo opcodes' arguments are slot numbers
    for op, arg, _ in pickletools.genops(io.BytesIO(data)):
        name = op.name
        if name in ("PROTO", "FRAME"):
            continue
        if name == "STOP":
            break
        if name == "MEMOIZE":
            memoize(slot)
            slot += 1
        elif name in _PUTS:
            memoize(arg)
        elif name in _GETS:
            deps = out.deps.setdefault(arg, set()) if arg >= first else set()
            stack.append(_Item(slot=arg, deps=deps, value=out.known.get(arg)))
        elif name == "MARK":
            marks.append(len(stack))
        elif name == "POP":
            if marks and marks[-1] == len(stack):
                marks.pop()
            else:
                stack.pop()
        elif name == "POP_MARK":
            del stack[marks.pop() :]
        elif name == "DUP":
            stack.append(stack[-1])
        else:
            _apply(name, op, arg, stack, marks)
    return out


def _apply(name: str, op: Any, arg: Any, stack: list[_Item], marks: list[int]) -> None:
    """Any other opcode: pop its arguments, push its result (or the object it filled)."""
    before = op.stack_before
    if pickletools.markobject in before:
        below = before.index(pickletools.markobject)
        mark = marks.pop()
        inputs = stack[mark - below :]
        del stack[mark - below :]
    else:
        inputs = stack[len(stack) - len(before) :] if before else []
        del stack[len(stack) - len(before) :]
    if name in _FILLS:
        target = inputs[0]
        for child in inputs[1:]:
            target.take(child)
        stack.append(target)
        return
    if name == "READONLY_BUFFER":
        stack.append(inputs[0])
        return
    result = _Item()
    for child in inputs:
        result.take(child)
    if name in _TUPLES:
        result.members = inputs
    elif name == "REDUCE" and len(inputs) == 2:
        # the callable may set the state of what it is given (cloudpickle's state setters)
        for member in inputs[1].members:
            if member.slot is not None and not isinstance(member.value, _Global):
                member.deps |= result.deps - {member.slot}
        result.value = _library_object(inputs[0].value, inputs[1].members)
    elif name == "STACK_GLOBAL":
        module, attr = (i.value for i in inputs)
        if isinstance(module, str) and isinstance(attr, str):
            result.value = _Global(module, attr)
    elif isinstance(arg, (str, bytes)) and name != "GLOBAL":
        result.value = arg
    if op.stack_after:
        stack.append(result)


# a library's module-level object, saved as a reference (see :mod:`.module_objects`)
_LOOKUP = _Global("jupyter_ckpt.image.module_objects", "lookup")


def _library_object(function: Any, args: list[_Item]) -> _Global | None:
    """A reference to a library's object is an import: whole wherever it comes from."""
    names = [a.value for a in args]
    if function == _LOOKUP and len(names) == 2 and all(isinstance(n, str) for n in names):
        return _Global(*names)
    return None


def whole(obj: Any) -> bool:
    """Whether a memoized object is complete and carries no identity, so a later variable
    may use it although the variable that made it failed."""
    if isinstance(obj, _ATOMS):
        return True
    return type(obj) in (tuple, frozenset) and all(whole(item) for item in obj)


def first_slots(data: memoryview, parts: Sequence[Sequence[int]]) -> list[int]:
    """Each variable's first memo slot, and after them the count of all: from the parts
    (which record where each variable's slots end), or, in images written before they
    did, by counting memo writes."""
    if all(len(p) > 3 for p in parts):
        return [0, *(p[3] for p in parts)]
    firsts = [0]
    for start, end, *_ in parts:
        stream = io.BytesIO(data[start:end])
        count = 0
        while stream.tell() < end - start:  # the variable's pickle, then its probe
            count += sum(op.name == "MEMOIZE" for op, _, _ in pickletools.genops(stream))
        firsts.append(firsts[-1] + count)
    return firsts


class Damage:
    """The slots of a stream that must not be used, and the markers that fill them."""

    def __init__(self, data: memoryview, parts: Sequence[Sequence[int]]) -> None:
        self.data = data
        self.parts = parts
        self.firsts = first_slots(data, parts)
        self.poisoned: set[int] = set()
        self.markers: list[Poison] = []

    def counts(self) -> list[int]:
        """References to each marker: taken before a variable loads, compared after."""
        return [sys.getrefcount(m) for m in self.markers]

    def picked_up(self, before: list[int]) -> Poison | None:
        """The marker a variable that loaded took in, if any (counted as before was)."""
        now = self.counts()
        return next((self.markers[k] for k, n in enumerate(before) if now[k] > n), None)

    def failed(
        self, i: int, name: str, memo: dict[int, Any], buffers: Sequence[Any], reason: str
    ) -> None:
        """Variable ``i`` raised while loading. It is loaded again by :class:`_Mender`, and
        ``memo`` (the unpickler's) gets its slots: a marker in those that are unfinished, or
        in all of them if even that fails."""
        first, end = self.firsts[i], self.firsts[i + 1]
        marker = Poison(name, reason)
        self.markers.append(marker)
        replay = trace(self._bytes(i), first)
        first_buffer = self.parts[i][2]
        earlier = {s: memo[s] for s in range(first)}
        mender = _Mender(self._bytes(i), buffers[first_buffer:], earlier, marker)
        try:
            mender.load()
            made = mender.memo
        except Exception:  # not even the Python unpickler gets through: nothing is usable
            made = {}
        bad: set[int] = set()
        for s in range(first, end):
            if s in made:
                memo[s] = made[s]
            elif isinstance(replay.known.get(s), (str, bytes)):
                memo[s] = replay.known[s]
            else:
                memo[s] = marker
            if memo[s] is marker:
                bad.add(s)
        slot_of = {id(memo[s]): s for s in range(first, end)}
        broken = {slot_of[id(obj)] for obj in mender.broken if id(obj) in slot_of}
        bad |= {s for s in broken if not isinstance(replay.known.get(s), _Global)}
        # the closure cells of an unfinished function are filled with its state, later
        bad |= {
            s
            for s in self._reachable(bad, replay.deps)
            if s >= first and isinstance(memo.get(s), types.CellType)
        }
        bad = self._dependents(range(first, end), replay.deps, bad, memo)
        for s in bad:
            memo[s] = marker
        self.poisoned |= bad

    def tainted(self, i: int) -> set[int]:
        """Variable ``i`` loaded but picked up a marker: its slots that depend on one."""
        first, end = self.firsts[i], self.firsts[i + 1]
        bad = self._dependents(range(first, end), trace(self._bytes(i), first).deps, set(), None)
        self.poisoned |= bad
        return bad

    def _bytes(self, i: int) -> memoryview:
        start, end = self.parts[i][:2]
        return self.data[start:end]

    def _dependents(
        self,
        slots: Iterable[int],
        deps: dict[int, set[int]],
        bad: set[int],
        memo: dict[int, Any] | None,
    ) -> set[int]:
        """``bad`` and the slots among ``slots`` that hold or were built from a bad or an
        already poisoned slot (whole values excepted)."""
        candidates = {s for s in slots if s not in bad and (memo is None or not whole(memo.get(s)))}
        users: dict[int, list[int]] = {}  # slot -> the candidates that hold or used it
        for s in candidates:
            for d in deps.get(s, ()):
                users.setdefault(d, []).append(s)
        bad = set(bad)
        todo = list(bad | self.poisoned)
        while todo:
            for user in users.get(todo.pop(), ()):
                if user not in bad:
                    bad.add(user)
                    todo.append(user)
        return bad

    @staticmethod
    def _reachable(start: set[int], deps: dict[int, set[int]]) -> set[int]:
        seen, todo = set(start), list(start)
        while todo:
            for d in deps.get(todo.pop(), ()):
                if d not in seen:
                    seen.add(d)
                    todo.append(d)
        return seen


class _Mender(pickle._Unpickler):
    """Loads a variable that failed again, in Python, step by step: a step that raises
    leaves a marker where its result would be, and the rest is built as the stream says.
    What a failed step left half-built (the object it was filling, or what it handed a
    state setter) is kept in ``broken``."""

    # the pure-Python unpickler's own state, which typeshed does not describe
    stack: list[Any]
    append: Callable[[Any], None]

    def __init__(
        self, data: memoryview, buffers: Sequence[Any], memo: dict[int, Any], marker: Poison
    ) -> None:
        super().__init__(io.BytesIO(data), buffers=buffers)
        self.memo = memo
        self.marker = marker
        self.broken: list[Any] = []


def _guarded(code: int, step: Any) -> Any:
    op = pickletools.code2op.get(chr(code))  # type: ignore[attr-defined]
    name = op.name if op else ""

    def run(self: _Mender) -> None:
        args = self.stack[-1] if name == "REDUCE" and self.stack else None
        try:
            step(self)
        except pickle._Stop:  # type: ignore[attr-defined]
            raise
        except Exception:
            if name in _FILLS:
                self.broken.append(self.stack[-1])
                self.stack[-1] = self.marker
            elif name == "REDUCE":
                self.broken.extend(args if isinstance(args, tuple) else ())
                self.stack[-1] = self.marker
            elif op is not None and op.stack_after:
                self.append(self.marker)
            else:
                raise

    return run


_Mender.dispatch = {code: _guarded(code, step) for code, step in pickle._Unpickler.dispatch.items()}
