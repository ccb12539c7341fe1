"""A kernel's states, the events that move it between them, and its per-kernel record
(:class:`KernelLifecycle`). The table of both, with the module that runs each transition,
is in the package's docstring (:mod:`jupyter_ckpt_server.lifecycle`)."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jupyter_ckpt.errors import CkptError

from ..timeline import Timeline


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
    # record of the kernel keeps that image (see .records.RecordKeeper.keeping)
    unrestored: str | None = None
    autosave_image: str | None = None  # its last autosave: replaced by the next one
    executed: list[int] = field(default_factory=list)  # cells run since the record's image
    cells: int = 0  # cells any client ran (execute_input seen on iopub)
    messages: int = 0  # messages clients sent it on websockets
    suspend_task: asyncio.Task[dict[str, Any]] | None = None  # shared by its callers
    restore_task: asyncio.Task[dict[str, Any]] | None = None  # shared by its callers
    # its wait for GPU memory (see jupyter_ckpt_server.demand)
    gpu_wait: asyncio.Future[bool] | None = None
    # set once the restored kernel holds its state, before its record is written
    restore_ready: asyncio.Future[dict[str, Any]] | None = None
    timeline: Timeline | None = None  # the steps of the restore in progress
    delivered: asyncio.Event = field(default_factory=asyncio.Event)  # see Restore.delivered
    autosave: asyncio.Task[Any] | None = None  # the autosave in progress
    stream: Any = None  # the server's own iopub subscription
    joined: asyncio.Event = field(default_factory=asyncio.Event)
    kernel_info: dict[str, Any] | None = None
    debug_info: dict[str, Any] | None = None  # its debugger's facts, saved at suspend
    refresh: asyncio.Task[None] | None = None
    refreshed_at: float = 0.0
    # the record a checkpoint's record replaced: put back if the user deletes that image
    before_checkpoint: dict[str, Any] | None = None
    # told of each change of ``state`` (after it), wherever it is made: the server's
    # clients follow the kernel from the events it sends (see Kernels.new_lifecycle)
    on_state: Callable[[KernelLifecycle], None] | None = field(
        default=None, repr=False, compare=False
    )

    def __setattr__(self, name: str, value: Any) -> None:
        changed = name == "state" and self.__dict__.get("state") is not value
        super().__setattr__(name, value)
        if changed and self.on_state is not None:
            self.on_state(self)

    @property
    def shown_state(self) -> str:
        """The state its clients see: the model's ``ckpt`` state, or ``gone``."""
        return "gone" if self.state is S.GONE else str(self.model_field()["state"])

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

    @property
    def record_stale(self) -> bool:
        """Whether its running record misses cells it ran since its image."""
        record = self.record
        return (
            record is not None
            and record.get("state") == "running"
            and record.get("cells_after", []) != self.executed
        )

    def close_stream(self) -> None:
        """Stop the server's own iopub subscription to it, if any."""
        if self.stream is not None and not self.stream.closed():
            self.stream.close()
        self.stream = None

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
