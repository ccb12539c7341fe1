"""The idle monitor: every ``check_interval``, suspend the kernels the policy says are due.

One tick asks NVML once for every process's GPU memory and utilization and reads the
process table once (psutil); per kernel it then reads fields the server already keeps
(``last_activity``, ``execution_state``, connections). Only kernels that are otherwise due
within a tick, or had background work at their last check, are asked for their threads
and tasks (a silent call of a few milliseconds), so 100 kernels cost little more than one
(``benchmarks/bench_monitor.py``).

Background work is activity: while the monitor sees it the kernel is not suspended, and
its idle clock runs from the last moment the monitor saw the work (or the last message,
whichever is later). A kernel whose training thread ends is thus suspended
``idle_timeout`` after the monitor last saw the thread, never mid-work.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

from jupyter_ckpt.gpu import GpuSnapshot

from . import work
from .manager import CkptManager, SuspendFailed

# Retention also runs after every write; this catches images that age out meanwhile.
RETENTION_EVERY_SECONDS = 3600
GPU_WINDOW_SECONDS = 3


@dataclass
class Assessment:
    """What the monitor thinks of one running kernel (also the status API's answer)."""

    kernel_id: str
    kernel_name: str
    execution_state: str
    connections: int
    idle_seconds: float
    idle_timeout: float
    gpu: dict[str, Any]
    blocked_by: list[str] = field(default_factory=list)
    # the background work among blocked_by: what a suspend now would stop
    background_work: list[str] = field(default_factory=list)

    @property
    def due(self) -> bool:
        return not self.blocked_by and self.idle_seconds >= self.idle_timeout

    @property
    def seconds_until_suspend(self) -> float | None:
        if self.blocked_by:
            return None
        return max(0.0, self.idle_timeout - self.idle_seconds)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "seconds_until_suspend": self.seconds_until_suspend}


