"""The kernels whose lifecycles the owner keeps, and what its transitions share: each
kernel's :class:`~.states.KernelLifecycle` and lock, the server's parts they call (the
kernel manager, the store, ``rpc``, the events), and the steps common to them (a deadline,
an abort, a test's step hook). :class:`~.owner.Lifecycles` is built on it; the transition
modules receive the owner as this, so that none of them imports the owner back."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from jupyter_ckpt.store import ImageStore

from ..events import Events
from ..policy import SuspendPolicy
from ..progress import ProgressWatch
from ..recovery import server_identity
from ..rpc import Aborted, KernelRPC, SuspendFailed
from ..standby import Standby
from .states import KernelLifecycle, State

S = State


class Kernels:
    """Every kernel's :class:`KernelLifecycle`, the parts of the server its transitions
    call, and the steps they share."""

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
        # the GPU memory the image held per device: waits for that memory (see
        # jupyter_ckpt_server.demand; True if it asked for any), or raises CkptError saying
        # why not
        self.gpu_gate: Callable[[str, dict[str, int]], Awaitable[bool]] | None = None
        self.restore_count = 0
        self.standby = Standby(kernel_manager, rpc, log)

    # -- lookups ------------------------------------------------------------------------------

    def __getitem__(self, kernel_id: str) -> KernelLifecycle:
        return self.kernels[kernel_id]

    def get(self, kernel_id: str) -> KernelLifecycle | None:
        return self.kernels.get(kernel_id)

    def state(self, kernel_id: str) -> State | None:
        lc = self.kernels.get(kernel_id)
        return None if lc is None else lc.state

    def new_lifecycle(
        self, kernel_id: str, state: State, record: dict[str, Any] | None = None
    ) -> KernelLifecycle:
        """A kernel the owner keeps from now on, whose every change of state its clients
        hear of (a ``state`` event)."""

        def told(lc: KernelLifecycle) -> None:
            self.events.state(lc.kernel_id, lc.shown_state)

        lc = KernelLifecycle(kernel_id, state, record=record, on_state=told)
        told(lc)
        return lc

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
        :mod:`jupyter_ckpt_server.websocket`): while it is suspended, and while a suspend is
        under way, whose end decides which process answers the socket's messages. A socket
        attached to the process being suspended could send a cell that reaches it after the
        suspend's last check, just before it is stopped: that cell would be lost."""
        lc = self.kernels.get(kernel_id)
        return lc is not None and (lc.state is S.SUSPENDING or self.is_suspended(kernel_id))

    async def suspend_ended(self, kernel_id: str) -> None:
        """Once the suspend under way, if any, has committed or failed."""
        lc = self.kernels.get(kernel_id)
        task = None if lc is None else lc.suspend_task
        if task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.shield(task)

    # -- what the transitions share ---------------------------------------------------------------

    async def step(self, step: str, kernel_id: str) -> None:
        if self.step_hook is not None:
            await self.step_hook(step, kernel_id)

    def check(self, lc: KernelLifecycle) -> None:
        """Stop the suspend or restore in progress if an action asked it to."""
        if lc.abort is not None:
            raise Aborted(lc.abort)

    def timeout(self, deadline: float | None) -> float:
        """Seconds one step may take: the policy's, capped by the caller's deadline."""
        timeout = self.policy.checkpoint_timeout
        if deadline is not None:
            timeout = min(timeout, deadline - time.monotonic())
        if timeout <= 0:
            raise SuspendFailed("no time left before the deadline")
        return timeout

    @contextlib.asynccontextmanager
    async def locked(self, lc: KernelLifecycle, deadline: float | None) -> AsyncIterator[None]:
        """Hold the kernel's lock; an autosave that holds it beyond the deadline is
        cancelled (its image is not needed: the caller writes a newer one)."""
        try:
            await asyncio.wait_for(lc.lock.acquire(), self.timeout(deadline))
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
