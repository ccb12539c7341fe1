"""The server side's one object: configuration, and the parts it is made of.

:class:`CkptManager` builds the parts once and hands each what it needs, in one direction:

- :mod:`.rpc`: talking to a kernel (silent requests, its process and GPU use);
- :mod:`.lifecycle`: each kernel's state, record and images, the only writer of records;
- :mod:`.autosave`: the background saver the lifecycle uses;
- :mod:`.retention` and :mod:`.events`.

The handlers, the websocket, the idle monitor, the autosave scheduler and the service
call the methods below, which go straight to those parts.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from jupyter_core.paths import jupyter_runtime_dir
from traitlets import Any as AnyTrait
from traitlets import Bool, Float, Instance, Unicode, default, observe
from traitlets.config import LoggingConfigurable

from jupyter_ckpt import compat
from jupyter_ckpt.gpu import GpuProbe, GpuSnapshot, GpuUsage
from jupyter_ckpt.store import ImageStore

from .autosave import BackgroundSaver
from .events import Events
from .idleclock import IdleClock
from .kernelmanager import CkptKernelManager
from .lifecycle import Lifecycles
from .policy import SuspendPolicy
from .progress import ProgressWatch
from .retention import Retention
from .rpc import Aborted, KernelRPC, NothingToSave, SuspendFailed

__all__ = ["Aborted", "CkptManager", "NothingToSave", "SuspendFailed"]


class CkptManager(LoggingConfigurable):
    """Suspends and restores the kernels of one :class:`CkptKernelManager`."""

    policy = Instance(SuspendPolicy)
    store = Instance(ImageStore)
    kernel_manager = Instance(CkptKernelManager)
    probe = Instance(GpuProbe, args=())
    emit = AnyTrait(help="callable(data): emit one jupyter_ckpt event")
    session_manager = AnyTrait(
        None,
        allow_none=True,
        help="""The server's SessionManager: a kernel's record keeps its sessions, so that
        after a restart or a respawn on another node its notebooks reopen attached to it.""",
    )

    gpu_release_timeout = Float(
        10, help="Seconds to wait for a suspended kernel's GPU memory to be released."
    ).tag(config=True)

    node_facts_file = Unicode(
        help="A JSON file that describes this node instead of probing it (GpuProbe.node() "
        "format, optionally with 'python' and 'packages'): what images are checked against "
        "before a resume or restore. Default: $JUPYTER_CKPT_NODE_FACTS.",
    ).tag(config=True)

    progress_dir = Unicode(
        help="A private directory where kernels note how far their image is written or "
        "read, for progress events. Default: jupyter-ckpt-progress in the runtime directory.",
    ).tag(config=True)

    @default("progress_dir")
    def _default_progress_dir(self) -> str:
        return os.path.join(jupyter_runtime_dir(), "jupyter-ckpt-progress")

    progress_interval = Float(
        0.5, help="Seconds between two progress events of one kernel's save or restore."
    ).tag(config=True)

    standby_kernel = Bool(
        True,
        help="While kernels are suspended, keep one kernel process of each of their kernel "
        "specs started (Python kernel specs run by ipykernel), for the next restore to take "
        "over: the first result after a suspend then waits for no kernel start. It holds no "
        "GPU memory (one that does is stopped) and about 70 MB of host memory.",
    ).tag(config=True)

    @default("node_facts_file")
    def _default_node_facts_file(self) -> str:
        return os.environ.get(compat.NODE_FACTS_ENV, "")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.records = self.store.records
        self._node: dict[str, Any] | None = None
        self.rpc = KernelRPC(self.kernel_manager, self.probe)
        self.events = Events(self.emit, self.log)
        self.progress = ProgressWatch(self.progress_dir, self.emit, self.progress_interval)
        self.retention = Retention(self.store, self.events, self.log)
        self.idle_clock = IdleClock(self.kernel_manager, lambda k: self.client_messages[k])
        self.saver = BackgroundSaver(self.idle_clock, self.rpc, self.events, self.log)
        self.lifecycles = Lifecycles(
            kernel_manager=self.kernel_manager,
            store=self.store,
            policy=self.policy,
            rpc=self.rpc,
            events=self.events,
            progress=self.progress,
            saver=self.saver,
            session_manager=self.session_manager,
            node=lambda: self.node,
            gpu_release_timeout=self.gpu_release_timeout,
            log=self.log,
        )
        self.lifecycles.standby.enabled = self.standby_kernel

    @observe("probe")
    def _probe_changed(self, change: dict[str, Any]) -> None:
        if hasattr(self, "rpc"):  # a new probe (another NVML, a test's stand-in)
            self.rpc.probe = change["new"]

    @observe("standby_kernel")
    def _standby_changed(self, change: dict[str, Any]) -> None:
        if hasattr(self, "lifecycles"):
            self.lifecycles.standby.enabled = change["new"]

    @observe("gpu_release_timeout")
    def _release_timeout_changed(self, change: dict[str, Any]) -> None:
        if hasattr(self, "lifecycles"):
            self.lifecycles.gpu_release_timeout = change["new"]

    @observe("store")
    def _store_changed(self, change: dict[str, Any]) -> None:
        if hasattr(self, "lifecycles"):  # a store swapped in (fault-injection tests)
            self.records = self.lifecycles.records = change["new"].records
            self.lifecycles.store = self.retention.store = change["new"]

    @property
    def node(self) -> dict[str, Any]:
        """This node's facts; they change only with a driver reload, so asked once."""
        if self._node is None:
            self._node = compat.node_facts(self.node_facts_file or None, self.probe)
        return self._node

    @property
    def step_hook(self) -> Callable[[str, str], Awaitable[None]] | None:
        """async callable(step, kernel_id), awaited before each awaited step of a suspend
        (kernel_info, checkpoint, verify, record), after its record is written
        (recorded) and before a restore loads the image (restore): widens each window
        for fault-injection tests."""
        return self.lifecycles.step_hook

    @step_hook.setter
    def step_hook(self, hook: Callable[[str, str], Awaitable[None]] | None) -> None:
        self.lifecycles.step_hook = hook

    # -- what the other parts ask ----------------------------------------------------------

    @property
    def restore_count(self) -> int:
        return self.lifecycles.restore_count

    @property
    def client_messages(self) -> Counter[str]:
        """Kernel id -> messages clients sent it (tells a check's own traffic from a user's)."""
        return Counter({k: lc.messages for k, lc in self.lifecycles.kernels.items()})

    def note_client_message(self, kernel_id: str) -> None:
        self.lifecycles.client_message(kernel_id)

    def aborting(self, kernel_id: str) -> str | None:
        """Why the suspend or restore of the kernel in progress is being aborted, if it is."""
        lc = self.lifecycles.get(kernel_id)
        return None if lc is None else lc.abort

    async def kernel_call(self, kernel_id: str, call: str, timeout: float) -> dict[str, Any]:
        return await self.rpc.call(kernel_id, call, timeout)

    def kernel_pid(self, kernel_id: str) -> int | None:
        return self.rpc.pid(kernel_id)

    def gpu_usage(self, kernel_id: str, snapshot: GpuSnapshot | None = None) -> GpuUsage:
        return self.rpc.gpu_usage(kernel_id, snapshot)

    async def ensure_compatible(self, image_id: str) -> None:
        await self.lifecycles.ensure_compatible(image_id)

    # -- actions ----------------------------------------------------------------------------

    async def checkpoint(self, kernel_id: str, name: str | None = None) -> dict[str, Any]:
        """Write an image now; the kernel keeps running."""
        summary = await self.lifecycles.checkpoint(kernel_id, name)
        await self.enforce_retention()
        return summary

    async def suspend(
        self, kernel_id: str, trigger: str = "api", timeout: float | None = None
    ) -> dict[str, Any]:
        summary = await self.lifecycles.suspend(kernel_id, trigger, timeout)
        await self.enforce_retention()
        return summary

    def restore(
        self, kernel_id: str, trigger: str = "message", hand_over: bool = False
    ) -> asyncio.Future[dict[str, Any]]:
        return self.lifecycles.restore(kernel_id, trigger, hand_over)

    async def enforce_retention(self) -> list[str]:
        return await self.retention.enforce()

    async def load_records(self) -> None:
        """List the kernels suspended (or crashed) under an earlier run of the server."""
        await self.lifecycles.load_records()
        await self.enforce_retention()

    async def sessions_of(self, kernel_id: str) -> list[dict[str, Any]]:
        return await self.lifecycles.sessions_of(kernel_id)