class IdleMonitor:
    """Runs the policy over the running kernels; suspends the due ones."""

    def __init__(self, manager: CkptManager) -> None:
        self.manager = manager
        self._task: asyncio.Task[None] | None = None
        self._retention_at = time.monotonic()
        # kernel id -> the last moment the monitor saw background work in it: an activity
        self._work_seen: dict[str, datetime] = {}
        # kernel id -> the threads and tasks its last kernel-side check found (only kernels
        # that had some: they are checked again every tick until they have none)
        self._kernel_work: dict[str, list[str]] = {}

    def snapshot(self) -> GpuSnapshot:
        # GPU utilization over the last tick, so that work between two ticks is not
        # missed; at least a few seconds, as drivers sample each process about once a second
        window = max(self.manager.policy.check_interval, GPU_WINDOW_SECONDS)
        return self.manager.probe.snapshot(window)

    def assess_all(
        self, snapshot: GpuSnapshot | None = None, kernel_ids: list[str] | None = None
    ) -> list[Assessment]:
        """The running kernels (all, or those of ``kernel_ids``) from one snapshot;
        threads and tasks as last checked."""
        km = self.manager.kernel_manager
        snapshot = snapshot or self.snapshot()
        now = datetime.now(timezone.utc)
        running = km.running_ids()
        for gone in (self._work_seen.keys() | self._kernel_work.keys()) - set(running):
            self._work_seen.pop(gone, None)
            self._kernel_work.pop(gone, None)
        chosen = running if kernel_ids is None else [k for k in running if k in kernel_ids]
        return [self._assess(k, km.get_kernel(k), snapshot, now) for k in chosen]

    def _assess(
        self, kernel_id: str, kernel: Any, snapshot: GpuSnapshot, now: datetime
    ) -> Assessment:
        manager = self.manager
        policy = manager.policy
        km = manager.kernel_manager
        timeout = policy.idle_timeout_for(kernel.kernel_spec.metadata)
        pid = manager.kernel_pid(kernel_id)
        usage = manager.gpu_usage(kernel_id, snapshot)
        connections = km._kernel_connections.get(kernel_id, 0)
        a = Assessment(
            kernel_id=kernel_id,
            kernel_name=kernel.kernel_name,
            execution_state=getattr(kernel, "execution_state", "unknown"),
            connections=connections,
            idle_seconds=0.0,
            idle_timeout=timeout,
            gpu=usage.to_json(),
        )
        blocked = a.blocked_by
        if timeout == 0:
            blocked.append("idle suspension is off (idle_timeout=0)")
        if kernel.kernel_name in policy.exclude_kernel_names:
            blocked.append(f"kernel name {kernel.kernel_name!r} is in exclude_kernel_names")
        if a.execution_state in ("busy", "starting"):
            blocked.append(f"the kernel is {a.execution_state}")
        if connections and not policy.suspend_connected:
            blocked.append(f"{connections} client(s) connected (suspend_connected=False)")
        if policy.gpu_only:
            if not usage.holds_gpu:
                blocked.append("holds no GPU memory (gpu_only=True)")
            elif usage.source == "nvml" and usage.total < policy.min_gpu_memory_mb * 2**20:
                blocked.append(f"holds less than min_gpu_memory_mb={policy.min_gpu_memory_mb}")
        if kernel_id in km.suspended or km.ckpt_states.get(kernel_id) == "suspending":
            blocked.append("a suspend or restore is in progress")
        kinds = policy.background_work
        if "children" in kinds and pid:
            tree = manager.probe.process_tree(pid, snapshot.children)
            connection_file = getattr(kernel, "connection_file", "")
            a.background_work += work.child_processes(pid, tree, connection_file)
        if "gpu" in kinds:
            a.background_work += work.gpu_busy(usage, policy.gpu_busy_percent)
        seen = bool(a.background_work)
        # threads and tasks as the kernel's last check found them (then counted as seen)
        a.background_work += self._kernel_work.get(kernel_id, [])
        self._note_work(a, now, getattr(kernel, "last_activity", None) or now, seen)
        return a

    def _note_work(self, a: Assessment, now: datetime, last_activity: datetime, seen: bool) -> None:
        """Block ``a`` on its work; if work was ``seen`` now, that is activity now. Its
        idle clock runs from the later of the last message and the last work seen."""
        a.blocked_by += [w for w in a.background_work if w not in a.blocked_by]
        if seen:
            self._work_seen[a.kernel_id] = now
        last = max(last_activity, self._work_seen.get(a.kernel_id, last_activity))
        a.idle_seconds = (now - last).total_seconds()

    def _wants_kernel_check(self, a: Assessment) -> bool:
        """Ask the kernel only when its answer decides: nothing else blocks it and it is
        due within a tick, or it had threads or tasks at its last check."""
        if a.blocked_by != self._kernel_work.get(a.kernel_id, []):
            return False
        soon = a.idle_seconds + self.manager.policy.check_interval >= a.idle_timeout
        return soon or a.kernel_id in self._kernel_work

    async def _check_kernel(self, a: Assessment) -> None:
        """Replace ``a``'s threads and tasks with a fresh answer from the kernel."""
        previous = self._kernel_work.pop(a.kernel_id, [])
        a.blocked_by = [b for b in a.blocked_by if b not in previous]
        a.background_work = [b for b in a.background_work if b not in previous]
        found = await work.kernel_side(self.manager, a.kernel_id, self.manager.policy)
        if found:
            self._kernel_work[a.kernel_id] = found
            a.background_work += found
        km = self.manager.kernel_manager
        now = datetime.now(timezone.utc)
        kernel = km.get_kernel(a.kernel_id) if km.is_running(a.kernel_id) else None
        self._note_work(a, now, getattr(kernel, "last_activity", None) or now, bool(found))

    async def assess(self, kernel_ids: list[str] | None = None) -> list[Assessment]:
        """Assess the running kernels (or those of ``kernel_ids``, each asked for its
        threads and tasks now unless it is busy): what the status API shows."""
        snapshot = await asyncio.to_thread(self.snapshot)
        assessments = self.assess_all(snapshot, kernel_ids)
        if kernel_ids is None:
            return assessments
        km = self.manager.kernel_manager
        askable = [
            a
            for a in assessments
            if a.execution_state not in ("busy", "starting")
            and km.ckpt_states.get(a.kernel_id) != "suspending"
        ]
        await asyncio.gather(*(self._check_kernel(a) for a in askable))
        return assessments

    async def tick(self) -> list[str]:
        """Suspend every due kernel; the ids suspended. Failures are logged and evented
        by the manager, and the kernel keeps running."""
        assessments = self.assess_all(await asyncio.to_thread(self.snapshot))
        await asyncio.gather(
            *(self._check_kernel(a) for a in assessments if self._wants_kernel_check(a))
        )
        suspended = []
        for assessment in assessments:
            if not assessment.due:
                continue
            # Suspends before this one may have taken minutes: decide again, from scratch.
            if not self.manager.kernel_manager.is_running(assessment.kernel_id):
                continue
            (fresh,) = await self.assess([assessment.kernel_id])
            if not fresh.due:
                continue
            with contextlib.suppress(SuspendFailed):
                await self.manager.suspend(assessment.kernel_id, trigger="idle")
                suspended.append(assessment.kernel_id)
        if time.monotonic() - self._retention_at > RETENTION_EVERY_SECONDS:
            self._retention_at = time.monotonic()
            await self.manager.enforce_retention()
        return suspended

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.manager.policy.check_interval)
            try:
                await self.tick()
            except Exception:  # never let one bad tick stop the monitor
                self.manager.log.exception("jupyter_ckpt idle monitor tick failed")

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
