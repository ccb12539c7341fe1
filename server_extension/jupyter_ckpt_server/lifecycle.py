"""One owner for each kernel's lifecycle: its state, its record and the pins on its images.

**The invariant.** At every instant, for every kernel that ran a cell, a new server on the
same store brings back a state at least as new as that kernel's newest committed image
(checkpoint, autosave or suspend), and no retention, delete, rekey or gc removes an image
that a record names. Only the user's own shutdown (or restart) drops a kernel's record.

How it holds: :class:`Lifecycles` is the only code that writes or removes a kernel record
(``kernels/<id>.json``) and the only code that changes a kernel's ckpt state. A record is
replaced by a single atomic put, never removed and rewritten, and its in-memory copy
changes only once the put succeeded, so a failed write leaves the previous record, and
the image it pins, in force. Every external entry point (the kernels and sessions API
through :class:`~.kernelmanager.CkptKernelManager`, the websocket, the idle monitor, the
autosave scheduler, the stop guard, suspend-all, resume, delete, retention) calls in
here; this module calls the kernel (``rpc``), the store, the background saver and the
kernel manager's process primitives, and nothing calls back into it through a slot.
One kernel's transitions are serialized by its lock. A restore hands the kernel to the
client whose cell woke it before the record is written (the put follows under the lock).

Three rules keep the invariant where paths meet:

- **A pin lasts until a newer state is committed.** An image that holds a user's state
  stays pinned until a newer state of that kernel is committed and verified: an image
  that came from it (its ``parent`` chain leads to it). A failed restore is not a newer
  state, nor is what the kernel holds without it: while the kernel is ``restore-failed``
  every record it writes (autosave, checkpoint, suspend, stop) restores that image and
  keeps (``keeps``) the kernel's own newest image beside it (:meth:`Lifecycles._keeping`).
  A store that cannot be reached during a restore is waited for while the cell waits.
- **A cancelled write never lands later.** A record put or removal runs to its end on its
  thread; a task cancelled meanwhile stops once it has (:func:`_to_the_end`).
- **A message accepted for a kernel reaches the process that answers it, or the suspend
  aborts.** A websocket opened during a suspend is never attached to the process being
  suspended, and a message on a socket the suspend closed goes to the restored kernel
  (:mod:`.websocket`).

States and the events that move a kernel (``TRANSITIONS``; events that leave the state
as it is, such as a cell, a checkpoint or an interrupt, are not listed):

==============  ============================  ==============  =============================
state           event                         next            its record in the store
==============  ============================  ==============  =============================
(none)          start                         running         none yet
running         autosave tick                 autosaving      (unchanged)
restore-failed  autosave tick                 autosaving      (unchanged)
autosaving      autosave done or failed       running         running -> the new autosave
autosaving      done, image not restored      restore-failed  the image, keeping the new one
restore-failed  newer state of the image      running         running -> the newer image
running         suspend (idle, api, stop)     suspending      (unchanged)
restore-failed  suspend                       suspending      (unchanged)
suspending      committed                     suspended       suspended -> the new image
                                                              (restore-failed: the image it
                                                              failed on, keeping the new one)
suspending      failed or aborted             running         (unchanged)
suspended       first message, connect        restoring       (unchanged)
restoring       restored                      running         running -> the image
restoring       restore failed                restore-failed  (unchanged: pins the image)
(none)          crash found at start          suspended       running, marked recovered
any             restart by the user           running         removed: the state is given up
any             shutdown by the user          gone            removed
any             shutdown by a server stop     gone            kept: recoverable next start
==============  ============================  ==============  =============================

A save that finds the kernel's state unchanged since its newest image writes none (see
:mod:`jupyter_ckpt.image.identity`): the transition names that image instead of a new one.

A shutdown, restart or client message during a suspend aborts it at its next step; a
shutdown or restart during a restore makes it skip its image; an autosave in progress is
cancelled by a shutdown or restart, and waited for (within the deadline) by a suspend.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import enum
import json
import os
import posixpath
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from jupyter_client.session import Session
from jupyter_core.utils import ensure_async

from jupyter_ckpt import compat
from jupyter_ckpt.errors import (
    CkptError,
    GpuUnavailable,
    IncompatibleImage,
    StoreError,
    StoreUnavailable,
)
from jupyter_ckpt.gpu import image_device_bytes
from jupyter_ckpt.kernel import summarize_save
from jupyter_ckpt.kernel.state import NOTEBOOK_ID_ENV
from jupyter_ckpt.store import ImageStore

from . import kernelprocess
from .backoff import backoff
from .events import Events, now_iso
from .policy import SuspendPolicy
from .progress import ProgressWatch
from .readahead import readahead
from .recovery import recovered_field, recovery_message, server_identity, writer_alive
from .rpc import Aborted, KernelRPC, NothingToSave, StoreFailed, SuspendFailed
from .standby import Standby
from .timeline import Timeline

# how often at most a running record is rewritten with the cells run since its image
RECORD_REFRESH_SECONDS = 5.0
# how long the server waits for a started kernel's first message before it hands the
# kernel out all the same (it is slow, not stuck: see kernelprocess), and how often kernel
# info is asked for meanwhile
JOIN_TIMEOUT = 300.0
JOIN_NUDGE_SECONDS = 0.5
# how long a started kernel may say nothing before the server looks at who holds its
# ports, and how many processes it starts at most when one cannot answer
SILENT_AFTER = 10.0
START_ATTEMPTS = 3
# how long a restore's event waits for its clients' queued messages to be delivered (a
# client that closed meanwhile never reports it)
DELIVERY_WAIT = 5.0
# the first and the longest wait between two tries of a restore whose store did not answer
RESTORE_RETRY_FIRST = 1.0
RESTORE_RETRY_MAX = 15.0
# how long a suspend waits for the kernel's debugger to describe itself (it is optional)
DEBUG_INFO_TIMEOUT = 5.0
# the end of the topic ipykernel publishes status messages under (kernel.<id>.status): two
# of every request's messages, our own silent calls' included, and never a cell's input
_STATUS_TOPIC = b".status"

# The id of the kernel that a restore is starting in the current task. jupyter_server and
# jupyter_client refuse to start a kernel with an id that is already ``in`` the manager;
# only the restoring task must see the suspended id as free, while every other task (a
# session listing polled during the restore) must still see the kernel.
restoring: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "jupyter_ckpt_restoring", default=None
)


def _record_stale(lc: KernelLifecycle) -> bool:
    """Whether the kernel's running record misses cells it ran since its image."""
    record = lc.record
    return (
        record is not None
        and record.get("state") == "running"
        and record.get("cells_after", []) != lc.executed
    )


async def _to_the_end(work: Callable[[], None]) -> bool:
    """Run a store write on a thread to its end, whatever happens to the task that asked
    for it; whether that task was cancelled meanwhile (it must then stop, once it has
    taken the write's outcome into account).

    A thread cannot be stopped: a write whose awaiting task were cancelled would still
    land, later, after whatever followed the cancel (a shutdown's removal of the record, a
    suspend's record), and undo it. So the cancel waits for the write instead."""
    job = asyncio.ensure_future(asyncio.to_thread(work))
    cancelled = False
    while not job.done():
        try:
            await asyncio.shield(job)
        except asyncio.CancelledError:
            cancelled = cancelled or not job.done()
        except Exception:
            break  # the write failed: the caller reads it from the job
    job.result()
    return cancelled


def _store_unreachable(exc: SuspendFailed) -> bool:
    """Whether a kernel call failed because the store could not be reached: worth
    another try."""
    return isinstance(exc, StoreFailed) and exc.kind == StoreUnavailable.__name__


