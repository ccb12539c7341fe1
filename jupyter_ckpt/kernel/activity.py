"""Background work inside the kernel, in words: what a thread runs, whether it is the
user's code, and which of the user's asyncio tasks are pending and woke.

Whether a thread works is measured by the server, from outside: its CPU time and I/O
over the check window, and whether it ran at all (woke) in it (see
``jupyter_ckpt_server.work``). Work that waits between its steps (a poll, a paced loop, a
training step waiting on data) costs almost no CPU, so waking counts too, but only for
the user's code: a thread whose stack holds a function the notebook defined (or a module
of the user's own, outside the installed libraries) is work when it woke; a library's
thread that wakes on its own timer (tqdm's monitor, a logging listener, a debugger) is not.
The server asks :func:`describe` (a silent call) for that verdict on the threads it saw
busy or awake. It reads thread and task objects, their frames and the names of the
functions they run; it never touches user objects.

A user marks work that should not keep the kernel (a loop that may as well stop with a
suspend) with :func:`idle_ok` or ``%ckpt idle-ok``.
"""

from __future__ import annotations

import asyncio
import fnmatch
import functools
import os
import site
import sys
import sysconfig
import threading
import time
import weakref
from collections.abc import Iterable
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

# Threads whose entry point runs whatever job it is handed: what they run is read from
# their stack at each ask. Every other thread runs its entry point's code for its whole
# life, so the verdict on it holds for good (the server keeps it).
JOB_RUNNERS = (*POOL_MODULES, "IPython.lib.backgroundjobs", "anyio")


def _library_dirs() -> tuple[str, ...]:
    """Where installed code lives: the standard library and site-packages."""
    paths = sysconfig.get_paths()
    dirs = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    dirs.update(site.getsitepackages() if hasattr(site, "getsitepackages") else [])
    dirs.add(site.getusersitepackages())
    return tuple(os.path.join(os.path.realpath(d), "") for d in dirs if d)


LIBRARY_DIRS = _library_dirs()

# What the user marked as work that does not keep the kernel (see idle_ok): patterns
# matched like SuspendPolicy.background_thread_ignore.
IDLE_OK: set[str] = set()


def idle_ok(*work: Any, undo: bool = False) -> list[str]:
    """Mark background work as not keeping the kernel from being suspended, for a loop
    that may as well stop with a suspend (a suspend ends every thread and task): each of
    ``work`` is a function (or its name), a thread, a task, or a name pattern such as
    ``"poll_*"``, matched against a thread's or task's name and the function it runs.
    ``undo=True`` takes the marks back. The marks now, sorted."""
    for item in work:
        pattern = _work_name(item)
        (IDLE_OK.discard if undo else IDLE_OK.add)(pattern)
    return sorted(IDLE_OK)


def _work_name(item: Any) -> str:
    if isinstance(item, str):
        return item
    if isinstance(item, threading.Thread):
        return item.name
    if isinstance(item, asyncio.Task):
        return item.get_name()
    if callable(item):
        return _describe_function(item)
    raise TypeError(f"idle_ok takes functions, threads, tasks or names, not {type(item).__name__}")


def _in(module: str | None, packages: tuple[str, ...]) -> bool:
    return bool(module and any(module == p or module.startswith(p + ".") for p in packages))


def _frame_module(frame: FrameType) -> str | None:
    return frame.f_globals.get("__name__")


@functools.lru_cache(maxsize=4096)  # asked for every frame of every thread asked about
def _users(module: str | None, filename: str | None) -> bool:
    """Whether code of ``module`` in ``filename`` is the user's: the notebook's cells
    (``__main__``), or a module of their own (a file outside the installed libraries)."""
    if _in(module, KERNEL_PACKAGES):
        return False
    if module == "__main__":
        return True
    if not filename or filename.startswith("<"):  # frozen, built in, generated
        return False
    return not os.path.realpath(filename).startswith(LIBRARY_DIRS)


def _user_frame(frame: FrameType) -> bool:
    # the launcher's top level (``python -m ipykernel_launcher``) is __main__ too
    return frame.f_code.co_name != "<module>" and _users(
        _frame_module(frame), frame.f_code.co_filename
    )


def _user_callable(fn: Any) -> bool:
    fn = getattr(fn, "__func__", fn)  # a bound method's function
    code = getattr(fn, "__code__", None)
    module = getattr(fn, "__module__", None)
    if code is not None:
        return _users(module, code.co_filename)
    return _users(module, getattr(sys.modules.get(module or ""), "__file__", None))


