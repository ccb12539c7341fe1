"""Autosave without a stall: fork the kernel and let the child write the image.

Redis's BGSAVE does the same: ``fork()`` gives the child a copy-on-write snapshot of the
whole process at one instant, the child serializes it to the store while the parent goes
on answering the user, and only the pages the parent changes meanwhile are copied.

What a fork does not carry, and how the child lives with it:

- Threads. Only the forking thread exists in the child. The kernel's other threads
  (ZMQ's I/O threads, IPython's IOPub and history threads, torch/OpenBLAS pools, the
  user's) are gone, and a lock one of them held stays held forever. So the child never
  touches the kernel's ZMQ sockets, streams or thread pools: it opens its own
  :class:`ImageStore` (whose I/O threads it starts itself), sends its output to a log
  file rather than to the notebook, reports through a result file and leaves with
  ``os._exit``. An alarm kills a child that blocks on a lock it inherited held; the
  server then reports that the autosave failed and why.
- A user thread that ran at the fork is captured as it was at that instant (between
  two bytecodes: the fork happens with the GIL held); the threads alive are reported.
- A GPU context. CUDA cannot be used in a forked child. So torch's device state is
  copied to host memory first, while the kernel is held (a stall of about its size over
  the device-to-host bandwidth: :mod:`jupyter_ckpt.image.hostcopy`), and the child
  writes those copies; it sees no device but them. The kernel saves in the kernel
  instead (a blocking save, whose stall and reason are reported) when another
  framework's context is open (the process holds a ``/dev/nvidia<N>`` without torch's
  CUDA) or imported, when a device tensor is one only torch's own reduce can read, or
  when host memory does not allow the copies (see :func:`memory_blocker`).
- Memory. Every page the parent writes during the save is copied, up to the whole
  state, and the copies count against the pod's or container's memory limit (its
  cgroup), not only the node's: an autosave is skipped (a GPU kernel's is saved in the
  kernel), with the reason and the limit that applied, when the free memory is below
  the state's size (plus the host copies of the GPU state).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from typing import Any

import psutil

from ..gpu import nvidia_device_open
from ..image import devices, hostcopy
from ..store import ImageStore
from .activity import user_threads
from .summary import failure, newest_manifest, summarize_save, unsaveable_ids

# Seconds a child may run before its alarm kills it (the server gives up at its own
# checkpoint_timeout, which it passes in).
DEFAULT_CHILD_TIMEOUT = 600
# The child yields the CPU to the kernel: a cell the user runs meanwhile comes first.
CHILD_NICENESS = 10
# The child's process name (Linux's comm): the server's idle check tells it from the
# user's own forks of the kernel, which are work.
AUTOSAVE_PROCESS_NAME = "ckpt-autosave"


@dataclass
class Job:
    """One forked autosave: its child and where the child reports."""

    pid: int
    directory: str
    started: float
    threads: list[str]
    # the providers its image leaves out, as they were at the fork (see KernelSession)
    untouched: dict[str, bytes]

    @property
    def result_path(self) -> str:
        return os.path.join(self.directory, "result.json")

    @property
    def log_path(self) -> str:
        return os.path.join(self.directory, "child.log")


_job: Job | None = None

# a background save's temporary directory, and the file in it naming the kernel's pid
DIRECTORY_PREFIX = "ckpt-autosave-"
OWNER_FILE = "kernel.pid"


def stale_directories(root: str | None = None) -> list[str]:
    """Temporary directories of background saves whose kernel is gone (killed, crashed or
    shut down before it reaped its child): nobody else removes them."""
    root = root or tempfile.gettempdir()
    stale = []
    for entry in os.scandir(root):
        if not entry.name.startswith(DIRECTORY_PREFIX) or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            with open(os.path.join(entry.path, OWNER_FILE)) as f:
                owner = int(f.read())
        except (OSError, ValueError):  # not yet written, or written by an older version
            owner = None
        if owner is None:
            with contextlib.suppress(OSError):
                if time.time() - entry.stat().st_mtime > 60:
                    stale.append(entry.path)
        elif not psutil.pid_exists(owner):
            stale.append(entry.path)
    return stale


def fork_blocker(proc_root: str = "/proc") -> str | None:
    """Why the state cannot be written from a forked child, or None."""
    if not hasattr(os, "fork"):
        return "this platform has no fork()"
    if devices.device_ops.cuda_initialized():
        return "CUDA is initialized in the kernel and a forked child cannot use it"
    device = nvidia_device_open(os.getpid(), proc_root)
    if device is not None:
        return f"the kernel has a CUDA context ({device} is open) and a forked child cannot use it"
    return None


def free_memory(root: str = "/") -> tuple[int, str]:
    """Bytes a forked child's copied pages may take before something is killed, and whose
    limit that is: the node's available memory, or less where a memory cgroup of this
    process (a pod's or container's limit, or one of its parents') leaves less room."""
    free, limit = psutil.virtual_memory().available, "the node's available memory"
    try:
        with open(os.path.join(root, "proc/self/cgroup")) as f:
            lines = f.read().splitlines()
    except OSError:
        return free, limit
    for line in lines:
        _, controllers, path = line.split(":", 2) if line.count(":") >= 2 else ("", "-", "")
        if not controllers:  # v2: the unified hierarchy
            base = os.path.join(root, "sys/fs/cgroup")
            names = ("memory.max", "memory.current")
        elif "memory" in controllers.split(","):  # v1: the memory controller's own
            base = os.path.join(root, "sys/fs/cgroup/memory")
            names = ("memory.limit_in_bytes", "memory.usage_in_bytes")
        else:
            continue
        # up to the hierarchy's root, which is the container's own where the path names
        # a host cgroup the container does not see
        directory = os.path.normpath(os.path.join(base, path.lstrip("/")))
        while directory.startswith(base):
            try:
                with open(os.path.join(directory, names[0])) as f:
                    maximum = f.read().strip()
                with open(os.path.join(directory, names[1])) as f:
                    room = int(maximum) - int(f.read()) if maximum != "max" else free
            except (OSError, ValueError):
                room = free
            if room < free:
                free, limit = max(room, 0), "the room left under the pod's/container's memory limit"
            directory = os.path.dirname(directory)
    return free, limit


def state_bytes(session: Any) -> int:
    """What the child may come to hold in copied pages: the host part of the last image
    when the session wrote or restored one, else the kernel's resident memory."""
    if session.last_bytes:
        return int(session.last_bytes)
    return int(psutil.Process().memory_info().rss)


def start(session: Any, name: str, timeout: float = DEFAULT_CHILD_TIMEOUT) -> dict[str, Any]:
    """Start an autosave and return at once: ``{"state": "started", "result": path,
    "pid": ..., "stall": ...}`` for a forked child, ``{"state": "done", ...}`` for a
    blocking save (with the stall), or ``{"state": "skipped", "reason": ...}``."""
    global _job
    collect(session)
    if _job is not None:
        return {"state": "skipped", "reason": "an autosave is already running"}
    started = time.perf_counter()
    blocker = fork_blocker()
    storages: list[tuple[str, Any]] = []
    if blocker is not None and hasattr(os, "fork") and devices.device_ops.cuda_initialized():
        storages, blocker = hostcopy.device_storages(devices.device_ops)
    found = time.perf_counter()
    if blocker is None:
        blocker = memory_blocker(session, sum(s.nbytes() for _, s in storages))
        if blocker is not None and not storages:
            return {"state": "skipped", "reason": blocker}
    if blocker is not None:
        summary = session.save(verify=True, trigger="autosave")  # named by default
        stall = time.perf_counter() - started
        return {"state": "done", "mode": "blocking", "reason": blocker, "stall": stall, **summary}
    copies = hostcopy.copy_to_host(storages, devices.device_ops, session.store.buffer_bytes)
    copied = time.perf_counter()
    directory = tempfile.mkdtemp(prefix=DIRECTORY_PREFIX)
    with open(os.path.join(directory, OWNER_FILE), "w") as f:
        f.write(str(os.getpid()))
    threads = user_threads()  # user threads: saved as they were at the fork
    states = session.process_states()  # the kernel's: the child's random is reseeded
    untouched = session.untouched_after(states)
    forking = time.perf_counter()
    gc.freeze()  # the child's collector must not write every object's page
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # "multi-threaded fork"
            pid = os.fork()
        if pid == 0:
            _child(session, name, directory, timeout, copies, states)  # never returns
    finally:
        gc.unfreeze()
    del copies  # the child's now: the kernel's pages of them go back
    _job = Job(
        pid=pid, directory=directory, started=time.time(), threads=threads, untouched=untouched
    )
    return {
        "state": "started",
        "mode": "fork",
        "pid": pid,
        "result": _job.result_path,
        "log": _job.log_path,
        "fork_seconds": time.perf_counter() - forking,
        "stall": time.perf_counter() - started,
        "copy_bytes": sum(s.nbytes() for _, s in storages),
        "find_seconds": found - started,  # of the device storages, before the copy
        "copy_seconds": copied - found,
        "threads_at_fork": threads,
    }


def memory_blocker(session: Any, copy_bytes: int) -> str | None:
    """Why host memory does not allow a forked save, or None. The rule: the free memory
    (see :func:`free_memory`) must hold the host copies of the device state plus the
    state's size, which copy-on-write may come to duplicate while the child writes."""
    state = state_bytes(session)
    free, limit = free_memory()
    if free >= state + copy_bytes:
        return None
    copies = f"the host copies of the GPU state ({_mib(copy_bytes)}) plus " if copy_bytes else ""
    return (
        f"free memory ({_mib(free)}, {limit}) is below {copies}the state's size "
        f"({_mib(state)}), which a forked save may have to copy"
    )


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.1f} MiB"


