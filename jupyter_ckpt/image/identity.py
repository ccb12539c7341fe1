"""What identifies the state an image holds, apart from when and why it was written.

Two saves of a kernel in which nothing changed (a Save Now followed by an autosave, a
cell that only displays something, a suspend right after a restore) would otherwise
write images that differ only in their timestamps. The comparison reads manifests only:
the chunks are content-addressed, so equal chunk digests mean equal bytes, and nothing
is unpickled.
"""

from __future__ import annotations

from typing import Any

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


def state_of(manifest: dict[str, Any]) -> dict[str, Any]:
    """The parts of a manifest that two images of the same state share."""
    kernel = manifest.get("kernel") or {}
    return {
        **{key: manifest.get(key) for key in STATE_KEYS},
        "kernel": {key: kernel.get(key) for key in KERNEL_STATE_KEYS},
    }


def same_state(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return state_of(a) == state_of(b)
