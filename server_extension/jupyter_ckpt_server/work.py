"""Background work of a kernel that runs no cell, judged by what its processes do.

Who started a thread says nothing about whether it works: a training loop may run in a
thread that IPython or anyio started, and a library's monitor thread may sleep for the
kernel's whole life. So the server measures, over each check window (the time between two
ticks of the monitor), what the kernel's process tree does:

- each thread's CPU time and bytes read and written (psutil's per-thread times, and Linux's
  per-thread I/O counters): a thread above ``busy_cpu_percent`` or
  ``busy_io_bytes_per_second`` is busy, whatever it runs;
- whether each thread ran at all (Linux's count of the times it was scheduled, in
  ``/proc/<pid>/task/<tid>/schedstat``): work that waits between its steps (a poll, a
  paced loop, a socket or a queue read) costs almost no CPU but wakes. A thread that woke
  is work when the user's code runs in it, which only the kernel can say; one blocked or
  asleep for the whole window is idle, whoever started it;
- the kernel's main thread runs the asyncio loop: it counts only for the user's asyncio
  tasks (otherwise it is the kernel answering messages), busy while they are pending,
  awake when the kernel says one of them ran;
- a live child process always counts: suspending the kernel would kill it;
- GPU utilization (NVML) of the whole tree.

The kernel is asked (a silent call of :func:`jupyter_ckpt.kernel.activity.describe`) to
name the threads found busy or awake and to judge them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psutil

from jupyter_ckpt.gpu import GpuUsage
from jupyter_ckpt.kernel.background import AUTOSAVE_PROCESS_NAME

from .policy import SuspendPolicy
from .rpc import SuspendFailed

if TYPE_CHECKING:
    from .manager import CkptManager

# multiprocessing's (and loky's) own long-lived helpers wait for work for as long as the
# kernel lives; their children (a forkserver's workers) are work like any other
IDLE_HELPERS = ("resource_tracker", "multiprocessing.forkserver", "semaphore_tracker")

NO_ANSWER = "the kernel did not answer the activity check"


@dataclass
class Sample:
    """Cumulative CPU seconds, I/O bytes and times scheduled of each thread of one
    process, at ``at``."""

    pid: int
    at: float
    cpu: dict[int, float] = field(default_factory=dict)
    io: dict[int, int] = field(default_factory=dict)
    runs: dict[int, int] = field(default_factory=dict)


@dataclass
class Load:
    """What one thread did over a window: CPU (% of one core) and I/O (bytes/s), whether
    that is ``busy`` by the policy's thresholds, and how many times it woke (was
    scheduled) over the last ``awake_window`` seconds."""

    tid: int
    cpu_percent: float
    io_rate: float
    busy: bool = True
    wakes: int = 0
    awake_window: float = 0.0
    # seconds since it last ran, where that was read (see last_ran)
    last_active: float | None = None

    def __str__(self) -> str:
        parts = []
        if self.cpu_percent >= 0.5:
            parts.append(f"{self.cpu_percent:.0f}% CPU")
        if self.io_rate >= 1024:
            parts.append(f"{_rate(self.io_rate)} I/O")
        if not parts and self.wakes:
            times = "once" if self.wakes == 1 else f"{self.wakes} times"
            parts.append(f"woke {times} in the last {self.awake_window:.0f} s")
            if self.last_active is not None:
                parts.append(f"last active {self.last_active:.1f} s ago")
        return ", ".join(parts) or "active"


def _rate(bytes_per_second: float) -> str:
    for unit in ("B", "KB", "MB"):
        if bytes_per_second < 1000:
            return f"{bytes_per_second:.0f} {unit}/s"
        bytes_per_second /= 1000
    return f"{bytes_per_second:.1f} GB/s"


def _thread_io(pid: int, tid: int) -> int | None:
    """Bytes the thread passed to read and write calls (files, pipes; not socket recv or
    send), from Linux's per-thread counters; None where there are none."""
    try:
        with open(f"/proc/{pid}/task/{tid}/io", "rb") as f:
            fields = f.read().split(b"\n", 2)  # rchar, wchar come first
        return int(fields[0].split()[1]) + int(fields[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def thread_runs(pid: int, tid: int) -> int | None:
    """How many times the thread was scheduled so far (it grows each time the thread
    wakes), from Linux's schedstat; None where there is none."""
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
            return int(f.read().split()[2])
    except (OSError, IndexError, ValueError):
        return None


def _ran_at(path: str) -> float | None:
    """When the thread of a ``sched`` file last started to run, in milliseconds of the
    scheduler's clock; None where Linux keeps no such file."""
    try:
        with open(path, "rb") as f:
            for line in f:
                if line.startswith(b"se.exec_start"):
                    return float(line.split(b":")[1])
    except (OSError, IndexError, ValueError):
        pass
    return None


def last_ran(pid: int, tid: int) -> float | None:
    """Seconds since the thread last ran. The scheduler's clock is not one Python reads,
    so the thread's last start is read against this thread's own, which runs now."""
    theirs = _ran_at(f"/proc/{pid}/task/{tid}/sched")
    mine = _ran_at(f"/proc/self/task/{threading.get_native_id()}/sched")
    if theirs is None or mine is None:
        return None
    return max(0.0, (mine - theirs) / 1000)


def sample(pid: int) -> Sample | None:
    """The threads of ``pid`` now; None when the process is gone."""
    try:
        threads = psutil.Process(pid).threads()
    except psutil.Error:
        return None
    taken = Sample(pid, time.monotonic())
    for thread in threads:
        taken.cpu[thread.id] = thread.user_time + thread.system_time
        io = _thread_io(pid, thread.id)
        if io is not None:
            taken.io[thread.id] = io
        runs = thread_runs(pid, thread.id)
        if runs is not None:
            taken.runs[thread.id] = runs
    return taken


def at_start(pid: int) -> Sample | None:
    """``pid`` as it started, before any of its threads ran: where to look back from for
    a kernel no window was measured of yet. None when the process is gone."""
    try:
        started = psutil.Process(pid).create_time()
    except psutil.Error:
        return None
    return Sample(pid, time.monotonic() - (time.time() - started))


def active_threads(
    before: Sample, after: Sample, policy: SuspendPolicy, since: Sample | None = None
) -> list[Load]:
    """The threads of ``after`` that were busy since ``before`` (by the policy's
    thresholds) or woke since ``since`` (default: ``before``; an earlier sample looks
    further back for work that waits between its steps). A thread born in the window
    brings all of its time."""
    window = after.at - before.at
    if window <= 0 or before.pid != after.pid:
        return []
    since = since if since is not None and since.pid == after.pid else before
    active = []
    for tid, cpu in after.cpu.items():
        cpu_percent = 100 * (cpu - before.cpu.get(tid, 0.0)) / window
        io_rate = (after.io.get(tid, 0) - before.io.get(tid, 0)) / window
        busy = cpu_percent >= policy.busy_cpu_percent or io_rate >= policy.busy_io_bytes_per_second
        wakes = after.runs.get(tid, 0) - since.runs.get(tid, 0)
        if busy or wakes > 0:
            active.append(Load(tid, cpu_percent, io_rate, busy, wakes, after.at - since.at))
    return active


def _cmdline(process: psutil.Process) -> list[str]:
    return process.cmdline() or [process.name()]


def kernel_process(pid: int, children: dict[int, list[int]], connection_file: str) -> int:
    """The kernel's own process. A kernel started through a wrapper (``conda run``, a
    launcher script) is a descendant of the process the server started: going down from
    it, each child given the kernel's connection file under another command line is the
    next step. A fork of the kernel has the kernel's very command line: it is a child."""
    current = pid
    while connection_file and len(children.get(current, [])) > 0:
        try:
            cmdline = _cmdline(psutil.Process(current))
        except psutil.Error:
            return current
        for child in children[current]:
            with contextlib.suppress(psutil.Error):
                below = _cmdline(psutil.Process(child))
                if below != cmdline and connection_file in " ".join(below):
                    current = child
                    break
        else:
            return current
    return current


def _short(cmdline: list[str], width: int = 60) -> str:
    """``python -c import time; ...``: the program's base name and the start of its args."""
    text = " ".join([os.path.basename(cmdline[0]), *cmdline[1:]])
    return text if len(text) <= width else text[: width - 3] + "..."


def _descendants(pid: int, children: dict[int, list[int]]) -> Iterable[tuple[int, int]]:
    """(pid, its parent) of every process below ``pid``, parents first."""
    todo = [pid]
    while todo:
        parent = todo.pop(0)
        for child in sorted(children.get(parent, [])):
            yield child, parent
            todo.append(child)


def child_processes(kernel_pid: int, children: dict[int, list[int]]) -> list[str]:
    """``["2 child processes: python -c ...; sleep 5"]``, or [] when the kernel has none.
    Every live child counts, however it was started (fork, spawn, forkserver, subprocess):
    a suspend would kill it. Not counted: exited children not yet reaped, multiprocessing's
    resource tracker and an idle forkserver (not their children), the kernel's autosave."""
    try:
        kernel_cmdline = _cmdline(psutil.Process(kernel_pid))
    except psutil.Error:
        return []
    shown = []
    for pid, parent in _descendants(kernel_pid, children):
        try:
            process = psutil.Process(pid)
            if process.status() == psutil.STATUS_ZOMBIE:
                continue
            if process.name() == AUTOSAVE_PROCESS_NAME:
                continue
            cmdline = _cmdline(process)
        except psutil.Error:  # gone meanwhile
            continue
        text = " ".join(cmdline)
        if parent == kernel_pid and any(helper in text for helper in IDLE_HELPERS):
            continue
        fork = cmdline == kernel_cmdline
        shown.append(f"a fork of the kernel (pid {pid})" if fork else _short(cmdline))
    if not shown:
        return []
    more = "; ..." if len(shown) > 2 else ""
    plural = "es" if len(shown) > 1 else ""
    return [f"{len(shown)} child process{plural}: {'; '.join(shown[:2])}{more}"]


def gpu_busy(usage: GpuUsage, threshold: int) -> list[str]:
    """``["GPU 0 is 87% busy"]`` for each device the kernel keeps at ``threshold`` or more."""
    return [
        f"GPU {index} is {percent}% busy"
        for index, percent in sorted(usage.busy.items())
        if percent > 0 and percent >= threshold
    ]


# the verdict :func:`verdicts` gives a thread Python does not know (native code: BLAS,
# OpenMP, a C extension's workers): work when busy, never for waking alone
NATIVE: dict[str, Any] = {"name": "", "user": False, "fixed": True}


def verdicts(tids: list[int], answer: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The kernel's verdict on each thread of ``tids``, from its ``answer`` (see
    :func:`jupyter_ckpt.kernel.activity.verdict`), ``NATIVE`` for a thread Python does not
    know."""
    known: dict[str, dict[str, Any]] = answer.get("threads", {})
    return {str(tid): known.get(str(tid), NATIVE) for tid in tids}


def named(
    loads: list[Load],
    known: dict[str, dict[str, Any]],
    tasks: list[str],
    woken_tasks: list[str],
    kernel_pid: int,
) -> list[str]:
    """The working threads and tasks in words. A thread works when it was busy and the
    kernel names it (not the kernel's own machinery, nor a helper it was told to ignore),
    or when it woke and runs the user's code (see :func:`verdicts`); one the kernel was
    not asked about counts when busy, by its id; native threads together. The main
    thread's load is the user's tasks': the pending ``tasks`` when it was busy, else the
    ``woken_tasks``."""
    reasons, native = [], []
    for load in loads:
        judged = known.get(str(load.tid))
        if load.tid == kernel_pid:
            reasons += [f"{task} ({load})" for task in (tasks if load.busy else woken_tasks)]
        elif judged is None:
            if load.busy:
                reasons.append(f"a thread (id {load.tid}) is running ({load})")
        elif judged["name"] == NATIVE["name"]:
            if load.busy:
                native.append(load)
        elif judged["name"] is not None and (load.busy or judged["user"]):
            load = dataclasses.replace(load, last_active=last_ran(kernel_pid, load.tid))
            reasons.append(f"{judged['name']} ({load})")
    if native:
        busiest = max(native, key=lambda load: (load.cpu_percent, load.io_rate))
        count = f"{len(native)} threads are" if len(native) > 1 else "a thread is"
        reasons.append(f"{count} running native code (busiest: {busiest})")
    return reasons


async def ask_kernel(
    manager: CkptManager,
    kernel_id: str,
    policy: SuspendPolicy,
    tids: list[int],
    since: float | None = None,
) -> dict[str, Any] | str:
    """What the kernel says of its threads ``tids`` and the user's tasks (which of them
    ran in the last ``since`` seconds, default since the last ask); a reason (as a string)
    when it cannot say. A kernel that does not answer within ``activity_timeout`` counts
    as busy, never as idle."""
    timeout = min(policy.activity_timeout, policy.check_interval)
    ignore = list(policy.background_thread_ignore)
    call = f"describe({sorted(tids)!r}, {ignore!r}, {since!r})"
    try:
        return await quiet_call(manager, kernel_id, call, timeout)
    except asyncio.TimeoutError:
        return NO_ANSWER
    except SuspendFailed as exc:  # an error in the kernel, or a kernel without jupyter_ckpt
        return f"the activity check failed: {exc}"


async def quiet_call(manager: CkptManager, kernel_id: str, call: str, timeout: float) -> Any:
    """``manager.kernel_call`` within ``timeout`` (else ``asyncio.TimeoutError``), leaving
    the kernel's idle clock where it was (see :mod:`.idleclock`)."""
    async with manager.idle_clock.kept(kernel_id, timeout):
        return await asyncio.wait_for(manager.kernel_call(kernel_id, call, timeout + 1), timeout)
