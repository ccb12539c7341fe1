"""What the REST API does, as plain async methods testable without tornado."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from jupyter_server.utils import ApiPath, to_os_path

from jupyter_ckpt import compat
from jupyter_ckpt.errors import InvalidReference

from .demand import GpuDemand
from .manager import CkptManager, NothingToSave, SuspendFailed
from .monitor import IdleMonitor
from .notebookids import NotebookIds
from .storehealth import StoreHealth
from .storeusage import StoreUsage
from .work import quiet_call


def image_summary(manifest: dict[str, Any]) -> dict[str, Any]:
    variables = manifest.get("variables", [])
    kernel = manifest.get("kernel", {})
    return {
        "id": manifest["id"],
        "name": manifest["name"],
        "created": manifest["created"],
        "parent": manifest.get("parent"),
        # why it was written: autosave, idle, manual, shutdown, replaced (None: older images)
        "trigger": manifest.get("trigger"),
        "kernel_id": kernel.get("id"),
        "notebook_path": kernel.get("notebook_path"),
        # the notebook file's id (jupyter_server_fileid), which follows renames and moves
        "notebook_id": kernel.get("notebook_id"),
        "devices": manifest.get("devices", []),
        "size": manifest.get("sizes", {}),
        "variables_count": len(variables),
        # the panel names the variables added or removed from one image to the next
        "variable_names": [v["name"] for v in variables],
        "lost": [v["name"] for v in variables if v["status"] == "lost"],
        # left out on purpose: the panel says so, and offers to save them again
        "excluded": [v["name"] for v in variables if v["status"] == "excluded"],
        "python": manifest.get("environment", {}).get("python"),
        "gpu": _gpu_summary(manifest),
    }


def _notebook_id(manifest: dict[str, Any]) -> str | None:
    return (manifest.get("kernel") or {}).get("notebook_id")


def _gpu_summary(manifest: dict[str, Any]) -> dict[str, Any] | None:
    """The GPU model the image's tensors were on and the bytes they held there."""
    cuda = [d for d in manifest.get("devices", []) if d.startswith("cuda")]
    if not cuda:
        return None
    gpus = {g["index"]: g for g in manifest.get("gpu", {}).get("gpus", [])}
    first = gpus.get(int(cuda[0].partition(":")[2] or 0), {})
    held = sum(
        v.get("bytes", 0)
        for v in manifest.get("variables", [])
        if any(d.startswith("cuda") for d in v.get("devices", []))
    )
    return {"model": first.get("name"), "memory_bytes": held}


def check_path(path: str, root_dir: str) -> None:
    """Refuse a notebook path that leads outside the server's root directory."""
    root = os.path.realpath(root_dir)
    target = os.path.realpath(to_os_path(ApiPath(path), root))
    if os.path.commonpath([root, target]) != root:
        raise InvalidReference(f"path {path!r} is outside the server's root directory")


