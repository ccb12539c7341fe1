"""An autosave: running (or restore-failed) -> autosaving -> back, its image recorded in
a running record so that a crash is recoverable from it. The server's
:mod:`jupyter_ckpt_server.autosave` decides when, and writes the image in the background;
this records it."""

from __future__ import annotations

import asyncio
import time

from jupyter_ckpt.errors import CkptError

from ..events import now_iso
from ..rpc import SuspendFailed
from .checkpoint import Checkpoint, kept_trigger
from .kernels import Kernels
from .records import RecordKeeper
from .states import KernelLifecycle, State

S = State


class Autosave:
    """A kernel's autosave, under its lock; the next one replaces its image."""

    def __init__(self, owner: Kernels, keeper: RecordKeeper, checkpoints: Checkpoint) -> None:
        self.owner = owner
        self.keeper = keeper
        self.checkpoints = checkpoints

    def start(self, kernel_id: str) -> asyncio.Task[None] | None:
        """Autosave a running kernel in the background unless another action holds it."""
        lc = self.owner.kernels.get(kernel_id)
        if lc is None or not lc.saves_itself or lc.lock.locked() or lc.autosave:
            return None
        lc.autosave = asyncio.ensure_future(self._run(lc))
        lc.autosave.add_done_callback(lambda _: setattr(lc, "autosave", None))
        return lc.autosave

    async def _run(self, lc: KernelLifecycle) -> None:
        owner = self.owner
        started = time.perf_counter()
        kernel_id = lc.kernel_id
        forget_image = self.checkpoints.forget_image
        async with lc.lock:
            if not lc.saves_itself:
                return
            lc.move("autosave")
            written = None
            try:
                cells = lc.cells
                summary = await owner.saver.save(
                    kernel_id, owner.policy.checkpoint_timeout, kernel_info=lc.kernel_info is None
                )
                if summary is None:  # skipped, and said why
                    return
                lc.kernel_info = summary.pop("kernel_info", lc.kernel_info)
                # an unchanged save returned an earlier image: not this autosave's to remove
                written = None if summary.get("unchanged") else summary["id"]
                try:
                    await asyncio.to_thread(owner.store.verify, summary["id"])
                except CkptError as exc:
                    raise SuspendFailed(f"the image failed verification: {exc}") from exc
                trigger = kept_trigger(lc, summary) or "autosave"
                record = await self.keeper.running(lc, summary, trigger, now_iso())
                if lc.cells != cells:  # cells ran during the save: they come after it
                    record["cells_after"] = list(lc.executed)
                previous = lc.autosave_image
                await self.keeper.put(lc, record)
                lc.refreshed_at = time.monotonic()
                written = None  # recorded: kept
                # replaced by the next autosave only if this one wrote it: an unchanged
                # save returns an earlier image (a checkpoint, the restored image), kept
                if not summary.get("unchanged"):
                    lc.autosave_image = summary["id"]
                elif previous != summary["id"]:
                    lc.autosave_image = None
                if previous is not None and previous != summary["id"]:
                    await asyncio.to_thread(forget_image, previous)
            except (SuspendFailed, CkptError, OSError) as exc:
                owner.events.failure("checkpoint", kernel_id, "autosave", exc, started)
                return
            finally:
                if lc.state is S.AUTOSAVING:
                    lc.move("autosaved" if lc.unrestored is None else "autosaved, unrestored")
                # written but not recorded: not offered for restore (a put that landed
                # as the autosave was cancelled recorded it: it is kept)
                if written is not None and not lc.records_name(written):
                    await asyncio.to_thread(forget_image, written)
        owner.saver.report(kernel_id, summary, started)
