"""The kernel manager that keeps suspended kernels under their ids.

Why a ``MappingKernelManager`` subclass (enabled with ``ServerApp.kernel_manager_class``)
rather than patching handlers: the kernel manager is the one place every part of the server
asks whether a kernel exists. The kernels API lists and describes kernels through it, the
session manager drops any session whose kernel is not ``in`` it, and JupyterLab disposes a
kernel connection as soon as its id leaves ``/api/kernels``. Answering those questions here
keeps a suspended kernel's id, model and sessions alive with no change to any handler.

A suspended kernel has no ``KernelManager`` object (its process is gone); it is a
:class:`~.lifecycle.KernelLifecycle` in the suspended state. This class is an entry point:
the kernels API's actions (start, restart, shutdown, interrupt, a session's environment)
ask the lifecycles (:meth:`attach`) first, and the lifecycles use :meth:`stop_process` and
the inherited start to run processes.

The private jupyter_server and jupyter_client names it relies on (its ``_async_*``
overrides, the kernels it holds) are listed, with the versions checked, in :mod:`.compat`.
"""

from __future__ import annotations

import asyncio
import functools
import os
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from jupyter_core.utils import ensure_async
from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager
from tornado import web

from jupyter_ckpt.errors import CkptError

from . import compat
from .lifecycle import Lifecycles, State, restoring
from .notebookids import NotebookIds
from .rpc import SuspendFailed

if TYPE_CHECKING:
    from jupyter_server.utils import ApiPath