def _child(
    session: Any,
    name: str,
    directory: str,
    timeout: float,
    copies: dict[int, Any],
    states: tuple[dict[str, Any], dict[str, str]],
) -> None:
    """Write the image and leave. Runs in the forked child only; its device is the host
    ``copies`` made before the fork."""
    status = 1
    try:
        devices.device_ops = hostcopy.CopiedDeviceOps(copies, devices.device_ops)
        _name_process(AUTOSAVE_PROCESS_NAME)
        gc.disable()
        os.nice(CHILD_NICENESS)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # an interrupt is for the kernel
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(max(1, int(timeout)))
        log = os.open(os.path.join(directory, "child.log"), os.O_WRONLY | os.O_CREAT, 0o600)
        os.dup2(log, 1)
        os.dup2(log, 2)
        # the kernel's sys.stdout/stderr publish on IOPub through a thread the child lacks
        sys.stdout = sys.stderr = open(log, "w", closefd=False)  # noqa: SIM115
        result = _save(session, name, states)
        tmp = os.path.join(directory, "result.json.tmp")
        with open(tmp, "w") as f:
            json.dump(result, f)
        os.replace(tmp, os.path.join(directory, "result.json"))
        status = 0
    finally:
        os._exit(status)


def _name_process(name: str) -> None:
    """Set this process's name where the platform allows (Linux: prctl PR_SET_NAME)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(15, name.encode(), 0, 0, 0)


def _save(session: Any, name: str, states: tuple[dict[str, Any], dict[str, str]]) -> dict[str, Any]:
    started = time.perf_counter()
    try:
        store = ImageStore(config=session.shell.config)  # its own I/O threads
        newest = newest_manifest(store, session.last_image)
        manifest = session.capture(
            store,
            store.writer(),
            name=name,
            verify=True,  # the child's own copy of the state: the kernel does not wait
            trigger="autosave",
            newest=newest,
            states=states,
        )
    except Exception as exc:
        return failure(exc)
    summary = summarize_save(manifest, time.perf_counter() - started)
    return {**summary, "unsaveable_ids": unsaveable_ids(manifest, session.shell.user_ns)}


def collect(session: Any) -> dict[str, Any]:
    """The running autosave's outcome once its child has exited (reaping it): the
    image becomes the parent of the next one. ``{"state": "running"}`` meanwhile,
    ``{"state": "none"}`` when there is none."""
    global _job
    job = _job
    if job is None:
        return {"state": "none"}
    pid, status = os.waitpid(job.pid, os.WNOHANG)
    if pid == 0:
        return {"state": "running", "seconds": time.time() - job.started}
    _job = None
    try:
        result = read_result(job.result_path, job.log_path, os.waitstatus_to_exitcode(status))
    finally:
        shutil.rmtree(job.directory, ignore_errors=True)
    if not result.get("error"):
        session.last_image = result["id"]
        session.last_bytes = result["host_bytes"]
        session.untouched = job.untouched
        # ids from the child's copy of the state, the parent's at the fork
        session.unsaveable = {k: int(v) for k, v in result.get("unsaveable_ids", {}).items()}
    return {"state": "done", "mode": "fork", **result}


def read_result(result_path: str, log_path: str, exit_code: int | None) -> dict[str, Any]:
    """The child's summary, or ``{"error": why}`` naming how it ended and its last output.
    The server reads the same file, without the kernel, to learn that the child finished."""
    try:
        with open(result_path) as f:
            return json.load(f)
    except (OSError, ValueError):
        pass
    if exit_code is not None and exit_code < 0 and -exit_code == signal.SIGALRM:
        how = "was stopped by its time limit (a lock held by a thread at the fork?)"
    elif exit_code is not None and exit_code < 0:
        how = f"was killed by signal {signal.Signals(-exit_code).name}"
    else:
        how = f"exited with status {exit_code} without a result"
    try:
        with open(log_path, errors="replace") as f:
            tail = f.read()[-2000:].strip()
    except OSError:
        tail = ""
    return {"error": f"the autosave process {how}" + (f": {tail}" if tail else "")}
