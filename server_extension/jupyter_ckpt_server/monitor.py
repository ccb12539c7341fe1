"""The idle monitor: every ``check_interval``, suspend the kernels the policy says are due.

One tick asks NVML once for every process's GPU memory and scans /proc once for the process
tree; per kernel it then only reads fields the server already keeps (``last_activity``,
``execution_state``, connections), so 100 kernels cost little more than one
(``benchmarks/bench_monitor.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

from jupyter_ckpt.gpu import GpuSnapshot, GpuUsage

from .manager import CkptManager, SuspendFailed

# Retention also runs after every write; this catches images that age out meanwhile.
RETENTION_EVERY_SECONDS = 3600


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

    def assess_all(self) -> list[Assessment]:
        manager = self.manager
        km = manager.kernel_manager
        snapshot = manager.probe.snapshot() if manager.probe.available else None
        now = datetime.now(timezone.utc)
        return [
            self._assess(kernel_id, km.get_kernel(kernel_id), snapshot, now)
            for kernel_id in km.running_ids()
        ]

    def _assess(
        self, kernel_id: str, kernel: Any, snapshot: GpuSnapshot | None, now: datetime
    ) -> Assessment:
        manager = self.manager
        policy = manager.policy
        km = manager.kernel_manager
        timeout = policy.idle_timeout_for(kernel.kernel_spec.metadata)
        usage = manager.gpu_usage(kernel_id, snapshot) if snapshot else GpuUsage()
        connections = km._kernel_connections.get(kernel_id, 0)
        last = getattr(kernel, "last_activity", None) or now
        a = Assessment(
            kernel_id=kernel_id,
            kernel_name=kernel.kernel_name,
            execution_state=getattr(kernel, "execution_state", "unknown"),
            connections=connections,
            idle_seconds=(now - last).total_seconds(),
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
        return a

    async def tick(self) -> list[str]:
        """Suspend every due kernel; the ids suspended. Failures are logged and evented
        by the manager, and the kernel keeps running."""
        suspended = []
        for assessment in self.assess_all():
            if not assessment.due:
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
