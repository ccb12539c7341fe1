"""A kernel's record in the store and the pins it holds: every write of a record goes
through :class:`RecordKeeper`, the owner's part that writes them (see the package's
invariant and its rules: a pin lasts until a newer state is committed, a cancelled write
never lands later)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Any

from jupyter_ckpt.errors import CkptError

from ..events import now_iso
from .kernels import Kernels
from .sessions import Sessions
from .states import KernelLifecycle, State

S = State
# how often at most a running record is rewritten with the cells run since its image
RECORD_REFRESH_SECONDS = 5.0


async def to_the_end(work: Callable[[], None]) -> bool:
    """Run a store write on a thread to its end, whatever happens to the task that asked
    for it; whether that task was cancelled meanwhile (it must then stop, once it has
    taken the write's outcome into account).

    A thread cannot be stopped: a write whose awaiting task were cancelled would still
    land, later, after whatever followed the cancel (a shutdown's removal of the record, a
    suspend's record), and undo it. So the cancel waits for the write instead."""
    job = asyncio.ensure_future(asyncio.to_thread(work))
    cancelled = False
    while not job.done():
        try:
            await asyncio.shield(job)
        except asyncio.CancelledError:
            cancelled = cancelled or not job.done()
        except Exception:
            break  # the write failed: the caller reads it from the job
    job.result()
    return cancelled


class RecordKeeper:
    """Puts, replaces and removes kernel records, for the owner and under each kernel's
    lock; what the records pin."""

    def __init__(self, owner: Kernels, sessions: Sessions) -> None:
        self.owner = owner
        self.sessions = sessions

    # -- pins -------------------------------------------------------------------------------

    def pinned(self) -> dict[str, dict[str, str]]:
        """Image id -> the kernel whose record names it and how (what GET /images shows).
        A checkpoint the user took stays theirs to delete (:meth:`release_checkpoint`)."""
        pins = {}
        for lc in list(self.owner.kernels.values()):
            if lc.record is None or lc.record.get("trigger") == "checkpoint":
                continue
            how = {
                S.SUSPENDED: "suspended",
                S.RESTORING: "suspended",
                S.RESTORE_FAILED: "restore-failed",
            }.get(lc.state, "autosave")
            pins[lc.record["image_id"]] = {"state": how, "kernel_id": lc.kernel_id}
            for kept in lc.record.get("keeps", []):
                pins[kept] = {"state": "restore-failed", "kernel_id": lc.kernel_id}
        return pins

    def running_from(self) -> dict[str, list[str]]:
        """Image id -> the running kernels whose record names it: the image each runs
        from (restored or resumed from, or last saved, unchanged since or not)."""
        images: dict[str, list[str]] = {}
        for lc in list(self.owner.kernels.values()):
            record = lc.record
            if lc.state not in (S.RUNNING, S.AUTOSAVING) or record is None:
                continue
            if record.get("state") == "running" and record.get("image_id"):
                images.setdefault(record["image_id"], []).append(lc.kernel_id)
        return images

    # -- the only writes ----------------------------------------------------------------------

    async def put(self, lc: KernelLifecycle, record: dict[str, Any]) -> None:
        """Replace the kernel's record; the in-memory copy follows only a committed put.
        A caller cancelled meanwhile is cancelled once the put has landed (or failed):
        a cancelled write never lands later (see :func:`to_the_end`)."""
        record, newer = await self.keeping(lc, record)
        cancelled = await to_the_end(lambda: self.owner.records.put(record))
        lc.record = record
        if newer:  # the kernel holds a state that came from the image it failed on
            lc.unrestored = lc.restore_error = None
            if lc.state is S.RESTORE_FAILED:
                lc.move("newer state")
        if record.get("trigger") != "checkpoint":
            lc.before_checkpoint = None
        self.schedule_refresh(lc)  # cells that ran while it was written
        if cancelled:
            raise asyncio.CancelledError

    async def keeping(
        self, lc: KernelLifecycle, record: dict[str, Any]
    ) -> tuple[dict[str, Any], bool]:
        """The record to put for ``record``, and whether its image is a newer state of the
        image the kernel's restore failed on.

        A failed restore is not a newer state, and neither is what the kernel does without
        that state: until an image that came from it (the user restored it with ``%ckpt
        restore``, then saved) is recorded, every record of the kernel still restores it,
        and keeps (pins) the kernel's own newest image beside it, so neither is lost."""
        unrestored = lc.unrestored
        image_id = record["image_id"]
        if unrestored is None or image_id == unrestored:
            return record, False
        if await asyncio.to_thread(self._descends, image_id, unrestored):
            return {k: v for k, v in record.items() if k != "keeps"}, True
        earlier = (lc.record or {}).get("keeps", [])
        keeps = [image_id, *(k for k in earlier if k not in (image_id, lc.autosave_image))]
        return {**record, "image_id": unrestored, "keeps": keeps}, False

    def _descends(self, image_id: str, ancestor: str) -> bool:
        """Whether image ``image_id`` holds a state that came from ``ancestor``: it is
        that image, or its parents (the image each save came from) lead to it."""
        seen: set[str] = set()
        current: str | None = image_id
        while current is not None and current not in seen:
            if current == ancestor:
                return True
            seen.add(current)
            try:
                current = self.owner.store.load_manifest(current).get("parent")
            except CkptError:
                return False
        return False

    async def drop(self, lc: KernelLifecycle) -> None:
        """Remove the kernel's record: only for a state its user gave up."""
        if lc.record is None:
            return
        try:
            cancelled = await to_the_end(lambda: self.owner.records.delete(lc.kernel_id))
        except FileNotFoundError:
            cancelled = False
        except (CkptError, OSError) as exc:
            self.owner.log.warning(
                "Could not remove the record of kernel %s: %s", lc.kernel_id, exc
            )
            return
        lc.record = None
        if cancelled:
            raise asyncio.CancelledError

    async def put_back(self, lc: KernelLifecycle, previous: dict[str, Any] | None) -> None:
        """Undo an aborted suspend's record: the record it replaced, or none."""
        try:
            if previous is None:
                await to_the_end(lambda: self.owner.records.delete(lc.kernel_id))
                lc.record = None
            else:
                await self.put(lc, previous)
        except (CkptError, OSError) as exc:
            self.owner.log.warning(
                "could not put back the record of kernel %s: %s", lc.kernel_id, exc
            )

    async def update(self, lc: KernelLifecycle, record: dict[str, Any]) -> None:
        """Put ``record``; a failure is logged: the record before it still names the
        kernel's image."""
        try:
            await self.put(lc, record)
        except (CkptError, OSError) as exc:
            self.owner.log.warning(
                "Could not update the record of kernel %s: %s", lc.kernel_id, exc
            )

    async def update_env(self, kernel_id: str, env: dict[str, str]) -> None:
        """A session of a suspended kernel moved (renamed notebook, changed kernel path):
        its record follows, so the restored kernel and its later images name the notebook."""
        lc = self.owner.kernels.get(kernel_id)
        if lc is None or lc.record is None:
            return
        async with lc.lock:
            if lc.record is None:
                return
            lc.launch = {**lc.launch, "env": {**lc.launch.get("env", {}), **env}}
            record = {
                **lc.record,
                "env": {**lc.record.get("env", {}), **env},
                "sessions": await self.sessions.of(kernel_id) or lc.record.get("sessions", []),
            }
            await self.update(lc, record)

    async def note_stop(self, lc: KernelLifecycle) -> None:
        """The server stops a kernel it could not suspend: its running record stays, so
        the next server brings back its last image, and says when the stop came."""
        assert lc.record is not None
        record = {**lc.record, "cells_after": list(lc.executed), "stopped_at": now_iso()}
        await self.update(lc, record)

    async def release_checkpoint(self, image_id: str) -> None:
        """The user deletes a checkpoint a running kernel's record names: the record goes
        back to the one it replaced (an autosave, the image the kernel came from, or
        none), so the store lets the image go and no record names a missing image."""
        for lc in list(self.owner.kernels.values()):
            record = lc.record
            if record is None or record["image_id"] != image_id:
                continue
            if record.get("trigger") != "checkpoint":
                continue
            async with lc.lock:
                try:  # the store's record, which the store's delete goes by
                    stored = await asyncio.to_thread(self.owner.records.get, lc.kernel_id)
                except CkptError:
                    continue
                if lc.record is record and stored.get("trigger") == "checkpoint":
                    await self.put_back(lc, lc.before_checkpoint)
                    lc.before_checkpoint = None

    # -- what a record holds --------------------------------------------------------------------

    def base(self, lc: KernelLifecycle, image_id: str) -> dict[str, Any]:
        kernel = self.owner.km.get_kernel(lc.kernel_id)
        return {
            "kernel_id": lc.kernel_id,
            "kernel_name": kernel.kernel_name,
            "path": lc.launch.get("path"),
            "env": lc.launch.get("env", {}),
            "image_id": image_id,
            "kernel_info": lc.kernel_info,
            "debug_info": lc.debug_info,
            "last_activity": kernel.last_activity.isoformat(),
            "suspended_at": now_iso(),
            "server_name": os.environ.get("JUPYTERHUB_SERVER_NAME", ""),
        }

    async def running(
        self, lc: KernelLifecycle, summary: dict[str, Any], trigger: str, saved_at: str
    ) -> dict[str, Any]:
        """The record of a running kernel whose newest image is ``summary``'s."""
        owner = self.owner
        count = summary.get("execution_count") or 0
        lc.executed = [n for n in lc.executed if n >= count]
        return {
            **self.base(lc, summary["id"]),
            "autosave_at": saved_at,
            "execution_count": count,
            "trigger": trigger,
            "gpu": owner.rpc.gpu_usage(lc.kernel_id).to_json(),
            "lost": summary["lost"],
            "bytes": summary["bytes"],
            "written": summary.get("written", 0),
            "state": "running",
            "server": owner.identity,
            "cells_after": list(lc.executed),
            "alive_at": now_iso(),
            "sessions": await self.sessions.of(lc.kernel_id),
        }

    # -- the cells run since a running record's image -------------------------------------------

    def schedule_refresh(self, lc: KernelLifecycle) -> None:
        """Rewrite the running record with the cells run since its image, at most every
        RECORD_REFRESH_SECONDS: a crash then names the cells whose effects are lost."""
        if lc.refresh is None and lc.record_stale:
            lc.refresh = asyncio.ensure_future(self._refresh(lc))

    async def _refresh(self, lc: KernelLifecycle) -> None:
        """Until the record lists every cell: a cell that runs while a record is being
        written (this one's, or the restore's that replaces the suspended record) is
        listed by the next round, not lost."""
        try:
            while lc.record_stale:
                await asyncio.sleep(lc.refreshed_at + RECORD_REFRESH_SECONDS - time.monotonic())
                async with lc.lock:
                    if lc.state is not S.RUNNING or not lc.record_stale:
                        return
                    assert lc.record is not None
                    record = {**lc.record, "cells_after": list(lc.executed), "alive_at": now_iso()}
                    lc.refreshed_at = time.monotonic()
                    await self.put(lc, record)
        except (CkptError, OSError) as exc:
            self.owner.log.warning(
                "Could not update the record of kernel %s: %s", lc.kernel_id, exc
            )
        finally:
            lc.refresh = None
