"""A kernel's request for GPU memory, and the server's answer, as files.

Why files: a kernel asks for a GPU from inside a cell (``%ckpt gpu``, or a library or a
startup file calling :func:`jupyter_ckpt.kernel.request_gpu` before it allocates), and
must wait there until the server has made room. The server reaches a kernel only by
silent requests on its shell channel, which the kernel serves after the running cell: it
cannot answer a cell that waits. A request file in a directory private to the server
(``$JUPYTER_CKPT_DEMAND_DIR``, the way progress files travel, see
:mod:`jupyter_ckpt.store.progress`) works while the cell waits, needs no new channel,
and the server reads the directory once per poll of its demand queue.

``<dir>/<kernel id>.json``: the request ``{"bytes": N, "device": D or null, "user": U}``,
written by the kernel; removing it withdraws the demand (an interrupted cell does).
``<dir>/<kernel id>.answer.json``: ``{"state": "waiting", "ahead": N, "message": ...}``
while it waits, then ``"granted"`` (with ``"device"``) or ``"refused"`` (with the one line
that says why); written by the server, removed by the kernel once it has read the end.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

DEMAND_DIR_ENV = "JUPYTER_CKPT_DEMAND_DIR"
ANSWER_SUFFIX = ".answer.json"


def request_path(directory: str, kernel_id: str) -> str:
    return os.path.join(directory, f"{kernel_id}.json")


def answer_path(directory: str, kernel_id: str) -> str:
    return os.path.join(directory, f"{kernel_id}{ANSWER_SUFFIX}")


def write(path: str, data: dict[str, Any]) -> None:
    """Replace ``path`` at once: a reader never sees half a file."""
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w") as f:
        json.dump(data, f)
    os.replace(temporary, path)


def read(path: str) -> dict[str, Any] | None:
    """The file's data, or None where there is none (or it is not ours to read)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def pending(directory: str) -> dict[str, dict[str, Any]]:
    """kernel id -> its request, for every request in ``directory``."""
    try:
        names = os.listdir(directory)
    except OSError:
        return {}
    found = {}
    for name in names:
        if name.endswith(".json") and not name.endswith(ANSWER_SUFFIX):
            data = read(os.path.join(directory, name))
            if data is not None:
                found[name[: -len(".json")]] = data
    return found


def remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)
