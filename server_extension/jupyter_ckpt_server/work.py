"""Background work of a kernel that runs no cell, in words for ``blocked_by``.

The server sees child processes and GPU utilization itself (from the tick's one psutil and
NVML pass); threads and asyncio tasks only the kernel can see, so it is asked through a
silent call of :func:`jupyter_ckpt.kernel.background_work`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import psutil

from jupyter_ckpt.gpu import GpuUsage

from .policy import SuspendPolicy
from .rpc import SuspendFailed

if TYPE_CHECKING:
    from .manager import CkptManager

KERNEL_SIDE_KINDS = ("threads", "tasks")

# multiprocessing's own long-lived helpers wait for work for as long as the kernel lives
IDLE_HELPERS = (
    "multiprocessing.resource_tracker",
    "multiprocessing.forkserver",
    "multiprocessing.semaphore_tracker",
)

NO_ANSWER = "the kernel did not answer the activity check"


def _short(cmdline: list[str], width: int = 40) -> str:
    """``python -c import time; ...``: the program's base name and the start of its args."""
    text = " ".join([os.path.basename(cmdline[0]), *cmdline[1:]])
    return text if len(text) <= width else text[: width - 3] + "..."


def child_processes(kernel_pid: int, tree: set[int], connection_file: str) -> list[str]:
    """``["2 child processes: python -c ...; sleep 5"]``, or [] when the kernel has none
    (exited children not yet reaped and multiprocessing's helpers do not count). A kernel
    started through a wrapper (``conda run``, a launcher script) is a child of the process
    the server started: a process given the kernel's connection file is the kernel."""
    shown = []
    for pid in sorted(tree - {kernel_pid}):
        try:
            process = psutil.Process(pid)
            if process.status() == psutil.STATUS_ZOMBIE:
                continue
            cmdline = process.cmdline() or [process.name()]
        except psutil.Error:  # gone meanwhile
            continue
        text = " ".join(cmdline)
        if (connection_file and connection_file in text) or any(
            helper in text for helper in IDLE_HELPERS
        ):
            continue
        shown.append(_short(cmdline))
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


async def kernel_side(manager: CkptManager, kernel_id: str, policy: SuspendPolicy) -> list[str]:
    """The kernel's busy threads and pending tasks; a kernel that does not answer within
    ``activity_timeout`` counts as busy, never as idle."""
    kinds = [k for k in KERNEL_SIDE_KINDS if k in policy.background_work]
    km = manager.kernel_manager
    if not kinds or not km.is_running(kernel_id):
        return []
    timeout = min(policy.activity_timeout, policy.check_interval)
    call = f"background_work({kinds!r}, {list(policy.background_thread_ignore)!r})"
    try:
        found: dict[str, Any] = await quiet_call(manager, kernel_id, call, timeout)
        return [reason for kind in kinds for reason in found.get(kind, [])]
    except asyncio.TimeoutError:
        return [NO_ANSWER]
    except SuspendFailed as exc:  # an error in the kernel, or a kernel without jupyter_ckpt
        return [f"the activity check failed: {exc}"]


async def quiet_call(manager: CkptManager, kernel_id: str, call: str, timeout: float) -> Any:
    """``manager.kernel_call`` within ``timeout`` (else ``asyncio.TimeoutError``), leaving
    the kernel's idle clock where it was (see :func:`idle_clock_kept`)."""
    async with idle_clock_kept(manager, kernel_id, timeout):
        return await asyncio.wait_for(manager.kernel_call(kernel_id, call, timeout + 1), timeout)


@contextlib.asynccontextmanager
async def idle_clock_kept(
    manager: CkptManager, kernel_id: str, timeout: float
) -> AsyncIterator[None]:
    """Around the server's own silent calls to a kernel. Such a call is itself an execute
    request, which the server counts as activity; unless a client sent the kernel
    something meanwhile, the kernel's idle clock is put back where it was, so that the
    server's checks and autosaves never keep a kernel from being suspended."""
    km = manager.kernel_manager
    kernel = km.get_kernel(kernel_id)
    last, last_any = kernel.last_activity, km.last_kernel_activity
    messages = manager.client_messages[kernel_id]
    try:
        yield
    finally:
        await _seen_done(kernel, last, timeout)
        if km.is_running(kernel_id) and manager.client_messages[kernel_id] == messages:
            if km.last_kernel_activity == kernel.last_activity:
                km.last_kernel_activity = last_any
            kernel.last_activity = last


async def _seen_done(kernel: Any, last: Any, timeout: float) -> None:
    """Wait until the server has seen the call's busy and idle status messages (they come
    on iopub, which may lag the reply): only then is the idle clock safe to put back."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while kernel.last_activity == last or kernel.execution_state == "busy":
        if loop.time() > deadline:
            return
        await asyncio.sleep(0.005)
