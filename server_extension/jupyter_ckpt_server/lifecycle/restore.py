"""A restore: suspended -> restoring -> running, or restore-failed (the kernel runs
without its state; its record keeps the image pinned). The suspended kernel starts again
under its id and reads its image back; a client waiting to run its cell gets the kernel
as soon as it holds its state, before the running record is written under the lock.

A store that cannot be reached during a restore is waited for while the cell waits; a
shutdown or restart during a restore makes it skip its image."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import time
from collections.abc import Awaitable
from typing import Any

from jupyter_ckpt import compat
from jupyter_ckpt.errors import CkptError, GpuUnavailable, IncompatibleImage, StoreUnavailable
from jupyter_ckpt.kernel import summarize_save
from jupyter_ckpt.kernel.state import NOTEBOOK_ID_ENV

from ..backoff import backoff
from ..readahead import readahead
from ..recovery import recovery_message
from ..rpc import Aborted, StoreFailed, SuspendFailed
from ..timeline import Timeline
from .kernels import Kernels
from .records import RecordKeeper
from .sessions import Sessions
from .states import KernelLifecycle, State

S = State
# how long a restore's event waits for its clients' queued messages to be delivered (a
# client that closed meanwhile never reports it)
DELIVERY_WAIT = 5.0
# the first and the longest wait between two tries of a restore whose store did not answer
RESTORE_RETRY_FIRST = 1.0
RESTORE_RETRY_MAX = 15.0

# The id of the kernel that a restore is starting in the current task. jupyter_server and
# jupyter_client refuse to start a kernel with an id that is already ``in`` the manager;
# only the restoring task must see the suspended id as free, while every other task (a
# session listing polled during the restore) must still see the kernel.
restoring: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "jupyter_ckpt_restoring", default=None
)


def left_out(report: dict[str, Any]) -> dict[str, Any]:
    """The restore event's fields for the variables its image left out on purpose, and
    the cell that makes each again: the client tells the user (none when there are none)."""
    excluded = report.get("excluded") or []
    if not excluded:
        return {}
    cells = report.get("cells") or {}
    return {"excluded": excluded, "cells": {n: cells[n] for n in excluded if n in cells}}


def _store_unreachable(exc: SuspendFailed) -> bool:
    """Whether a kernel call failed because the store could not be reached: worth
    another try."""
    return isinstance(exc, StoreFailed) and exc.kind == StoreUnavailable.__name__


class Restore:
    """A suspended kernel's restore, one at a time (its callers share it), under its
    lock; and what a resume shares with it (the image's GPU memory, the running record)."""

    def __init__(self, owner: Kernels, keeper: RecordKeeper, sessions: Sessions) -> None:
        self.owner = owner
        self.keeper = keeper
        self.sessions = sessions
        self._tasks: set[asyncio.Future[Any]] = set()  # see _background

    async def ensure_compatible(self, image_id: str) -> dict[str, Any] | None:
        """Refuse, with the reasons, an image this node cannot restore: before any kernel
        starts for it. Returns its manifest (None: unreadable or gone)."""
        owner = self.owner
        try:
            manifest = await asyncio.to_thread(owner.store.load_manifest, image_id)
        except CkptError:
            return None  # unreadable or gone: the restore itself reports that
        problems = (await asyncio.to_thread(compat.assess, manifest, owner.node()))[0]
        if problems:
            raise IncompatibleImage(
                f"image '{manifest['name']}' ({image_id[:12]}) cannot be restored on this "
                f"node: {'; '.join(problems)}"
            )
        return manifest

    def start(
        self, kernel_id: str, trigger: str, hand_over: bool
    ) -> asyncio.Future[dict[str, Any]]:
        """Start the suspended kernel under its id and restore its image into it. Callers
        that arrive while a restore runs share it: concurrent reconnects restore once.
        The restore is under way from this call on, before anything awaits it, so that
        a client connecting meanwhile sees it (:meth:`under_way`) and joins it.

        With ``hand_over`` (a client waits to run its cell) the future is done as soon as
        the kernel holds its state; the running record is written after that, still under
        the kernel's lock (the suspended record names the same image meanwhile, so a
        new server would bring back the same state). Its clients then call
        :meth:`delivered` once their queued messages are on their way to the kernel."""
        loop = asyncio.get_running_loop()
        lc = self.owner.kernels.get(kernel_id)
        if lc is None:
            failed = loop.create_future()
            failed.set_exception(SuspendFailed(f"kernel {kernel_id} is not suspended"))
            return failed
        if lc.restore_task is None:
            ready = lc.restore_ready = loop.create_future()
            task = lc.restore_task = asyncio.ensure_future(self._restore(lc, trigger, ready))
            task.add_done_callback(lambda _: setattr(lc, "restore_task", None))
        assert lc.restore_ready is not None
        return asyncio.shield(lc.restore_ready if hand_over else lc.restore_task)

    async def _restore(
        self, lc: KernelLifecycle, trigger: str, ready: asyncio.Future[dict[str, Any]]
    ) -> dict[str, Any]:
        try:
            async with lc.lock:
                report = await self._locked(lc, trigger, ready)
        except BaseException as exc:
            lc.timeline = None
            if not ready.done():
                ready.set_exception(exc)
                ready.exception()  # retrieved by whoever awaits it, or by no one
            raise
        if not ready.done():
            ready.set_result(report)
        return report

    async def _locked(
        self, lc: KernelLifecycle, trigger: str, ready: asyncio.Future[dict[str, Any]]
    ) -> dict[str, Any]:
        owner = self.owner
        kernel_id, km = lc.kernel_id, owner.km
        timeline = Timeline()
        started = timeline.started
        if lc.state is not S.SUSPENDED:
            if lc.has_process:  # restored already, for another client
                return {"kernel_id": kernel_id, "image_id": None, "error": None}
            raise SuspendFailed(f"kernel {kernel_id} is not suspended")
        record = lc.record
        assert record is not None
        try:
            await owner.step("compatibility", kernel_id)
            manifest = await self.ensure_compatible(record["image_id"])
        except IncompatibleImage as exc:  # it stays suspended, its image kept
            owner.events.failure("restore", kernel_id, trigger, exc, started)
            raise SuspendFailed(str(exc)) from exc
        timeline.mark("compatibility checked")
        try:  # the GPU memory the kernel held, when others hold it now
            if await self.gpu_memory(lc, (record.get("gpu") or {}).get("by_device") or {}):
                timeline.mark("GPU memory free")
        except CkptError as exc:  # it stays suspended, its image kept
            owner.events.failure("restore", kernel_id, trigger, exc, started)
            raise SuspendFailed(str(exc)) from exc
        if manifest is not None:  # the files the restore reads, while the kernel starts
            self._background(asyncio.to_thread(readahead, owner.store, manifest))
        lc.abort = None
        lc.timeline = timeline
        lc.delivered = asyncio.Event()
        lc.move("restore")
        env = {**os.environ, **record.get("env", {}), **self.sessions.notebook_env(record)}
        await owner.standby.started(record["kernel_name"])
        token = restoring.set(kernel_id)
        try:
            await km.start_kernel(
                kernel_id=kernel_id,
                kernel_name=record["kernel_name"],
                path=record.get("path"),
                env=env,
            )
        except Exception as exc:
            lc.state = S.SUSPENDED
            owner.events.failure("restore", kernel_id, trigger, exc, started)
            raise SuspendFailed(f"could not start kernel {kernel_id}: {exc}") from exc
        finally:
            restoring.reset(token)
        timeline.mark("kernel started")
        owner.restore_count += 1
        report: dict[str, Any] = {"kernel_id": kernel_id, "image_id": record["image_id"]}
        if lc.recovered is not None:
            report["recovery"] = recovery_message({**record, "recovered": lc.recovered})
        try:
            owner.check(lc)
            await owner.rpc.ready(kernel_id)
            await owner.step("restore", kernel_id)
            owner.check(lc)
            async with owner.progress.watch(kernel_id, "restore") as progress:
                # who the kernel is: a process that stood by was started as no one
                notebook = env.get("JPY_SESSION_NAME")
                notebook_id = env.get(NOTEBOOK_ID_ENV)
                call = (
                    f"restore({record['image_id']!r}, progress={progress!r}, "
                    f"kernel_id={kernel_id!r}, notebook={notebook!r}, "
                    f"notebook_id={notebook_id!r})"
                )
                timeline.mark("restore request sent")
                report.update(await self._read_image(lc, call, timeline))
            timeline.kernel_steps(report.pop("steps", {}))
            report["error"] = None
        except Aborted as exc:
            # the shutdown or restart that aborted the restore drops the record
            lc.state = S.RESTORE_FAILED
            lc.restore_error = str(exc)
            owner.events.failure("restore", kernel_id, trigger, exc, started)
            return {**report, "error": str(exc), "restored": [], "missing": {}}
        except (SuspendFailed, CkptError, RuntimeError, TimeoutError) as exc:
            report.update(error=str(exc), restored=[], missing=self._saved_names(record))
        finally:
            lc.abort = None
        await owner.rpc.settled(kernel_id)
        timeline.mark("kernel idle")
        lc.recovered = None
        if report["error"]:
            # The kernel runs without its state; the record stays, and with it the image's
            # pin, so that retention and DELETE keep the image for a retry or a resume;
            # so do the records it writes until it holds a newer state of that image.
            lc.move("restore-failed")
            lc.restore_error = report["error"]
            lc.unrestored = record["image_id"]
            owner.events.failure(
                "restore", kernel_id, trigger, SuspendFailed(report["error"]), started
            )
            return report
        lc.move("restored")
        lc.unrestored = None
        ready.set_result(report)  # its clients run their cells while the record is written
        await self.restored(lc, record["image_id"])
        timeline.mark("record written")
        self._background(self._report(lc, trigger, report, timeline, lc.delivered))
        return report

    async def _read_image(
        self, lc: KernelLifecycle, call: str, timeline: Timeline
    ) -> dict[str, Any]:
        """The kernel's restore of its image. A store that cannot be reached meanwhile is
        waited for, and the restore tried again, while the cell that woke the kernel
        waits (within ``checkpoint_timeout``, each wait shown as the restore's
        progress): an outage of seconds must not hand out an empty kernel."""
        owner = self.owner
        deadline = time.monotonic() + owner.policy.checkpoint_timeout
        delays = backoff(RESTORE_RETRY_FIRST, RESTORE_RETRY_MAX)
        delay = next(delays)
        while True:
            try:
                return await owner.rpc.call(lc.kernel_id, call, owner.timeout(deadline))
            except SuspendFailed as exc:
                if not _store_unreachable(exc) or time.monotonic() + delay > deadline:
                    raise
                why = f"the store did not answer ({exc}); trying again in {delay:.0f} s"
            owner.check(lc)
            timeline.mark("store unreachable: waited")
            owner.log.warning("Restoring kernel %s: %s", lc.kernel_id, why)
            if owner.progress.emit is not None:
                owner.progress.emit(
                    {
                        "action": "progress",
                        "status": "running",
                        "phase": "restore",
                        "kernel_id": lc.kernel_id,
                        "msg": why,
                    }
                )
            await asyncio.sleep(delay)
            owner.check(lc)
            delay = next(delays)

    async def gpu_memory(self, lc: KernelLifecycle, by_device: dict[str, int]) -> bool:
        """Wait for the GPU memory an image held (device -> bytes) to be free for the
        kernel; whether it asked for any. A shutdown or restart meanwhile ends the wait
        (:meth:`.Lifecycles.settle`): GpuUnavailable, and the image is not restored."""
        gate = self.owner.gpu_gate
        if gate is None or not any(by_device.values()):
            return False
        lc.gpu_wait = asyncio.ensure_future(gate(lc.kernel_id, by_device))
        try:
            return await lc.gpu_wait
        except asyncio.CancelledError:
            if not lc.gpu_wait.cancelled():
                raise  # the caller was cancelled, not the wait
            raise GpuUnavailable(
                f"kernel {lc.kernel_id} was shut down or restarted while it waited for GPU memory"
            ) from None
        finally:
            lc.gpu_wait = None

    def _background(self, work: Awaitable[Any]) -> None:
        """Run ``work`` on its own; its failure is logged, not raised."""

        def done(task: asyncio.Future[Any]) -> None:
            self._tasks.discard(task)
            if not task.cancelled() and task.exception() is not None:
                self.owner.log.warning("jupyter-ckpt: %s", task.exception())

        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(done)

    def under_way(self, kernel_id: str) -> bool:
        """Whether a restore of the kernel was asked for and has not ended."""
        lc = self.owner.kernels.get(kernel_id)
        return lc is not None and (lc.restore_task is not None or lc.state is S.RESTORING)

    def delivered(self, kernel_id: str) -> None:
        """A client's messages that waited for the restore went to the restored kernel."""
        lc = self.owner.kernels.get(kernel_id)
        if lc is not None and lc.timeline is not None and not lc.delivered.is_set():
            lc.timeline.mark("queued messages delivered")
            lc.delivered.set()

    async def _report(
        self,
        lc: KernelLifecycle,
        trigger: str,
        report: dict[str, Any],
        timeline: Timeline,
        delivered: asyncio.Event,
    ) -> None:
        """Emit the restore's event with its timeline, once the clients that waited for
        it have their messages delivered (or after DELIVERY_WAIT: a client went away)."""
        if trigger in ("message", "connect"):
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(delivered.wait(), DELIVERY_WAIT)
        if lc.timeline is timeline:
            lc.timeline = None
        self.owner.events.event(
            "restore",
            lc.kernel_id,
            trigger,
            timeline.started,
            report,
            timeline=timeline.to_json(),
            mapped_bytes=report.get("mapped_bytes", 0),
            **left_out(report),
        )
        self.owner.log.info("Restored kernel %s:\n%s", lc.kernel_id, timeline.describe())

    async def restored(self, lc: KernelLifecycle, image_id: str) -> None:
        """The kernel now holds the state of ``image_id``: a running record names it at
        once (one put replaces the suspended record), so a crash before its first
        autosave is recoverable from it."""
        owner = self.owner
        try:
            manifest = await asyncio.to_thread(owner.store.open, image_id)
            summary = {**summarize_save(manifest, 0.0), "written": 0}
            record = await self.keeper.running(lc, summary, "restore", manifest["created"])
            await owner.step("running-record", lc.kernel_id)
            await self.keeper.put(lc, record)
            lc.refreshed_at = time.monotonic()
        except (CkptError, OSError) as exc:
            owner.log.warning("Could not write the record of kernel %s: %s", lc.kernel_id, exc)
        owner.saver.restored(lc.kernel_id)

    def _saved_names(self, record: dict[str, Any]) -> dict[str, str]:
        """Every variable of the record's image, for a restore that failed as a whole."""
        try:
            manifest = self.owner.store.open(record["image_id"])
        except CkptError as exc:
            return {"(all variables)": f"image {record['image_id']} unreadable: {exc}"}
        return {
            v["name"]: "image could not be restored"
            for v in manifest["variables"]
            if v["status"] in ("saved", "imported")
        }
