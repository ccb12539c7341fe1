"""Background checkpoints: when to autosave a kernel, and what its record keeps.

Every ``autosave_interval`` at most, a kernel that ran a cell since its last autosave and
has been idle for ``autosave_idle`` is asked to save in the background
(:mod:`jupyter_ckpt.kernel.background`: a forked child writes the image while the kernel
goes on). The call returns at once; the server then watches the child's result file,
never the kernel's shell, so a cell the user runs meanwhile is not queued behind it. The
image is verified, as a suspend's is, before the kernel's record names it.

The record (``state: "running"``) is what makes a crash recoverable (:mod:`.recovery`).
A restored kernel gets one at once, naming the image it was restored from (the manager
drops the suspended record), so a crash before its first autosave is recoverable too.
It also lists the cells run after the autosave: the server reads their numbers from the
kernel's ``execute_input`` messages on iopub, and rewrites the record at most every
:data:`RECORD_REFRESH_SECONDS` (one small signed file; a crash loses at most that much of
the list, never state), so a busy notebook costs a few writes a minute, not one per cell.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import signal
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import psutil
from jupyter_client.session import Session
from traitlets import Instance
from traitlets.config import LoggingConfigurable

from jupyter_ckpt.errors import CkptError
from jupyter_ckpt.kernel import summarize_save
from jupyter_ckpt.kernel.background import read_result

from .manager import CkptManager, SuspendFailed
from .recovery import server_identity
from .work import idle_clock_kept

RECORD_REFRESH_SECONDS = 5.0
# how long a started kernel's watch may take to receive its first message, and how often
# kernel info is asked for meanwhile
JOIN_TIMEOUT = 30.0
JOIN_NUDGE_SECONDS = 0.5
# how often the child's result file is looked for
RESULT_POLL_SECONDS = 0.1


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


@dataclass
class Tracked:
    """What the server knows of one running kernel between autosaves."""

    stream: Any  # the autosaver's own iopub subscription
    # set by the stream's first message: from then on no execute_input is missed
    joined: asyncio.Event = field(default_factory=asyncio.Event)
    # numbers of the cells (In[n]) run since the last autosave's image
    executed: list[int] = field(default_factory=list)
    # when the last autosave ended: none yet, so the first comes once a cell ran
    saved_at: float = float("-inf")
    image_id: str | None = None  # the last autosave's image
    record: dict[str, Any] | None = None  # the running record written for it
    kernel_info: dict[str, Any] | None = None
    task: asyncio.Task[None] | None = None  # the autosave in progress
    child: int | None = None  # its forked child's pid, while it runs
    refresh: asyncio.Task[None] | None = None  # a pending record refresh
    refreshed_at: float = 0.0
    paused: bool = False  # a suspend is (or was) under way: the record is its business


class Autosaver(LoggingConfigurable):
    """Schedules autosaves of the running kernels and keeps their running records."""

    manager = Instance(CkptManager)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tracked: dict[str, Tracked] = {}
        self._task: asyncio.Task[None] | None = None
        self.identity = server_identity()
        km = self.manager.kernel_manager
        km.on_watch = self.watch
        km.after_start = self.joined
        self.manager.before_suspend = self.before_suspend
        inner = km.before_action

        async def before_action(kernel_id: str, action: str) -> None:
            if inner is not None:
                await inner(kernel_id, action)
            await self.settle(kernel_id, action)

        km.before_action = before_action
        self.manager.after_restore = self.restored

    @property
    def policy(self) -> Any:
        return self.manager.policy

    # -- watching the cells a kernel runs ---------------------------------------------------

    def watch(self, kernel_id: str, start: bool) -> None:
        """Follow a started kernel's ``execute_input`` messages (stop following on False)."""
        old = self.tracked.pop(kernel_id, None)
        if old is not None:
            self._forget(old)
        if not start:
            return
        kernel = self.manager.kernel_manager.get_kernel(kernel_id)
        stream = kernel.connect_iopub()
        self.tracked[kernel_id] = Tracked(stream=stream)
        session = Session(config=kernel.session.config, key=kernel.session.key)

        def on_iopub(msg_list: list[bytes]) -> None:
            _, parts = session.feed_identities(msg_list)
            msg = session.deserialize(parts, content=False)
            # a restart keeps the stream but starts the kernel's tracking afresh
            tracked = self.tracked.get(kernel_id)
            if tracked is not None:
                tracked.joined.set()
            if tracked is not None and msg["header"]["msg_type"] == "execute_input":
                tracked.executed.append(json.loads(msg["content"])["execution_count"])
                self._schedule_refresh(kernel_id, tracked)

        stream.on_recv(on_iopub)

    async def joined(self, kernel_id: str) -> None:
        """Wait until the watch of a kernel just started receives its messages.

        A ZMQ subscriber misses what the kernel publishes before its subscription reaches
        the kernel (the "slow joiner"): a first cell run meanwhile would go unseen and the
        kernel never autosaved. As jupyter_server's websocket does before it forwards
        output, ask for kernel info until a message arrives (ipykernel 7 also greets each
        new subscriber); the reply is kept for the kernel's record."""
        tracked = self.tracked.get(kernel_id)
        deadline = time.monotonic() + JOIN_TIMEOUT
        while tracked is not None and not tracked.joined.is_set():
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise SuspendFailed(f"no message within {JOIN_TIMEOUT:.0f} s")
                tracked.kernel_info = await self.manager._request(kernel_id, "kernel_info", left)
                await asyncio.wait_for(tracked.joined.wait(), min(JOIN_NUDGE_SECONDS, left))
            except asyncio.TimeoutError:
                continue
            except SuspendFailed as exc:
                self.log.warning("Autosave may miss the cells of kernel %s: %s", kernel_id, exc)
                return

    def _forget(self, tracked: Tracked) -> None:
        self._stop_work(tracked)
        if not tracked.stream.closed():
            tracked.stream.close()

    def _stop_work(self, tracked: Tracked) -> None:
        """Cancel the autosave in progress (killing its child) and any record refresh."""
        for task in (tracked.task, tracked.refresh):
            if task is not None:
                task.cancel()
        if tracked.child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(tracked.child, signal.SIGKILL)
            tracked.child = None

    # -- scheduling ---------------------------------------------------------------------------

    def tick_seconds(self) -> float:
        """How often kernels are looked at: often enough for the shortest interval."""
        policy = self.policy
        return max(0.1, min(policy.check_interval, policy.autosave_interval / 4 or 5, 5))

    def due(self, kernel_id: str) -> bool:
        """Whether ``kernel_id`` should be autosaved now (see the module's docstring)."""
        manager, km = self.manager, self.manager.kernel_manager
        tracked = self.tracked.get(kernel_id)
        if tracked is None or tracked.task is not None or not tracked.executed:
            return False
        if not self._may_write(kernel_id):
            return False
        if kernel_id in km.ckpt_states or kernel_id in manager._restores:
            return False
        kernel = km.get_kernel(kernel_id)
        interval = self.interval(kernel)
        if interval == 0 or time.monotonic() - tracked.saved_at < interval:
            return False
        metadata = kernel.kernel_spec.metadata
        if kernel.execution_state != "idle":
            return False
        idle = (datetime.now(timezone.utc) - kernel.last_activity).total_seconds()
        return idle >= self.policy.for_spec("autosave_idle", metadata)

    def interval(self, kernel: Any) -> float:
        """The kernel's autosave interval; 0 (off) for kernels of excluded specs, which
        are never saved, neither by a suspend nor in the background."""
        if kernel.kernel_name in self.policy.exclude_kernel_names:
            return 0
        return self.policy.for_spec("autosave_interval", kernel.kernel_spec.metadata)

    def tick(self) -> list[str]:
        """Start the autosaves that are due, up to ``autosave_concurrency``; their ids."""
        for kernel_id, tracked in list(self.tracked.items()):
            suspending = kernel_id in self.manager.kernel_manager.ckpt_states
            if tracked.paused and not suspending and self._may_write(kernel_id):
                tracked.paused = False  # the suspend failed: the kernel runs on
                self._schedule_refresh(kernel_id, tracked, now=True)
        running = sum(t.task is not None for t in self.tracked.values())
        started = []
        for kernel_id in list(self.tracked):
            if running >= self.policy.autosave_concurrency:
                break
            if self.due(kernel_id):
                self.start(kernel_id)
                started.append(kernel_id)
                running += 1
        return started

    def start(self, kernel_id: str) -> asyncio.Task[None]:
        """Autosave ``kernel_id`` now (the scheduler's and the tests' entry point)."""
        tracked = self.tracked[kernel_id]
        if tracked.task is None:
            tracked.task = asyncio.ensure_future(self._autosave(kernel_id, tracked))
        return tracked.task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.tick_seconds())
            try:
                self.tick()
            except Exception:  # never let one bad tick stop autosaves
                self.log.exception("jupyter_ckpt autosave tick failed")

    def begin(self) -> None:
        """Start the loop where autosave is on, globally or for some installed kernelspec
        (its metadata may turn it on while it is off globally); the kernelspecs are read
        once, so a spec installed later needs a server restart for that."""
        if self._task is None and (self.policy.autosave_interval > 0 or self._spec_wants_it()):
            self._task = asyncio.ensure_future(self._run())

    def _spec_wants_it(self) -> bool:
        specs_of = self.manager.kernel_manager.kernel_spec_manager.get_all_specs
        if inspect.iscoroutinefunction(specs_of):  # a gateway's: its kernels are remote
            return False
        specs = specs_of()
        return any(
            self.policy.for_spec("autosave_interval", spec["spec"].get("metadata")) > 0
            for name, spec in specs.items()
            if name not in self.policy.exclude_kernel_names
        )

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # -- one autosave ---------------------------------------------------------------------

    async def _autosave(self, kernel_id: str, tracked: Tracked) -> None:
        manager = self.manager
        started = time.perf_counter()
        timeout = self.policy.checkpoint_timeout
        image_id = None
        try:
            async with idle_clock_kept(manager, kernel_id, 5):
                if tracked.kernel_info is None:
                    tracked.kernel_info = await manager._request(kernel_id, "kernel_info", timeout)
                begun = await manager.kernel_call(kernel_id, f"autosave({timeout!r})", timeout)
            if begun["state"] == "skipped":
                self.log.info("Autosave of kernel %s skipped: %s", kernel_id, begun["reason"])
                manager.record_event(
                    "checkpoint", kernel_id, "autosave", started, status="skipped",
                    msg=begun["reason"],
                )  # fmt: skip
                return
            summary = begun
            if begun["state"] == "started":
                tracked.child = begun["pid"]
                summary = {**begun, **await self._child_result(kernel_id, begun, timeout)}
                tracked.child = None
            if summary.get("error"):
                raise SuspendFailed(summary["error"])
            image_id = summary["id"]
            try:
                await asyncio.to_thread(manager.store.verify, image_id)
            except CkptError as exc:
                raise SuspendFailed(f"the image failed verification: {exc}") from exc
            if not self._may_write(kernel_id) or self.tracked.get(kernel_id) is not tracked:
                raise SuspendFailed("the kernel was suspended or shut down during the autosave")
            await self._record(kernel_id, tracked, summary)
            image_id = None  # recorded: kept
        except (SuspendFailed, CkptError, OSError) as exc:
            manager.record_failure("checkpoint", kernel_id, "autosave", exc, started)
            return
        finally:
            tracked.task = None
            tracked.saved_at = time.monotonic()
            if image_id is not None:  # written but not recorded: not offered for restore
                await asyncio.to_thread(manager._forget_image, image_id)
        extra = {}
        if summary.get("threads_at_fork"):
            # what the fork could not carry: these threads' work goes on in the kernel only
            extra["msg"] = "saved as of the fork while user threads ran: " + "; ".join(
                summary["threads_at_fork"]
            )
        if summary["mode"] == "blocking":
            extra["msg"] = f"saved in the kernel: {summary['reason']}"
        manager.record_event(
            "checkpoint", kernel_id, "autosave", started, summary,
            written=summary["written"], mode=summary["mode"],
            stall_seconds=summary.get("stall", 0.0), **extra,
        )  # fmt: skip
        self.log.info(
            "Autosaved kernel %s to image %s (%s, %d bytes written)",
            kernel_id,
            summary["id"],
            summary["mode"],
            summary["written"],
        )

    async def _child_result(
        self, kernel_id: str, begun: dict[str, Any], timeout: float
    ) -> dict[str, Any]:
        """The forked child's summary, read from its result file without the kernel; a
        child that died without one is asked about through the kernel (which reaps it)."""
        deadline = time.monotonic() + timeout + 5  # the child's own alarm comes first
        pid, path = begun["pid"], begun["result"]
        while not os.path.exists(path):
            if not _alive(pid):
                if os.path.exists(path):
                    break
                outcome = await self.manager.kernel_call(kernel_id, "autosave_result()", timeout)
                return outcome if outcome.get("state") == "done" else {"error": str(outcome)}
            if time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                return {"error": f"the autosave process did not finish within {timeout:.0f} s"}
            await asyncio.sleep(RESULT_POLL_SECONDS)
        return read_result(path, begun["log"], None)

    async def _record(
        self,
        kernel_id: str,
        tracked: Tracked,
        summary: dict[str, Any],
        restored_at: str | None = None,
    ) -> None:
        """Name the image in the kernel's running record: the new autosave (then drop the
        previous one), or the image the kernel was restored from (written ``restored_at``;
        not the autosaver's to drop)."""
        km = self.manager.kernel_manager
        kernel = km.get_kernel(kernel_id)
        launch = km.launch.get(kernel_id, {})
        count = summary.get("execution_count") or 0
        tracked.executed = [n for n in tracked.executed if n >= count]
        previous = tracked.image_id
        if restored_at is None:
            tracked.image_id = summary["id"]
        tracked.record = {
            "kernel_id": kernel_id,
            "kernel_name": kernel.kernel_name,
            "path": launch.get("path"),
            "env": launch.get("env", {}),
            "image_id": summary["id"],
            "kernel_info": tracked.kernel_info,
            "last_activity": kernel.last_activity.isoformat(),
            "suspended_at": _now(),
            "autosave_at": restored_at or _now(),
            "execution_count": count,
            "trigger": "restore" if restored_at else "autosave",
            "gpu": self.manager.gpu_usage(kernel_id).to_json(),
            "lost": summary["lost"],
            "bytes": summary["bytes"],
            "written": summary["written"],  # what this autosave added to the store
            "state": "running",
            "server": self.identity,
            "sessions": await self.manager.sessions_of(kernel_id),
        }
        await self._write(kernel_id, tracked)
        if previous is not None and previous != tracked.image_id:
            await asyncio.to_thread(self.manager._forget_image, previous)

    async def restored(self, kernel_id: str, record: dict[str, Any]) -> None:
        """A kernel was restored from the image of ``record`` (its suspended record, which
        the manager removed): name that image in a running record, with the execution
        count at it, so that a crash before the next autosave is recoverable from it."""
        tracked = self.tracked.get(kernel_id)
        km = self.manager.kernel_manager
        if tracked is None or not self._may_write(kernel_id):
            return
        if self.interval(km.get_kernel(kernel_id)) == 0:
            return  # no autosave, no running record: a crash is not recoverable
        try:
            manifest = await asyncio.to_thread(self.manager.store.open, record["image_id"])
            if tracked.kernel_info is None:
                tracked.kernel_info = record.get("kernel_info")
            summary = {**summarize_save(manifest, 0.0), "written": 0}
            await self._record(kernel_id, tracked, summary, restored_at=manifest["created"])
            # the image it was restored from counts as its last save: the next autosave
            # comes an interval later, not as soon as the first cell after the restore ran
            tracked.saved_at = time.monotonic()
        except (CkptError, OSError) as exc:
            self.log.warning("Could not write the record of kernel %s: %s", kernel_id, exc)

    # -- the running record -------------------------------------------------------------------

    def _may_write(self, kernel_id: str) -> bool:
        """Whether the running record is ours to write: the kernel runs, and no suspended
        or failed-restore record is there. A suspend in progress waits for the autosave
        (:meth:`before_suspend`) and writes its record after it."""
        km = self.manager.kernel_manager
        return (
            km.is_running(kernel_id)
            and not km.is_suspended(kernel_id)
            and kernel_id not in km.failed_restores
        )

    async def _write(self, kernel_id: str, tracked: Tracked) -> None:
        assert tracked.record is not None
        record = {**tracked.record, "cells_after": list(tracked.executed), "alive_at": _now()}
        tracked.refreshed_at = time.monotonic()
        await asyncio.to_thread(self.manager.records.put, record)

    def _schedule_refresh(self, kernel_id: str, tracked: Tracked, now: bool = False) -> None:
        """Rewrite the running record with the cells run since, at most every
        RECORD_REFRESH_SECONDS (a record exists only once the kernel was autosaved)."""
        if tracked.record is None or tracked.refresh is not None or tracked.task is not None:
            return
        wait = 0.0 if now else tracked.refreshed_at + RECORD_REFRESH_SECONDS - time.monotonic()

        async def refresh() -> None:
            try:
                await asyncio.sleep(max(0.0, wait))
                if not tracked.paused and self._may_write(kernel_id):
                    await self._write(kernel_id, tracked)
            except (CkptError, OSError) as exc:
                self.log.warning("Could not update the record of kernel %s: %s", kernel_id, exc)
            finally:
                tracked.refresh = None

        tracked.refresh = asyncio.ensure_future(refresh())

    # -- suspend, shutdown, restart ---------------------------------------------------------

    async def before_suspend(self, kernel_id: str) -> None:
        """A suspend starts: let an autosave in progress finish (its image is then the
        suspend's parent, so the suspend writes little) and stop touching the record."""
        tracked = self.tracked.get(kernel_id)
        if tracked is None:
            return
        tracked.paused = True
        for task in (tracked.task, tracked.refresh):
            if task is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(task)

    async def settle(self, kernel_id: str, action: str) -> None:
        """A shutdown or restart by the user gives the state up: stop an autosave in
        progress and remove the running record (a clean shutdown leaves no crash behind)."""
        tracked = self.tracked.get(kernel_id)
        if action == "interrupt" or tracked is None:
            return
        self._stop_work(tracked)
        self.tracked[kernel_id] = Tracked(stream=tracked.stream)
        if tracked.record is not None and self._may_write(kernel_id):
            try:
                await asyncio.to_thread(self.manager.records.delete, kernel_id)
            except (CkptError, OSError) as exc:
                self.log.warning("Could not remove the record of kernel %s: %s", kernel_id, exc)


def _alive(pid: int) -> bool:
    """Whether a process runs (an exited child not yet reaped by its kernel does not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
