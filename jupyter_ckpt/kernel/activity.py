"""Background work inside the kernel, in words: what a busy thread runs, which of the
user's asyncio tasks are pending.

Whether a thread works is measured by the server, from outside (its CPU time and I/O over
the check window, see ``jupyter_ckpt_server.work``): who started a thread says nothing
about it (IPython's ``BackgroundJobManager`` and anyio run training loops in threads of
their own; tqdm and logging leave threads that sleep for the kernel's whole life). The
server then asks :func:`describe` (a silent call) to name the threads it found busy. It
reads thread and task objects and the names of the functions they run; it never touches
user objects.
"""

from __future__ import annotations

import asyncio
import fnmatch
import sys
import threading
from types import FrameType
from typing import Any

# Packages that make up the kernel itself: a thread or task that runs only their code is
# machinery (IOPub, heartbeat, control, history, ipykernel's tasks, a worker thread waiting
# for a job); a user function found on its stack is what it runs.
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

# Thread pools and the standard library's waiting machinery: a worker's entry point, not
# the job it runs.
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
    "asyncio",
)


def _in(module: str | None, packages: tuple[str, ...]) -> bool:
    return bool(module and any(module == p or module.startswith(p + ".") for p in packages))


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


def _job(frame: FrameType | None) -> str | None:
    """The job a worker thread runs now: the outermost function the notebook defined on
    its stack, else the outermost that is neither the kernel's nor a pool's (a library's
    wrapper around the job, such as joblib's batches, comes after the notebook's own)."""
    job = notebook_job = None
    while frame is not None:
        module = _frame_module(frame)
        if module == "__main__" and frame.f_code.co_name != "<module>":  # not a launcher
            notebook_job = frame.f_code.co_name
        if not _in(module, POOL_MODULES) and not _in(module, KERNEL_PACKAGES):
            job = frame.f_code.co_name  # keep the outermost: the job itself
        elif module == "concurrent.futures.thread" and frame.f_code.co_name == "run":
            # a work item calling a builtin (time.sleep) has no frame of its own
            item = frame.f_locals.get("self")
            job = job or _describe_function(getattr(item, "fn", None))
        frame = frame.f_back
    return notebook_job or job


def describe_thread(thread: threading.Thread, frame: FrameType | None) -> str | None:
    """What a thread runs, in words: by its target when the user's code started it, else by
    the user function on its stack (a pool's or IPython's or anyio's worker). None for a
    thread that runs the kernel's code only (IOPub, history, a pool waiting for a job):
    what it does is the kernel answering, not work."""
    module, name = _thread_entry(thread)
    if not _in(module, POOL_MODULES) and not _in(module, KERNEL_PACKAGES):
        return f"a thread started by `{name}` is running"
    job = _job(frame)
    if job is not None:
        return f"a {'pool ' if _in(module, POOL_MODULES) else ''}thread is running `{job}`"
    return None


def _ignored(thread: threading.Thread, ignore: list[str] | tuple[str, ...]) -> bool:
    names = (thread.name, _thread_entry(thread)[1])
    return any(fnmatch.fnmatchcase(n, p) for p in ignore for n in names)


def user_threads() -> list[str]:
    """The live threads the user's code started and the pool threads running a job, in
    words (what a fork of the kernel cannot carry; see :mod:`.background`)."""
    frames = sys._current_frames()
    described = (
        describe_thread(thread, frames.get(thread.ident or -1))
        for thread in threading.enumerate()
        if thread is not threading.main_thread() and thread is not threading.current_thread()
    )
    return [d for d in described if d is not None]


def _coroutine_module(task: asyncio.Task[Any]) -> str | None:
    coro = task.get_coro()
    frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
    if frame is not None:
        return _frame_module(frame)
    return getattr(coro, "__module__", None) or type(coro).__module__


def pending_tasks() -> list[str]:
    """The user's pending asyncio tasks on the kernel's loop, in words."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # a kernel whose loop does not run this call
        return []
    current = asyncio.current_task(loop)
    return sorted(
        f"an asyncio task running `{_describe_function(task.get_coro())}` is pending"
        for task in asyncio.all_tasks(loop)
        if task is not current
        and not task.done()
        and not _in(_coroutine_module(task), KERNEL_PACKAGES)
    )


def describe(tids: list[int], ignore: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """``{"threads": {native id: what it runs, or None when that is not work (a helper
    matched by ``ignore``, the kernel's own machinery)}, "tasks": [pending user tasks]}``
    for the threads the server found busy."""
    frames = sys._current_frames()
    wanted = set(tids)
    threads: dict[str, str | None] = {}
    for thread in threading.enumerate():
        # the main thread's load is its tasks': the server judges it by them
        if thread.native_id in wanted and thread is not threading.main_thread():
            threads[str(thread.native_id)] = (
                None
                if _ignored(thread, ignore)
                else describe_thread(thread, frames.get(thread.ident or -1))
            )
    return {"threads": threads, "tasks": pending_tasks()}
