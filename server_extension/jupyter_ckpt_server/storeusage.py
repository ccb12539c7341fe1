"""How much of its room the store uses, for the status (the panel's store meter).

Read from the store's signed index (only manifests new since the last read are read),
off the event loop, at most every ``max_age`` seconds: the status is asked after every
cell, and a listing of a remote store takes a round trip. The bytes are those each image
wrote (a chunk counts with the image that first wrote it: once that image is deleted, a
chunk a later image still uses counts no more, so the meter may read low, never high),
against ``ImageStore.quota_bytes`` when there is one; a local store also says how large
its file system is and how much of it is free.

States:

======== ============================ =========================================
state    on ``current()``             then
======== ============================ =========================================
empty    reads, waits up to READ_WAIT fresh (or empty, if the read failed)
fresh    the last reading             stale once ``max_age`` has passed, or
                                      at once after a save or a delete
stale    reads, waits up to READ_WAIT fresh (the last reading, if it failed
                                      or takes longer)
======== ============================ =========================================
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from typing import Any

from jupyter_ckpt.errors import CkptError
from jupyter_ckpt.store import ImageStore
from jupyter_ckpt.store.backends import LocalBackend

from .events import STORE_CHANGES

MAX_AGE = 30.0
# how long the status waits for a reading under way
READ_WAIT = 2.0


def read_usage(store: ImageStore) -> dict[str, Any]:
    """The store's use now (see the module's docstring)."""
    images = written = 0
    for _image_id, summary, _error in store.iter_manifests():
        images += 1
        sizes = (summary or {}).get("sizes") or {}
        written += int(sizes.get("written") or sizes.get("logical") or 0)
    usage: dict[str, Any] = {
        "bytes": written,
        "images": images,
        "quota_bytes": store.quota_bytes or None,
        "disk_bytes": None,
        "disk_free_bytes": None,
    }
    if isinstance(store.backend, LocalBackend):
        disk = shutil.disk_usage(store.backend.url)
        usage.update(disk_bytes=disk.total, disk_free_bytes=disk.free)
    return usage


class StoreUsage:
    """The last reading of the store's use, refreshed in the background when stale."""

    def __init__(self, store: ImageStore, max_age: float = MAX_AGE) -> None:
        self.store = store
        self.max_age = max_age
        self._usage: dict[str, Any] | None = None
        self._read_at = 0.0
        self._reading: asyncio.Task[None] | None = None

    async def current(self) -> dict[str, Any] | None:
        """The store's use (None while it cannot be read)."""
        if self._reading is None and time.monotonic() - self._read_at > self.max_age:
            self._reading = asyncio.ensure_future(self._read())
        if self._reading is not None:
            # briefly: a store that does not answer must not hold up the status (its
            # health says why), which asks again later
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._reading), READ_WAIT)
        return self._usage

    async def on_event(self, logger: Any, schema_id: str, data: dict[str, Any]) -> None:
        """A jupyter_events listener: after a save or a delete the store holds other
        images, and the next ``current()`` reads it again."""
        if data.get("action") in STORE_CHANGES and data.get("status") == "success":
            self._read_at = 0.0

    async def _read(self) -> None:
        try:
            self._usage = await asyncio.to_thread(read_usage, self.store)
        except (CkptError, OSError):
            pass  # the store's health says why; the last reading stands
        finally:
            self._read_at = time.monotonic()
            self._reading = None
