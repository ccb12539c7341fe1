"""Retention: old images go, never one a kernel's record names."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from jupyter_ckpt.errors import CkptError
from jupyter_ckpt.store import ImageStore

from .events import Events


class Retention:
    """Applies ImageStore.retention_days / max_images / quota_bytes after saves and on the
    monitor's schedule. The store refuses to remove an image that a kernel record names
    (suspended, restore-failed, a running kernel's autosave or origin)."""

    def __init__(self, store: ImageStore, events: Events, log: Any) -> None:
        self.store = store
        self.events = events
        self.log = log

    async def enforce(self) -> list[str]:
        """The ids removed. Failures are logged: retention must not break a suspend that
        already succeeded."""
        started = time.perf_counter()
        try:
            # Chunks are collected every ImageStore.gc_interval, not after every save.
            removed, _, freed = await asyncio.to_thread(self.store.enforce_retention, collect=None)
        except (CkptError, OSError) as exc:
            self.log.warning("Retention failed: %s", exc)
            return []
        for image_id in removed:
            self.events.event("delete", None, "retention", started, {"id": image_id})
        if removed:
            self.log.info("Retention removed %d image(s), %d bytes", len(removed), freed)
        return removed
