"""Progress events while a kernel writes or reads its image.

The kernel keeps the bytes it has done in a small file (:mod:`jupyter_ckpt.store.progress`)
that the server names and polls while it awaits the kernel call. A kernel that cannot
write the file (it runs on another machine) just sends no progress events.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from jupyter_ckpt.store.progress import read_progress


class ProgressWatch:
    """Names a private progress file per kernel call and emits ``progress`` events from it,
    at most every ``interval`` seconds and only when it changed."""

    def __init__(
        self, directory: str, emit: Callable[[dict[str, Any]], None] | None, interval: float
    ) -> None:
        self.directory = directory
        self.emit = emit
        self.interval = interval

    def _prepare(self) -> str | None:
        """The private directory the files go in (only the server's user can read it)."""
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            os.chmod(self.directory, 0o700)
        except OSError:
            return None
        return self.directory

    @contextlib.asynccontextmanager
    async def watch(self, kernel_id: str, phase: str) -> AsyncIterator[str | None]:
        """Yield the file path to hand the kernel (None: no progress for this call) and
        emit events from it until the block ends, the last one when it does."""
        emit = self.emit
        directory = self._prepare() if emit is not None else None
        if emit is None or directory is None:
            yield None
            return
        path = os.path.join(directory, f"{kernel_id}-{phase}-{uuid.uuid4().hex[:8]}.json")
        last: tuple[int, int] | None = None

        def publish() -> None:
            nonlocal last
            now = read_progress(path)
            if now is not None and now != last:
                last = now
                emit(
                    {
                        "action": "progress",
                        "status": "running",
                        "phase": phase,
                        "kernel_id": kernel_id,
                        "bytes_done": now[0],
                        "bytes_total": now[1],
                    }
                )

        async def poll() -> None:
            while True:
                await asyncio.sleep(self.interval)
                publish()

        poller = asyncio.ensure_future(poll())
        try:
            yield path
        finally:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
            publish()  # the kernel's last word: all of it, when it finished
            for leftover in (path, f"{path}.part"):
                with contextlib.suppress(OSError):
                    os.remove(leftover)
