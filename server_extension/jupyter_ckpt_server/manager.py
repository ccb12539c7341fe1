"""Checkpoint, suspend and restore kernels: the server side of DESIGN section 4.

The server never unpickles user objects: it asks the kernel to write (or read) its image
through a silent execute of ``jupyter_ckpt.kernel`` (not stored in history, no execution
count), reads the JSON summary back from ``user_expressions``, and checks the result
against the store (signature and every chunk) before it shuts anything down.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import os
import queue
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from datetime import datetime, timezone
from typing import Any

from jupyter_client.session import Session
from jupyter_core.paths import jupyter_runtime_dir
from jupyter_core.utils import ensure_async
from traitlets import Any as AnyTrait
from traitlets import Float, Instance, Unicode, default
from traitlets.config import LoggingConfigurable

from jupyter_ckpt import compat
from jupyter_ckpt.errors import CkptError, IncompatibleImage
from jupyter_ckpt.gpu import GpuProbe, GpuSnapshot, GpuUsage
from jupyter_ckpt.store import ImageStore

from .kernelmanager import CkptKernelManager, restoring
from .policy import SuspendPolicy
from .progress import ProgressWatch
from .recovery import recovered_field, recovery_message, writer_alive

# seconds between two checks that a kernel we wait for is still alive
_LIVENESS_POLL = 1.0

_CALL = "__import__('json').dumps(__import__('jupyter_ckpt.kernel').kernel.{call})"


class SuspendFailed(CkptError):
    """A kernel could not be checkpointed or suspended; it keeps running. ``lost``: the
    variables that could not be saved, when that is why (name -> reason)."""

    def __init__(self, message: str, lost: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.lost = lost or {}


class NothingToSave(SuspendFailed):
    """The kernel holds no state to save: its process has died or is gone already, or it
    is suspended already. Stopping its server loses nothing."""


class Aborted(SuspendFailed):
    """A client or a kernels-API action needed the kernel: the suspend or restore stops."""


# what a kernels-API action tells a suspend or restore in progress
_ACTIONS = {
    "shutdown": "the kernel was shut down",
    "restart": "the kernel was restarted",
    "interrupt": "the kernel was interrupted",
}


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


async def _shared(
    tasks: dict[str, asyncio.Task[dict[str, Any]]],
    kernel_id: str,
    start: Callable[[], Coroutine[Any, Any, dict[str, Any]]],
) -> dict[str, Any]:
    """Run ``start()`` once per kernel at a time; callers arriving meanwhile share its
    result, and cancelling one caller does not cancel the others' work."""
    task = tasks.get(kernel_id)
    if task is None:
        task = tasks[kernel_id] = asyncio.ensure_future(start())
        task.add_done_callback(lambda _: tasks.pop(kernel_id, None))
    return await asyncio.shield(task)


# what an image holds, as opposed to when, where and under which name it was written
_CONTENT = ("kernel", "variables", "imports", "groups", "excluded", "devices", "environment")


def _content(manifest: dict[str, Any]) -> dict[str, Any]:
    return {key: manifest.get(key) for key in _CONTENT}


def _describe_lost(lost: dict[str, str]) -> str:
    return "; ".join(f"{name} ({why})" for name, why in lost.items())


