"""The idle monitor: every ``check_interval``, suspend the kernels the policy says are due.

One tick asks NVML once for every process's GPU memory and utilization and reads the
process table once (psutil); per kernel it then reads fields the server already keeps
(``last_activity``, ``execution_state``, connections), its child processes, and its
threads' CPU time, I/O and wake-ups since the last tick (:mod:`.work`): the check window.
The kernel is asked (a silent call of a few milliseconds) only about threads found busy or
awake that it has not judged for good yet, and about its tasks when its main thread woke,
and only so many kernels per tick; so 100 kernels at rest cost little more than one, and
100 kernels starting work at once not much more (``benchmarks/bench_monitor.py``).

Background work is activity: while the monitor sees it the kernel is not suspended, and
its idle clock runs from the last moment the monitor saw the work (or the last message,
whichever is later). A kernel whose training thread ends is thus suspended
``idle_timeout`` after the monitor last saw the thread, never mid-work.

A kernel whose last image left variables out, under ``on_unsaveable = "keep"``, is never
suspended: its status says so at once ("Won't suspend: gen cannot be saved") instead of
counting down to a suspend that would fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

from jupyter_ckpt.gpu import GpuSnapshot

from . import compat, work
from .manager import CkptManager, SuspendFailed

# Retention also runs after every write; this catches images that age out meanwhile.
RETENTION_EVERY_SECONDS = 3600
GPU_WINDOW_SECONDS = 3
# The window a one-kernel status measures threads over: long enough for a thread that
# computes to show, short enough for the status to answer at once.
MIN_WINDOW_SECONDS = 0.5
UNSAVEABLE_ACTIONS = ("checkpoint", "suspend")
# How many kernels one tick asks to name their busy threads at most (a few milliseconds of
# the server's CPU each): what bounds a tick's cost when every kernel starts work at once.
MAX_ASKS_PER_TICK = 25


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


def _unsaveable_text(names: list[str]) -> str:
    return f"Won't suspend: {', '.join(names)} cannot be saved"


class IdleMonitor:
    """Runs the policy over the running kernels; suspends the due ones."""

    def __init__(self, manager: CkptManager) -> None:
        self.manager = manager
        self._task: asyncio.Task[None] | None = None
        self._retention_at = time.monotonic()
        # kernel id -> the last moment the monitor saw background work in it: an activity
        self._work_seen: dict[str, datetime] = {}
        # kernel id -> the threads and tasks found working in its last window (only
        # kernels that had some)
        self._kernel_work: dict[str, list[str]] = {}
        # kernel id -> its threads at the last tick: where the next window starts
        self._samples: dict[str, work.Sample] = {}
        # kernel id -> its threads at the tick before: where the last window started
        self._window_starts: dict[str, work.Sample] = {}
        # kernel id -> the pid of the kernel itself (below any launcher)
        self._kernel_pids: dict[str, int] = {}
        # kernel id -> thread id -> the kernel's verdict on it, where it holds for the
        # thread's life (see work.verdicts): such a thread is asked about once, until a
        # client's message (a cell: `%ckpt idle-ok` may have changed the verdict)
        self._names: dict[str, dict[str, dict[str, Any]]] = {}
        # kernel id -> how many client messages it had when its verdicts were given
        self._names_at: dict[str, int] = {}
        # kernel id -> when a tick last asked it (time.monotonic())
        self._asked_at: dict[str, float] = {}
        # kernel id -> (when, the variables a suspend would leave out: as its last image
        # left them out, or as the kernel said when last asked after a cell)
        self._unsaveable: dict[str, tuple[datetime, list[str]]] = {}

    def snapshot(self) -> GpuSnapshot:
        # GPU utilization over the last tick, so that work between two ticks is not
        # missed; at least a few seconds, as drivers sample each process about once a second
        window = max(self.manager.policy.check_interval, GPU_WINDOW_SECONDS)
        return self.manager.probe.snapshot(window)

    async def on_event(self, logger: Any, schema_id: str, data: dict[str, Any]) -> None:
        """A jupyter_events listener: a written image names the variables it left out
        (none: the kernel can be suspended again)."""
        kernel_id = data.get("kernel_id")
        written = data.get("action") in UNSAVEABLE_ACTIONS and data.get("status") == "success"
        if written and kernel_id and "missing" in data:
            self._unsaveable[kernel_id] = (datetime.now(timezone.utc), data["missing"])

    def saw_unsaveable(self, kernel_id: str, names: list[str]) -> None:
        """The variables a suspend now would leave out, as the kernel just said (those
        the last image left out that it still holds, and those made since)."""
        self._unsaveable[kernel_id] = (datetime.now(timezone.utc), names)

    def unsaveable(self, kernel_id: str) -> list[str]:
        """The variables that keep the kernel from being suspended (on_unsaveable=keep):
        those the newer of its last written image and its last failed attempt left out."""
        when, names = self._unsaveable.get(kernel_id, (None, []))
        failure = self.manager.events.failures.get(kernel_id) or {}
        if failure.get("lost"):
            failed_at = datetime.fromisoformat(failure["at"])
            if when is None or failed_at >= when:
                names = list(failure["lost"])
        return sorted(names)

    def assess_all(
        self, snapshot: GpuSnapshot | None = None, kernel_ids: list[str] | None = None
    ) -> list[Assessment]:
        """The running kernels (all, or those of ``kernel_ids``) from one snapshot;
        threads and tasks as the last window found them."""
        km = self.manager.kernel_manager
        snapshot = snapshot or self.snapshot()
        now = datetime.now(timezone.utc)
        running = km.running_ids()
        for table in (
            self._work_seen,
            self._kernel_work,
            self._samples,
            self._window_starts,
            self._kernel_pids,
            self._names,
            self._names_at,
            self._unsaveable,
            self._asked_at,
        ):
            for gone in table.keys() - set(running):
                table.pop(gone, None)
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
        connections = compat.connections(km, kernel_id)
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
        unsaveable = self.unsaveable(kernel_id)
        if unsaveable and policy.on_unsaveable == "keep":
            blocked.append(_unsaveable_text(unsaveable))
        if timeout == 0:
            blocked.append("idle suspension is off (idle_timeout=0)")
        if kernel.kernel_name in policy.exclude_kernel_names:
            blocked.append(f"kernel name {kernel.kernel_name!r} is in exclude_kernel_names")
        # the server's own silent requests (this monitor's activity check, a restore's
        # last steps, another status request's check) are no work of the user's; a
        # suspend waits them out (KernelRPC.busy)
        if a.execution_state == "starting" or (
            a.execution_state == "busy" and not manager.rpc.serving_us(kernel_id)
        ):
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
        if pid:
            connection_file = str(
                getattr(kernel, "launched_connection_file", None)
                or getattr(kernel, "connection_file", "")
            )
            kernel_pid = work.kernel_process(pid, snapshot.children, connection_file)
            self._kernel_pids[kernel_id] = kernel_pid
            if "children" in kinds:
                a.background_work += work.child_processes(kernel_pid, snapshot.children)
        if "gpu" in kinds:
            a.background_work += work.gpu_busy(usage, policy.gpu_busy_percent)
        seen = bool(a.background_work)
        # threads and tasks as the last window found them (then counted as seen)
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

    def _loads(
        self, before: work.Sample, after: work.Sample, since: work.Sample | None = None
    ) -> list[work.Load]:
        """The threads busy or awake between two samples (see :func:`work.active_threads`)
        that the policy counts: the main thread's only for "tasks", the others' only for
        "threads"."""
        kinds = self.manager.policy.background_work
        return [
            load
            for load in work.active_threads(before, after, self.manager.policy, since)
            if ("tasks" if load.tid == after.pid else "threads") in kinds
        ]

    def _measure_all(self, assessments: list[Assessment]) -> dict[str, list[work.Load]]:
        """Each kernel's busy and awake threads since the last tick; this tick starts the
        next window. (Runs in a worker thread: it reads /proc.)"""
        loads: dict[str, list[work.Load]] = {}
        if not self._asks:  # neither threads nor tasks count: nothing to measure
            return loads
        for a in assessments:
            pid = self._kernel_pids.get(a.kernel_id)
            after = work.sample(pid) if pid else None
            before = self._samples.pop(a.kernel_id, None)
            if after is None:
                continue
            self._samples[a.kernel_id] = after
            if before is not None:
                self._window_starts[a.kernel_id] = before
            loads[a.kernel_id] = self._loads(before, after) if before else []
        return loads

    async def _measure_now(self, kernel_id: str) -> list[work.Load]:
        """The kernel's busy threads over the next ``MIN_WINDOW_SECONDS``: what it does
        now, for a status of this kernel alone or right before a suspend (a window from
        the last tick would dilute a thread started since); and those that woke since the
        last tick's window started (a loop that sleeps between its steps may not wake in
        half a second: its last step counts, as it did for the tick), or since the kernel
        started when no tick has measured a window of it yet. The tick's windows are left
        as they are."""
        pid = self._kernel_pids.get(kernel_id)
        before = work.sample(pid) if pid else None
        if before is None:
            return []
        await asyncio.sleep(MIN_WINDOW_SECONDS)
        after = work.sample(before.pid)
        since = self._window_starts.get(kernel_id)
        if since is None or since.pid != before.pid:  # no window yet: since the start
            since = work.at_start(before.pid)
        return self._loads(before, after, since) if after else []

    @property
    def _asks(self) -> bool:
        """Whether the kernel has anything to say: it names threads and tasks only."""
        return bool({"threads", "tasks"} & set(self.manager.policy.background_work))

    def _wants_kernel_check(self, a: Assessment, loads: list[work.Load]) -> bool:
        """Ask the kernel only when its answer says something: nothing but its threads
        and tasks blocks it, and a thread it has not judged for good (or its main thread,
        for its tasks) was busy or awake in the window. A kernel at rest is never asked:
        its own threads are judged once, its main thread sleeps, and a suspend asks it
        again anyway."""
        if not loads or not self._asks or a.blocked_by != self._kernel_work.get(a.kernel_id, []):
            return False
        known = self._known(a.kernel_id)
        main = self._kernel_pids.get(a.kernel_id)
        return any(x.tid == main or str(x.tid) not in known for x in loads)

    def _to_ask(self, assessments: list[Assessment], loads: dict[str, list[work.Load]]) -> set[str]:
        """The kernels this tick asks: those whose answer says something, at most
        ``MAX_ASKS_PER_TICK``, the longest unasked first. The others are asked at a
        later tick; meanwhile a busy thread counts as work unnamed (by its id), and a
        suspend always asks first, so waiting never lets work be taken for idleness."""
        wanted = [
            a.kernel_id
            for a in assessments
            if self._wants_kernel_check(a, loads.get(a.kernel_id, []))
        ]
        wanted.sort(key=lambda k: self._asked_at.get(k, 0.0))
        chosen = set(wanted[:MAX_ASKS_PER_TICK])
        now = time.monotonic()
        self._asked_at.update(dict.fromkeys(chosen, now))
        return chosen

    async def _check_kernel(self, a: Assessment, loads: list[work.Load], ask: bool) -> None:
        """Replace ``a``'s threads and tasks with what the window found: named by the
        kernel when ``ask``, else as it named them before (or by thread id)."""
        previous = self._kernel_work.pop(a.kernel_id, [])
        a.blocked_by = [b for b in a.blocked_by if b not in previous]
        a.background_work = [b for b in a.background_work if b not in previous]
        kernel_pid = self._kernel_pids.get(a.kernel_id, 0)
        known = self._known(a.kernel_id)
        sample = self._samples.get(a.kernel_id)
        for tid in [t for t in known if sample and int(t) not in sample.cpu]:
            del known[tid]  # the thread ended: its id may come back for another
        found: list[str] = []
        if ask:
            tids = [load.tid for load in loads]
            # the user's tasks that ran since the window started, as the threads' wakes
            start = self._window_starts.get(a.kernel_id)
            since = time.monotonic() - start.at if start and start.pid == kernel_pid else None
            policy = self.manager.policy
            answer = await work.ask_kernel(self.manager, a.kernel_id, policy, tids, since)
            if isinstance(answer, str):
                found = [answer]
            else:
                judged = work.verdicts([t for t in tids if t != kernel_pid], answer)
                known.update({t: v for t, v in judged.items() if v["fixed"]})
                tasks, woken = answer.get("tasks", []), answer.get("woken_tasks", [])
                found = work.named(loads, {**known, **judged}, tasks, woken, kernel_pid)
                self._restart_main_window(a.kernel_id)
        else:  # the main thread's load is work only with tasks: left for a window that asks
            others = [x for x in loads if x.tid != kernel_pid]
            found = work.named(others, known, [], [], kernel_pid)
        if found:
            self._kernel_work[a.kernel_id] = found
            a.background_work += found
        km = self.manager.kernel_manager
        now = datetime.now(timezone.utc)
        kernel = km.get_kernel(a.kernel_id) if km.is_running(a.kernel_id) else None
        self._note_work(a, now, getattr(kernel, "last_activity", None) or now, bool(found))

    def _known(self, kernel_id: str) -> dict[str, dict[str, Any]]:
        """The kernel's verdicts that still hold: none once a client sent it something."""
        messages = self.manager.client_messages[kernel_id]
        if self._names_at.get(kernel_id) != messages:
            self._names[kernel_id] = {}
            self._names_at[kernel_id] = messages
        return self._names.setdefault(kernel_id, {})

    def _restart_main_window(self, kernel_id: str) -> None:
        """Start the main thread's next window after a call the kernel answered: the call
        woke it (the kernel said which tasks ran until then), and counting that would
        have the next tick ask again, and so on for ever."""
        sample = self._samples.get(kernel_id)
        runs = work.thread_runs(sample.pid, sample.pid) if sample else None
        if sample is not None and runs is not None:
            sample.runs[sample.pid] = runs

    async def assess(self, kernel_ids: list[str] | None = None) -> list[Assessment]:
        """Assess the running kernels (or those of ``kernel_ids``, each measured and asked
        for its threads and tasks now unless it is busy): what the status API shows."""
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

        async def check(a: Assessment) -> None:
            try:
                await self._check_kernel(a, await self._measure_now(a.kernel_id), ask=self._asks)
            except KeyError:  # the kernel manager no longer has it
                if km.is_running(a.kernel_id):
                    raise
                # suspended or shut down meanwhile (an idle tick's suspend): as assessed

        await asyncio.gather(*(check(a) for a in askable))
        return assessments

    async def tick(self) -> list[str]:
        """Suspend every due kernel; the ids suspended. Failures are logged and evented
        by the manager, and the kernel keeps running."""
        assessments = self.assess_all(await asyncio.to_thread(self.snapshot))
        loads = await asyncio.to_thread(self._measure_all, assessments)
        asked = self._to_ask(assessments, loads)
        await asyncio.gather(
            *(
                self._check_kernel(a, loads.get(a.kernel_id, []), a.kernel_id in asked)
                for a in assessments
            )
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
        self.manager.lifecycles.keep_standby()
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
