"""A resume: a new kernel started and restored from a saved image, for a notebook (it
takes over the notebook's session) or a console. Kernels whose restore of that image
failed then hold no pin on it any more (restore-failed -> running)."""

from __future__ import annotations

import asyncio
import posixpath
import time
from typing import Any

from jupyter_ckpt.errors import GpuUnavailable
from jupyter_ckpt.gpu import image_device_bytes

from ..rpc import SuspendFailed
from .checkpoint import Checkpoint
from .kernels import Kernels
from .records import RecordKeeper
from .restore import Restore
from .states import State

S = State


class Resume:
    """Resumes of images, one per notebook (or image) at a time: a double click shares one."""

    def __init__(
        self, owner: Kernels, keeper: RecordKeeper, restores: Restore, checkpoints: Checkpoint
    ) -> None:
        self.owner = owner
        self.keeper = keeper
        self.restores = restores
        self.checkpoints = checkpoints
        self._running: dict[str, tuple[str, asyncio.Task[dict[str, Any]]]] = {}

    async def run(self, image_id: str, path: str | None, kernel_name: str | None) -> dict[str, Any]:
        """Start a new kernel restored from an image, for a notebook or a console. Two
        resumes of one notebook at once (a double click) share one restore."""
        key = f"path:{path}" if path else f"image:{image_id}"
        running = self._running.get(key)
        if running is not None:
            if running[0] != image_id:
                raise SuspendFailed(f"another image is being resumed into {path} right now")
            return await asyncio.shield(running[1])
        task = asyncio.ensure_future(self._resume(image_id, path, kernel_name))
        self._running[key] = (image_id, task)
        task.add_done_callback(lambda _: self._running.pop(key, None))
        return await asyncio.shield(task)

    async def _resume(
        self, image_id: str, path: str | None, kernel_name: str | None
    ) -> dict[str, Any]:
        owner = self.owner
        started = time.perf_counter()
        manifest = await self.restores.ensure_compatible(image_id)
        if path:
            # as the session manager starts a notebook's kernel: in the notebook's
            # directory, with JPY_SESSION_NAME, so later images keep naming the notebook
            kernel_id = await owner.session_manager.start_kernel_for_session(
                session_id="",
                path=path,
                name=posixpath.basename(path),
                type="notebook",
                kernel_name=kernel_name,
            )
        else:
            kernel_id = await owner.km.start_kernel(kernel_name=kernel_name)
        lc = owner.kernels[kernel_id]
        failed: SuspendFailed | None
        async with lc.lock:
            try:
                await self.restores.gpu_memory(lc, image_device_bytes(manifest or {}))
                async with owner.progress.watch(kernel_id, "resume") as progress:
                    report = await owner.rpc.call(
                        kernel_id,
                        f"restore({image_id!r}, progress={progress!r})",
                        owner.policy.checkpoint_timeout,
                    )
            except (SuspendFailed, GpuUnavailable) as exc:
                owner.events.failure("resume", kernel_id, "api", exc, started)
                failed = exc if isinstance(exc, SuspendFailed) else SuspendFailed(str(exc))
            else:
                failed = None
                await self.restores.restored(lc, image_id)
        if failed is not None:
            if kernel_id in owner.km:  # a shutdown may have ended the wait
                await owner.km.shutdown_kernel(kernel_id)
            raise failed
        session = await self._attach(path, kernel_id) if path else None
        await self._release(image_id)
        owner.events.event("resume", kernel_id, "api", started, report)
        return {"kernel_id": kernel_id, "session": session, "restore": report}

    async def _attach(self, path: str, kernel_id: str) -> dict[str, Any]:
        """Make ``kernel_id`` the one kernel of the notebook at ``path``: its existing
        session (open or not) moves to the new kernel and the kernel it had is shut down,
        so the notebook can never attach to the old kernel, nor leave the new one
        orphaned. A running old kernel is checkpointed first, so its variables stay in the
        store as an image; a suspended one loses only its record: its image is kept."""
        owner = self.owner
        sessions = owner.session_manager
        existing = [s for s in await sessions.list_sessions() if s["path"] == path]
        if not existing:
            return await sessions.create_session(
                path=path, name=posixpath.basename(path), type="notebook", kernel_id=kernel_id
            )
        old = {s["kernel"]["id"] for s in existing} - {kernel_id}
        for session in existing:
            await sessions.update_session(session["id"], kernel_id=kernel_id)
        for old_id in old:
            if owner.km.has_process(old_id):
                try:
                    await self.checkpoints.run(old_id, None, "replaced")
                except SuspendFailed as exc:
                    owner.log.warning("Kernel %s replaced without a checkpoint: %s", old_id, exc)
            if old_id in owner.km:
                await owner.km.shutdown_kernel(old_id)
        return await sessions.get_session(session_id=existing[0]["id"])

    async def _release(self, image_id: str) -> None:
        """The image was resumed: kernels whose restore of it failed no longer pin it."""
        for lc in self.owner.in_state(S.RESTORE_FAILED):
            if lc.record is not None and lc.record["image_id"] == image_id:
                async with lc.lock:
                    await self.keeper.drop(lc)
                    lc.state = S.RUNNING
                    lc.restore_error = lc.unrestored = None
