"""What a save answers the server: the summary of its image, or why it failed.

Shared by the kernel's own saves (:mod:`jupyter_ckpt.kernel`) and the background child
(:mod:`.background`), and read by the server; it imports neither of them.
"""

from __future__ import annotations

from typing import Any

from ..errors import CkptError
from ..store import ImageStore


def failure(exc: BaseException) -> dict[str, str]:
    """What a failed save answers the server: why, and the error's type (the server
    tells a store's failure from the kernel's by it)."""
    return {"error": _describe(exc), "error_type": type(exc).__name__}


def _describe(exc: BaseException) -> str:
    """Our errors name their cause; anything else is named by its type too."""
    return str(exc) if isinstance(exc, CkptError) else f"{type(exc).__name__}: {exc}"


def unsaveable_ids(manifest: dict[str, Any], namespace: dict[str, Any]) -> dict[str, int]:
    """The variables an image left out, each with the id of the value it could not save:
    the same value still there means the same failure at the next save."""
    return {
        v["name"]: id(namespace[v["name"]])
        for v in manifest["variables"]
        if v["status"] == "lost" and v["name"] in namespace
    }


def newest_manifest(store: ImageStore, image_id: str | None) -> dict[str, Any] | None:
    """``image_id``'s manifest, or None when it is gone or unreadable (then a save that
    holds the same state writes a new image: it is needed)."""
    if not image_id:
        return None
    try:
        return store.open(image_id)
    except (CkptError, OSError):
        return None


def host_bytes(manifest: dict[str, Any]) -> int:
    """The image's bytes that lived in host memory: its logical size less its GPU state
    (which counts the storages of variables that failed too, hence the floor)."""
    on_devices = manifest.get("gpu", {}).get("device_bytes", {})
    return max(0, manifest["sizes"]["logical"] - sum(on_devices.values()))


def summarize_save(manifest: dict[str, Any], seconds: float) -> dict[str, Any]:
    """``unchanged``: the save found the state of ``manifest``, an earlier image, and
    wrote nothing; the cells up to its execution count are in that image's state."""
    variables = manifest["variables"]
    unchanged = manifest.get("unchanged")
    return {
        "id": manifest["id"],
        "name": manifest["name"],
        "saved": [v["name"] for v in variables if v["status"] in ("saved", "imported")],
        "lost": {v["name"]: v["reason"] for v in variables if v["status"] == "lost"},
        "excluded": [v["name"] for v in variables if v["status"] == "excluded"],
        "bytes": manifest["sizes"]["logical"],
        "host_bytes": host_bytes(manifest),
        "written": 0 if unchanged else manifest["sizes"]["written"],
        "seconds": seconds,
        "verify_seconds": manifest.get("verify_seconds"),
        # the number of the next cell: cells from it on ran after the image
        "execution_count": (unchanged or manifest["kernel"]).get("execution_count"),
        "trigger": manifest.get("trigger"),
        "unchanged": bool(unchanged),
        # what a restore will not bring back as it was, besides the variables
        "warnings": save_warnings(manifest),
    }


def save_warnings(manifest: dict[str, Any]) -> list[str]:
    lost = manifest.get("process", {}).get("lost", {})
    return [
        *manifest.get("warnings", []),
        *(f"{provider} not kept: {why}" for provider, why in sorted(lost.items())),
    ]
