"""Kernels that crashed: the records autosave left behind, and what the user is told.

While a kernel runs with autosave, its record says ``state: "running"`` and names its
last autosave. The user's shutdown removes the record and a suspend replaces it, so a
server that starts and finds a running record whose kernel no process serves knows that
kernel crashed (SIGKILL, OOM, a dead node) or was stopped with its server without a
suspend (a busy kernel, ``suspend_on_shutdown = False``): it lists it as recoverable,
like a suspended one, and the first restore says what was lost.
"""

from __future__ import annotations

import os
import socket
from datetime import datetime
from typing import Any

import psutil


def server_identity() -> dict[str, Any]:
    """Who writes running records: a server still alive under this identity (on this
    host) still serves the kernel, so its record is no crash."""
    me = psutil.Process()
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": me.create_time()}


def writer_alive(record: dict[str, Any]) -> bool:
    """Whether the server that wrote a running record still runs. Only a server on this
    host can be seen; one on another node sharing the store is taken as gone (one server
    per user and store is the deployment this supports)."""
    writer = record.get("server") or {}
    if writer.get("host") != socket.gethostname() or writer.get("pid") == os.getpid():
        return False
    try:
        process = psutil.Process(writer["pid"])
        return abs(process.create_time() - writer["started"]) < 1
    except (psutil.Error, KeyError, TypeError):
        return False


def recovered_field(record: dict[str, Any]) -> dict[str, Any] | None:
    """The model's ``ckpt.recovered`` of a crashed kernel's record, else None."""
    if record.get("state") != "running":
        return None
    field = {"autosave_at": record["autosave_at"], "crashed_after": record.get("alive_at")}
    if record.get("stopped_at"):  # an orderly stop that could not suspend it
        field["stopped_at"] = record["stopped_at"]
    return field


def _clock(iso: str) -> str:
    return datetime.fromisoformat(iso).astimezone().strftime("%H:%M %Z").strip()


def recovery_message(record: dict[str, Any]) -> str:
    """ "Restored from the autosave of 14:02 UTC (...); cells run after it: In[41], In[42]"."""
    recovered = record["recovered"]
    saved = datetime.fromisoformat(recovered["autosave_at"])
    saved_at = _clock(recovered["autosave_at"])
    if record.get("trigger") == "restore":  # it crashed after a restore, before an autosave
        text = f"jupyter-ckpt: restored from the image of {saved_at} it was last restored from"
    elif record.get("trigger") == "checkpoint":  # a checkpoint is its newest image
        text = f"jupyter-ckpt: restored from its checkpoint of {saved_at}"
    else:
        text = f"jupyter-ckpt: restored from the autosave of {saved_at}"
    alive = recovered.get("crashed_after")
    if recovered.get("stopped_at"):
        stopped = datetime.fromisoformat(recovered["stopped_at"])
        minutes = (stopped - saved).total_seconds() / 60
        text += (
            f" (the server stopped at {_clock(recovered['stopped_at'])} without suspending "
            f"the kernel, {minutes:.0f} minute(s) after that image)"
        )
    elif alive:
        minutes = (datetime.fromisoformat(alive) - saved).total_seconds() / 60
        text += (
            f" (the kernel crashed after {_clock(alive)}, when the server last saw it "
            f"alive, {minutes:.0f} minute(s) after that image)"
        )
    cells = record.get("cells_after") or []
    if cells:
        text += "; cells run after it, whose effects are lost: " + ", ".join(
            f"In[{n}]" for n in cells
        )
    else:
        text += "; no cell ran after it"
    return text + "."
