"""The server extension: wires the policy, store, manager, monitor and handlers together."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from jupyter_core.paths import jupyter_runtime_dir
from jupyter_server.extension.application import ExtensionApp
from traitlets import TraitError, default

from jupyter_ckpt import compat, gpurequest
from jupyter_ckpt.errors import CkptError
from jupyter_ckpt.gpu import GpuProbe
from jupyter_ckpt.process import hash_seed_env
from jupyter_ckpt.store import ImageStore

from . import startup
from .autosave import Autosaver
from .compat import KERNEL_ID
from .configcheck import unknown_settings
from .demand import GpuDemand
from .handlers import default_handlers
from .kernelmanager import CkptKernelManager
from .manager import CkptManager
from .metrics import MetricsListener
from .monitor import IdleMonitor
from .notebookids import NotebookIds
from .policy import SuspendPolicy
from .service import CkptService
from .shutdown import StopGuard, grace_period_warning
from .storehealth import StoreHealth
from .storeusage import StoreUsage
from .websocket import CkptKernelWebsocketHandler

SCHEMA_ID = "https://events.jupyter.org/jupyter_ckpt/v1"
SCHEMA_PATH = Path(__file__).parent / "event_schemas" / "ckpt-v1.yaml"


class CkptExtensionApp(ExtensionApp):
    """Suspend idle GPU kernels to images and restore them when their users return."""

    name = "jupyter_ckpt_server"
    load_other_extensions = True
    classes = [SuspendPolicy, ImageStore, CkptManager]
    manager: CkptManager | None = None  # None when the extension could not initialize
    monitor: IdleMonitor | None = None
    demand: GpuDemand | None = None
    autosaver: Autosaver | None = None
    stop_guard: StopGuard | None = None  # set once the server runs its event loop
    store_health: StoreHealth | None = None  # set once the server runs its event loop
    _stopping: asyncio.Future[None] | None = None
    _prepared: asyncio.Future[None] | None = None

    @default("config_file_name")
    def _default_config_file_name(self) -> str:
        """``jupyter_ckpt_server_config`` (installed in etc/jupyter) makes CkptKernelManager
        the server's kernel manager. The server links extensions before it creates its
        kernel manager, and a kernel_manager_class the user configured still wins."""
        return "jupyter_ckpt_server_config"

    def initialize_settings(self) -> None:
        assert self.serverapp is not None  # the server links its extensions first
        km = self.serverapp.kernel_manager
        if not isinstance(km, CkptKernelManager):
            raise TypeError(
                "jupyter_ckpt_server needs ServerApp.kernel_manager_class = "
                "'jupyter_ckpt_server.kernelmanager.CkptKernelManager' (or a subclass); "
                f"the server uses {type(km).__name__}, so no kernel will be suspended"
            )
        try:
            typos = unknown_settings(self.config, [*self.classes, Autosaver])
            if typos:  # its default would apply, and the user would not know
                raise TraitError("; ".join(typos))
            self.policy = SuspendPolicy(parent=self)
            store = ImageStore(parent=self)
        except (TraitError, CkptError) as exc:
            # jupyter_server would only warn and serve on without the extension, which is
            # easy to miss until kernels are never suspended: bad settings stop the server.
            self.log.critical("jupyter_ckpt_server: %s; fix it and start the server again", exc)
            raise SystemExit(1) from exc
        if self.policy.suspend_on_shutdown:
            warning = grace_period_warning(self.policy, os.environ)
            if warning:
                self.log.warning(warning)
        event_logger = self.serverapp.event_logger
        assert event_logger is not None  # the server starts its event logger first
        event_logger.register_event_schema(SCHEMA_PATH)
        self.manager = CkptManager(
            parent=self,
            policy=self.policy,
            store=store,
            kernel_manager=km,
            probe=GpuProbe(),
            emit=lambda data: event_logger.emit(schema_id=SCHEMA_ID, data=data),
            session_manager=self.serverapp.session_manager,
        )
        self.monitor = IdleMonitor(self.manager)
        demand_dir = os.path.join(jupyter_runtime_dir(), "jupyter-ckpt-demand")
        self.demand = GpuDemand(self.manager, self.monitor, demand_dir)
        km.gpu_gate = self.demand.before_start
        self.manager.lifecycles.gpu_gate = self.demand.before_restore
        notebook_ids = NotebookIds(self.serverapp.web_app.settings, self.serverapp.root_dir)
        km.attach(
            self.manager.lifecycles,
            {
                "JUPYTER_CKPT_STORE": store.root_url,
                "JUPYTER_CKPT_USER": store.user,
                "JUPYTER_CKPT_SECRET_FILE": store.signer.secret_file,
                "JUPYTER_CKPT_ENCRYPTION": store.encryption,
                "JUPYTER_CKPT_BUFFER_BYTES": str(store.buffer_bytes),
                "JUPYTER_CKPT_MAP_BUFFERS": "1" if store.map_buffers else "0",
                gpurequest.DEMAND_DIR_ENV: demand_dir,
                # a restored kernel iterates sets of strings as the saved one did
                **hash_seed_env(store.signer.derive),
            },
            notebook_ids,
        )
        # what a written image left out decides whether the kernel can be suspended
        event_logger.add_listener(schema_id=SCHEMA_ID, listener=self.monitor.on_event)
        metrics = MetricsListener(self.manager.lifecycles, store, self.log)
        event_logger.add_listener(schema_id=SCHEMA_ID, listener=metrics.on_event)
        usage = StoreUsage(store)
        event_logger.add_listener(schema_id=SCHEMA_ID, listener=usage.on_event)
        self.autosaver = Autosaver(parent=self, manager=self.manager)
        self.service = CkptService(
            self.manager,
            self.monitor,
            self.serverapp.session_manager,
            self.demand,
            notebook_ids,
            usage,
        )
        self.settings.update(
            jupyter_ckpt_manager=self.manager,
            jupyter_ckpt_monitor=self.monitor,
            jupyter_ckpt_demand=self.demand,
            jupyter_ckpt_autosaver=self.autosaver,
            jupyter_ckpt_service=self.service,
        )

    def initialize_handlers(self) -> None:
        # Extension routes are matched before the server's own, so this handler serves
        # every kernel websocket, running or suspended.
        self.handlers.extend(
            [
                *default_handlers,
                *startup.handlers,
                (rf"/api/kernels/{KERNEL_ID}/channels", CkptKernelWebsocketHandler),
            ]
        )

    async def _start_jupyter_server_extension(self, serverapp: Any) -> None:
        if self.manager is None or self.monitor is None:
            return
        # kernel and session requests arriving from now on wait for the records
        loaded = serverapp.web_app.settings[startup.SETTING] = asyncio.Event()
        # a restore checks compatibility first: its slow part is done now, off its path
        self._prepared = asyncio.ensure_future(asyncio.to_thread(compat.prepare))
        health = self.store_health = StoreHealth(
            self.manager.store.backend.url, self.log, on_change=self.manager.events.store
        )
        self.service.store_health = self.manager.events.store_health = health
        try:
            # A store that is down must not stop the rest: the records come when it is back.
            if not await health.attempt(self.manager.load_records, "loading kernel records"):
                health.retry(self.manager.load_records, "loading kernel records")
        finally:
            loaded.set()
        self.monitor.start()
        if self.demand is not None:
            self.demand.start()
        if self.autosaver is not None:
            self.autosaver.begin()
        if self.policy.suspend_on_shutdown:
            self.stop_guard = StopGuard(serverapp, self.policy, self.log)
            self.stop_guard.install()

    async def stop_extension(self) -> None:
        """Runs before the server stops its kernels: suspend those that would lose state.

        Every stop path calls it, some twice (a second signal, the shutdown API then
        SIGTERM from ``jupyter server stop``): each call waits for the one suspend, so
        no cleanup shuts kernels down while they are being saved."""
        if self.monitor is None or self.manager is None:
            return
        if self._stopping is None:
            # from here on, kernels shut down by the stop keep their records
            self.manager.lifecycles.stopping = True
            if self.stop_guard is not None:
                self.stop_guard.begin()
            self._stopping = asyncio.ensure_future(self._suspend_before_stop())
        await asyncio.shield(self._stopping)

    async def _suspend_before_stop(self) -> None:
        assert self.monitor is not None and self.manager is not None
        try:
            if self.store_health is not None:
                await self.store_health.stop()
            await self.monitor.stop()
            if self.demand is not None:
                await self.demand.stop()
            if self.autosaver is not None:
                await self.autosaver.stop()
            if not self.policy.suspend_on_shutdown:
                return
            kernels = len(self.manager.kernel_manager.running_ids())
            self.log.info(
                "Suspending up to %d kernel(s) before stopping (shutdown_timeout %.0f s)",
                kernels,
                self.policy.shutdown_timeout,
            )
            result = await self.service.suspend_all(
                trigger="shutdown", timeout=self.policy.shutdown_timeout
            )
            for kernel_id, why in result["failed"].items():
                self.log.warning("Kernel %s was not suspended before shutdown: %s", kernel_id, why)
        except Exception:
            # the server must still stop; an error here would leave it running forever
            self.log.exception("Suspending kernels before shutdown failed")
        finally:
            if self.stop_guard is not None:
                self.stop_guard.end()