class CkptService:
    """Images, resume, suspend-all and status for the REST handlers."""

    store_health: StoreHealth | None = None  # set when the extension starts

    def __init__(
        self,
        manager: CkptManager,
        monitor: IdleMonitor,
        session_manager: Any,
        demand: GpuDemand | None = None,
        notebook_ids: NotebookIds | None = None,
        store_usage: StoreUsage | None = None,
    ) -> None:
        self.manager = manager
        self.monitor = monitor
        self.session_manager = session_manager
        self.demand = demand
        self.notebook_ids = notebook_ids
        self.store_usage = store_usage

    @property
    def node(self) -> dict[str, Any]:
        return self.manager.node

    async def _image_states(self) -> dict[str, dict[str, str]]:
        """The images kernels hold, and how: ``suspended`` (a suspended kernel comes back
        from it), ``restore-failed`` (kept for a retry), ``autosave`` (a running kernel's
        crash-recovery record names it). The store refuses to delete any of them."""
        records, _ = await asyncio.to_thread(self.manager.records.all)
        return {
            **{
                r["image_id"]: {"state": "autosave", "kernel_id": k}
                for k, r in records.items()
                if r.get("state") == "running"
                and r.get("image_id")
                and r.get("trigger") != "checkpoint"
            },
            **self.manager.lifecycles.pinned(),
        }

    async def _in_use(self) -> dict[str, list[dict[str, Any]]]:
        """Image id -> the running kernels that run from it, each with its sessions (the
        notebook or console a user knows it by)."""
        running = self.manager.lifecycles.running_from()
        if not running:
            return {}
        sessions: dict[str | None, list[dict[str, Any]]] = {}
        if self.session_manager is not None:
            for session in await self.session_manager.list_sessions():
                kernel_id = (session.get("kernel") or {}).get("id")
                about = {key: session.get(key) for key in ("name", "path", "type")}
                sessions.setdefault(kernel_id, []).append(about)
        return {
            image_id: [{"kernel_id": k, "sessions": sessions.get(k, [])} for k in kernels]
            for image_id, kernels in running.items()
        }

    async def list_images(self) -> list[dict[str, Any]]:
        entries = await asyncio.to_thread(lambda: list(self.manager.store.iter_manifests()))
        states = await self._image_states()
        in_use = await self._in_use()
        valid = [m for _, m, _ in entries if m is not None]
        verdicts = iter(compat.check_all(valid, self.node))
        paths = self._notebook_paths(valid)
        images: list[dict[str, Any]] = []
        for image_id, manifest, error in entries:
            if manifest is None:
                images.append({"id": image_id, "state": "invalid", "error": error})
                continue
            images.append(
                {
                    **image_summary(manifest),
                    **states.get(image_id, {"state": "saved"}),
                    "notebook_current_path": paths.get(_notebook_id(manifest)),
                    "in_use_by": in_use.get(image_id, []),
                    "compatibility": next(verdicts),
                }
            )
        return images

    async def image(self, ref: str) -> dict[str, Any]:
        manifest = await asyncio.to_thread(self.manager.store.open, ref)
        states = await self._image_states()
        in_use = await self._in_use()
        return {
            **image_summary(manifest),
            **states.get(manifest["id"], {"state": "saved"}),
            "notebook_current_path": self._notebook_paths([manifest]).get(_notebook_id(manifest)),
            "in_use_by": in_use.get(manifest["id"], []),
            "variables": manifest.get("variables", []),
            "environment": manifest.get("environment", {}),
            "compatibility": compat.check(manifest, self.node),
        }

    def _notebook_paths(self, manifests: list[dict[str, Any]]) -> dict[str | None, str | None]:
        """Notebook file id -> the file's API path now (None: gone), for the images'
        notebooks: one look-up per notebook, not per image."""
        ids = {_notebook_id(m) for m in manifests} - {None}
        if self.notebook_ids is None:
            return {}
        return {i: self.notebook_ids.path_of(i) for i in ids}

    async def delete_image(self, ref: str) -> str:
        started = time.perf_counter()
        # The store refuses (ImageInUse) while a kernel's record names the image: a
        # suspended kernel's, or a running kernel's autosave (see _image_states).
        await self.manager.lifecycles.release_checkpoint(
            await asyncio.to_thread(self.manager.store.resolve, ref)
        )
        image_id = await asyncio.to_thread(self.manager.store.delete, ref)
        self.manager.events.event("delete", None, "api", started, {"id": image_id})
        return image_id

    async def resume(
        self, ref: str, path: str | None = None, kernel_name: str | None = None
    ) -> dict[str, Any]:
        """Start a new kernel restored from an image; with ``path``, it becomes the kernel
        of that notebook's session (the old kernel is checkpointed, then shut down)."""
        km = self.manager.kernel_manager
        if path is not None:
            check_path(path, km.root_dir)
        image_id = await asyncio.to_thread(self.manager.store.resolve, ref)
        resumed = await self.manager.lifecycles.resume(image_id, path, kernel_name)
        return {
            "kernel": km.kernel_model(resumed["kernel_id"]),
            "session": resumed["session"],
            "restore": resumed["restore"],
        }

    async def suspend_all(self, trigger: str, timeout: float | None = None) -> dict[str, Any]:
        """Suspend every running kernel that would lose state, in parallel, within
        ``timeout``. ``failed``: kernels that keep running with their state, and why;
        ``nothing_to_save``: kernels that turned out to hold none (died, gone, suspended
        already); ``excluded``: kernels of ``exclude_kernel_names``, never saved."""
        manager = self.manager
        excluded = set(manager.policy.exclude_kernel_names)
        km = manager.kernel_manager
        running = km.running_ids()
        skipped = [k for k in running if km.get_kernel(k).kernel_name in excluded]
        tasks = {
            k: asyncio.ensure_future(manager.suspend(k, trigger=trigger, timeout=timeout))
            for k in running
            if k not in skipped
        }
        if tasks:
            await asyncio.wait(tasks.values(), timeout=timeout)
        suspended, failed, nothing = [], {}, {}
        for kernel_id, task in tasks.items():
            if not task.done():
                task.cancel()
                failed[kernel_id] = f"not done within {timeout} s"
            elif isinstance(task.exception(), NothingToSave):
                nothing[kernel_id] = str(task.exception())
            elif task.exception() is not None:
                failed[kernel_id] = str(task.exception())
            else:
                suspended.append(kernel_id)
        return {
            "suspended": suspended,
            "failed": failed,
            "nothing_to_save": nothing,
            "excluded": skipped,
        }

    async def status(self, kernel_id: str | None = None) -> dict[str, Any]:
        """Policy, node and every kernel; with ``kernel_id``, that kernel only, with its
        background work checked now (what "Suspend Kernel Now" would stop)."""
        manager = self.manager
        km = manager.kernel_manager
        kernels = []
        if kernel_id:
            await self._check_unsaveable(kernel_id)
        for assessment in await self.monitor.assess([kernel_id] if kernel_id else None):
            kernels.append(
                {
                    **assessment.to_json(),
                    "state": km.ckpt_field(assessment.kernel_id)["state"],
                    "last_failure": manager.events.failures.get(assessment.kernel_id),
                }
            )
        kernels.extend(
            {"kernel_id": k, "kernel_name": record["kernel_name"], **km.ckpt_field(k)}
            for k, record in list(km.suspended.items())
            if kernel_id in (None, k)
        )
        demand = self.demand
        for kernel in kernels:  # its place in a GPU demand queue, or None
            kernel["gpu_demand"] = demand.status_of(kernel["kernel_id"]) if demand else None
        return {
            "policy": manager.policy.to_json(),
            "gpu_demand": demand.to_json() if demand else None,
            "store": await self._store_status(),
            "node": self.node,
            "kernels": kernels,
        }

    async def _store_status(self) -> dict[str, Any] | None:
        """The store's health, and its use against its quota (``usage``; null while it
        cannot be read)."""
        if self.store_health is None:
            return None
        usage = await self.store_usage.current() if self.store_usage else None
        return {**self.store_health.to_json(), "usage": usage}

    async def _check_unsaveable(self, kernel_id: str) -> None:
        """Which variables a suspend now would leave out, asked now (a client asks after
        each cell): one a cell just made is announced at once, not at the next save
        minutes later; one the user deleted, rebound or excluded no longer keeps the
        kernel up. The kernel's look is cheap (see :mod:`jupyter_ckpt.kernel.probe`)."""
        manager = self.manager
        failure = manager.events.failures.get(kernel_id)
        failed = bool(failure and failure.get("lost"))
        km = manager.kernel_manager
        if not km.is_running(kernel_id):
            return
        if km.get_kernel(kernel_id).execution_state == "busy":  # type: ignore[attr-defined]
            return  # asked again when the cell is done
        timeout = manager.policy.activity_timeout
        try:
            found = await quiet_call(manager, kernel_id, "unsaveable_now()", timeout)
        except (SuspendFailed, asyncio.TimeoutError):
            return  # they stand until the kernel can say
        still = set(found)
        self.monitor.saw_unsaveable(kernel_id, sorted(found))
        # unless a newer attempt replaced the failure meanwhile
        if failure and failed and manager.events.failures.get(kernel_id) is failure:
            lost = {name: why for name, why in failure["lost"].items() if name in still}
            if lost:
                failure["lost"] = lost
            else:
                del manager.events.failures[kernel_id]
