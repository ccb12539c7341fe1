"""The owner of every kernel's lifecycle: :class:`Lifecycles` holds each kernel's
:class:`~.states.KernelLifecycle` and its lock (as a :class:`~.kernels.Kernels`), takes
every entry point, and runs each transition through its module under that lock (see the
package's table). It is the only writer of records and pins, through its
:class:`~.records.RecordKeeper`, which it hands to the transitions it builds."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from ..rpc import SuspendFailed
from . import adopt, standby
from .autosave import Autosave
from .checkpoint import Checkpoint
from .kernels import Kernels
from .records import RecordKeeper
from .restore import Restore
from .resume import Resume
from .sessions import Sessions
from .start import Start
from .states import KernelLifecycle, State
from .suspend import Suspend

S = State
# what a kernels-API action tells a suspend or restore in progress
_ACTIONS = {
    "shutdown": "the kernel was shut down",
    "restart": "the kernel was restarted",
    "interrupt": "the kernel was interrupted",
}


class Lifecycles(Kernels):
    """Every kernel's :class:`KernelLifecycle`, and the transitions between its states."""

    def __init__(self, **server: Any) -> None:
        super().__init__(**server)
        # the parts it runs the transitions with (see the package's table)
        self.sessions = Sessions(self)
        self.keeper = RecordKeeper(self, self.sessions)
        self.starts = Start(self, self.keeper)
        self.checkpoints = Checkpoint(self, self.keeper)
        self.autosaves = Autosave(self, self.keeper, self.checkpoints)
        self.suspends = Suspend(self, self.keeper, self.sessions, self.checkpoints)
        self.restores = Restore(self, self.keeper, self.sessions)
        self.resumes = Resume(self, self.keeper, self.restores, self.checkpoints)

    # -- lookups ------------------------------------------------------------------------------

    def pinned(self) -> dict[str, dict[str, str]]:
        """Image id -> the kernel whose record pins it and how (:mod:`.records`)."""
        return self.keeper.pinned()

    def running_from(self) -> dict[str, list[str]]:
        """Image id -> the running kernels whose record names it (:mod:`.records`)."""
        return self.keeper.running_from()

    def keep_standby(self) -> None:
        """A process standing by for the specs of suspended kernels (:mod:`.standby`)."""
        standby.keep_standby(self)

    # -- a kernel process starts (:mod:`.start`) -------------------------------------------------

    def refuse_gone(self, kernel_id: str | None) -> None:
        if kernel_id is not None and kernel_id in self.gone:
            raise SuspendFailed(
                f"kernel {kernel_id} was shut down and its state given up; its images are "
                "kept: resume one from the saved sessions instead"
            )

    def watch(self, kernel_id: str, start: bool) -> None:
        """Follow a started kernel's messages, or stop (:mod:`.start`)."""
        self.starts.watch(kernel_id, start)

    async def started(self, kernel_id: str, launch: dict[str, Any]) -> None:
        """A kernel process started: hand it out once heard (:mod:`.start`)."""
        await self.starts.started(kernel_id, launch)

    def process_restarted(self, kernel_id: str) -> None:
        """The kernel's process died and was restarted on its own (:mod:`.start`)."""
        self.starts.process_restarted(kernel_id)

    # -- entry points from the kernels API -----------------------------------------------------

    async def settle(self, kernel_id: str, action: str) -> KernelLifecycle | None:
        """Before a kernels-API action: stop a suspend in progress at its next step (the
        kernel keeps running), make a restore skip its image on shutdown or restart, and
        cancel an autosave; wait for them, so the action applies to a settled state."""
        lc = self.kernels.get(kernel_id)
        if lc is None:
            return None
        why = _ACTIONS[action]
        if lc.state is S.SUSPENDING or (lc.state is S.RESTORING and action != "interrupt"):
            lc.abort = lc.abort or why
        if action != "interrupt":
            self.saver.cancel(kernel_id)
            if lc.autosave is not None:
                lc.autosave.cancel()
            if lc.gpu_wait is not None:  # a restore or resume waiting for GPU memory
                lc.gpu_wait.cancel()
        tasks = [lc.suspend_task, lc.restore_task]
        if action != "interrupt":
            tasks.append(lc.autosave)
        for task in tasks:
            if task is not None:
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await asyncio.shield(task)
        return lc

    async def shutdown(self, kernel_id: str) -> None:
        """The kernel is shut down: by its user (its record goes, the state is given up)
        or by a server stop (its record stays, so the next server brings it back)."""
        lc = await self.settle(kernel_id, "shutdown")
        if lc is None:
            return
        async with lc.lock:
            if not self.stopping:
                await self.keeper.drop(lc)
                self.gone.add(kernel_id)
            elif lc.record is not None and lc.record.get("state") == "running":
                await self.keeper.note_stop(lc)
            self._forget(lc)

    async def restarted(self, kernel_id: str) -> None:
        """The user restarts the kernel: its state, and so its record, is given up."""
        lc = await self.settle(kernel_id, "restart")
        if lc is None:
            return
        async with lc.lock:
            await self.keeper.drop(lc)
            lc.move("restart")
            lc.recovered = lc.restore_error = lc.autosave_image = lc.unrestored = None
            lc.executed = []

    async def update_env(self, kernel_id: str, env: dict[str, str]) -> None:
        """A session of a suspended kernel moved: its record follows (:mod:`.records`)."""
        await self.keeper.update_env(kernel_id, env)

    def _forget(self, lc: KernelLifecycle) -> None:
        lc.state = S.GONE
        self.saver.forget(lc.kernel_id)
        self.rpc.forget(lc.kernel_id)
        lc.close_stream()
        if lc.refresh is not None:
            lc.refresh.cancel()
        self.kernels.pop(lc.kernel_id, None)

    def client_message(self, kernel_id: str) -> None:
        """A client sent the kernel a message (any channel): a suspend in progress must not
        shut the kernel down, or the message would be lost."""
        lc = self.kernels.get(kernel_id)
        if lc is None:
            return
        lc.messages += 1
        if lc.state is S.SUSPENDING:
            lc.abort = lc.abort or "a client used the kernel while it was being suspended"

    # -- the transitions, each run by its module ---------------------------------------------

    async def checkpoint(
        self, kernel_id: str, name: str | None = None, trigger: str = "manual"
    ) -> dict[str, Any]:
        """Write an image now; the kernel keeps running (:mod:`.checkpoint`)."""
        return await self.checkpoints.run(kernel_id, name, trigger)

    async def release_checkpoint(self, image_id: str) -> None:
        """The user deletes a checkpoint a running kernel's record names: the record goes
        back to the one it replaced (:mod:`.records`)."""
        await self.keeper.release_checkpoint(image_id)

    def start_autosave(self, kernel_id: str) -> asyncio.Task[None] | None:
        """Autosave a running kernel in the background unless another action holds it."""
        return self.autosaves.start(kernel_id)

    async def suspend(
        self, kernel_id: str, trigger: str = "api", timeout: float | None = None
    ) -> dict[str, Any]:
        """Write the kernel's image, record it, stop its process (:mod:`.suspend`)."""
        return await self.suspends.run(kernel_id, trigger, timeout)

    async def ensure_compatible(self, image_id: str) -> dict[str, Any] | None:
        """Refuse, with the reasons, an image this node cannot restore (:mod:`.restore`)."""
        return await self.restores.ensure_compatible(image_id)

    def restore(
        self, kernel_id: str, trigger: str = "message", hand_over: bool = False
    ) -> asyncio.Future[dict[str, Any]]:
        """Start the suspended kernel and restore its image into it (:mod:`.restore`);
        ``hand_over``: done once the kernel holds its state, before its record is written."""
        return self.restores.start(kernel_id, trigger, hand_over)

    def restore_under_way(self, kernel_id: str) -> bool:
        """Whether a restore of the kernel was asked for and has not ended."""
        return self.restores.under_way(kernel_id)

    def delivered(self, kernel_id: str) -> None:
        """A client's messages that waited for the restore went to the restored kernel."""
        self.restores.delivered(kernel_id)

    async def resume(
        self, image_id: str, path: str | None, kernel_name: str | None
    ) -> dict[str, Any]:
        """Start a new kernel restored from an image (:mod:`.resume`)."""
        return await self.resumes.run(image_id, path, kernel_name)

    async def sessions_of(self, kernel_id: str) -> list[dict[str, Any]]:
        """The sessions (notebooks, consoles) attached to a kernel, as a record keeps them."""
        return await self.sessions.of(kernel_id)

    async def load_records(self) -> None:
        """Adopt the kernels an earlier run of the server recorded (:mod:`.adopt`)."""
        await adopt.load_records(self, self.sessions)