class CkptKernelManager(AsyncMappingKernelManager):
    """``AsyncMappingKernelManager`` that also lists, describes and forgets suspended
    kernels, and starts kernels with the server's image store in their environment."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # environment every kernel gets: the store and secret of the server's ImageStore
        self.ckpt_env: dict[str, str] = {}
        # kernel id -> clients connected to it while it is suspended
        self.suspended_connections: dict[str, int] = {}
        # the owner of every kernel's ckpt state; None: the extension is off, and this
        # manager behaves as the stock one
        self.lifecycles: Lifecycles | None = None
        # the id of a notebook kernel's file, added to its environment
        self.notebook_ids: NotebookIds | None = None
        self._env_updates: set[asyncio.Task[None]] = set()
        # awaited before a new kernel starts, with its id and kernel spec name: waits for
        # the GPU memory its spec needs (see .demand), or raises CkptError saying why not
        self.gpu_gate: Callable[[str, str], Awaitable[None]] | None = None

    def attach(
        self,
        lifecycles: Lifecycles,
        env: dict[str, str],
        notebook_ids: NotebookIds | None = None,
    ) -> None:
        """The extension is on: kernels get ``env`` (and their notebook's file id) and
        the lifecycles own their state."""
        self.lifecycles = lifecycles
        self.ckpt_env = env
        self.notebook_ids = notebook_ids

    def __contains__(self, kernel_id: object) -> bool:
        if isinstance(kernel_id, str) and self.has_process(kernel_id):
            return True
        if self.lifecycles is None or not isinstance(kernel_id, str):
            return False
        return self.lifecycles.is_suspended(kernel_id) and restoring.get() != kernel_id

    def has_process(self, kernel_id: str) -> bool:
        """A kernel process exists (it may also be suspending or restoring)."""
        return super().__contains__(kernel_id)

    is_running = has_process

    def is_suspended(self, kernel_id: str) -> bool:
        return self.lifecycles is not None and self.lifecycles.is_suspended(kernel_id)

    def running_ids(self) -> list[str]:
        return list(compat.kernels(self))

    # -- views of the lifecycles, for the monitor, the status and the listings ---------------

    def _records_in(self, *states: State) -> dict[str, dict[str, Any]]:
        if self.lifecycles is None:
            return {}
        return {
            lc.kernel_id: {**lc.record, "state": lc.state.value}
            for lc in self.lifecycles.in_state(*states)
            if lc.record is not None
        }

    @property
    def suspended(self) -> dict[str, dict[str, Any]]:
        """Kernel id -> record of the kernels suspended or being restored."""
        return self._records_in(State.SUSPENDED, State.RESTORING)

    @property
    def failed_restores(self) -> dict[str, dict[str, Any]]:
        """Kernel id -> record of kernels running without the image their restore failed."""
        return self._records_in(State.RESTORE_FAILED)

    @property
    def ckpt_states(self) -> dict[str, str]:
        """Kernel id -> "suspending" for the kernels being suspended."""
        if self.lifecycles is None:
            return {}
        return {lc.kernel_id: "suspending" for lc in self.lifecycles.in_state(State.SUSPENDING)}

    # -- models ---------------------------------------------------------------------------

    def ckpt_field(self, kernel_id: str) -> dict[str, Any]:
        lc = None if self.lifecycles is None else self.lifecycles.get(kernel_id)
        return {"state": "running"} if lc is None else lc.model_field()

    def _suspended_model(self, kernel_id: str) -> dict[str, Any]:
        assert self.lifecycles is not None
        lc = self.lifecycles[kernel_id]
        assert lc.record is not None
        return {
            "id": kernel_id,
            "name": lc.record["kernel_name"],
            "last_activity": lc.record["last_activity"],
            # JupyterLab knows no "suspended" status; idle keeps the notebook usable
            "execution_state": "idle" if lc.state is State.SUSPENDED else "starting",
            "connections": self.suspended_connections.get(kernel_id, 0),
            "ckpt": lc.model_field(),
        }

    def kernel_model(self, kernel_id: str) -> dict[str, Any]:
        # A restore's new process is in _kernels a moment before jupyter_server gives it
        # its activity markers: until then it is modelled from its record.
        kernel = compat.kernels(self).get(kernel_id)
        lc = None if self.lifecycles is None else self.lifecycles.get(kernel_id)
        if (
            lc is not None
            and lc.state in (State.SUSPENDED, State.RESTORING)
            and (kernel is None or not kernel.trait_has_value("last_activity"))
        ):
            return self._suspended_model(kernel_id)
        model = super().kernel_model(kernel_id)
        model["ckpt"] = self.ckpt_field(kernel_id)
        return model

    def list_kernels(self) -> list[dict[str, Any]]:
        models = super().list_kernels()
        for model in models:
            model["ckpt"] = self.ckpt_field(model["id"])
        listed = {m["id"] for m in models}
        models.extend(self._suspended_model(k) for k in list(self.suspended) if k not in listed)
        return models

    # -- websockets closing after their kernel was suspended --------------------------------
    # A connection tidies up through these when its socket closes; for a suspended kernel
    # there is no process left to detach from, only the old zmq streams to close.

    def remove_restart_callback(
        self, kernel_id: str, callback: Any, event: str = "restart"
    ) -> None:
        if self.has_process(kernel_id):
            super().remove_restart_callback(kernel_id, callback, event)

    def start_buffering(self, kernel_id: str, session_key: str, channels: dict) -> None:
        if not self.is_suspended(kernel_id):
            super().start_buffering(kernel_id, session_key, channels)
            return
        for stream in channels.values():
            if not stream.closed():
                stream.close()

    # -- the kernels API's actions -----------------------------------------------------------

    def start_watching_activity(self, kernel_id: str) -> None:
        super().start_watching_activity(kernel_id)
        if self.lifecycles is not None:
            self.lifecycles.watch(kernel_id, True)

    def stop_watching_activity(self, kernel_id: str) -> None:
        if self.lifecycles is not None:
            self.lifecycles.watch(kernel_id, False)
        super().stop_watching_activity(kernel_id)

    async def _async_start_kernel(
        self, *, kernel_id: str | None = None, path: ApiPath | None = None, **kwargs: Any
    ) -> str:
        """Start a kernel with the store in its environment; a suspended id is returned
        as an existing kernel (it restores when a client needs it). An id its user shut
        down is not started again: a stale client would get an empty kernel there."""
        if kernel_id is not None and kernel_id in self:
            return await super()._async_start_kernel(kernel_id=kernel_id, path=path, **kwargs)
        if self.lifecycles is None:
            return await super()._async_start_kernel(kernel_id=kernel_id, path=path, **kwargs)
        try:
            self.lifecycles.refuse_gone(kernel_id)
        except SuspendFailed as exc:
            raise web.HTTPError(404, str(exc)) from exc
        if self.gpu_gate is not None and restoring.get() is None:
            kernel_id = kernel_id or str(uuid.uuid4())
            try:
                name = kwargs.get("kernel_name") or self.default_kernel_name
                await self.gpu_gate(kernel_id, name)
            except CkptError as exc:
                raise web.HTTPError(503, str(exc)) from exc
        base_env = kwargs.pop("env", None) or os.environ
        env = {**base_env, **self.ckpt_env}
        if self.notebook_ids is not None:
            env.update(self.notebook_ids.env_for(env))
        kernel_id = await super()._async_start_kernel(
            kernel_id=kernel_id, path=path, env=env, **kwargs
        )
        self.add_restart_callback(
            kernel_id, functools.partial(self.lifecycles.process_restarted, kernel_id)
        )
        await self.lifecycles.started(
            kernel_id,
            {
                "kernel_name": self.get_kernel(kernel_id).kernel_name,
                "path": path,
                # only what differs from the server's environment: the rest is inherited
                "env": {k: v for k, v in env.items() if os.environ.get(k) != v},
            },
        )
        return kernel_id

    start_kernel = _async_start_kernel  # type: ignore[assignment]

    def pre_start_kernel(self, kernel_name: str | None, kwargs: Any) -> tuple[Any, str, str]:
        """The manager of a kernel about to start: for a restore, the process standing
        by for its spec when there is one (see :mod:`.standby`)."""
        manager, kernel_name, kernel_id = super().pre_start_kernel(kernel_name, kwargs)
        if self.lifecycles is not None and restoring.get() == kernel_id:
            standby = self.lifecycles.standby.take(kernel_name, kwargs.get("env") or {})
            if standby is not None:
                return standby, kernel_name, kernel_id
        return manager, kernel_name, kernel_id

    async def _async_shutdown_kernel(  # type: ignore[override]
        self, kernel_id: str, now: bool = False, restart: bool = False
    ) -> None:
        if self.lifecycles is not None and self.lifecycles.get(kernel_id) is not None:
            await self.lifecycles.shutdown(kernel_id)
        elif not self.has_process(kernel_id):
            raise web.HTTPError(404, f"Kernel does not exist: {kernel_id}")  # as upstream
        if self.has_process(kernel_id):
            await self.stop_process(kernel_id, now=now, restart=restart)

    shutdown_kernel = _async_shutdown_kernel  # type: ignore[assignment]

    async def stop_process(self, kernel_id: str, now: bool = False, restart: bool = False) -> None:
        """Shut the kernel's process down and keep any record: a suspend's last step."""
        await super()._async_shutdown_kernel(kernel_id, now=now, restart=restart)

    async def _async_shutdown_all(self, now: bool = False) -> None:
        """The server stops: kernels that could not be suspended keep their records (a
        running kernel's last autosave stays recoverable), unlike a user's shutdown."""
        if self.lifecycles is not None:
            self.lifecycles.stopping = True
            await self.lifecycles.standby.close()
        await super()._async_shutdown_all(now=now)

    shutdown_all = _async_shutdown_all  # type: ignore[assignment]

    async def interrupt_kernel(self, kernel_id: str) -> None:  # type: ignore[override]
        if self.lifecycles is not None:
            await self.lifecycles.settle(kernel_id, "interrupt")
        if not self.has_process(kernel_id):
            return  # nothing runs in a suspended kernel
        await ensure_async(super().interrupt_kernel(kernel_id))

    async def _async_restart_kernel(self, kernel_id: str, now: bool = False) -> Any:
        """Restarting a kernel gives its state up; restarting a suspended one means
        starting it fresh, as a restart drops a running kernel's state."""
        record = self.suspended.get(kernel_id)
        if self.lifecycles is not None:
            await self.lifecycles.restarted(kernel_id)
        if self.has_process(kernel_id):
            restarted = await super()._async_restart_kernel(kernel_id, now=now)
            if self.lifecycles is not None:
                # on the same ports, what the server's watches last saw was the old
                # process's (its "idle", its first message): the new one would be handed
                # out before the server hears it, and its first cell go unseen
                kernel: Any = self.get_kernel(kernel_id)  # jupyter_server adds the state
                kernel.execution_state = "starting"
                self.lifecycles.watch(kernel_id, True)
                await self.lifecycles.started(kernel_id, self.lifecycles[kernel_id].launch)
            return restarted
        if record is None:
            raise web.HTTPError(404, f"Kernel does not exist: {kernel_id}")
        await self._async_start_kernel(
            kernel_id=kernel_id,
            kernel_name=record["kernel_name"],
            path=record.get("path"),
            env={**os.environ, **record.get("env", {})},
        )
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    restart_kernel = _async_restart_kernel  # type: ignore[assignment]

    def update_env(self, *, kernel_id: str, env: dict[str, str]) -> None:
        """A session moved (renamed notebook, PATCH /api/sessions): a running kernel's
        environment as upstream; a suspended kernel's record follows (it has no process)."""
        if self.has_process(kernel_id):
            super().update_env(kernel_id=kernel_id, env=env)
        if self.lifecycles is not None and self.lifecycles.get(kernel_id) is not None:
            task = asyncio.ensure_future(self.lifecycles.update_env(kernel_id, env))
            self._env_updates.add(task)
            task.add_done_callback(self._env_updates.discard)
