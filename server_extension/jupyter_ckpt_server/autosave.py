"""Background checkpoints: when to autosave a kernel, and how the image is written.

Every ``autosave_interval`` at most, a kernel that ran a cell since its last image and has
been idle for ``autosave_idle`` is asked to save in the background
(:mod:`jupyter_ckpt.kernel.background`: a forked child writes the image while the kernel
goes on). The call returns at once; the server then watches the child's result file,
never the kernel's shell, so a cell the user runs meanwhile is not queued behind it.

Two parts, called in one direction: :class:`Autosaver` decides when (it asks the kernel's
lifecycle to autosave), and :class:`BackgroundSaver` writes the image for the lifecycle,
which verifies it and names it in the kernel's running record
(:mod:`.lifecycle`). A crash is then recoverable from that record (:mod:`.recovery`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import shutil
import signal
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from traitlets import Any as AnyTrait
from traitlets.config import LoggingConfigurable

from jupyter_ckpt.kernel.background import read_result

from .events import Events
from .idleclock import IdleClock
from .kernelprocess import alive
from .rpc import KernelRPC, SuspendFailed

# how often the child's result file is looked for
RESULT_POLL_SECONDS = 0.1


@dataclass
class Job:
    """One kernel's background saves: the last one's end, and the child of the one now."""

    # when the last autosave ended: none yet, so the first comes once a cell ran
    saved_at: float = float("-inf")
    child: int | None = None  # the forked child's pid, while it runs
    # where the last child reported: the kernel removes it when it collects the result,
    # at its next autosave; the server, when the kernel goes first
    directory: str | None = None


class BackgroundSaver:
    """Writes a running kernel's image from a forked child (or, where the kernel cannot
    fork, in the kernel), for the lifecycle that records it."""

    def __init__(self, idle_clock: IdleClock, rpc: KernelRPC, events: Events, log: Any) -> None:
        self.idle_clock = idle_clock  # the server's own calls are no activity
        self.rpc = rpc
        self.events = events
        self.log = log
        self.jobs: dict[str, Job] = {}

    def job(self, kernel_id: str) -> Job:
        return self.jobs.setdefault(kernel_id, Job())

    async def save(
        self, kernel_id: str, timeout: float, kernel_info: bool
    ) -> dict[str, Any] | None:
        """The summary of a new image (unverified), or None when the kernel skipped it (and
        said why). With ``kernel_info``, the kernel's info is asked for too (for records)."""
        started = time.perf_counter()
        job = self.job(kernel_id)
        try:
            async with self.idle_clock.kept(kernel_id, 5):
                info = None
                if kernel_info:
                    info = await self.rpc.request(kernel_id, "kernel_info", timeout)
                begun = await self.rpc.call(kernel_id, f"autosave({timeout!r})", timeout)
            if begun["state"] == "skipped":
                self.log.info("Autosave of kernel %s skipped: %s", kernel_id, begun["reason"])
                self.events.event(
                    "checkpoint", kernel_id, "autosave", started, status="skipped",
                    msg=begun["reason"],
                )  # fmt: skip
                return None
            summary = begun
            if begun["state"] == "started":
                job.child, job.directory = begun["pid"], os.path.dirname(begun["result"])
                summary = {**begun, **await self._child_result(kernel_id, begun, timeout)}
            if summary.get("error"):
                raise SuspendFailed(summary["error"])
            if info is not None:
                summary["kernel_info"] = info
            return summary
        finally:
            job.child = None
            job.saved_at = time.monotonic()

    def cancel(self, kernel_id: str) -> None:
        """Kill the child of the autosave in progress and remove its directory: the kernel
        is going away (or restarting) and will not collect it."""
        job = self.jobs.get(kernel_id)
        if job is None:
            return
        if job.child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(job.child, signal.SIGKILL)
        if job.directory is not None:
            shutil.rmtree(job.directory, ignore_errors=True)
        job.child = job.directory = None

    def forget(self, kernel_id: str) -> None:
        self.cancel(kernel_id)
        self.jobs.pop(kernel_id, None)

    def restored(self, kernel_id: str) -> None:
        """The image a kernel came from counts as its last save: the next autosave comes
        an interval later, not as soon as the first cell after the restore ran."""
        self.job(kernel_id).saved_at = time.monotonic()

    def report(self, kernel_id: str, summary: dict[str, Any], started: float) -> None:
        extra = {}
        if summary.get("threads_at_fork"):
            # what the fork could not carry: these threads' work goes on in the kernel only
            extra["msg"] = "saved as of the fork while user threads ran: " + "; ".join(
                summary["threads_at_fork"]
            )
        if summary["mode"] == "blocking":
            extra["msg"] = f"saved in the kernel: {summary['reason']}"
        elif summary.get("copy_bytes"):
            # GPU state copied to host memory while the kernel was held: the stall
            extra.update(copy_bytes=summary["copy_bytes"], copy_seconds=summary["copy_seconds"])
        self.events.event(
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
            if not alive(pid):
                if os.path.exists(path):
                    break
                outcome = await self.rpc.call(kernel_id, "autosave_result()", timeout)
                return outcome if outcome.get("state") == "done" else {"error": str(outcome)}
            if time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                return {"error": f"the autosave process did not finish within {timeout:.0f} s"}
            await asyncio.sleep(RESULT_POLL_SECONDS)
        return read_result(path, begun["log"], None)


class Autosaver(LoggingConfigurable):
    """Decides when each running kernel is autosaved, and asks its lifecycle to."""

    manager = AnyTrait()

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._task: asyncio.Task[None] | None = None

    @property
    def policy(self) -> Any:
        return self.manager.policy

    @property
    def saver(self) -> BackgroundSaver:
        return self.manager.saver

    def tick_seconds(self) -> float:
        """How often kernels are looked at: often enough for the shortest interval."""
        policy = self.policy
        return max(0.1, min(policy.check_interval, policy.autosave_interval / 4 or 5, 5))

    def due(self, kernel_id: str) -> bool:
        """Whether ``kernel_id`` should be autosaved now (see the module's docstring)."""
        lc = self.manager.lifecycles.get(kernel_id)
        if lc is None or not lc.saves_itself or lc.lock.locked() or not lc.executed:
            return False
        kernel = self.manager.kernel_manager.get_kernel(kernel_id)
        interval = self.interval(kernel)
        if interval == 0 or time.monotonic() - self.saver.job(kernel_id).saved_at < interval:
            return False
        if kernel.execution_state != "idle":
            return False
        idle = (datetime.now(timezone.utc) - kernel.last_activity).total_seconds()
        return idle >= self.policy.for_spec("autosave_idle", kernel.kernel_spec.metadata)

    def interval(self, kernel: Any) -> float:
        """The kernel's autosave interval; 0 (off) for kernels of excluded specs, which
        are never saved, neither by a suspend nor in the background."""
        if kernel.kernel_name in self.policy.exclude_kernel_names:
            return 0
        return self.policy.for_spec("autosave_interval", kernel.kernel_spec.metadata)

    def tick(self) -> list[str]:
        """Start the autosaves that are due, up to ``autosave_concurrency``; their ids."""
        lifecycles = self.manager.lifecycles
        running = sum(lc.autosave is not None for lc in lifecycles.kernels.values())
        started = []
        for kernel_id in list(lifecycles.kernels):
            if running >= self.policy.autosave_concurrency:
                break
            if self.due(kernel_id) and lifecycles.start_autosave(kernel_id) is not None:
                started.append(kernel_id)
                running += 1
        return started

    def start(self, kernel_id: str) -> asyncio.Task[None] | None:
        """Autosave ``kernel_id`` now, due or not (the tests' entry point)."""
        return self.manager.lifecycles.start_autosave(kernel_id)

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
