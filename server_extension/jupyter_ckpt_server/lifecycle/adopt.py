"""The kernels an earlier run of the server recorded: (none) -> suspended. A suspended
kernel's record is adopted with its sessions; a running record whose server is gone is a
kernel that crashed, recoverable from its last image."""

from __future__ import annotations

import asyncio
import os
import shutil
from typing import Any

from ..recovery import recovered_field, writer_alive
from .kernels import Kernels
from .sessions import Sessions
from .states import State


async def load_records(owner: Kernels, sessions: Sessions) -> None:
    """List the kernels suspended by an earlier run of the server, with their sessions;
    a running record whose server is gone is a kernel that crashed."""
    records, errors = await asyncio.to_thread(owner.records.all)
    for kernel_id, why in errors.items():
        owner.log.warning("Ignoring the record of suspended kernel %s: %s", kernel_id, why)
    server_name = os.environ.get("JUPYTERHUB_SERVER_NAME", "")
    adopted = 0
    for kernel_id, record in records.items():
        if owner.km.has_process(kernel_id) or writer_alive(record):
            continue
        if record.get("server_name", "") != server_name:
            continue  # another named server of the same user: its kernels, not ours
        lc = owner.kernels[kernel_id] = owner.new_lifecycle(kernel_id, State.SUSPENDED, record)
        lc.recovered = recovered_field(record)
        if lc.recovered is not None:
            owner.log.warning(
                "Kernel %s crashed; recoverable from its autosave of %s",
                kernel_id,
                lc.recovered["autosave_at"],
            )
        await sessions.reattach(kernel_id, record.get("sessions", []))
        adopted += 1
    if adopted:
        owner.log.info("%d suspended kernel(s) restore when their users return", adopted)
    _remove_stale_autosave_dirs(owner.log)


def _remove_stale_autosave_dirs(log: Any) -> None:
    """Temporary directories of background saves whose kernel died with them."""
    from jupyter_ckpt.kernel.background import stale_directories

    for directory in stale_directories():
        log.info("Removing the leftover autosave directory %s", directory)
        shutil.rmtree(directory, ignore_errors=True)