class CkptManager(LoggingConfigurable):
    """Suspends and restores the kernels of one :class:`CkptKernelManager`."""

    policy = Instance(SuspendPolicy)
    store = Instance(ImageStore)
    kernel_manager = Instance(CkptKernelManager)
    probe = Instance(GpuProbe, args=())
    emit = AnyTrait(help="callable(data): emit one jupyter_ckpt event")
    before_suspend = AnyTrait(
        None,
        allow_none=True,
        help="async callable(kernel_id), awaited as a suspend starts: an autosave of the "
        "kernel in progress finishes first, so the two never overlap.",
    )
    after_restore = AnyTrait(
        None,
        allow_none=True,
        help="async callable(kernel_id, record), awaited inside a successful restore with "
        "the suspended record it replaced (after a resume, a record naming the image): the "
        "autosaver records the restored kernel before any autosave of it can start.",
    )
    session_manager = AnyTrait(
        None,
        allow_none=True,
        help="""The server's SessionManager: a kernel's record keeps its sessions, so that
        after a restart or a respawn on another node its notebooks reopen attached to it.""",
    )
    step_hook = AnyTrait(
        None,
        allow_none=True,
        help="""async callable(step, kernel_id), awaited before each awaited step of a
        suspend (kernel_info, checkpoint, verify, record), after its record is written
        (recorded) and before a restore loads the image (restore): widens each window
        for fault-injection tests.""",
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

    @default("node_facts_file")
    def _default_node_facts_file(self) -> str:
        return os.environ.get(compat.NODE_FACTS_ENV, "")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.records = self.store.records
        self._node: dict[str, Any] | None = None
        # kernel id -> why its last checkpoint or suspend failed (shown in status)
        self.failures: dict[str, dict[str, Any]] = {}
        self._suspending: dict[str, asyncio.Task[dict[str, Any]]] = {}
        # kernel id -> messages clients sent it (tells a check's own traffic from a user's)
        self.client_messages: Counter[str] = Counter()
        self._restores: dict[str, asyncio.Task[dict[str, Any]]] = {}
        # kernel id -> why its suspend (or restore) in progress must stop before it commits
        self._suspend_aborts: dict[str, str] = {}
        self._restore_aborts: dict[str, str] = {}
        self.restore_count = 0
        self.progress = ProgressWatch(self.progress_dir, self.emit, self.progress_interval)
        self.kernel_manager.on_discard = self.discard
        self.kernel_manager.before_action = self.settle

    @property
    def node(self) -> dict[str, Any]:
        """This node's facts; they change only with a driver reload, so asked once."""
        if self._node is None:
            self._node = compat.node_facts(self.node_facts_file or None, self.probe)
        return self._node

    async def ensure_compatible(self, image_id: str) -> None:
        """Refuse, with the reasons, an image this node cannot restore: before any kernel
        starts for it. Packages are looked up in the server's environment; kernels that
        run in another are described by the node facts file's ``packages``."""
        try:
            manifest = await asyncio.to_thread(self.store.load_manifest, image_id)
        except CkptError:
            return  # unreadable or gone: the restore itself reports that, as before
        problems = (await asyncio.to_thread(compat.assess, manifest, self.node))[0]
        if problems:
            raise IncompatibleImage(
                f"image '{manifest['name']}' ({image_id[:12]}) cannot be restored on this "
                f"node: {'; '.join(problems)}"
            )

    # -- talking to a kernel --------------------------------------------------------------

    async def _request(self, kernel_id: str, send: str, timeout: float, **kw: Any) -> dict:
        """Send one shell request on a private client and return its reply's content.
        Fails as soon as the kernel's process dies or is replaced (an automatic restart
        loses the state and the request with it), not only after ``timeout``."""
        kernel = self.kernel_manager.get_kernel(kernel_id)
        pid = self.kernel_pid(kernel_id)
        # Its own session: kernel.client() copies the manager's, so two calls at once (an
        # autosave and a checkpoint) would send the same message ids from the same shell
        # identity, and one could take the other's reply as its own.
        session = Session(key=kernel.session.key, signature_scheme=kernel.session.signature_scheme)
        client = kernel.client(session=session)
        client.start_channels(iopub=False, stdin=False, hb=False, control=False)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            msg_id = getattr(client, send)(**kw)
            while True:
                left = deadline - loop.time()
                if left <= 0:
                    raise SuspendFailed(f"the kernel did not answer within {timeout:.0f} s")
                try:
                    reply = await client.get_shell_msg(timeout=min(left, _LIVENESS_POLL))
                except queue.Empty:
                    alive = await ensure_async(kernel.is_alive())
                    if not alive or self.kernel_pid(kernel_id) != pid:
                        raise SuspendFailed("the kernel's process died") from None
                    continue
                if reply["parent_header"].get("msg_id") == msg_id:
                    return reply["content"]
        finally:
            client.stop_channels()

    async def kernel_call(self, kernel_id: str, call: str, timeout: float) -> dict[str, Any]:
        """Evaluate ``jupyter_ckpt.kernel.<call>`` silently in the kernel; its JSON result."""
        content = await self._request(
            kernel_id,
            "execute",
            timeout,
            code="",
            silent=True,
            store_history=False,
            user_expressions={"ckpt": _CALL.format(call=call)},
            allow_stdin=False,
        )
        result = content.get("user_expressions", {}).get("ckpt", content)
        if result.get("status") != "ok":
            ename, evalue = result.get("ename", "Error"), result.get("evalue", "")
            if ename == "ModuleNotFoundError" and "jupyter_ckpt" in evalue:
                raise SuspendFailed(
                    "the kernel's environment lacks jupyter_ckpt "
                    "(pip install jupyter-ckpt in the kernel's environment)"
                )
            raise SuspendFailed(f"{ename}: {evalue}")
        # text/plain is the repr of the JSON string: literal_eval reads it, runs nothing
        value = json.loads(ast.literal_eval(result["data"]["text/plain"]))
        if isinstance(value, dict) and value.get("error"):  # failed, and said why
            raise SuspendFailed(value["error"])
        return value

    def gpu_usage(self, kernel_id: str, snapshot: GpuSnapshot | None = None) -> GpuUsage:
        pid = self.kernel_pid(kernel_id)
        return self.probe.usage(pid, snapshot) if pid else GpuUsage()

    def kernel_pid(self, kernel_id: str) -> int | None:
        if not self.kernel_manager.is_running(kernel_id):
            return None
        kernel = self.kernel_manager.get_kernel(kernel_id)
        return getattr(getattr(kernel, "provisioner", None), "pid", None)

    # -- checkpoint and suspend -----------------------------------------------------------

    def _timeout(self, deadline: float | None) -> float:
        """Seconds one step may take: the policy's, capped by the caller's deadline."""
        timeout = self.policy.checkpoint_timeout
        if deadline is not None:
            timeout = min(timeout, deadline - time.monotonic())
        if timeout <= 0:
            raise SuspendFailed("no time left before the deadline")
        return timeout

    async def checkpoint(self, kernel_id: str, name: str | None = None) -> dict[str, Any]:
        """Write an image now; the kernel keeps running."""
        started = time.perf_counter()
        try:
            summary = await self._write_image(kernel_id, name, self._timeout(None))
        except SuspendFailed as exc:
            self.record_failure("checkpoint", kernel_id, "api", exc, started)
            raise
        self.record_event("checkpoint", kernel_id, "api", started, summary)
        await self.enforce_retention()
        return summary

    async def _write_image(
        self, kernel_id: str, name: str | None, timeout: float, action: str = "checkpoint"
    ) -> dict[str, Any]:
        if not self.kernel_manager.is_running(kernel_id):
            raise SuspendFailed(f"kernel {kernel_id} is not running")
        await self._hooked("checkpoint", kernel_id)
        async with self.progress.watch(kernel_id, action) as progress:
            call = f"checkpoint({name!r}, progress={progress!r})"
            summary = await self.kernel_call(kernel_id, call, timeout)
        await self._hooked("verify", kernel_id)
        try:
            await asyncio.to_thread(self.store.verify, summary["id"])
        except CkptError as exc:
            # a broken image must not be offered for restore or resume
            await asyncio.to_thread(self._forget_image, summary["id"])
            raise SuspendFailed(f"the image failed verification and was removed: {exc}") from exc
        return summary

    async def suspend(
        self, kernel_id: str, trigger: str = "api", timeout: float | None = None
    ) -> dict[str, Any]:
        """Write the kernel's image, record it, shut the kernel down; raise SuspendFailed
        (the kernel keeps running) if any step fails or another caller needs the kernel
        meanwhile. One suspend per kernel at a time; ``timeout`` caps the whole of it."""
        if kernel_id not in self._suspending:
            self._suspend_aborts.pop(kernel_id, None)
        deadline = None if timeout is None else time.monotonic() + timeout
        return await _shared(
            self._suspending, kernel_id, lambda: self._suspend(kernel_id, trigger, deadline)
        )

    def note_client_message(self, kernel_id: str) -> None:
        """A client sent the kernel a message (any channel): a suspend in progress must not
        shut the kernel down, or the message would be lost."""
        self.client_messages[kernel_id] += 1
        if kernel_id in self._suspending:
            self._suspend_aborts.setdefault(
                kernel_id, "a client used the kernel while it was being suspended"
            )

    async def settle(self, kernel_id: str, action: str) -> None:
        """Before a kernels-API action: stop a suspend in progress at its next step (the
        kernel keeps running), make a restore skip its image on shutdown or restart, and
        wait for both, so the action applies to a kernel in a settled state."""
        why = _ACTIONS[action]
        suspending = self._suspending.get(kernel_id)
        if suspending is not None:
            self._suspend_aborts.setdefault(kernel_id, why)
        restoring = self._restores.get(kernel_id)
        if restoring is not None and action != "interrupt":
            self._restore_aborts.setdefault(kernel_id, why)
        for task in (suspending, restoring):
            if task is not None:
                with contextlib.suppress(Exception):
                    await asyncio.shield(task)

    def aborting(self, kernel_id: str) -> str | None:
        """Why the suspend or restore of the kernel in progress is being aborted, if it is."""
        return self._suspend_aborts.get(kernel_id) or self._restore_aborts.get(kernel_id)

    async def _hooked(self, step: str, kernel_id: str) -> None:
        if self.step_hook is not None:
            await self.step_hook(step, kernel_id)

    def _check(self, aborts: dict[str, str], kernel_id: str) -> None:
        why = aborts.get(kernel_id)
        if why is not None:
            raise Aborted(why)

    async def _suspend(
        self, kernel_id: str, trigger: str, deadline: float | None
    ) -> dict[str, Any]:
        km = self.kernel_manager
        started = time.perf_counter()
        image_id = None  # the image the record names
        written = None  # the image this suspend wrote, removed if the suspend fails
        recorded = False
        try:
            if km.is_suspended(kernel_id):
                raise NothingToSave(f"kernel {kernel_id} is already suspended")
            if not km.is_running(kernel_id):
                raise NothingToSave(f"kernel {kernel_id} is not running")
            kernel = km.get_kernel(kernel_id)
            if kernel.execution_state == "busy":
                raise SuspendFailed("the kernel is busy")
            if not await ensure_async(kernel.is_alive()):
                raise NothingToSave("the kernel's process has died: there is no state to save")
            km.ckpt_states[kernel_id] = "suspending"
            if self.before_suspend is not None:
                await self.before_suspend(kernel_id)
            # After every await up to the shutdown, a client message, restart, interrupt
            # or shutdown that arrived meanwhile aborts the suspend (see settle()).
            self._check(self._suspend_aborts, kernel_id)
            await self._hooked("kernel_info", kernel_id)
            info = await self._request(kernel_id, "kernel_info", self._timeout(deadline))
            self._check(self._suspend_aborts, kernel_id)
            usage = self.gpu_usage(kernel_id)
            summary = await self._write_image(kernel_id, None, self._timeout(deadline), "suspend")
            image_id = written = summary["id"]
            self._check(self._suspend_aborts, kernel_id)
            parent = await asyncio.to_thread(self._unchanged_parent, image_id)
            if parent is not None:
                # nothing changed since the image the kernel came from: keep that one, so
                # that idle cycles of an untouched kernel do not pile up identical images
                await asyncio.to_thread(self._forget_image, image_id)
                written = None
                image_id = parent["id"]
                summary = {**summary, "id": image_id, "name": parent["name"]}
            # at shutdown the state is lost anyway: keep what can be kept
            if summary["lost"] and self.policy.on_unsaveable == "keep" and trigger != "shutdown":
                raise SuspendFailed(
                    "variables cannot be saved (on_unsaveable=keep): "
                    + _describe_lost(summary["lost"]),
                    lost=summary["lost"],
                )
            launch = km.launch.get(kernel_id, {})
            record = {
                "kernel_id": kernel_id,
                "kernel_name": kernel.kernel_name,
                "path": launch.get("path"),
                "env": launch.get("env", {}),
                "image_id": image_id,
                "kernel_info": info,
                "last_activity": kernel.last_activity.isoformat(),
                "suspended_at": _now(),
                "trigger": trigger,
                "gpu": usage.to_json(),
                "lost": summary["lost"],
                "sessions": await self.sessions_of(kernel_id),
            }
            await self._hooked("record", kernel_id)
            await asyncio.to_thread(self.records.put, record)
            recorded = True
            await self._hooked("recorded", kernel_id)
            # the last check: no await from here until the process is told to stop
            self._check(self._suspend_aborts, kernel_id)
        except (SuspendFailed, CkptError, OSError) as exc:
            km.ckpt_states.pop(kernel_id, None)
            if recorded:
                await asyncio.to_thread(self._undo_record, kernel_id)
            if written is not None:
                await asyncio.to_thread(self._forget_image, written)
            self.record_failure("suspend", kernel_id, trigger, exc, started)
            raise (exc if isinstance(exc, SuspendFailed) else SuspendFailed(str(exc))) from exc
        finally:
            self._suspend_aborts.pop(kernel_id, None)
        pid_tree = self.probe.process_tree(self.kernel_pid(kernel_id) or 0)
        # listed as suspended before the process goes, so the id never leaves the listing
        km.suspended[kernel_id] = {**record, "state": "suspended"}
        km.failed_restores.pop(kernel_id, None)  # the new record replaced the old one
        self.failures.pop(kernel_id, None)
        # Clients reconnect at once and find the kernel suspended (is_suspended holds from
        # here on), so they never attach to the process that is shutting down.
        self._close_clients(kernel_id)
        await km.stop_process(kernel_id, now=False)
        release = await self._wait_gpu_released(pid_tree) if usage.holds_gpu else 0.0
        self.record_event(
            "suspend",
            kernel_id,
            trigger,
            started,
            summary,
            gpu_release_seconds=release,
            kernel_name=record["kernel_name"],
        )
        self.log.info(
            "Suspended kernel %s to image %s (%s): %.1f s",
            kernel_id,
            image_id,
            trigger,
            time.perf_counter() - started,
        )
        await self.enforce_retention()
        return {**summary, "kernel_id": kernel_id}

    async def enforce_retention(self) -> list[str]:
        """Apply ImageStore.retention_days / max_images / quota_bytes; never touches an
        image a suspended kernel needs. Failures are logged: retention must not break a
        suspend that already succeeded."""
        started = time.perf_counter()
        try:
            # Chunks are collected every ImageStore.gc_interval, not after every save.
            removed, _, freed = await asyncio.to_thread(self.store.enforce_retention, collect=None)
        except (CkptError, OSError) as exc:
            self.log.warning("Retention failed: %s", exc)
            return []
        for image_id in removed:
            self.record_event("delete", None, "retention", started, {"id": image_id})
        if removed:
            self.log.info("Retention removed %d image(s), %d bytes", len(removed), freed)
        return removed

    def _unchanged_parent(self, image_id: str) -> dict[str, Any] | None:
        """The manifest of the image's parent (the image the kernel last wrote or was
        restored from) when both hold the same state: same variables and chunks, same
        history, execution count, directory and environment. Manifests are JSON: nothing
        is unpickled."""
        manifest = self.store.open(image_id)
        if not manifest.get("parent"):
            return None
        try:
            parent = self.store.open(manifest["parent"])
        except CkptError:
            return None  # gone or unreadable: the new image is needed
        return parent if _content(parent) == _content(manifest) else None

    def _undo_record(self, kernel_id: str) -> None:
        """Put back what an aborted suspend's record replaced: no record, or the one that
        pins the image of the kernel's failed restore."""
        failed = self.kernel_manager.failed_restores.get(kernel_id)
        try:
            if failed is None:
                self.records.delete(kernel_id)
            else:
                self.records.put(
                    {k: v for k, v in failed.items() if k not in ("state", "restore_error")}
                )
        except (CkptError, OSError) as exc:
            self.log.warning("could not remove the record of kernel %s: %s", kernel_id, exc)

    def _forget_image(self, image_id: str) -> None:
        try:
            self.store.delete(image_id)
        except CkptError as exc:
            self.log.warning("could not remove image %s: %s", image_id, exc)

    def _close_clients(self, kernel_id: str) -> None:
        """Close open websockets; clients reconnect and land on the suspended kernel."""
        from jupyter_server.services.kernels.connection.channels import (
            ZMQChannelsWebsocketConnection,
        )

        for key, handler in list(ZMQChannelsWebsocketConnection._open_sessions.items()):
            if key.startswith(f"{kernel_id}:"):
                handler.close()

    async def _wait_gpu_released(self, pids: set[int]) -> float:
        """Seconds until no process of the old tree holds GPU memory (or the timeout)."""
        started = time.perf_counter()
        deadline = started + self.gpu_release_timeout
        while time.perf_counter() < deadline:
            held = await asyncio.to_thread(self.probe.memory_by_pid)
            if not pids & held.keys():
                return time.perf_counter() - started
            await asyncio.sleep(0.1)
        self.log.warning(
            "GPU memory of %s not released after %.0f s", pids, self.gpu_release_timeout
        )
        return time.perf_counter() - started

    # -- restore --------------------------------------------------------------------------

    async def restore(self, kernel_id: str, trigger: str = "message") -> dict[str, Any]:
        """Start the suspended kernel under its id and restore its image into it. Callers
        that arrive while a restore runs share it: concurrent reconnects restore once."""
        return await _shared(self._restores, kernel_id, lambda: self._restore(kernel_id, trigger))

    async def _restore(self, kernel_id: str, trigger: str) -> dict[str, Any]:
        km = self.kernel_manager
        started = time.perf_counter()
        suspending = self._suspending.get(kernel_id)
        if suspending is not None:  # let its shutdown finish before starting the kernel again
            with contextlib.suppress(SuspendFailed):
                await asyncio.shield(suspending)
        if not km.is_suspended(kernel_id):
            if km.is_running(kernel_id):  # restored already, for another client
                return {"kernel_id": kernel_id, "image_id": None, "error": None}
            raise SuspendFailed(f"kernel {kernel_id} is not suspended")
        record = km.suspended[kernel_id]
        try:
            await self.ensure_compatible(record["image_id"])
        except IncompatibleImage as exc:  # it stays suspended, its image kept, for a node that can
            self.record_failure("restore", kernel_id, trigger, exc, started)
            raise SuspendFailed(str(exc)) from exc
        record["state"] = "restoring"
        token = restoring.set(kernel_id)
        try:
            await km.start_kernel(
                kernel_id=kernel_id,
                kernel_name=record["kernel_name"],
                path=record.get("path"),
                env={**os.environ, **record.get("env", {}), **self._notebook_env(record)},
            )
        except Exception as exc:
            record["state"] = "suspended"
            self.record_failure("restore", kernel_id, trigger, exc, started)
            raise SuspendFailed(f"could not start kernel {kernel_id}: {exc}") from exc
        finally:
            restoring.reset(token)
        self.restore_count += 1
        report: dict[str, Any] = {"kernel_id": kernel_id, "image_id": record["image_id"]}
        if "recovered" in record:
            report["recovery"] = recovery_message(record)
        try:
            self._check(self._restore_aborts, kernel_id)
            await self._wait_ready(kernel_id)
            await self._hooked("restore", kernel_id)
            self._check(self._restore_aborts, kernel_id)
            async with self.progress.watch(kernel_id, "restore") as progress:
                call = f"restore({record['image_id']!r}, progress={progress!r})"
                report.update(
                    await self.kernel_call(kernel_id, call, self.policy.checkpoint_timeout)
                )
            report["error"] = None
        except Aborted as exc:
            # the shutdown or restart that aborted the restore drops the record
            self.record_failure("restore", kernel_id, trigger, exc, started)
            return {**report, "error": str(exc), "restored": [], "missing": {}}
        except (SuspendFailed, CkptError, RuntimeError, TimeoutError) as exc:
            report.update(error=str(exc), restored=[], missing=self._saved_names(record))
        finally:
            self._restore_aborts.pop(kernel_id, None)
        await self._settled(kernel_id)
        km.suspended.pop(kernel_id, None)
        if report["error"]:
            # The kernel runs without its state; the record stays, and with it the image's
            # pin, so that retention and DELETE keep the image for a retry or a resume.
            km.failed_restores[kernel_id] = {**record, "restore_error": report["error"]}
            self.record_failure(
                "restore", kernel_id, trigger, SuspendFailed(report["error"]), started
            )
        else:
            await asyncio.to_thread(self.records.delete, kernel_id)
            await self.restored(kernel_id, record)
            self.record_event("restore", kernel_id, trigger, started, report)
        return report

    async def restored(self, kernel_id: str, record: dict[str, Any]) -> None:
        """A kernel now holds the state of ``record``'s image (a restore or a resume)."""
        if self.after_restore is not None:
            await self.after_restore(kernel_id, record)

    def _notebook_env(self, record: dict[str, Any]) -> dict[str, str]:
        """JPY_SESSION_NAME of the kernel's notebook under this server's root: after a
        respawn on a node that mounts the home elsewhere, the recorded one names a file of
        the old node (the restored kernel maps its working directory from the two)."""
        notebooks = [s for s in record.get("sessions", []) if s["type"] == "notebook"]
        if self.session_manager is None or not notebooks:
            return {}
        env = self.session_manager.get_kernel_env(notebooks[0]["path"], notebooks[0]["name"])
        return {"JPY_SESSION_NAME": env["JPY_SESSION_NAME"]}

    async def _settled(self, kernel_id: str, timeout: float = 10) -> None:
        """Wait until the server has seen the kernel go idle after our silent call. Until
        then it thinks the kernel busy, and a websocket connecting meanwhile skips the
        check that its iopub subscription is live, so a cell's first output could be lost."""
        kernel = self.kernel_manager.get_kernel(kernel_id)
        deadline = time.monotonic() + timeout
        while kernel.execution_state == "busy" and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    async def _wait_ready(self, kernel_id: str) -> None:
        kernel = self.kernel_manager.get_kernel(kernel_id)
        ready = getattr(kernel, "ready", None)
        if ready is not None:
            await (ready if asyncio.isfuture(ready) else asyncio.wrap_future(ready))

    def _saved_names(self, record: dict[str, Any]) -> dict[str, str]:
        """Every variable of the record's image, for a restore that failed as a whole."""
        try:
            manifest = self.store.open(record["image_id"])
        except CkptError as exc:
            return {"(all variables)": f"image {record['image_id']} unreadable: {exc}"}
        return {
            v["name"]: "image could not be restored"
            for v in manifest["variables"]
            if v["status"] in ("saved", "imported")
        }

    async def discard(self, kernel_id: str) -> None:
        """A suspended kernel was shut down for good: drop its record (the image stays)."""
        await asyncio.to_thread(self.records.delete, kernel_id)

    async def release_image(self, image_id: str) -> None:
        """The image was resumed: kernels whose restore of it failed no longer pin it."""
        km = self.kernel_manager
        for kernel_id, record in list(km.failed_restores.items()):
            if record["image_id"] == image_id:
                km.failed_restores.pop(kernel_id, None)
                await self.discard(kernel_id)

    async def sessions_of(self, kernel_id: str) -> list[dict[str, Any]]:
        """The sessions (notebooks, consoles) attached to a kernel, as a record keeps them."""
        if self.session_manager is None:
            return []
        return [
            {key: session[key] for key in ("id", "path", "name", "type")}
            for session in await self.session_manager.list_sessions()
            if (session.get("kernel") or {}).get("id") == kernel_id
        ]

    async def _reattach_sessions(self, kernel_id: str, sessions: list[dict[str, Any]]) -> None:
        """Give a recorded kernel its sessions back, under their ids, unless the session
        database (a persistent one) still has them."""
        if self.session_manager is None:
            return
        known = {session["id"] for session in await self.session_manager.list_sessions()}
        for session in sessions:
            if session["id"] not in known:
                await self.session_manager.save_session(
                    session["id"],
                    path=session["path"],
                    name=session["name"],
                    type=session["type"],
                    kernel_id=kernel_id,
                )

    async def load_records(self) -> None:
        """List the kernels suspended by an earlier run of the server, with their sessions."""
        records, errors = await asyncio.to_thread(self.records.all)
        for kernel_id, why in errors.items():
            self.log.warning("Ignoring the record of suspended kernel %s: %s", kernel_id, why)
        for kernel_id, record in records.items():
            if self.kernel_manager.is_running(kernel_id) or writer_alive(record):
                continue
            # a running record (autosave) with no server left: the kernel crashed
            recovered = recovered_field(record)
            if recovered is not None:
                record = {**record, "recovered": recovered}
                self.log.warning(
                    "Kernel %s crashed; recoverable from its autosave of %s",
                    kernel_id,
                    recovered["autosave_at"],
                )
            self.kernel_manager.suspended[kernel_id] = {**record, "state": "suspended"}
            await self._reattach_sessions(kernel_id, record.get("sessions", []))
        if records:
            self.log.info("%d suspended kernel(s) restore when their users return", len(records))
        await self.enforce_retention()

    # -- events and failures --------------------------------------------------------------

    def record_failure(
        self, action: str, kernel_id: str, trigger: str, exc: BaseException, started: float
    ) -> None:
        reason = str(exc)
        self.failures[kernel_id] = {"action": action, "reason": reason, "at": _now()}
        if getattr(exc, "lost", None):
            self.failures[kernel_id]["lost"] = exc.lost
        self.log.warning("Could not %s kernel %s: %s", action, kernel_id, reason)
        self.record_event(action, kernel_id, trigger, started, status="error", msg=reason)

    def record_event(
        self,
        action: str,
        kernel_id: str | None,
        trigger: str,
        started: float,
        summary: dict[str, Any] | None = None,
        status: str = "success",
        **extra: Any,
    ) -> None:
        data: dict[str, Any] = {
            "action": action,
            "status": status,
            "trigger": trigger,
            "seconds": time.perf_counter() - started,
            **extra,
        }
        if kernel_id:
            data["kernel_id"] = kernel_id
        if summary:
            data["image_id"] = summary.get("id") or summary.get("image_id")
            data["write_seconds"] = summary.get("seconds", 0.0)
            if "bytes" in summary:
                data["bytes"] = summary["bytes"]
            data["missing"] = sorted(summary.get("lost") or summary.get("missing") or {})
        if self.emit is not None:
            self.emit(data)