async def _until(condition: Callable[[], bool], timeout: float) -> None:
    """Wait for ``condition``, which no event announces (the server's own view of a
    kernel); asyncio.TimeoutError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise asyncio.TimeoutError
        await asyncio.sleep(0.01)


class State(str, enum.Enum):
    RUNNING = "running"
    AUTOSAVING = "autosaving"
    SUSPENDING = "suspending"
    SUSPENDED = "suspended"
    RESTORING = "restoring"
    RESTORE_FAILED = "restore-failed"
    GONE = "gone"


S = State
TRANSITIONS: dict[tuple[State, str], State] = {
    (S.RUNNING, "autosave"): S.AUTOSAVING,
    (S.RESTORE_FAILED, "autosave"): S.AUTOSAVING,
    (S.AUTOSAVING, "autosaved"): S.RUNNING,
    (S.AUTOSAVING, "autosaved, unrestored"): S.RESTORE_FAILED,
    (S.RESTORE_FAILED, "newer state"): S.RUNNING,
    (S.RUNNING, "suspend"): S.SUSPENDING,
    (S.RESTORE_FAILED, "suspend"): S.SUSPENDING,
    (S.SUSPENDING, "committed"): S.SUSPENDED,
    (S.SUSPENDING, "failed"): S.RUNNING,
    (S.SUSPENDED, "restore"): S.RESTORING,
    (S.RESTORING, "restored"): S.RUNNING,
    (S.RESTORING, "restore-failed"): S.RESTORE_FAILED,
    **{(s, "restart"): S.RUNNING for s in State if s is not S.GONE},
    **{(s, "shutdown"): S.GONE for s in State},
}

# what a kernels-API action tells a suspend or restore in progress
_ACTIONS = {
    "shutdown": "the kernel was shut down",
    "restart": "the kernel was restarted",
    "interrupt": "the kernel was interrupted",
}

# the trigger an image is labelled with, by what asked a suspend for it
_SUSPEND_LABELS = {"api": "manual", "idle": "idle", "shutdown": "shutdown", "demand": "demand"}


def _describe_lost(lost: dict[str, str]) -> str:
    return "; ".join(f"{name} ({why})" for name, why in lost.items())


class InvalidTransition(CkptError):
    """An event that the kernel's state does not allow (a bug, not a user error)."""


@dataclass
class KernelLifecycle:
    """One kernel: its state, its record as the store holds it, and what runs on it."""

    kernel_id: str
    state: State
    record: dict[str, Any] | None = None  # the record in the store, as last put or read
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    abort: str | None = None  # why the suspend or restore in progress must stop
    launch: dict[str, Any] = field(default_factory=dict)  # kernel name, path, environment
    recovered: dict[str, Any] | None = None  # a crashed kernel found at start
    restore_error: str | None = None
    # the image its restore failed on, while it holds no state that came from it: every
    # record of the kernel keeps that image (see Lifecycles._keeping)
    unrestored: str | None = None
    autosave_image: str | None = None  # its last autosave: replaced by the next one
    executed: list[int] = field(default_factory=list)  # cells run since the record's image
    cells: int = 0  # cells any client ran (execute_input seen on iopub)
    messages: int = 0  # messages clients sent it on websockets
    suspend_task: asyncio.Task[dict[str, Any]] | None = None  # shared by its callers
    restore_task: asyncio.Task[dict[str, Any]] | None = None  # shared by its callers
    gpu_wait: asyncio.Future[bool] | None = None  # its wait for GPU memory (see .demand)
    # set once the restored kernel holds its state, before its record is written
    restore_ready: asyncio.Future[dict[str, Any]] | None = None
    timeline: Timeline | None = None  # the steps of the restore in progress
    delivered: asyncio.Event = field(default_factory=asyncio.Event)  # see Lifecycles.delivered
    autosave: asyncio.Task[Any] | None = None  # the autosave in progress
    stream: Any = None  # the server's own iopub subscription
    joined: asyncio.Event = field(default_factory=asyncio.Event)
    kernel_info: dict[str, Any] | None = None
    debug_info: dict[str, Any] | None = None  # its debugger's facts, saved at suspend
    refresh: asyncio.Task[None] | None = None
    refreshed_at: float = 0.0
    # the record a checkpoint's record replaced: put back if the user deletes that image
    before_checkpoint: dict[str, Any] | None = None

    def move(self, event: str) -> None:
        nxt = TRANSITIONS.get((self.state, event))
        if nxt is None:
            raise InvalidTransition(f"kernel {self.kernel_id}: no {event!r} from {self.state}")
        self.state = nxt

    @property
    def saves_itself(self) -> bool:
        """Whether it is autosaved: it runs (with the state it came back with, or
        without the one its restore failed on: what it holds since is kept too)."""
        return self.state in (S.RUNNING, S.RESTORE_FAILED)

    def records_name(self, image_id: str) -> bool:
        """Whether its record names (or keeps) ``image_id``."""
        record = self.record or {}
        return image_id == record.get("image_id") or image_id in record.get("keeps", [])

    @property
    def has_process(self) -> bool:
        return self.state not in (S.SUSPENDED, S.GONE)

    def model_field(self) -> dict[str, Any]:
        """The kernel model's ``ckpt`` field."""
        if self.state in (S.SUSPENDED, S.RESTORING) and self.record is not None:
            field_ = {
                "state": self.state.value,
                "image": self.record["image_id"],
                "suspended_at": self.record["suspended_at"],
                "gpu_bytes": self.record.get("gpu", {}).get("bytes", 0),
            }
            if self.recovered is not None:
                field_["recovered"] = self.recovered
            return field_
        if self.state is S.RESTORE_FAILED and self.record is not None:
            return {
                "state": "restore-failed",
                "image": self.record["image_id"],
                "suspended_at": self.record["suspended_at"],
                "error": self.restore_error,
            }
        if self.state is S.SUSPENDING:
            return {"state": "suspending"}
        return {"state": "running"}


