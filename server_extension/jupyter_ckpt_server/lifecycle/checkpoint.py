"""A checkpoint: an image written while the kernel keeps running (the user's Save Now, a
replaced kernel's last save), and the writing and verifying of images that a suspend
shares with it. A checkpoint leaves the kernel's state as it is."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from jupyter_ckpt.errors import CkptError, StoreError

from ..events import now_iso
from ..rpc import NothingToSave, StoreFailed, SuspendFailed
from .kernels import Kernels
from .records import RecordKeeper
from .states import KernelLifecycle, State

S = State


def kept_trigger(lc: KernelLifecycle, summary: dict[str, Any]) -> str | None:
    """For a save that found the state of the image the running record names: the
    record's trigger, which the record moved on to the cells run since (none of which
    changed the state) keeps, and with it the image's pin. None for any other save."""
    record = lc.record
    if not summary.get("unchanged") or record is None:
        return None
    if record.get("state") != "running" or record["image_id"] != summary["id"]:
        return None
    return str(record.get("trigger", "autosave"))


class Checkpoint:
    """Writes a kernel's images, for a checkpoint and for a suspend, under its lock."""

    def __init__(self, owner: Kernels, keeper: RecordKeeper) -> None:
        self.owner = owner
        self.keeper = keeper

    async def run(self, kernel_id: str, name: str | None, trigger: str) -> dict[str, Any]:
        """Write an image now; the kernel keeps running. Without a name, a state identical
        to the kernel's newest image writes none: that image comes back, ``unchanged``.
        ``trigger``: the label of the image (``manual``: the user's Save Now)."""
        owner = self.owner
        started = time.perf_counter()
        try:
            lc = owner.kernels.get(kernel_id)
            if lc is None or not owner.km.has_process(kernel_id):
                raise NothingToSave(f"kernel {kernel_id} is not running")
            async with owner.locked(lc, None):
                if not lc.has_process:
                    raise SuspendFailed(f"kernel {kernel_id} is not running")
                summary = await self.write_image(kernel_id, name, owner.timeout(None), trigger)
                if summary["id"] == lc.autosave_image:
                    # the user's save found the autosave's state: the next autosave must
                    # not remove the image this save returned
                    lc.autosave_image = None
                # recoverable from it at once, as from an autosave
                if lc.state in (S.RUNNING, S.RESTORE_FAILED):
                    await self._record(lc, summary)
        except SuspendFailed as exc:
            owner.events.failure("checkpoint", kernel_id, "api", exc, started)
            raise
        owner.events.event("checkpoint", kernel_id, "api", started, summary)
        return summary

    async def _record(self, lc: KernelLifecycle, summary: dict[str, Any]) -> None:
        keeper = self.keeper
        kept = kept_trigger(lc, summary)
        if kept is not None:
            await keeper.update(lc, await keeper.running(lc, summary, kept, now_iso()))
            return
        record = await keeper.running(lc, summary, "checkpoint", now_iso())
        previous = lc.record
        if previous is not None and previous.get("trigger") == "checkpoint":
            previous = lc.before_checkpoint
        try:
            await keeper.put(lc, record)
            lc.before_checkpoint = previous  # after the put: it clears it
        except (CkptError, OSError) as exc:  # the image is saved all the same
            self.owner.log.warning("Could not record kernel %s: %s", lc.kernel_id, exc)

    async def write_image(
        self,
        kernel_id: str,
        name: str | None,
        timeout: float,
        trigger: str,
        action: str = "checkpoint",
    ) -> dict[str, Any]:
        owner = self.owner
        await owner.step("checkpoint", kernel_id)
        async with owner.progress.watch(kernel_id, action) as progress:
            call = f"checkpoint({name!r}, progress={progress!r}, trigger={trigger!r})"
            summary = await owner.rpc.call(kernel_id, call, timeout)
        await owner.step("verify", kernel_id)
        await self.verify(summary["id"], written=not summary.get("unchanged"))
        return summary

    async def verify(self, image_id: str, written: bool = True) -> None:
        """Verify an image before relying on it, also an earlier one an unchanged save
        returned (its chunks may have rotted since); only one this save wrote is removed
        when it fails."""
        try:
            await asyncio.to_thread(self.owner.store.verify, image_id)
        except StoreError as exc:  # the store failed, not the image: it is kept
            why = f"the image could not be verified: {exc}"
            raise StoreFailed(why, type(exc).__name__) from exc
        except CkptError as exc:
            if not written:
                msg = f"the kernel's newest image failed verification: {exc}"
                raise SuspendFailed(msg) from exc
            # a broken image must not be offered for restore or resume
            await asyncio.to_thread(self.forget_image, image_id)
            raise SuspendFailed(f"the image failed verification and was removed: {exc}") from exc

    def forget_image(self, image_id: str) -> None:
        try:
            self.owner.store.delete(image_id)
        except CkptError as exc:
            self.owner.log.warning("could not remove image %s: %s", image_id, exc)
