"""Process-state providers: what a notebook sets without naming it.

A restored kernel must be indistinguishable from one that never stopped. Its variables are
the namespace; the rest lives in the process: the random streams a seeded experiment
draws from, library options (print precision, error handling, pandas display, matplotlib
style), warnings filters, logger levels, IPython's extensions and settings. Each
:class:`Provider` captures one such piece at save and applies it at restore, before the
namespace is put back.

A provider names the modules it reads: it is asked only when one of them is imported, so a
library the kernel never imported costs nothing at save (and is not imported by a
restore). One that fails, at save or at restore, does not stop the others: its failure is
reported under its name. What is not kept, and why, is in docs/user-guide.md.
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

# Process states travel in the image's stream beside the variables, each under its
# provider's name with this prefix (no variable can have such a name).
PREFIX = "process:"


@dataclass(frozen=True)
class Provider:
    """``capture()`` returns a picklable state (None: nothing to keep); ``apply(state)``
    puts it back in a fresh process."""

    name: str
    modules: tuple[str, ...]
    capture: Callable[[], Any]
    apply: Callable[[Any], None]

    def wanted(self) -> bool:
        return not self.modules or any(m in sys.modules for m in self.modules)


def capture_states(
    providers: Iterable[Provider], untouched: dict[str, bytes] | None = None
) -> tuple[dict[str, Any], dict[str, str]]:
    """(provider -> state, provider -> why it could not be read), for every provider
    whose library is imported, but those whose state is still as ``untouched`` (see
    :func:`untouched`) has it."""
    states: dict[str, Any] = {}
    failed: dict[str, str] = {}
    for p in providers:
        if not p.wanted():
            continue
        try:
            state = p.capture()
        except Exception as exc:
            failed[p.name] = f"{type(exc).__name__}: {exc}"
            continue
        if state is None:
            continue
        state = canonical(state)
        if untouched and p.name in untouched and _pickled(state) == untouched[p.name]:
            continue
        states[p.name] = state
    return states, failed


def untouched(providers: Iterable[Provider], kept: Iterable[str]) -> dict[str, bytes]:
    """The states, now, of the providers a restored image did not hold: a library that
    the process imported on its own (one started ahead imports numpy) is not the user's
    until its state changes, and an image of an unchanged kernel stays the same image."""
    skip = set(kept)
    states, _ = capture_states(p for p in providers if p.name not in skip)
    pickled = {name: _pickled(state) for name, state in states.items()}
    return {name: data for name, data in pickled.items() if data is not None}


def _pickled(state: Any) -> bytes | None:
    try:
        return pickle.dumps(state, protocol=5)
    except Exception:  # compared only; a state that does not pickle is never "untouched"
        return None


def canonical(value: Any) -> Any:
    """``value`` with the same data in the same bytes, whichever process holds it: equal
    strings are one object (pickle's memo shares by identity), containers are new (none
    shared by chance), sets are sorted lists (their order follows per-process string
    hashes). Two saves of one state must be equal images (see ``image.identity``)."""
    kind = type(value)
    if kind is str:
        return sys.intern(value)
    if kind in (list, tuple):
        return kind(canonical(v) for v in value)
    if kind in (set, frozenset):
        return sorted((canonical(v) for v in value), key=repr)
    if kind is dict:
        return {canonical(k): canonical(v) for k, v in value.items()}
    return value


def apply_states(states: dict[str, Any], providers: Iterable[Provider]) -> list[str]:
    """Apply each provider's state, in the providers' order; a warning per failure."""
    warnings = []
    for p in providers:
        if p.name not in states:
            continue
        try:
            p.apply(states[p.name])
        except Exception as exc:
            warnings.append(f"{p.name} not restored: {type(exc).__name__}: {exc}")
    return warnings
