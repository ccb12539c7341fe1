"""A kernel's idle clock, kept where it was around the server's own silent calls.

Such a call (an activity check, an autosave) is itself an execute request, which
jupyter_server counts as activity; put back, the server's checks and autosaves never keep
a kernel from being suspended. Below the manager, the monitor and the background saver,
which all make such calls: it is given the kernel manager and how to count a kernel's
client messages, and calls nothing above it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from .polling import poll

if TYPE_CHECKING:
    from .kernelmanager import CkptKernelManager


class IdleClock:
    """Puts a kernel's ``last_activity`` (and the server's) back after a silent call,
    unless a client sent the kernel something meanwhile."""

    def __init__(
        self, kernel_manager: CkptKernelManager, client_messages: Callable[[str], int]
    ) -> None:
        self.kernel_manager = kernel_manager
        #: kernel id -> messages clients sent it (tells a call's own traffic from a user's)
        self.client_messages = client_messages

    @contextlib.asynccontextmanager
    async def kept(self, kernel_id: str, timeout: float) -> AsyncIterator[None]:
        """Around one silent call to the kernel: waits (up to ``timeout``) for the server
        to see the call's status messages, then puts the clock back."""
        km = self.kernel_manager
        kernel: Any = km.get_kernel(kernel_id)  # jupyter_server adds last_activity at run time
        last, last_any = kernel.last_activity, km.last_kernel_activity
        messages = self.client_messages(kernel_id)
        try:
            yield
        finally:
            # the call's busy and idle status messages come on iopub, which may lag the
            # reply: only once the server has seen them is the clock safe to put back
            await poll(
                lambda: kernel.last_activity != last and kernel.execution_state != "busy",
                timeout,
                0.005,
            )
            if km.is_running(kernel_id) and self.client_messages(kernel_id) == messages:
                if km.last_kernel_activity == kernel.last_activity:
                    km.last_kernel_activity = last_any
                kernel.last_activity = last
