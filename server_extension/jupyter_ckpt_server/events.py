"""What the server tells about each action: jupyter_ckpt events, log lines, last failures."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from .rpc import StoreFailed
from .storehealth import StoreHealth

# the actions after which the store holds other images (an ``images`` event: a %ckpt
# command's cell, whose writes the server did not make)
STORE_CHANGES = ("checkpoint", "suspend", "delete", "images")


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


class Events:
    """Emits one event per action (DESIGN section 5) and keeps each kernel's last failure,
    which the status shows until a later attempt succeeds or its cause is gone.

    Besides the actions, a ``state`` event for each change of a kernel's state as its
    clients see it (running, suspending, suspended, restoring, restore-failed, gone) and
    a ``store`` event for each change of the store's health, and an ``images`` event
    when a cell that ran a ``%ckpt`` command ends: every open JupyterLab follows them at
    once, with no poll (see docs/panel.md).
    """

    def __init__(self, emit: Callable[[dict[str, Any]], None] | None, log: Any) -> None:
        self.emit = emit
        self.log = log
        # kernel id -> why its last checkpoint or suspend failed (shown in status)
        self.failures: dict[str, dict[str, Any]] = {}
        # told whether the store took each save (set once the server runs: the store's
        # health in the status): a store that refuses writes is not "ok" while it reads
        self.store_health: StoreHealth | None = None
        # kernel id -> the state its last state event said: one event per change seen
        self._shown: dict[str, str] = {}

    def failure(
        self, action: str, kernel_id: str, trigger: str, exc: BaseException, started: float
    ) -> None:
        reason = str(exc)
        if self.store_health is not None and isinstance(exc, StoreFailed):
            self.store_health.saw(exc, f"the {action} of kernel {kernel_id}")
        self.failures[kernel_id] = {"action": action, "reason": reason, "at": now_iso()}
        if getattr(exc, "lost", None):
            self.failures[kernel_id]["lost"] = exc.lost  # type: ignore[attr-defined]
        self.log.warning("Could not %s kernel %s: %s", action, kernel_id, reason)
        self.event(action, kernel_id, trigger, started, status="error", msg=reason)

    def event(
        self,
        action: str,
        kernel_id: str | None,
        trigger: str,
        started: float,
        summary: dict[str, Any] | None = None,
        status: str = "success",
        **extra: Any,
    ) -> None:
        data: dict[str, Any] = {
            "action": action,
            "status": status,
            "trigger": trigger,
            "seconds": time.perf_counter() - started,
            **extra,
        }
        if kernel_id:
            data["kernel_id"] = kernel_id
        if summary and status == "success" and self.store_health is not None:
            self.store_health.saw(None, f"the {action} of kernel {kernel_id}")
        if summary:
            data["image_id"] = summary.get("id") or summary.get("image_id")
            data["write_seconds"] = summary.get("seconds", 0.0)
            if "bytes" in summary:
                data["bytes"] = summary["bytes"]
            data["missing"] = sorted(summary.get("lost") or summary.get("missing") or {})
        if self.emit is not None:
            self.emit(data)

    def state(self, kernel_id: str, shown: str) -> None:
        """A kernel's state changed to what its clients see as ``shown``: a ``state``
        event if that changed (autosaving is running to them)."""
        if self._shown.get(kernel_id) == shown:
            return
        if shown == "gone":
            self._shown.pop(kernel_id, None)
        else:
            self._shown[kernel_id] = shown
        if self.emit is not None:
            self.emit(
                {"action": "state", "status": "success", "kernel_id": kernel_id, "state": shown}
            )

    def images(self, kernel_id: str) -> None:
        """A cell that ran a ``%ckpt`` command ended in the kernel: the kernel writes
        and deletes images in the store itself, so every page lists them again."""
        if self.emit is not None:
            self.emit({"action": "images", "status": "success", "kernel_id": kernel_id})

    def store(self, health: StoreHealth) -> None:
        """The store's health changed: a ``store`` event (error: why it cannot be used)."""
        if self.emit is None:
            return
        data: dict[str, Any] = {"action": "store", "status": "success" if health.ok else "error"}
        if health.error:
            data["msg"] = health.error
        self.emit(data)
