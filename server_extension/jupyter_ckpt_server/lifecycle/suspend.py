"""A suspend: running (or restore-failed) -> suspending -> suspended, or back if it fails
or is aborted. The kernel's image is written and recorded, then its process stops.

After every await up to the process's stop, a client message, restart, interrupt or
shutdown that arrived meanwhile aborts the suspend (see :meth:`.Lifecycles.settle`): a
message accepted for a kernel reaches the process that answers it, or the suspend aborts."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from jupyter_core.utils import ensure_async

from jupyter_ckpt.errors import CkptError

from ..rpc import Aborted, NothingToSave, SuspendFailed
from . import standby
from .checkpoint import Checkpoint
from .debugger import debug_info
from .kernels import Kernels
from .records import RecordKeeper
from .sessions import Sessions
from .states import KernelLifecycle, State

S = State
# the trigger an image is labelled with, by what asked a suspend for it
SUSPEND_LABELS = {"api": "manual", "idle": "idle", "shutdown": "shutdown", "demand": "demand"}


def _describe_lost(lost: dict[str, str]) -> str:
    return "; ".join(f"{name} ({why})" for name, why in lost.items())


class Suspend:
    """A kernel's suspend, one at a time (its callers share it), under its lock."""

    def __init__(
        self, owner: Kernels, keeper: RecordKeeper, sessions: Sessions, checkpoints: Checkpoint
    ) -> None:
        self.owner = owner
        self.keeper = keeper
        self.sessions = sessions
        self.checkpoints = checkpoints

    async def run(
        self, kernel_id: str, trigger: str = "api", timeout: float | None = None
    ) -> dict[str, Any]:
        """Write the kernel's image, record it, shut the kernel down; raise SuspendFailed
        (the kernel keeps running) if any step fails or another caller needs the kernel
        meanwhile. One suspend per kernel at a time: callers arriving meanwhile share it;
        ``timeout`` caps the whole of it."""
        lc = self.owner.kernels.get(kernel_id)
        if lc is None:
            raise NothingToSave(f"kernel {kernel_id} is not running")
        if lc.suspend_task is None:
            deadline = None if timeout is None else time.monotonic() + timeout
            task = lc.suspend_task = asyncio.ensure_future(self._suspend(lc, trigger, deadline))
            task.add_done_callback(lambda _: setattr(lc, "suspend_task", None))
        return await asyncio.shield(lc.suspend_task)

    async def _suspend(
        self, lc: KernelLifecycle, trigger: str, deadline: float | None
    ) -> dict[str, Any]:
        started = time.perf_counter()
        try:
            async with self.owner.locked(lc, deadline):
                return await self._locked(lc, trigger, deadline, started)
        except SuspendFailed as exc:
            self.owner.events.failure("suspend", lc.kernel_id, trigger, exc, started)
            raise

    async def _locked(
        self, lc: KernelLifecycle, trigger: str, deadline: float | None, started: float
    ) -> dict[str, Any]:
        owner = self.owner
        kernel_id, km, rpc, keeper = lc.kernel_id, owner.km, owner.rpc, self.keeper
        if lc.state is S.SUSPENDED:
            raise NothingToSave(f"kernel {kernel_id} is already suspended")
        if lc.state is S.GONE or not km.has_process(kernel_id):
            raise NothingToSave(f"kernel {kernel_id} is not running")
        kernel = km.get_kernel(kernel_id)
        if not await ensure_async(kernel.is_alive()):
            raise NothingToSave("the kernel's process has died: there is no state to save")
        previous = lc.record
        was = lc.state
        lc.abort = None
        lc.move("suspend")
        standby.keep_standby(owner)  # started while the image is written, ready for its restore
        cells = lc.cells
        written = None  # the image this suspend wrote, removed if the suspend fails
        recorded = False
        try:
            # After every await up to the shutdown, a client message, restart, interrupt
            # or shutdown that arrived meanwhile aborts the suspend (see settle()).
            if await rpc.busy(kernel_id):
                raise SuspendFailed("the kernel is busy")
            owner.check(lc)
            await owner.step("kernel_info", kernel_id)
            info = await rpc.request(kernel_id, "kernel_info", owner.timeout(deadline))
            lc.kernel_info = info
            lc.debug_info = await debug_info(owner, kernel_id, info, deadline)
            owner.check(lc)
            usage = rpc.gpu_usage(kernel_id)
            label = SUSPEND_LABELS.get(trigger, trigger)
            timeout = owner.timeout(deadline)
            summary = await self.checkpoints.write_image(kernel_id, None, timeout, label, "suspend")
            image_id = summary["id"]
            # nothing changed since the kernel's newest image (its autosave, a checkpoint,
            # the image it came from): the save returned that one, so that idle cycles of
            # an untouched kernel do not pile up identical images; it is not this
            # suspend's to remove if the suspend fails
            written = None if summary.get("unchanged") else image_id
            owner.check(lc)
            # at shutdown the state is lost anyway: keep what can be kept
            if summary["lost"] and owner.policy.on_unsaveable == "keep" and trigger != "shutdown":
                raise SuspendFailed(
                    "variables cannot be saved (on_unsaveable=keep): "
                    + _describe_lost(summary["lost"]),
                    lost=summary["lost"],
                )
            record = {
                **keeper.base(lc, image_id),
                "trigger": trigger,
                "gpu": usage.to_json(),
                "lost": summary["lost"],
                "sessions": await self.sessions.of(kernel_id),
            }
            await owner.step("record", kernel_id)
            await keeper.put(lc, record)
            recorded = True
            await owner.step("recorded", kernel_id)
            # A fence: the kernel answers only after any cell queued before it (a console
            # on the shell channel, which no websocket sees), whose execute_input it has
            # published by then.
            await rpc.request(kernel_id, "kernel_info", owner.timeout(deadline))
            busy = await rpc.busy(kernel_id)
            # the last checks: no await from here until the process is told to stop
            owner.check(lc)
            if lc.cells != cells or busy:
                raise Aborted("a client ran a cell while the kernel was being suspended")
        except (SuspendFailed, CkptError, OSError) as exc:
            lc.state = S.RUNNING if lc.unrestored is None else was
            if recorded:
                await keeper.put_back(lc, previous)
            if written is not None:
                await asyncio.to_thread(self.checkpoints.forget_image, written)
            raise (exc if isinstance(exc, SuspendFailed) else SuspendFailed(str(exc))) from exc
        finally:
            lc.abort = None
        pid_tree = rpc.probe.process_tree(rpc.pid(kernel_id) or 0)
        # listed as suspended before the process goes, so the id never leaves the listing;
        # clients reconnect at once and find it suspended, never the dying process
        lc.move("committed")
        lc.restore_error = lc.recovered = lc.autosave_image = None
        lc.executed = []
        lc.close_stream()
        owner.events.failures.pop(kernel_id, None)
        rpc.close_clients(kernel_id)
        await km.stop_process(kernel_id, now=False)
        release = 0.0
        if usage.holds_gpu:
            release = await rpc.wait_gpu_released(pid_tree, owner.gpu_release_timeout, owner.log)
        owner.events.event(
            "suspend",
            kernel_id,
            trigger,
            started,
            summary,
            gpu_release_seconds=release,
            kernel_name=record["kernel_name"],
        )
        owner.log.info(
            "Suspended kernel %s to image %s (%s): %.1f s",
            kernel_id,
            image_id,
            trigger,
            time.perf_counter() - started,
        )
        return {**summary, "kernel_id": kernel_id}
