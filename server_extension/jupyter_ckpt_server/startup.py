"""Kernel and session requests wait until the records of suspended kernels are loaded.

The server listens before it starts its extensions, and the records come from the store (an
object store may take seconds): a notebook opened meanwhile, typically right after a hub
respawned the server, would find no session and start a new kernel beside its suspended
one. These subclasses of the server's own handlers (the extension's routes are matched
first) wait for the records, then behave exactly as the server's.
"""

from __future__ import annotations

import asyncio
from typing import Any

from jupyter_server.services.kernels.handlers import (
    KernelActionHandler,
    KernelHandler,
    MainKernelHandler,
)
from jupyter_server.services.sessions.handlers import SessionHandler, SessionRootHandler

from .compat import KERNEL_ACTION, KERNEL_ID, SESSION_ID

SETTING = "jupyter_ckpt_records_loaded"


async def records_loaded(settings: dict[str, Any]) -> None:
    """Until the extension has listed the suspended kernels and their sessions, once it
    has begun to (set even when loading failed, so no request waits forever). The
    extension starts in the server's first turn of the event loop, before any request."""
    loaded: asyncio.Event | None = settings.get(SETTING)
    if loaded is not None:
        await loaded.wait()


class AfterRecords:
    settings: dict[str, Any]

    async def prepare(self, **kwargs: Any) -> None:
        await records_loaded(self.settings)
        await super().prepare(**kwargs)  # type: ignore[misc]


class CkptMainKernelHandler(AfterRecords, MainKernelHandler):
    pass


class CkptKernelHandler(AfterRecords, KernelHandler):
    pass


class CkptKernelActionHandler(AfterRecords, KernelActionHandler):
    pass


class CkptSessionRootHandler(AfterRecords, SessionRootHandler):
    pass


class CkptSessionHandler(AfterRecords, SessionHandler):
    pass


handlers = [
    (r"/api/kernels", CkptMainKernelHandler),
    (rf"/api/kernels/{KERNEL_ID}", CkptKernelHandler),
    (rf"/api/kernels/{KERNEL_ID}/{KERNEL_ACTION}", CkptKernelActionHandler),
    (r"/api/sessions", CkptSessionRootHandler),
    (rf"/api/sessions/{SESSION_ID}", CkptSessionHandler),
]
