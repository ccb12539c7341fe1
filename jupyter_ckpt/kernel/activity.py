"""Background work inside the kernel: user threads and asyncio tasks still running.

Jupyter calls a kernel idle when no cell executes, but a cell may have left a training
thread or an asyncio task running. The server asks :func:`background_work` (a silent call,
once per monitor tick) before it suspends a kernel. It reads thread and task objects and
the names of the functions they run; it never touches user objects.

The kernel's own threads and tasks (IOPub, heartbeat, control, shell channel, history,
parent poller, ipykernel's tasks) are told apart by the module of the function they run,
so that a new ipykernel thread is recognised without a list of thread names.
"""

from __future__ import annotations

import asyncio
import fnmatch
import sys
import threading
from types import FrameType
from typing import Any

# Packages that make up the kernel itself; threads and tasks running their code are the
# kernel's, not the user's.
KERNEL_PACKAGES = (
    "ipykernel",
    "IPython",
    "zmq",
    "jupyter_client",
    "jupyter_core",
    "tornado",
    "anyio",
    "comm",
    "traitlets",
    "debugpy",
    # debugpy's vendored pydevd, imported under its own top-level names
    "_pydevd_bundle",
    "_pydev_bundle",
    "pydevd",
    "jupyter_ckpt",
)

# Threads the store's clients (fsspec's event loop, the DNS resolver aiohttp may use) keep
# for the life of the process once the kernel has talked to an object store: idle by
# design, not the user's work (by thread name, and by package).
CLIENT_THREAD_NAMES = ("fsspecIO",)
CLIENT_PACKAGES = ("pycares",)

# Thread pools: a worker waiting on its queue sits in these modules only and is idle; one
# with a frame of any other module on its stack is running a job.
POOL_MODULES = (
    "threading",
    "queue",
    "concurrent.futures.thread",
    "concurrent.futures._base",
    "multiprocessing.pool",
    "multiprocessing.queues",
    "multiprocessing.connection",
    "multiprocessing.dummy",
    "selectors",
)


def _in(module: str | None, packages: tuple[str, ...]) -> bool:
    return bool(module) and any(module == p or module.startswith(p + ".") for p in packages)


def _frame_module(frame: FrameType) -> str | None:
    return frame.f_globals.get("__name__")


def _describe_function(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def _thread_entry(thread: threading.Thread) -> tuple[str | None, str]:
    """(module, name) of what the thread runs: its target, or its class's ``run``."""
    target = getattr(thread, "_target", None)
    if target is not None:
        return getattr(target, "__module__", None), _describe_function(target)
    cls = type(thread)
    return cls.__module__, cls.__qualname__


def _pool_job(frame: FrameType | None) -> str | None:
    """The function a pool worker runs now, or None when it waits for a job."""
    job = None
    while frame is not None:
        module = _frame_module(frame)
        # ipykernel 6 wraps every thread's run (to route its output): machinery too
        if not _in(module, POOL_MODULES) and not _in(module, KERNEL_PACKAGES):
            job = frame.f_code.co_name  # keep the outermost: the job itself
        elif module == "concurrent.futures.thread" and frame.f_code.co_name == "run":
            # a work item calling a builtin (time.sleep) has no frame of its own
            item = frame.f_locals.get("self")
            job = job or _describe_function(getattr(item, "fn", None))
        frame = frame.f_back
    return job


def busy_threads(ignore: list[str] | tuple[str, ...] = ()) -> list[str]:
    """Why each live user thread counts as work ("a thread started by `_train`...")."""
    frames = sys._current_frames()
    reasons = []
    for thread in threading.enumerate():
        if thread is threading.main_thread() or thread is threading.current_thread():
            continue
        module, name = _thread_entry(thread)
        if _in(module, KERNEL_PACKAGES + CLIENT_PACKAGES) or thread.name in CLIENT_THREAD_NAMES:
            continue
        if any(fnmatch.fnmatchcase(n, p) for p in ignore for n in (thread.name, name)):
            continue
        if _in(module, POOL_MODULES):
            job = _pool_job(frames.get(thread.ident or -1))
            if job is not None:
                reasons.append(f"a pool thread is running `{job}`")
            continue
        reasons.append(f"a thread started by `{name}` is running")
    return reasons


def _coroutine_module(task: asyncio.Task[Any]) -> str | None:
    coro = task.get_coro()
    frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
    if frame is not None:
        return _frame_module(frame)
    return getattr(coro, "__module__", None) or type(coro).__module__


def pending_tasks() -> list[str]:
    """Why each pending asyncio task on the kernel's loop counts as work."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # a kernel whose loop does not run this call
        return []
    current = asyncio.current_task(loop)
    reasons = []
    for task in asyncio.all_tasks(loop):
        if task is current or task.done() or _in(_coroutine_module(task), KERNEL_PACKAGES):
            continue
        coro = task.get_coro()
        reasons.append(f"an asyncio task running `{_describe_function(coro)}` is pending")
    return sorted(reasons)


def background_work(
    kinds: list[str] | tuple[str, ...] = ("threads", "tasks"), ignore: list[str] | tuple = ()
) -> dict[str, list[str]]:
    """The kernel-side background work of the asked ``kinds``, in words, by kind."""
    found: dict[str, list[str]] = {}
    if "threads" in kinds:
        found["threads"] = busy_threads(ignore)
    if "tasks" in kinds:
        found["tasks"] = pending_tasks()
    return found