class Lifecycles:
    """Every kernel's :class:`KernelLifecycle`, and the transitions between its states."""

    def __init__(
        self,
        *,
        kernel_manager: Any,
        store: ImageStore,
        policy: SuspendPolicy,
        rpc: KernelRPC,
        events: Events,
        progress: ProgressWatch,
        saver: Any,
        session_manager: Any,
        node: Callable[[], dict[str, Any]],
        gpu_release_timeout: float,
        log: Any,
    ) -> None:
        self.km = kernel_manager
        self.store = store
        self.records = store.records
        self.policy = policy
        self.rpc = rpc
        self.events = events
        self.progress = progress
        self.saver = saver
        self.session_manager = session_manager
        self.node = node
        self.gpu_release_timeout = gpu_release_timeout
        self.log = log
        self.kernels: dict[str, KernelLifecycle] = {}
        # ids the user shut down: never started again, so a stale client cannot bring an
        # empty kernel back under an id whose notebook expects its state
        self.gone: set[str] = set()
        self.stopping = False  # the server is stopping: kernels shut down keep their record
        self.identity = server_identity()
        # async callable(step, kernel_id), awaited before each awaited step of a suspend
        # and a restore: widens each window for fault-injection tests
        self.step_hook: Callable[[str, str], Awaitable[None]] | None = None
        # awaited before an image's state goes back into a kernel, with the kernel's id and
        # the GPU memory the image held per device: waits for that memory (see .demand;
        # True if it asked for any), or raises CkptError saying why not
        self.gpu_gate: Callable[[str, dict[str, int]], Awaitable[bool]] | None = None
        self.restore_count = 0
        self._resumes: dict[str, tuple[str, asyncio.Task[dict[str, Any]]]] = {}
        self._tasks: set[asyncio.Future[Any]] = set()  # see _background
        self.standby = Standby(kernel_manager, rpc, log)

    # -- lookups ----------------------------------------------------------------------------

    def __getitem__(self, kernel_id: str) -> KernelLifecycle:
        return self.kernels[kernel_id]

    def get(self, kernel_id: str) -> KernelLifecycle | None:
        return self.kernels.get(kernel_id)

    def state(self, kernel_id: str) -> State | None:
        lc = self.kernels.get(kernel_id)
        return None if lc is None else lc.state

    def in_state(self, *states: State) -> list[KernelLifecycle]:
        return [lc for lc in list(self.kernels.values()) if lc.state in states]

    def is_suspended(self, kernel_id: str) -> bool:
        """Listed and served as suspended: from the moment its image is committed, while
        the old process is still shutting down (clients reconnecting then must not attach
        to a dying kernel), until a restore has started the new process."""
        lc = self.kernels.get(kernel_id)
        if lc is None:
            return False
        return lc.state is S.SUSPENDED or (
            lc.state is S.RESTORING and not self.km.has_process(kernel_id)
        )

    def holds_sockets(self, kernel_id: str) -> bool:
        """Whether a new websocket to the kernel is served without its process (see
        :mod:`.websocket`): while it is suspended, and while a suspend is under way, whose
        end decides which process answers the socket's messages. A socket attached to the
        process being suspended could send a cell that reaches it after the suspend's last
        check, just before it is stopped: that cell would be lost."""
        lc = self.kernels.get(kernel_id)
        return lc is not None and (lc.state is S.SUSPENDING or self.is_suspended(kernel_id))

    async def suspend_ended(self, kernel_id: str) -> None:
        """Once the suspend under way, if any, has committed or failed."""
        lc = self.kernels.get(kernel_id)
        task = None if lc is None else lc.suspend_task
        if task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.shield(task)

    def pinned(self) -> dict[str, dict[str, str]]:
        """Image id -> the kernel whose record names it and how (what GET /images shows).
        A checkpoint the user took stays theirs to delete (:meth:`release_checkpoint`)."""
        pins = {}
        for lc in list(self.kernels.values()):
            if lc.record is None or lc.record.get("trigger") == "checkpoint":
                continue
            how = {
                S.SUSPENDED: "suspended",
                S.RESTORING: "suspended",
                S.RESTORE_FAILED: "restore-failed",
            }.get(lc.state, "autosave")
            pins[lc.record["image_id"]] = {"state": how, "kernel_id": lc.kernel_id}
            for kept in lc.record.get("keeps", []):
                pins[kept] = {"state": "restore-failed", "kernel_id": lc.kernel_id}
        return pins

    def running_from(self) -> dict[str, list[str]]:
        """Image id -> the running kernels whose record names it: the image each runs
        from (restored or resumed from, or last saved, unchanged since or not)."""
        images: dict[str, list[str]] = {}
        for lc in list(self.kernels.values()):
            record = lc.record
            if lc.state not in (S.RUNNING, S.AUTOSAVING) or record is None:
                continue
            if record.get("state") == "running" and record.get("image_id"):
                images.setdefault(record["image_id"], []).append(lc.kernel_id)
        return images

    async def _step(self, step: str, kernel_id: str) -> None:
        if self.step_hook is not None:
            await self.step_hook(step, kernel_id)

    def _check(self, lc: KernelLifecycle) -> None:
        if lc.abort is not None:
            raise Aborted(lc.abort)

    # -- records: the only writes ------------------------------------------------------------

    async def _put(self, lc: KernelLifecycle, record: dict[str, Any]) -> None:
        """Replace the kernel's record; the in-memory copy follows only a committed put.
        A caller cancelled meanwhile is cancelled once the put has landed (or failed):
        a cancelled write never lands later (see :func:`_to_the_end`)."""
        record, newer = await self._keeping(lc, record)
        cancelled = await _to_the_end(lambda: self.records.put(record))
        lc.record = record
        if newer:  # the kernel holds a state that came from the image it failed on
            lc.unrestored = lc.restore_error = None
            if lc.state is S.RESTORE_FAILED:
                lc.move("newer state")
        if record.get("trigger") != "checkpoint":
            lc.before_checkpoint = None
        self._schedule_refresh(lc)  # cells that ran while it was written
        if cancelled:
            raise asyncio.CancelledError

    async def _keeping(
        self, lc: KernelLifecycle, record: dict[str, Any]
    ) -> tuple[dict[str, Any], bool]:
        """The record to put for ``record``, and whether its image is a newer state of the
        image the kernel's restore failed on.

        A failed restore is not a newer state, and neither is what the kernel does without
        that state: until an image that came from it (the user restored it with ``%ckpt
        restore``, then saved) is recorded, every record of the kernel still restores it,
        and keeps (pins) the kernel's own newest image beside it, so neither is lost."""
        unrestored = lc.unrestored
        image_id = record["image_id"]
        if unrestored is None or image_id == unrestored:
            return record, False
        if await asyncio.to_thread(self._descends, image_id, unrestored):
            return {k: v for k, v in record.items() if k != "keeps"}, True
        earlier = (lc.record or {}).get("keeps", [])
        keeps = [image_id, *(k for k in earlier if k not in (image_id, lc.autosave_image))]
        return {**record, "image_id": unrestored, "keeps": keeps}, False

    def _descends(self, image_id: str, ancestor: str) -> bool:
        """Whether image ``image_id`` holds a state that came from ``ancestor``: it is
        that image, or its parents (the image each save came from) lead to it."""
        seen: set[str] = set()
        current: str | None = image_id
        while current is not None and current not in seen:
            if current == ancestor:
                return True
            seen.add(current)
            try:
                current = self.store.load_manifest(current).get("parent")
            except CkptError:
                return False
        return False

    async def _drop(self, lc: KernelLifecycle) -> None:
        """Remove the kernel's record: only for a state its user gave up."""
        if lc.record is None:
            return
        try:
            cancelled = await _to_the_end(lambda: self.records.delete(lc.kernel_id))
        except FileNotFoundError:
            cancelled = False
        except (CkptError, OSError) as exc:
            self.log.warning("Could not remove the record of kernel %s: %s", lc.kernel_id, exc)
            return
        lc.record = None
        if cancelled:
            raise asyncio.CancelledError

    def _base_record(self, lc: KernelLifecycle, image_id: str) -> dict[str, Any]:
        kernel = self.km.get_kernel(lc.kernel_id)
        return {
            "kernel_id": lc.kernel_id,
            "kernel_name": kernel.kernel_name,
            "path": lc.launch.get("path"),
            "env": lc.launch.get("env", {}),
            "image_id": image_id,
            "kernel_info": lc.kernel_info,
            "debug_info": lc.debug_info,
            "last_activity": kernel.last_activity.isoformat(),
            "suspended_at": now_iso(),
            "server_name": os.environ.get("JUPYTERHUB_SERVER_NAME", ""),
        }

    async def _debug_info(
        self, kernel_id: str, info: dict[str, Any], deadline: float | None
    ) -> dict[str, Any] | None:
        """What the kernel's debugger says of itself (its ``debugInfo``), when it has one:
        JupyterLab asks for it on every connect, and a suspended kernel answers from it
        (see :mod:`.websocket`) rather than leave the question waiting for a restore."""
        if not (info.get("debugger") or "debugger" in info.get("supported_features", [])):
            return None  # (protocol 5.5 lists it among the supported features)
        try:
            reply = await self.rpc.request(
                kernel_id,
                "debug",
                min(DEBUG_INFO_TIMEOUT, self._timeout(deadline)),
                channel="control",
                type="request",
                seq=0,
                command="debugInfo",
                arguments={},
            )
        except SuspendFailed as exc:
            self.log.info("No debugger facts from kernel %s: %s", kernel_id, exc)
            return None
        return reply.get("body") if reply.get("success") else None

    async def _running_record(
        self, lc: KernelLifecycle, summary: dict[str, Any], trigger: str, saved_at: str
    ) -> dict[str, Any]:
        count = summary.get("execution_count") or 0
        lc.executed = [n for n in lc.executed if n >= count]
        return {
            **self._base_record(lc, summary["id"]),
            "autosave_at": saved_at,
            "execution_count": count,
            "trigger": trigger,
            "gpu": self.rpc.gpu_usage(lc.kernel_id).to_json(),
            "lost": summary["lost"],
            "bytes": summary["bytes"],
            "written": summary.get("written", 0),
            "state": "running",
            "server": self.identity,
            "cells_after": list(lc.executed),
            "alive_at": now_iso(),
            "sessions": await self.sessions_of(lc.kernel_id),
        }

    def _schedule_refresh(self, lc: KernelLifecycle) -> None:
        """Rewrite the running record with the cells run since its image, at most every
        RECORD_REFRESH_SECONDS: a crash then names the cells whose effects are lost."""
        if lc.refresh is None and _record_stale(lc):
            lc.refresh = asyncio.ensure_future(self._refresh(lc))

    async def _refresh(self, lc: KernelLifecycle) -> None:
        """Until the record lists every cell: a cell that runs while a record is being
        written (this one's, or the restore's that replaces the suspended record) is
        listed by the next round, not lost."""
        try:
            while _record_stale(lc):
                await asyncio.sleep(lc.refreshed_at + RECORD_REFRESH_SECONDS - time.monotonic())
                async with lc.lock:
                    if lc.state is not S.RUNNING or not _record_stale(lc):
                        return
                    assert lc.record is not None
                    record = {**lc.record, "cells_after": list(lc.executed), "alive_at": now_iso()}
                    lc.refreshed_at = time.monotonic()
                    await self._put(lc, record)
        except (CkptError, OSError) as exc:
            self.log.warning("Could not update the record of kernel %s: %s", lc.kernel_id, exc)
        finally:
            lc.refresh = None

    # -- a kernel process starts -------------------------------------------------------------

    def refuse_gone(self, kernel_id: str | None) -> None:
        if kernel_id is not None and kernel_id in self.gone:
            raise SuspendFailed(
                f"kernel {kernel_id} was shut down and its state given up; its images are "
                "kept: resume one from the saved sessions instead"
            )

    def watch(self, kernel_id: str, start: bool) -> None:
        """Follow a started kernel's ``execute_input`` messages on the server's own iopub
        subscription (stop on False): the cells run since its last image, and whether a
        client ran one during a suspend."""
        if not start:
            self.rpc.release(kernel_id)  # the process stops: so do our streams to it
        lc = self.kernels.get(kernel_id)
        if lc is None and not start:
            return
        if lc is None:
            lc = self.kernels[kernel_id] = KernelLifecycle(kernel_id, S.RUNNING)
        if lc.stream is not None and not lc.stream.closed():
            lc.stream.close()
        lc.stream = None
        if not start:
            return
        lc.joined = asyncio.Event()
        kernel = self.km.get_kernel(kernel_id)
        stream = lc.stream = kernel.connect_iopub()
        session = Session(config=kernel.session.config, key=kernel.session.key)

        def on_iopub(msg_list: list[bytes]) -> None:
            lc.joined.set()
            if msg_list[0].endswith(_STATUS_TOPIC):
                return  # ipykernel names each message's type in its topic: skip the parse
            _, parts = session.feed_identities(msg_list)
            msg = session.deserialize(parts, content=False)
            if msg["header"]["msg_type"] == "execute_input":
                lc.cells += 1
                lc.executed.append(json.loads(msg["content"])["execution_count"])
                self._schedule_refresh(lc)

        stream.on_recv(on_iopub)

    async def started(self, kernel_id: str, launch: dict[str, Any]) -> None:
        """A kernel process started (fresh, restarted, or for a restore): wait until the
        server's watch receives its messages before it is handed out; start the process
        again, on new ports, only on evidence that it cannot answer (see
        :mod:`.kernelprocess`: it holds no state yet, and every client would wait for it
        in vain). A silent process is slow: it is waited for, never killed."""
        lc = self.kernels.setdefault(kernel_id, KernelLifecycle(kernel_id, S.RUNNING))
        lc.launch = launch
        kernel = self.km.get_kernel(kernel_id)
        for attempt in range(1, START_ATTEMPTS + 1):
            problem = await self._join(lc, kernel)
            if problem is None:
                return
            if attempt == START_ATTEMPTS:
                break
            self.log.warning(
                "Kernel %s said nothing as it started: %s; starting it again", kernel_id, problem
            )
            self.km.stop_watching_activity(kernel_id)
            await ensure_async(kernel.restart_kernel(now=True, newports=True))
            self.km.start_watching_activity(kernel_id)
        self.log.warning("The server may miss the cells of kernel %s: %s", kernel_id, problem)

    async def _join(self, lc: KernelLifecycle, kernel: Any) -> str | None:
        """Wait until the server's watch has received the kernel's messages; what went
        wrong otherwise.

        A ZMQ subscriber misses what the kernel publishes before its subscription reaches
        the kernel (the "slow joiner"): a first cell run meanwhile would go unseen. As
        jupyter_server's websocket does, ask for kernel info until a message arrives; the
        reply is kept for the kernel's record. The server's own activity watch must have
        seen the kernel idle after it (not "starting", nor "busy" as jupyter_server 2.4
        shows for the kernel-info request): otherwise its state would change under a
        client between two requests, whenever the status came."""
        watched = kernelprocess.ports(kernel)
        begun = time.monotonic()

        def joined() -> bool:
            return lc.joined.is_set() and getattr(kernel, "execution_state", "") == "idle"

        while lc.stream is not None and not joined():
            waited = time.monotonic() - begun
            if waited > JOIN_TIMEOUT:  # slow, and handed out: its first cell may go unseen
                self.log.warning(
                    "Kernel %s said nothing within %.0f s; the server may miss its cells",
                    lc.kernel_id,
                    JOIN_TIMEOUT,
                )
                return None
            if problem := kernelprocess.cannot_answer(kernel, watched, waited > SILENT_AFTER):
                return problem
            # ask until the next look at its ports (each second once it has been silent)
            until_look = min(max(SILENT_AFTER - waited, 1.0), JOIN_TIMEOUT - waited)
            with contextlib.suppress(SuspendFailed):  # no answer yet, or its process exited
                lc.kernel_info = await self.rpc.request(lc.kernel_id, "kernel_info", until_look)
            with contextlib.suppress(asyncio.TimeoutError):
                await _until(joined, JOIN_NUDGE_SECONDS)
        return None

    def process_restarted(self, kernel_id: str) -> None:
        """The kernel's process died and was restarted automatically (an OOM kill): its
        state is lost, but its last autosave stays in the store as a saved image the
        user can resume; the fresh kernel's first autosave must not replace it."""
        lc = self.kernels.get(kernel_id)
        if lc is None or lc.autosave_image is None:
            return
        self.log.warning(
            "Kernel %s restarted after its process died; its last autosave %s is kept",
            kernel_id,
            lc.autosave_image,
        )
        lc.autosave_image = None

    # -- entry points from the kernels API ----------------------------------------------------

    async def settle(self, kernel_id: str, action: str) -> KernelLifecycle | None:
        """Before a kernels-API action: stop a suspend in progress at its next step (the
        kernel keeps running), make a restore skip its image on shutdown or restart, and
        cancel an autosave; wait for them, so the action applies to a settled state."""
        lc = self.kernels.get(kernel_id)
        if lc is None:
            return None
        why = _ACTIONS[action]
        if lc.state is S.SUSPENDING or (lc.state is S.RESTORING and action != "interrupt"):
            lc.abort = lc.abort or why
        if action != "interrupt":
            self.saver.cancel(kernel_id)
            if lc.autosave is not None:
                lc.autosave.cancel()
            if lc.gpu_wait is not None:  # a restore or resume waiting for GPU memory
                lc.gpu_wait.cancel()
        tasks = [lc.suspend_task, lc.restore_task]
        if action != "interrupt":
            tasks.append(lc.autosave)
        for task in tasks:
            if task is not None:
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await asyncio.shield(task)
        return lc

    async def shutdown(self, kernel_id: str) -> None:
        """The kernel is shut down: by its user (its record goes, the state is given up)
        or by a server stop (its record stays, so the next server brings it back)."""
        lc = await self.settle(kernel_id, "shutdown")
        if lc is None:
            return
        async with lc.lock:
            if not self.stopping:
                await self._drop(lc)
                self.gone.add(kernel_id)
            elif lc.record is not None and lc.record.get("state") == "running":
                await self._note_stop(lc)
            self._forget(lc)

    async def _note_stop(self, lc: KernelLifecycle) -> None:
        """The server stops a kernel it could not suspend: its running record stays, so
        the next server brings back its last image, and says when the stop came."""
        assert lc.record is not None
        record = {**lc.record, "cells_after": list(lc.executed), "stopped_at": now_iso()}
        try:
            await self._put(lc, record)
        except (CkptError, OSError) as exc:  # the record before it still names the image
            self.log.warning("Could not update the record of kernel %s: %s", lc.kernel_id, exc)

    async def restarted(self, kernel_id: str) -> None:
        """The user restarts the kernel: its state, and so its record, is given up."""
        lc = await self.settle(kernel_id, "restart")
        if lc is None:
            return
        async with lc.lock:
            await self._drop(lc)
            lc.move("restart")
            lc.recovered = lc.restore_error = lc.autosave_image = lc.unrestored = None
            lc.executed = []

    async def update_env(self, kernel_id: str, env: dict[str, str]) -> None:
        """A session of a suspended kernel moved (renamed notebook, changed kernel path):
        its record follows, so the restored kernel and its later images name the notebook."""
        lc = self.kernels.get(kernel_id)
        if lc is None or lc.record is None:
            return
        async with lc.lock:
            if lc.record is None:
                return
            lc.launch = {**lc.launch, "env": {**lc.launch.get("env", {}), **env}}
            record = {
                **lc.record,
                "env": {**lc.record.get("env", {}), **env},
                "sessions": await self.sessions_of(kernel_id) or lc.record.get("sessions", []),
            }
            try:
                await self._put(lc, record)
            except (CkptError, OSError) as exc:
                self.log.warning("Could not update the record of kernel %s: %s", kernel_id, exc)

    def _forget(self, lc: KernelLifecycle) -> None:
        lc.state = S.GONE
        self.saver.forget(lc.kernel_id)
        self.rpc.forget(lc.kernel_id)
        if lc.stream is not None and not lc.stream.closed():
            lc.stream.close()
        if lc.refresh is not None:
            lc.refresh.cancel()
        self.kernels.pop(lc.kernel_id, None)

    def client_message(self, kernel_id: str) -> None:
        """A client sent the kernel a message (any channel): a suspend in progress must not
        shut the kernel down, or the message would be lost."""
        lc = self.kernels.get(kernel_id)
        if lc is None:
            return
        lc.messages += 1
        if lc.state is S.SUSPENDING:
            lc.abort = lc.abort or "a client used the kernel while it was being suspended"

    # -- checkpoint ---------------------------------------------------------------------------

    def _timeout(self, deadline: float | None) -> float:
        """Seconds one step may take: the policy's, capped by the caller's deadline."""
        timeout = self.policy.checkpoint_timeout
        if deadline is not None:
            timeout = min(timeout, deadline - time.monotonic())
        if timeout <= 0:
            raise SuspendFailed("no time left before the deadline")
        return timeout

    @contextlib.asynccontextmanager
    async def _locked(self, lc: KernelLifecycle, deadline: float | None) -> AsyncIterator[None]:
        """Hold the kernel's lock; an autosave that holds it beyond the deadline is
        cancelled (its image is not needed: the caller writes a newer one)."""
        try:
            await asyncio.wait_for(lc.lock.acquire(), self._timeout(deadline))
        except asyncio.TimeoutError:
            if lc.autosave is None:
                raise SuspendFailed("another action on the kernel did not finish in time") from None
            self.saver.cancel(lc.kernel_id)
            lc.autosave.cancel()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.shield(lc.autosave)
            await lc.lock.acquire()
        try:
            yield
        finally:
            lc.lock.release()

    def _lifecycle(self, kernel_id: str) -> KernelLifecycle:
        lc = self.kernels.get(kernel_id)
        if lc is None or not self.km.has_process(kernel_id):
            raise NothingToSave(f"kernel {kernel_id} is not running")
        return lc

    async def checkpoint(
        self, kernel_id: str, name: str | None = None, trigger: str = "manual"
    ) -> dict[str, Any]:
        """Write an image now; the kernel keeps running. Without a name, a state identical
        to the kernel's newest image writes none: that image comes back, ``unchanged``.
        ``trigger``: the label of the image (``manual``: the user's Save Now)."""
        started = time.perf_counter()
        try:
            lc = self._lifecycle(kernel_id)
            async with self._locked(lc, None):
                if not lc.has_process:
                    raise SuspendFailed(f"kernel {kernel_id} is not running")
                summary = await self._write_image(kernel_id, name, self._timeout(None), trigger)
                if summary["id"] == lc.autosave_image:
                    # the user's save found the autosave's state: the next autosave must
                    # not remove the image this save returned
                    lc.autosave_image = None
                # recoverable from it at once, as from an autosave
                if lc.state in (S.RUNNING, S.RESTORE_FAILED):
                    await self._record_checkpoint(lc, summary)
        except SuspendFailed as exc:
            self.events.failure("checkpoint", kernel_id, "api", exc, started)
            raise
        self.events.event("checkpoint", kernel_id, "api", started, summary)
        return summary

    async def _record_checkpoint(self, lc: KernelLifecycle, summary: dict[str, Any]) -> None:
        kept = self._kept_trigger(lc, summary)
        if kept is not None:
            record = await self._running_record(lc, summary, kept, now_iso())
            try:
                await self._put(lc, record)
            except (CkptError, OSError) as exc:  # the record before it still names the image
                self.log.warning("Could not update the record of kernel %s: %s", lc.kernel_id, exc)
            return
        record = await self._running_record(lc, summary, "checkpoint", now_iso())
        previous = lc.record
        if previous is not None and previous.get("trigger") == "checkpoint":
            previous = lc.before_checkpoint
        try:
            await self._put(lc, record)
            lc.before_checkpoint = previous  # after the put: it clears it
        except (CkptError, OSError) as exc:  # the image is saved all the same
            self.log.warning("Could not record kernel %s: %s", lc.kernel_id, exc)

    @staticmethod
    def _kept_trigger(lc: KernelLifecycle, summary: dict[str, Any]) -> str | None:
        """For a save that found the state of the image the running record names: the
        record's trigger, which the record moved on to the cells run since (none of which
        changed the state) keeps, and with it the image's pin. None for any other save."""
        record = lc.record
        if not summary.get("unchanged") or record is None:
            return None
        if record.get("state") != "running" or record["image_id"] != summary["id"]:
            return None
        return str(record.get("trigger", "autosave"))

    async def _write_image(
        self,
        kernel_id: str,
        name: str | None,
        timeout: float,
        trigger: str,
        action: str = "checkpoint",
    ) -> dict[str, Any]:
        await self._step("checkpoint", kernel_id)
        async with self.progress.watch(kernel_id, action) as progress:
            call = f"checkpoint({name!r}, progress={progress!r}, trigger={trigger!r})"
            summary = await self.rpc.call(kernel_id, call, timeout)
        await self._step("verify", kernel_id)
        await self._verify(summary["id"], written=not summary.get("unchanged"))
        return summary

    async def _verify(self, image_id: str, written: bool = True) -> None:
        """Verify an image before relying on it, also an earlier one an unchanged save
        returned (its chunks may have rotted since); only one this save wrote is removed
        when it fails."""
        try:
            await asyncio.to_thread(self.store.verify, image_id)
        except StoreError as exc:  # the store failed, not the image: it is kept
            why = f"the image could not be verified: {exc}"
            raise StoreFailed(why, type(exc).__name__) from exc
        except CkptError as exc:
            if not written:
                msg = f"the kernel's newest image failed verification: {exc}"
                raise SuspendFailed(msg) from exc
            # a broken image must not be offered for restore or resume
            await asyncio.to_thread(self.forget_image, image_id)
            raise SuspendFailed(f"the image failed verification and was removed: {exc}") from exc

    def forget_image(self, image_id: str) -> None:
        try:
            self.store.delete(image_id)
        except CkptError as exc:
            self.log.warning("could not remove image %s: %s", image_id, exc)

    async def release_checkpoint(self, image_id: str) -> None:
        """The user deletes a checkpoint a running kernel's record names: the record goes
        back to the one it replaced (an autosave, the image the kernel came from, or
        none), so the store lets the image go and no record names a missing image."""
        for lc in list(self.kernels.values()):
            record = lc.record
            if record is None or record["image_id"] != image_id:
                continue
            if record.get("trigger") != "checkpoint":
                continue
            async with lc.lock:
                try:  # the store's record, which the store's delete goes by
                    stored = await asyncio.to_thread(self.records.get, lc.kernel_id)
                except CkptError:
                    continue
                if lc.record is record and stored.get("trigger") == "checkpoint":
                    await self._put_back(lc, lc.before_checkpoint)
                    lc.before_checkpoint = None

    # -- autosave ----------------------------------------------------------------------------

    def start_autosave(self, kernel_id: str) -> asyncio.Task[None] | None:
        """Autosave a running kernel in the background unless another action holds it."""
        lc = self.kernels.get(kernel_id)
        if lc is None or not lc.saves_itself or lc.lock.locked() or lc.autosave:
            return None
        lc.autosave = asyncio.ensure_future(self._autosave(lc))
        lc.autosave.add_done_callback(lambda _: setattr(lc, "autosave", None))
        return lc.autosave

    async def _autosave(self, lc: KernelLifecycle) -> None:
        started = time.perf_counter()
        kernel_id = lc.kernel_id
        async with lc.lock:
            if not lc.saves_itself:
                return
            lc.move("autosave")
            written = None
            try:
                cells = lc.cells
                summary = await self.saver.save(
                    kernel_id, self.policy.checkpoint_timeout, kernel_info=lc.kernel_info is None
                )
                if summary is None:  # skipped, and said why
                    return
                lc.kernel_info = summary.pop("kernel_info", lc.kernel_info)
                # an unchanged save returned an earlier image: not this autosave's to remove
                written = None if summary.get("unchanged") else summary["id"]
                try:
                    await asyncio.to_thread(self.store.verify, summary["id"])
                except CkptError as exc:
                    raise SuspendFailed(f"the image failed verification: {exc}") from exc
                trigger = self._kept_trigger(lc, summary) or "autosave"
                record = await self._running_record(lc, summary, trigger, now_iso())
                if lc.cells != cells:  # cells ran during the save: they come after it
                    record["cells_after"] = list(lc.executed)
                previous = lc.autosave_image
                await self._put(lc, record)
                lc.refreshed_at = time.monotonic()
                written = None  # recorded: kept
                # replaced by the next autosave only if this one wrote it: an unchanged
                # save returns an earlier image (a checkpoint, the restored image), kept
                if not summary.get("unchanged"):
                    lc.autosave_image = summary["id"]
                elif previous != summary["id"]:
                    lc.autosave_image = None
                if previous is not None and previous != summary["id"]:
                    await asyncio.to_thread(self.forget_image, previous)
            except (SuspendFailed, CkptError, OSError) as exc:
                self.events.failure("checkpoint", kernel_id, "autosave", exc, started)
                return
            finally:
                if lc.state is S.AUTOSAVING:
                    lc.move("autosaved" if lc.unrestored is None else "autosaved, unrestored")
                # written but not recorded: not offered for restore (a put that landed
                # as the autosave was cancelled recorded it: it is kept)
                if written is not None and not lc.records_name(written):
                    await asyncio.to_thread(self.forget_image, written)
        self.saver.report(kernel_id, summary, started)

    # -- suspend ------------------------------------------------------------------------------

    async def suspend(
        self, kernel_id: str, trigger: str = "api", timeout: float | None = None
    ) -> dict[str, Any]:
        """Write the kernel's image, record it, shut the kernel down; raise SuspendFailed
        (the kernel keeps running) if any step fails or another caller needs the kernel
        meanwhile. One suspend per kernel at a time: callers arriving meanwhile share it;
        ``timeout`` caps the whole of it."""
        lc = self.kernels.get(kernel_id)
        if lc is None:
            raise NothingToSave(f"kernel {kernel_id} is not running")
        if lc.suspend_task is None:
            deadline = None if timeout is None else time.monotonic() + timeout
            task = lc.suspend_task = asyncio.ensure_future(self._suspend(lc, trigger, deadline))
            task.add_done_callback(lambda _: setattr(lc, "suspend_task", None))
        return await asyncio.shield(lc.suspend_task)

    async def _suspend(
        self, lc: KernelLifecycle, trigger: str, deadline: float | None
    ) -> dict[str, Any]:
        started = time.perf_counter()
        try:
            async with self._locked(lc, deadline):
                return await self._suspend_locked(lc, trigger, deadline, started)
        except SuspendFailed as exc:
            self.events.failure("suspend", lc.kernel_id, trigger, exc, started)
            raise

    async def _suspend_locked(
        self, lc: KernelLifecycle, trigger: str, deadline: float | None, started: float
    ) -> dict[str, Any]:
        kernel_id, km = lc.kernel_id, self.km
        if lc.state is S.SUSPENDED:
            raise NothingToSave(f"kernel {kernel_id} is already suspended")
        if lc.state is S.GONE or not km.has_process(kernel_id):
            raise NothingToSave(f"kernel {kernel_id} is not running")
        kernel = km.get_kernel(kernel_id)
        if not await ensure_async(kernel.is_alive()):
            raise NothingToSave("the kernel's process has died: there is no state to save")
        previous = lc.record
        was = lc.state
        lc.abort = None
        lc.move("suspend")
        self.keep_standby()  # started while the image is written, ready for its restore
        cells = lc.cells
        written = None  # the image this suspend wrote, removed if the suspend fails
        recorded = False
        try:
            # After every await up to the shutdown, a client message, restart, interrupt
            # or shutdown that arrived meanwhile aborts the suspend (see settle()).
            if await self.rpc.busy(kernel_id):
                raise SuspendFailed("the kernel is busy")
            self._check(lc)
            await self._step("kernel_info", kernel_id)
            info = await self.rpc.request(kernel_id, "kernel_info", self._timeout(deadline))
            lc.kernel_info = info
            lc.debug_info = await self._debug_info(kernel_id, info, deadline)
            self._check(lc)
            usage = self.rpc.gpu_usage(kernel_id)
            label = _SUSPEND_LABELS.get(trigger, trigger)
            timeout = self._timeout(deadline)
            summary = await self._write_image(kernel_id, None, timeout, label, "suspend")
            image_id = summary["id"]
            # nothing changed since the kernel's newest image (its autosave, a checkpoint,
            # the image it came from): the save returned that one, so that idle cycles of
            # an untouched kernel do not pile up identical images; it is not this
            # suspend's to remove if the suspend fails
            written = None if summary.get("unchanged") else image_id
            self._check(lc)
            # at shutdown the state is lost anyway: keep what can be kept
            if summary["lost"] and self.policy.on_unsaveable == "keep" and trigger != "shutdown":
                raise SuspendFailed(
                    "variables cannot be saved (on_unsaveable=keep): "
                    + _describe_lost(summary["lost"]),
                    lost=summary["lost"],
                )
            record = {
                **self._base_record(lc, image_id),
                "trigger": trigger,
                "gpu": usage.to_json(),
                "lost": summary["lost"],
                "sessions": await self.sessions_of(kernel_id),
            }
            await self._step("record", kernel_id)
            await self._put(lc, record)
            recorded = True
            await self._step("recorded", kernel_id)
            # A fence: the kernel answers only after any cell queued before it (a console
            # on the shell channel, which no websocket sees), whose execute_input it has
            # published by then.
            await self.rpc.request(kernel_id, "kernel_info", self._timeout(deadline))
            busy = await self.rpc.busy(kernel_id)
            # the last checks: no await from here until the process is told to stop
            self._check(lc)
            if lc.cells != cells or busy:
                raise Aborted("a client ran a cell while the kernel was being suspended")
        except (SuspendFailed, CkptError, OSError) as exc:
            lc.state = S.RUNNING if lc.unrestored is None else was
            if recorded:
                await self._put_back(lc, previous)
            if written is not None:
                await asyncio.to_thread(self.forget_image, written)
            raise (exc if isinstance(exc, SuspendFailed) else SuspendFailed(str(exc))) from exc
        finally:
            lc.abort = None
        pid_tree = self.rpc.probe.process_tree(self.rpc.pid(kernel_id) or 0)
        # listed as suspended before the process goes, so the id never leaves the listing;
        # clients reconnect at once and find it suspended, never the dying process
        lc.move("committed")
        lc.restore_error = lc.recovered = lc.autosave_image = None
        lc.executed = []
        if lc.stream is not None and not lc.stream.closed():
            lc.stream.close()
        lc.stream = None
        self.events.failures.pop(kernel_id, None)
        self.rpc.close_clients(kernel_id)
        await km.stop_process(kernel_id, now=False)
        release = 0.0
        if usage.holds_gpu:
            release = await self.rpc.wait_gpu_released(pid_tree, self.gpu_release_timeout, self.log)
        self.events.event(
            "suspend",
            kernel_id,
            trigger,
            started,
            summary,
            gpu_release_seconds=release,
            kernel_name=record["kernel_name"],
        )
        self.log.info(
            "Suspended kernel %s to image %s (%s): %.1f s",
            kernel_id,
            image_id,
            trigger,
            time.perf_counter() - started,
        )
        return {**summary, "kernel_id": kernel_id}

    async def _put_back(self, lc: KernelLifecycle, previous: dict[str, Any] | None) -> None:
        """Undo an aborted suspend's record: the record it replaced, or none."""
        try:
            if previous is None:
                await _to_the_end(lambda: self.records.delete(lc.kernel_id))
                lc.record = None
            else:
                await self._put(lc, previous)
        except (CkptError, OSError) as exc:
            self.log.warning("could not put back the record of kernel %s: %s", lc.kernel_id, exc)

    # -- restore ------------------------------------------------------------------------------

    async def ensure_compatible(self, image_id: str) -> dict[str, Any] | None:
        """Refuse, with the reasons, an image this node cannot restore: before any kernel
        starts for it. Returns its manifest (None: unreadable or gone)."""
        try:
            manifest = await asyncio.to_thread(self.store.load_manifest, image_id)
        except CkptError:
            return None  # unreadable or gone: the restore itself reports that
        problems = (await asyncio.to_thread(compat.assess, manifest, self.node()))[0]
        if problems:
            raise IncompatibleImage(
                f"image '{manifest['name']}' ({image_id[:12]}) cannot be restored on this "
                f"node: {'; '.join(problems)}"
            )
        return manifest

    def restore(
        self, kernel_id: str, trigger: str = "message", hand_over: bool = False
    ) -> asyncio.Future[dict[str, Any]]:
        """Start the suspended kernel under its id and restore its image into it. Callers
        that arrive while a restore runs share it: concurrent reconnects restore once.
        The restore is under way from this call on, before anything awaits it, so that
        a client connecting meanwhile sees it (:meth:`restore_under_way`) and joins it.

        With ``hand_over`` (a client waits to run its cell) the future is done as soon as
        the kernel holds its state; the running record is written after that, still under
        the kernel's lock (the suspended record names the same image meanwhile, so a
        new server would bring back the same state). Its clients then call
        :meth:`delivered` once their queued messages are on their way to the kernel."""
        loop = asyncio.get_running_loop()
        lc = self.kernels.get(kernel_id)
        if lc is None:
            failed = loop.create_future()
            failed.set_exception(SuspendFailed(f"kernel {kernel_id} is not suspended"))
            return failed
        if lc.restore_task is None:
            ready = lc.restore_ready = loop.create_future()
            task = lc.restore_task = asyncio.ensure_future(self._restore(lc, trigger, ready))
            task.add_done_callback(lambda _: setattr(lc, "restore_task", None))
        assert lc.restore_ready is not None
        return asyncio.shield(lc.restore_ready if hand_over else lc.restore_task)

    def restore_under_way(self, kernel_id: str) -> bool:
        """Whether a restore of the kernel was asked for and has not ended."""
        lc = self.kernels.get(kernel_id)
        return lc is not None and (lc.restore_task is not None or lc.state is S.RESTORING)

    def delivered(self, kernel_id: str) -> None:
        """A client's messages that waited for the restore went to the restored kernel."""
        lc = self.kernels.get(kernel_id)
        if lc is not None and lc.timeline is not None and not lc.delivered.is_set():
            lc.timeline.mark("queued messages delivered")
            lc.delivered.set()

    async def _restore(
        self, lc: KernelLifecycle, trigger: str, ready: asyncio.Future[dict[str, Any]]
    ) -> dict[str, Any]:
        try:
            async with lc.lock:
                report = await self._restore_locked(lc, trigger, ready)
        except BaseException as exc:
            lc.timeline = None
            if not ready.done():
                ready.set_exception(exc)
                ready.exception()  # retrieved by whoever awaits it, or by no one
            raise
        if not ready.done():
            ready.set_result(report)
        return report

    async def _restore_locked(
        self, lc: KernelLifecycle, trigger: str, ready: asyncio.Future[dict[str, Any]]
    ) -> dict[str, Any]:
        kernel_id, km = lc.kernel_id, self.km
        timeline = Timeline()
        started = timeline.started
        if lc.state is not S.SUSPENDED:
            if lc.has_process:  # restored already, for another client
                return {"kernel_id": kernel_id, "image_id": None, "error": None}
            raise SuspendFailed(f"kernel {kernel_id} is not suspended")
        record = lc.record
        assert record is not None
        try:
            await self._step("compatibility", kernel_id)
            manifest = await self.ensure_compatible(record["image_id"])
        except IncompatibleImage as exc:  # it stays suspended, its image kept
            self.events.failure("restore", kernel_id, trigger, exc, started)
            raise SuspendFailed(str(exc)) from exc
        timeline.mark("compatibility checked")
        try:  # the GPU memory the kernel held, when others hold it now
            if await self._gpu_memory(lc, (record.get("gpu") or {}).get("by_device") or {}):
                timeline.mark("GPU memory free")
        except CkptError as exc:  # it stays suspended, its image kept
            self.events.failure("restore", kernel_id, trigger, exc, started)
            raise SuspendFailed(str(exc)) from exc
        if manifest is not None:  # the files the restore reads, while the kernel starts
            self._background(asyncio.to_thread(readahead, self.store, manifest))
        lc.abort = None
        lc.timeline = timeline
        lc.delivered = asyncio.Event()
        lc.move("restore")
        env = {**os.environ, **record.get("env", {}), **self._notebook_env(record)}
        await self.standby.started(record["kernel_name"])
        token = restoring.set(kernel_id)
        try:
            await km.start_kernel(
                kernel_id=kernel_id,
                kernel_name=record["kernel_name"],
                path=record.get("path"),
                env=env,
            )
        except Exception as exc:
            lc.state = S.SUSPENDED
            self.events.failure("restore", kernel_id, trigger, exc, started)
            raise SuspendFailed(f"could not start kernel {kernel_id}: {exc}") from exc
        finally:
            restoring.reset(token)
        timeline.mark("kernel started")
        self.restore_count += 1
        report: dict[str, Any] = {"kernel_id": kernel_id, "image_id": record["image_id"]}
        if lc.recovered is not None:
            report["recovery"] = recovery_message({**record, "recovered": lc.recovered})
        try:
            self._check(lc)
            await self.rpc.ready(kernel_id)
            await self._step("restore", kernel_id)
            self._check(lc)
            async with self.progress.watch(kernel_id, "restore") as progress:
                # who the kernel is: a process that stood by was started as no one
                notebook = env.get("JPY_SESSION_NAME")
                notebook_id = env.get(NOTEBOOK_ID_ENV)
                call = (
                    f"restore({record['image_id']!r}, progress={progress!r}, "
                    f"kernel_id={kernel_id!r}, notebook={notebook!r}, "
                    f"notebook_id={notebook_id!r})"
                )
                timeline.mark("restore request sent")
                report.update(await self._read_image(lc, call, timeline))
            timeline.kernel_steps(report.pop("steps", {}))
            report["error"] = None
        except Aborted as exc:
            # the shutdown or restart that aborted the restore drops the record
            lc.state = S.RESTORE_FAILED
            lc.restore_error = str(exc)
            self.events.failure("restore", kernel_id, trigger, exc, started)
            return {**report, "error": str(exc), "restored": [], "missing": {}}
        except (SuspendFailed, CkptError, RuntimeError, TimeoutError) as exc:
            report.update(error=str(exc), restored=[], missing=self._saved_names(record))
        finally:
            lc.abort = None
        await self.rpc.settled(kernel_id)
        timeline.mark("kernel idle")
        lc.recovered = None
        if report["error"]:
            # The kernel runs without its state; the record stays, and with it the image's
            # pin, so that retention and DELETE keep the image for a retry or a resume;
            # so do the records it writes until it holds a newer state of that image.
            lc.move("restore-failed")
            lc.restore_error = report["error"]
            lc.unrestored = record["image_id"]
            self.events.failure(
                "restore", kernel_id, trigger, SuspendFailed(report["error"]), started
            )
            return report
        lc.move("restored")
        lc.unrestored = None
        ready.set_result(report)  # its clients run their cells while the record is written
        await self._restored(lc, record["image_id"])
        timeline.mark("record written")
        self._background(self._report_restore(lc, trigger, report, timeline, lc.delivered))
        return report

    async def _read_image(
        self, lc: KernelLifecycle, call: str, timeline: Timeline
    ) -> dict[str, Any]:
        """The kernel's restore of its image. A store that cannot be reached meanwhile is
        waited for, and the restore tried again, while the cell that woke the kernel
        waits (within ``checkpoint_timeout``, each wait shown as the restore's
        progress): an outage of seconds must not hand out an empty kernel."""
        deadline = time.monotonic() + self.policy.checkpoint_timeout
        delays = backoff(RESTORE_RETRY_FIRST, RESTORE_RETRY_MAX)
        delay = next(delays)
        while True:
            try:
                return await self.rpc.call(lc.kernel_id, call, self._timeout(deadline))
            except SuspendFailed as exc:
                if not _store_unreachable(exc) or time.monotonic() + delay > deadline:
                    raise
                why = f"the store did not answer ({exc}); trying again in {delay:.0f} s"
            self._check(lc)
            timeline.mark("store unreachable: waited")
            self.log.warning("Restoring kernel %s: %s", lc.kernel_id, why)
            if self.progress.emit is not None:
                self.progress.emit(
                    {
                        "action": "progress",
                        "status": "running",
                        "phase": "restore",
                        "kernel_id": lc.kernel_id,
                        "msg": why,
                    }
                )
            await asyncio.sleep(delay)
            self._check(lc)
            delay = next(delays)

    async def _gpu_memory(self, lc: KernelLifecycle, by_device: dict[str, int]) -> bool:
        """Wait for the GPU memory an image held (device -> bytes) to be free for the
        kernel; whether it asked for any. A shutdown or restart meanwhile ends the wait
        (:meth:`settle`): GpuUnavailable, and the image is not restored."""
        if self.gpu_gate is None or not any(by_device.values()):
            return False
        lc.gpu_wait = asyncio.ensure_future(self.gpu_gate(lc.kernel_id, by_device))
        try:
            return await lc.gpu_wait
        except asyncio.CancelledError:
            if not lc.gpu_wait.cancelled():
                raise  # the caller was cancelled, not the wait
            raise GpuUnavailable(
                f"kernel {lc.kernel_id} was shut down or restarted while it waited for GPU memory"
            ) from None
        finally:
            lc.gpu_wait = None

    def keep_standby(self) -> None:
        """A process standing by for each spec of the kernels suspended or being
        suspended, and none for others (see :mod:`.standby`)."""
        if self.stopping:
            return
        names = {lc.record["kernel_name"] for lc in self.in_state(S.SUSPENDED) if lc.record}
        for lc in self.in_state(S.SUSPENDING):
            if self.km.has_process(lc.kernel_id):
                names.add(self.km.get_kernel(lc.kernel_id).kernel_name)
        self.standby.want(names, {**os.environ, **self.km.ckpt_env})

    def _background(self, work: Awaitable[Any]) -> None:
        """Run ``work`` on its own; its failure is logged, not raised."""

        def done(task: asyncio.Future[Any]) -> None:
            self._tasks.discard(task)
            if not task.cancelled() and task.exception() is not None:
                self.log.warning("jupyter-ckpt: %s", task.exception())

        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(done)

    async def _report_restore(
        self,
        lc: KernelLifecycle,
        trigger: str,
        report: dict[str, Any],
        timeline: Timeline,
        delivered: asyncio.Event,
    ) -> None:
        """Emit the restore's event with its timeline, once the clients that waited for
        it have their messages delivered (or after DELIVERY_WAIT: a client went away)."""
        if trigger in ("message", "connect"):
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(delivered.wait(), DELIVERY_WAIT)
        if lc.timeline is timeline:
            lc.timeline = None
        self.events.event(
            "restore",
            lc.kernel_id,
            trigger,
            timeline.started,
            report,
            timeline=timeline.to_json(),
            mapped_bytes=report.get("mapped_bytes", 0),
        )
        self.log.info("Restored kernel %s:\n%s", lc.kernel_id, timeline.describe())

    async def _restored(self, lc: KernelLifecycle, image_id: str) -> None:
        """The kernel now holds the state of ``image_id``: a running record names it at
        once (one put replaces the suspended record), so a crash before its first
        autosave is recoverable from it."""
        try:
            manifest = await asyncio.to_thread(self.store.open, image_id)
            summary = {**summarize_save(manifest, 0.0), "written": 0}
            record = await self._running_record(lc, summary, "restore", manifest["created"])
            await self._step("running-record", lc.kernel_id)
            await self._put(lc, record)
            lc.refreshed_at = time.monotonic()
        except (CkptError, OSError) as exc:
            self.log.warning("Could not write the record of kernel %s: %s", lc.kernel_id, exc)
        self.saver.restored(lc.kernel_id)

    def _notebook_env(self, record: dict[str, Any]) -> dict[str, str]:
        """JPY_SESSION_NAME of the kernel's notebook under this server's root: after a
        respawn on a node that mounts the home elsewhere, the recorded one names a file of
        the old node (the restored kernel maps its working directory from the two)."""
        notebooks = [s for s in record.get("sessions", []) if s["type"] == "notebook"]
        if self.session_manager is None or not notebooks:
            return {}
        env = self.session_manager.get_kernel_env(notebooks[0]["path"], notebooks[0]["name"])
        return {"JPY_SESSION_NAME": env["JPY_SESSION_NAME"]}

    def _saved_names(self, record: dict[str, Any]) -> dict[str, str]:
        """Every variable of the record's image, for a restore that failed as a whole."""
        try:
            manifest = self.store.open(record["image_id"])
        except CkptError as exc:
            return {"(all variables)": f"image {record['image_id']} unreadable: {exc}"}
        return {
            v["name"]: "image could not be restored"
            for v in manifest["variables"]
            if v["status"] in ("saved", "imported")
        }

    # -- resume -------------------------------------------------------------------------------

    async def resume(
        self, image_id: str, path: str | None, kernel_name: str | None
    ) -> dict[str, Any]:
        """Start a new kernel restored from an image, for a notebook or a console. Two
        resumes of one notebook at once (a double click) share one restore."""
        key = f"path:{path}" if path else f"image:{image_id}"
        running = self._resumes.get(key)
        if running is not None:
            if running[0] != image_id:
                raise SuspendFailed(f"another image is being resumed into {path} right now")
            return await asyncio.shield(running[1])
        task = asyncio.ensure_future(self._resume(image_id, path, kernel_name))
        self._resumes[key] = (image_id, task)
        task.add_done_callback(lambda _: self._resumes.pop(key, None))
        return await asyncio.shield(task)

    async def _resume(
        self, image_id: str, path: str | None, kernel_name: str | None
    ) -> dict[str, Any]:
        started = time.perf_counter()
        manifest = await self.ensure_compatible(image_id)
        if path:
            # as the session manager starts a notebook's kernel: in the notebook's
            # directory, with JPY_SESSION_NAME, so later images keep naming the notebook
            kernel_id = await self.session_manager.start_kernel_for_session(
                session_id="",
                path=path,
                name=posixpath.basename(path),
                type="notebook",
                kernel_name=kernel_name,
            )
        else:
            kernel_id = await self.km.start_kernel(kernel_name=kernel_name)
        lc = self.kernels[kernel_id]
        failed: SuspendFailed | None
        async with lc.lock:
            try:
                await self._gpu_memory(lc, image_device_bytes(manifest or {}))
                async with self.progress.watch(kernel_id, "resume") as progress:
                    report = await self.rpc.call(
                        kernel_id,
                        f"restore({image_id!r}, progress={progress!r})",
                        self.policy.checkpoint_timeout,
                    )
            except (SuspendFailed, GpuUnavailable) as exc:
                self.events.failure("resume", kernel_id, "api", exc, started)
                failed = exc if isinstance(exc, SuspendFailed) else SuspendFailed(str(exc))
            else:
                failed = None
                await self._restored(lc, image_id)
        if failed is not None:
            if kernel_id in self.km:  # a shutdown may have ended the wait
                await self.km.shutdown_kernel(kernel_id)
            raise failed
        session = await self._attach(path, kernel_id) if path else None
        await self._release(image_id)
        self.events.event("resume", kernel_id, "api", started, report)
        return {"kernel_id": kernel_id, "session": session, "restore": report}

    async def _attach(self, path: str, kernel_id: str) -> dict[str, Any]:
        """Make ``kernel_id`` the one kernel of the notebook at ``path``: its existing
        session (open or not) moves to the new kernel and the kernel it had is shut down,
        so the notebook can never attach to the old kernel, nor leave the new one
        orphaned. A running old kernel is checkpointed first, so its variables stay in the
        store as an image; a suspended one loses only its record: its image is kept."""
        sessions = self.session_manager
        existing = [s for s in await sessions.list_sessions() if s["path"] == path]
        if not existing:
            return await sessions.create_session(
                path=path, name=posixpath.basename(path), type="notebook", kernel_id=kernel_id
            )
        old = {s["kernel"]["id"] for s in existing} - {kernel_id}
        for session in existing:
            await sessions.update_session(session["id"], kernel_id=kernel_id)
        for old_id in old:
            if self.km.has_process(old_id):
                try:
                    await self.checkpoint(old_id, trigger="replaced")
                except SuspendFailed as exc:
                    self.log.warning("Kernel %s replaced without a checkpoint: %s", old_id, exc)
            if old_id in self.km:
                await self.km.shutdown_kernel(old_id)
        return await sessions.get_session(session_id=existing[0]["id"])

    async def _release(self, image_id: str) -> None:
        """The image was resumed: kernels whose restore of it failed no longer pin it."""
        for lc in self.in_state(S.RESTORE_FAILED):
            if lc.record is not None and lc.record["image_id"] == image_id:
                async with lc.lock:
                    await self._drop(lc)
                    lc.state = S.RUNNING
                    lc.restore_error = lc.unrestored = None

    # -- sessions, records of an earlier server ------------------------------------------------

    async def sessions_of(self, kernel_id: str) -> list[dict[str, Any]]:
        """The sessions (notebooks, consoles) attached to a kernel, as a record keeps them."""
        if self.session_manager is None:
            return []
        return [
            {key: session[key] for key in ("id", "path", "name", "type")}
            for session in await self.session_manager.list_sessions()
            if (session.get("kernel") or {}).get("id") == kernel_id
        ]

    async def _reattach_sessions(self, kernel_id: str, sessions: list[dict[str, Any]]) -> None:
        """Give a recorded kernel its sessions back, under their ids, unless the session
        database (a persistent one) still has them."""
        if self.session_manager is None:
            return
        known = {session["id"] for session in await self.session_manager.list_sessions()}
        for session in sessions:
            if session["id"] not in known:
                await self.session_manager.save_session(
                    session["id"],
                    path=session["path"],
                    name=session["name"],
                    type=session["type"],
                    kernel_id=kernel_id,
                )

    async def load_records(self) -> None:
        """List the kernels suspended by an earlier run of the server, with their sessions;
        a running record whose server is gone is a kernel that crashed."""
        records, errors = await asyncio.to_thread(self.records.all)
        for kernel_id, why in errors.items():
            self.log.warning("Ignoring the record of suspended kernel %s: %s", kernel_id, why)
        server_name = os.environ.get("JUPYTERHUB_SERVER_NAME", "")
        adopted = 0
        for kernel_id, record in records.items():
            if self.km.has_process(kernel_id) or writer_alive(record):
                continue
            if record.get("server_name", "") != server_name:
                continue  # another named server of the same user: its kernels, not ours
            lc = self.kernels[kernel_id] = KernelLifecycle(kernel_id, S.SUSPENDED, record=record)
            lc.recovered = recovered_field(record)
            if lc.recovered is not None:
                self.log.warning(
                    "Kernel %s crashed; recoverable from its autosave of %s",
                    kernel_id,
                    lc.recovered["autosave_at"],
                )
            await self._reattach_sessions(kernel_id, record.get("sessions", []))
            adopted += 1
        if adopted:
            self.log.info("%d suspended kernel(s) restore when their users return", adopted)
        _remove_stale_autosave_dirs(self.log)


def _remove_stale_autosave_dirs(log: Any) -> None:
    """Temporary directories of background saves whose kernel died with them."""
    from jupyter_ckpt.kernel.background import stale_directories

    for directory in stale_directories():
        log.info("Removing the leftover autosave directory %s", directory)
        shutil.rmtree(directory, ignore_errors=True)