def _describe_function(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def _target(thread: threading.Thread) -> Any:
    """The function the thread was started to run: its target, or a timer's function
    (which it runs once due); None for a thread that runs its class's ``run``."""
    if isinstance(thread, threading.Timer):
        return thread.function
    return getattr(thread, "_target", None)


def _entry(thread: threading.Thread) -> Any:
    """What the thread runs: its target, or its class's ``run``."""
    target = _target(thread)
    return target if target is not None else type(thread).run


def _thread_entry(thread: threading.Thread) -> tuple[str | None, str]:
    """(module, name) of what the thread runs: its target, or its class's ``run``."""
    target = _target(thread)
    if target is not None:
        return getattr(target, "__module__", None), _describe_function(target)
    cls = type(thread)
    return cls.__module__, cls.__qualname__


def _stack(frame: FrameType | None) -> Iterable[FrameType]:
    while frame is not None:
        yield frame
        frame = frame.f_back


def _work_item(frame: FrameType) -> Any:
    """The function a concurrent.futures worker's frame runs (a work item calling a
    builtin, such as time.sleep, has no frame of its own); None in other frames."""
    if _frame_module(frame) == "concurrent.futures.thread" and frame.f_code.co_name == "run":
        return getattr(frame.f_locals.get("self"), "fn", None)
    return None


def _job(frame: FrameType | None) -> str | None:
    """The job a worker thread runs now: the outermost function the notebook defined on
    its stack, else the outermost that is neither the kernel's nor a pool's (a library's
    wrapper around the job, such as joblib's batches, comes after the notebook's own)."""
    job = notebook_job = None
    for f in _stack(frame):
        module = _frame_module(f)
        if module == "__main__" and f.f_code.co_name != "<module>":  # not a launcher
            notebook_job = f.f_code.co_name
        if not _in(module, POOL_MODULES) and not _in(module, KERNEL_PACKAGES):
            job = f.f_code.co_name  # keep the outermost: the job itself
        elif (item := _work_item(f)) is not None:
            job = job or _describe_function(item)
    return notebook_job or job


def _runs_user_code(frame: FrameType | None) -> bool:
    """Whether the user's code is on the stack: a frame of it, or a pool's work item
    that is a function of it."""
    for f in _stack(frame):
        item = _work_item(f)
        if _user_frame(f) or (item is not None and _user_callable(item)):
            return True
    return False


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


def _ignored(names: Iterable[str], ignore: Iterable[str]) -> bool:
    names = list(names)
    return any(fnmatch.fnmatchcase(n, p) for p in ignore for n in names)


def verdict(
    thread: threading.Thread, frame: FrameType | None, ignore: Iterable[str] = ()
) -> dict[str, Any]:
    """The server's question about one thread it saw busy or awake: ``{"name": what it
    runs in words (see :func:`describe_thread`; None: not work, whatever it does),
    "user": whether the user's code runs in it (then waking is work), "fixed": whether
    this holds for the thread's whole life}``. A thread runs its entry point's code for
    good unless it is a worker handed jobs (a pool's, IPython's background jobs, anyio's):
    the verdict on those is read from their stack now, and so is one matched by a pattern
    (the patterns may change)."""
    name = describe_thread(thread, frame)
    module, entry = _thread_entry(thread)
    runs_jobs = _in(module, JOB_RUNNERS)
    if _ignored((thread.name, entry, _job(frame) or entry), ignore):
        return {"name": None, "user": False, "fixed": False}
    if runs_jobs:
        return {"name": name, "user": name is not None and _runs_user_code(frame), "fixed": False}
    return {"name": name, "user": _user_callable(_entry(thread)), "fixed": True}


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


# task -> a weak reference to the future it waited on at the last ask (None: it was
# ready to run). asyncio keeps no "last woke" time per task; but a task that waits on the
# same future object as at the last ask has not run since (a task that ran and awaits
# again waits on a new one: asyncio.sleep's, a queue's getter...), and one that waits on
# another, or is ready to run, has. Asyncio's own ``_fut_waiter`` (both its C and Python
# tasks keep it, since 3.4) tells this at no cost, where wrapping each task's steps would
# cost every step and change what the task is.
_waiting_on: weakref.WeakKeyDictionary[asyncio.Task[Any], Any] = weakref.WeakKeyDictionary()
_NEW = object()
# id -> a timer of the loop that calls the user's code, as the last ask saw them: a
# callback that re-arms itself (``loop.call_later``, tornado's PeriodicCallback) makes a
# new timer each time it runs, so one not seen at the last ask ran since
_timers_seen: weakref.WeakValueDictionary[int, asyncio.TimerHandle] = weakref.WeakValueDictionary()
# a task, or a timer's function -> when an ask first found that it had run (the server's
# window may reach back past the last ask: another status call may have asked since)
_ran_at: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()


def _ran(key: Any, ran: bool, cutoff: float) -> bool:
    """Note that ``key`` ran since the last ask (if ``ran``); whether it ran since
    ``cutoff`` (time.monotonic()) as far as the asks tell."""
    if ran:
        _ran_at[key] = time.monotonic()
    return _ran_at.get(key, float("-inf")) >= cutoff


def _woke(task: asyncio.Task[Any]) -> bool:
    """Whether ``task`` ran since the last ask (a task first seen did: it was created)."""
    waiter = getattr(task, "_fut_waiter", None)
    seen = _waiting_on.get(task, _NEW)
    _waiting_on[task] = None if waiter is None else weakref.ref(waiter)
    if seen is _NEW or waiter is None or seen is None:
        return True
    return bool(seen() is not waiter)


def _users_callback(handle: asyncio.TimerHandle) -> Any:
    """The user's function a timer of the loop calls, through ``functools.partial`` and
    tornado's wrappers (an IOLoop's timeout, a PeriodicCallback); None if none."""
    todo = [getattr(handle, "_callback", None), *(getattr(handle, "_args", None) or ())]
    for _ in range(8):  # a few wrappers deep at most
        todo = [c for c in todo if c is not None and callable(c)]
        for callback in todo:
            if _user_callable(callback):
                return callback
        todo = [getattr(c, "func", None) for c in todo] + [
            getattr(getattr(c, "__self__", None), "callback", None) for c in todo
        ]
    return None


def _user_timers(loop: asyncio.AbstractEventLoop, cutoff: float) -> list[tuple[str, str, bool]]:
    """(name, words, whether it ran since ``cutoff``) of the loop's timers that call the
    user's code (asyncio's own event loops keep them in ``_scheduled``)."""
    timers = []
    scheduled = [h for h in getattr(loop, "_scheduled", ()) if not h.cancelled()]
    for handle in scheduled:
        callback = _users_callback(handle)
        if callback is not None:
            name = _describe_function(callback)
            words = f"a callback `{name}` is scheduled on the kernel's loop"
            new = _timers_seen.get(id(handle)) is not handle
            timers.append((name, words, _ran(getattr(callback, "__func__", callback), new, cutoff)))
    _timers_seen.clear()
    _timers_seen.update({id(h): h for h in scheduled})
    return timers


def user_tasks(ignore: Iterable[str] = (), since: float | None = None) -> list[tuple[str, bool]]:
    """The user's pending asyncio tasks and timers on the kernel's loop, in words, each
    with whether it ran in the last ``since`` seconds (None: since the last ask)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # a kernel whose loop does not run this call
        return []
    current = asyncio.current_task(loop)
    cutoff = time.monotonic() - (since or 0.0)
    timers = _user_timers(loop, cutoff)
    tasks = [(words, woke) for name, words, woke in timers if not _ignored([name], ignore)]
    for task in asyncio.all_tasks(loop):
        if task is current or task.done() or _in(_coroutine_module(task), KERNEL_PACKAGES):
            continue
        function = _describe_function(task.get_coro())
        woke = _ran(task, _woke(task), cutoff)
        if not _ignored((task.get_name(), function), ignore):
            tasks.append((f"an asyncio task running `{function}` is pending", woke))
    return sorted(tasks)


def describe(
    tids: list[int], ignore: list[str] | tuple[str, ...] = (), since: float | None = None
) -> dict[str, Any]:
    """``{"threads": {native id: its verdict (see :func:`verdict`)}, "tasks": [pending
    user tasks], "woken_tasks": [those of them that ran in the last ``since`` seconds, or
    since the last ask]}`` for the threads the server saw busy or awake. ``ignore``: the
    server's patterns of helper threads; the user's :data:`IDLE_OK` marks apply too."""
    patterns = (*ignore, *IDLE_OK)
    frames = sys._current_frames()
    wanted = set(tids)
    threads = {
        # the main thread's load is its tasks': the server judges it by them
        str(thread.native_id): verdict(thread, frames.get(thread.ident or -1), patterns)
        for thread in threading.enumerate()
        if thread.native_id in wanted and thread is not threading.main_thread()
    }
    tasks = user_tasks(patterns, since)
    return {
        "threads": threads,
        "tasks": [text for text, _ in tasks],
        "woken_tasks": [text for text, woke in tasks if woke],
    }
