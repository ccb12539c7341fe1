"""The kernel manager that keeps suspended kernels under their ids.

Why a ``MappingKernelManager`` subclass (enabled with ``ServerApp.kernel_manager_class``)
rather than patching handlers: the kernel manager is the one place every part of the server
asks whether a kernel exists. The kernels API lists and describes kernels through it, the
session manager drops any session whose kernel is not ``in`` it, and JupyterLab disposes a
kernel connection as soon as its id leaves ``/api/kernels``. Answering those questions here
keeps a suspended kernel's id, model and sessions alive with no change to any handler.

A suspended kernel has no ``KernelManager`` object (its process is gone); it is a record in
:attr:`CkptKernelManager.suspended`. ``in`` and the models cover both kinds.

The kernels API's actions (restart, shutdown, interrupt) first let the checkpoint manager
settle a suspend or restore in progress (:attr:`CkptKernelManager.before_action`), so that
each ends in the state the user asked for rather than the one the suspend or restore was
heading to.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
from collections.abc import Awaitable, Callable
from typing import Any

from jupyter_core.utils import ensure_async
from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager

# The id of the kernel that a restore is starting in the current task. jupyter_server and
# jupyter_client refuse to start a kernel with an id that is already ``in`` the manager;
# only the restoring task must see the suspended id as free, while every other task (a
# session listing polled during the restore) must still see the kernel.
restoring: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "jupyter_ckpt_restoring", default=None
)


class CkptKernelManager(AsyncMappingKernelManager):
    """``AsyncMappingKernelManager`` that also lists, describes and forgets suspended
    kernels, and starts kernels with the server's image store in their environment."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # kernel id -> its suspended-kernel record (plus "state": suspended | restoring)
        self.suspended: dict[str, dict[str, Any]] = {}
        # kernel id -> how it was started (name, path, environment), for its record
        self.launch: dict[str, dict[str, Any]] = {}
        # environment every kernel gets: the store and secret of the server's ImageStore
        self.ckpt_env: dict[str, str] = {}
        # kernel id -> ckpt state of a running kernel ("suspending")
        self.ckpt_states: dict[str, str] = {}
        # kernel id -> clients connected to it while it is suspended
        self.suspended_connections: dict[str, int] = {}
        # kernel id -> the record of a kernel running without its image because the
        # restore failed; the record (and so the image's pin) stays until the kernel is
        # shut down, restarted, suspended again or its image resumed elsewhere
        self.failed_restores: dict[str, dict[str, Any]] = {}
        # called when a suspended kernel is shut down for good (drops its record)
        self.on_discard: Callable[[str], Awaitable[None]] | None = None
        # awaited with (kernel id, "shutdown" | "restart" | "interrupt") before the action:
        # aborts or waits for a suspend or restore of that kernel in progress
        self.before_action: Callable[[str, str], Awaitable[None]] | None = None
        # called with (kernel id, True) once the server watches a started or restarted
        # kernel's iopub, (kernel id, False) when it stops: the autosaver watches it too
        self.on_watch: Callable[[str, bool], None] | None = None
        # awaited once a started or restarted kernel is watched, before it is handed out:
        # the autosaver makes sure its watch sees the first cell
        self.after_start: Callable[[str], Awaitable[None]] | None = None

    def __contains__(self, kernel_id: object) -> bool:
        if kernel_id in self._kernels:
            return True
        return kernel_id in self.suspended and restoring.get() != kernel_id

    def is_suspended(self, kernel_id: str) -> bool:
        """Listed and served as suspended: from the moment its image is committed, while
        the old process is still shutting down (clients reconnecting then must not attach
        to a dying kernel; a restore waits for the suspend to finish), until a restore has
        started the new process."""
        record = self.suspended.get(kernel_id)
        return record is not None and (
            kernel_id not in self._kernels or record["state"] == "suspended"
        )

    def _has_no_process(self, kernel_id: str) -> bool:
        return kernel_id in self.suspended and kernel_id not in self._kernels

    def is_running(self, kernel_id: str) -> bool:
        """A kernel process exists (it may also be suspending or restoring)."""
        return kernel_id in self._kernels

    def running_ids(self) -> list[str]:
        return list(self._kernels)

    # -- models ---------------------------------------------------------------------------

    def _suspended_model(self, kernel_id: str) -> dict[str, Any]:
        record = self.suspended[kernel_id]
        return {
            "id": kernel_id,
            "name": record["kernel_name"],
            "last_activity": record["last_activity"],
            # JupyterLab knows no "suspended" status; idle keeps the notebook usable
            "execution_state": "idle" if record["state"] == "suspended" else "starting",
            "connections": self.suspended_connections.get(kernel_id, 0),
            "ckpt": self.ckpt_field(kernel_id),
        }

    def ckpt_field(self, kernel_id: str) -> dict[str, Any]:
        record = self.suspended.get(kernel_id)
        if record is None:
            failed = self.failed_restores.get(kernel_id)
            if failed is not None and kernel_id not in self.ckpt_states:
                return {
                    "state": "restore-failed",
                    "image": failed["image_id"],
                    "suspended_at": failed["suspended_at"],
                    "error": failed["restore_error"],
                }
            return {"state": self.ckpt_states.get(kernel_id, "running")}
        field = {
            "state": record["state"],
            "image": record["image_id"],
            "suspended_at": record["suspended_at"],
            "gpu_bytes": record.get("gpu", {}).get("bytes", 0),
        }
        if "recovered" in record:
            field["recovered"] = record["recovered"]
        return field

    def kernel_model(self, kernel_id: str) -> dict[str, Any]:
        # A restore's new process is in _kernels a moment before jupyter_server gives it
        # its activity markers: until then it is modelled from its record.
        kernel = self._kernels.get(kernel_id)
        if kernel_id in self.suspended and (
            kernel is None or not kernel.trait_has_value("last_activity")
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
        if not self._has_no_process(kernel_id):
            super().remove_restart_callback(kernel_id, callback, event)

    def start_buffering(self, kernel_id: str, session_key: str, channels: dict) -> None:
        if not self.is_suspended(kernel_id):
            super().start_buffering(kernel_id, session_key, channels)
            return
        for stream in channels.values():
            if not stream.closed():
                stream.close()

    # -- lifecycle ------------------------------------------------------------------------

    def start_watching_activity(self, kernel_id: str) -> None:
        super().start_watching_activity(kernel_id)
        if self.on_watch is not None:
            self.on_watch(kernel_id, True)

    def stop_watching_activity(self, kernel_id: str) -> None:
        if self.on_watch is not None:
            self.on_watch(kernel_id, False)
        super().stop_watching_activity(kernel_id)

    async def _async_start_kernel(  # type: ignore[override]
        self, *, kernel_id: str | None = None, path: str | None = None, **kwargs: Any
    ) -> str:
        """Start a kernel with the store in its environment; a suspended id is returned
        as an existing kernel (it restores when a client needs it)."""
        if kernel_id is not None and kernel_id in self:
            return await super()._async_start_kernel(kernel_id=kernel_id, path=path, **kwargs)
        base_env = kwargs.pop("env", None) or os.environ
        env = {**base_env, **self.ckpt_env}
        kernel_id = await super()._async_start_kernel(
            kernel_id=kernel_id, path=path, env=env, **kwargs
        )
        if self.after_start is not None:
            await self.after_start(kernel_id)
        self.launch[kernel_id] = {
            "kernel_name": self.get_kernel(kernel_id).kernel_name,
            "path": path,
            # only what differs from the server's environment: the rest is inherited again
            "env": {k: v for k, v in env.items() if os.environ.get(k) != v},
        }
        return kernel_id

    start_kernel = _async_start_kernel  # type: ignore[assignment]

    async def _settle(self, kernel_id: str, action: str) -> None:
        if self.before_action is not None:
            await self.before_action(kernel_id, action)

    async def _discard(self, kernel_id: str) -> None:
        """The kernel's record is no longer needed: the user gave its state up."""
        if self.on_discard is not None:
            await self.on_discard(kernel_id)
        self.suspended.pop(kernel_id, None)
        self.failed_restores.pop(kernel_id, None)

    async def _async_shutdown_kernel(  # type: ignore[override]
        self, kernel_id: str, now: bool = False, restart: bool = False
    ) -> None:
        await self._settle(kernel_id, "shutdown")
        if self._has_no_process(kernel_id):
            await self._discard(kernel_id)
            return
        if kernel_id in self.failed_restores or kernel_id in self.suspended:
            await self._discard(kernel_id)  # a restore that failed or was aborted
        await self.stop_process(kernel_id, now=now, restart=restart)

    shutdown_kernel = _async_shutdown_kernel  # type: ignore[assignment]

    async def stop_process(self, kernel_id: str, now: bool = False, restart: bool = False) -> None:
        """Shut the kernel's process down and keep any record: a suspend's last step."""
        self.launch.pop(kernel_id, None)
        self.ckpt_states.pop(kernel_id, None)
        await super()._async_shutdown_kernel(kernel_id, now=now, restart=restart)

    async def _async_interrupt_kernel(self, kernel_id: str) -> None:
        await self._settle(kernel_id, "interrupt")
        if self._has_no_process(kernel_id):
            return  # nothing runs in a suspended kernel
        await ensure_async(super().interrupt_kernel(kernel_id))

    interrupt_kernel = _async_interrupt_kernel  # type: ignore[assignment]

    async def _async_restart_kernel(self, kernel_id: str, now: bool = False) -> Any:
        """Restarting a suspended kernel means starting it fresh: its state is dropped,
        as a restart drops a running kernel's state."""
        await self._settle(kernel_id, "restart")
        if not self._has_no_process(kernel_id):
            if kernel_id in self.failed_restores or kernel_id in self.suspended:
                await self._discard(kernel_id)
            restarted = await super()._async_restart_kernel(kernel_id, now=now)
            if self.after_start is not None:
                await self.after_start(kernel_id)
            return restarted
        record = self.suspended[kernel_id]
        await self._async_shutdown_kernel(kernel_id)
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
