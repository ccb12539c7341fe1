"""What identifies the state an image holds, apart from when and why it was written.

Two saves of a kernel in which nothing changed (a Save Now followed by an autosave, a
cell that only displays something, a suspend right after a restore) would otherwise
write images that differ only in their timestamps. The comparison reads manifests only:
the chunks are content-addressed, so equal chunk digests mean equal bytes, and nothing
is unpickled.
"""

from __future__ import annotations

import io
import pickletools
from collections.abc import Iterable
from typing import Any, cast

import blake3

# What the namespace holds: every variable's facts and status, where its bytes are (the
# segments' chunk digests), the imports, the exclusions, and what it needs to load.
STATE_KEYS = (
    "variables",
    "imports",
    "groups",
    "segments",
    "excluded",
    "devices",
    "environment",
    "encryption",
)
# Facts of the kernel that a restore puts back and a cell can change. Left out: its id (a
# resumed kernel holding the state it was resumed from holds the same state), and the
# input history and execution count, which a cell that changes nothing still moves: a
# restore of the earlier image brings back the same variables, numbered from where that
# image was written.
KERNEL_STATE_KEYS = ("notebook_path", "cwd", "env")


# Streams up to this size get a canonical digest: a pass over their opcodes in Python,
# about 2 MB/s, so at most half a second on a save (arrays and tensors go out of band:
# their streams are small). Larger ones are compared by their bytes.
CANONICAL_MAX = 1 << 20

_TEXT_OPS = frozenset(
    {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE"}
    | {"SHORT_BINSTRING", "BINSTRING", "STRING"}
    | {"SHORT_BINBYTES", "BINBYTES", "BINBYTES8"}
)
_PUTS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
_GETS = frozenset({"GET", "BINGET", "LONG_BINGET"})


def canonical_digest(stream: bytes, packed: Iterable[memoryview]) -> str:
    """A digest of an image's pickle stream that does not depend on which equal strings
    were one object, and of the small buffers written beside it (``packed``).

    A pickle writes a string once and refers back to it where the same object comes
    again. Which equal strings are one object is not part of the state, and a restore
    does not keep it: a function's name or a module name interned in the saving process
    is a copy after the restore, written out again where it was a reference before. The
    digest reads every string as its value, wherever it comes from; any other object
    referred back to keeps its place."""
    digest = blake3.blake3()
    texts: dict[int, Any] = {}  # memo slot -> the string or bytes put there
    others: dict[int, int] = {}  # memo slot -> its number among the other objects
    slots = 0
    source = io.BytesIO(stream)
    while source.tell() < len(stream):  # one pickle per variable, one after another
        text: Any = None
        for op, arg, _ in pickletools.genops(source):
            name = op.name
            item: tuple[Any, ...] | None = (name, arg)
            if name in _TEXT_OPS:
                item, text = ("text", arg), arg
            elif name == "MEMOIZE" or name in _PUTS:
                slot = slots if name == "MEMOIZE" else cast(int, arg)
                slots += name == "MEMOIZE"
                if text is not None:
                    texts[slot], item = text, None
                else:
                    others[slot], item = len(others), ("put",)
            elif name in _GETS:
                slot = cast(int, arg)
                item = ("text", texts[slot]) if slot in texts else ("get", others.get(slot))
            elif name == "FRAME":
                item = None  # a frame's length follows the bytes
            if name not in _TEXT_OPS:
                text = None
            if item is not None:
                digest.update(repr(item).encode())
    for buffer in packed:
        digest.update(len(buffer).to_bytes(8, "little"))
        digest.update(buffer)
    return digest.hexdigest()


def _stream_state(manifest: dict[str, Any]) -> dict[str, Any]:
    """The groups and segments of the state: with canonical digests (every group's), the
    segments that hold the pickle stream (and the small buffers packed with it) count by
    that digest instead of their bytes."""
    groups = manifest.get("groups") or []
    segments = manifest.get("segments") or []
    if not groups or not all("canonical" in g for g in groups):
        return {"groups": groups, "segments": segments}
    held = {g["pickle"][0] for g in groups}
    return {
        "groups": [
            {
                "names": g["names"],
                "canonical": g["canonical"],
                "buffers": [None if ref[0] in held else ref for ref in g["buffers"]],
            }
            for g in groups
        ],
        "segments": [None if i in held else s for i, s in enumerate(segments)],
    }


def state_of(manifest: dict[str, Any]) -> dict[str, Any]:
    """The parts of a manifest that two images of the same state share."""
    kernel = manifest.get("kernel") or {}
    return {
        **{key: manifest.get(key) for key in STATE_KEYS},
        **_stream_state(manifest),
        "kernel": {key: kernel.get(key) for key in KERNEL_STATE_KEYS},
    }


def same_state(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return state_of(a) == state_of(b)
