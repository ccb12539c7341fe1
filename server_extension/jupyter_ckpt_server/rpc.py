"""Talking to a kernel: silent requests on private shell streams, and its process.

The server never unpickles user objects: it asks the kernel to write (or read) its image
through a silent execute of ``jupyter_ckpt.kernel`` (not stored in history, no execution
count) and reads the JSON summary back from ``user_expressions``.
"""

from __future__ import annotations

import ast
import asyncio
import json
import time
from collections import Counter
from typing import Any

from jupyter_client.session import Session
from jupyter_core.utils import ensure_async

from jupyter_ckpt.errors import CkptError
from jupyter_ckpt.gpu import GpuProbe, GpuSnapshot, GpuUsage

# seconds between two checks that a kernel we wait for is still alive
_LIVENESS_POLL = 1.0
# seconds after our request's reply within which the kernel's idle status (on iopub,
# which may lag the shell reply) may still be on its way to the server
_STATUS_LAG = 1.0

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


class KernelRPC:
    """Requests to the running kernels of one kernel manager."""

    def __init__(self, kernel_manager: Any, probe: GpuProbe) -> None:
        self.kernel_manager = kernel_manager
        self.probe = probe
        self._in_flight: Counter[str] = Counter()  # our requests now, per kernel
        self._ended: dict[str, float] = {}  # when our last request to a kernel ended
        self._sessions: dict[str, Session] = {}

    async def request(self, kernel_id: str, send: str, timeout: float, **kw: Any) -> dict:
        """Send one shell request on a private stream and return its reply's content.
        Fails as soon as the kernel's process dies or is replaced (an automatic restart
        loses the state and the request with it), not only after ``timeout``."""
        self._in_flight[kernel_id] += 1
        try:
            return await self._request(kernel_id, send, timeout, **kw)
        finally:
            self._in_flight[kernel_id] -= 1
            if not self._in_flight[kernel_id]:
                del self._in_flight[kernel_id]
            self._ended[kernel_id] = time.monotonic()

    def forget(self, kernel_id: str) -> None:
        """The kernel is gone for good: drop what was kept about our requests to it."""
        self._ended.pop(kernel_id, None)
        self._sessions.pop(kernel_id, None)

    def _session(self, kernel_id: str, kernel: Any) -> Session:
        """The session our requests to the kernel are signed in. Ours, one per kernel: a
        copy of the manager's (as ``kernel.client()`` makes) would number its messages
        from where the copy was made, so two calls at once (an autosave and a checkpoint)
        could send the same message id and take each other's replies."""
        session = self._sessions.get(kernel_id)
        if session is None or session.key != kernel.session.key:
            session = Session(
                key=kernel.session.key, signature_scheme=kernel.session.signature_scheme
            )
            self._sessions[kernel_id] = session
        return session

    async def _request(self, kernel_id: str, send: str, timeout: float, **content: Any) -> dict:
        kernel = self.kernel_manager.get_kernel(kernel_id)
        pid = self.pid(kernel_id)
        session = self._session(kernel_id, kernel)
        # A shell stream of its own (the kernel replies to the socket that asked) on the
        # manager's ZMQ context, rather than a kernel client: making a client, with its
        # own context and every channel, cost the server twice the whole call.
        stream = kernel.connect_shell()
        replies: asyncio.Queue[list[bytes]] = asyncio.Queue()
        stream.on_recv(replies.put_nowait)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            request = session.msg(f"{send}_request", content)
            session.send(stream, request)
            while True:
                left = deadline - loop.time()
                if left <= 0:
                    raise SuspendFailed(f"the kernel did not answer within {timeout:.0f} s")
                try:
                    received = await asyncio.wait_for(replies.get(), min(left, _LIVENESS_POLL))
                except asyncio.TimeoutError:
                    alive = await ensure_async(kernel.is_alive())
                    if not alive or self.pid(kernel_id) != pid:
                        raise SuspendFailed("the kernel's process died") from None
                    continue
                _, parts = session.feed_identities(received)
                reply = session.deserialize(parts)
                if reply["parent_header"].get("msg_id") == request["header"]["msg_id"]:
                    return reply["content"]
        finally:
            stream.close(linger=0)

    async def call(self, kernel_id: str, call: str, timeout: float) -> dict[str, Any]:
        """Evaluate ``jupyter_ckpt.kernel.<call>`` silently in the kernel; its JSON result."""
        content = await self.request(
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

    def pid(self, kernel_id: str) -> int | None:
        if not self.kernel_manager.is_running(kernel_id):
            return None
        kernel = self.kernel_manager.get_kernel(kernel_id)
        return getattr(getattr(kernel, "provisioner", None), "pid", None)

    def gpu_usage(self, kernel_id: str, snapshot: GpuSnapshot | None = None) -> GpuUsage:
        pid = self.pid(kernel_id)
        return self.probe.usage(pid, snapshot) if pid else GpuUsage()

    async def busy(self, kernel_id: str, timeout: float = 5) -> bool:
        """Whether the kernel is busy with a client's request. Our own silent calls (an
        activity check, the start of an autosave) make the server see it busy too, for
        moments: those are waited out, so that they never refuse or abort a suspend."""
        kernel = self.kernel_manager.get_kernel(kernel_id)
        deadline = time.monotonic() + timeout
        while kernel.execution_state == "busy" and time.monotonic() < deadline:
            if not self._in_flight[kernel_id]:
                ended = self._ended.get(kernel_id, float("-inf"))
                if time.monotonic() - ended > _STATUS_LAG:
                    break  # not ours: a client's cell
            await asyncio.sleep(0.01)
        return kernel.execution_state == "busy"

    async def settled(self, kernel_id: str, timeout: float = 10) -> None:
        """Wait until the server has seen the kernel go idle after our silent call. Until
        then it thinks the kernel busy, and a websocket connecting meanwhile skips the
        check that its iopub subscription is live, so a cell's first output could be lost."""
        kernel = self.kernel_manager.get_kernel(kernel_id)
        deadline = time.monotonic() + timeout
        while kernel.execution_state == "busy" and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    async def ready(self, kernel_id: str) -> None:
        kernel = self.kernel_manager.get_kernel(kernel_id)
        ready = getattr(kernel, "ready", None)
        if ready is not None:
            await (ready if asyncio.isfuture(ready) else asyncio.wrap_future(ready))

    def close_clients(self, kernel_id: str) -> None:
        """Close open websockets; clients reconnect and land on the suspended kernel."""
        from jupyter_server.services.kernels.connection.channels import (
            ZMQChannelsWebsocketConnection,
        )

        for key, handler in list(ZMQChannelsWebsocketConnection._open_sessions.items()):
            if key.startswith(f"{kernel_id}:"):
                handler.close()

    async def wait_gpu_released(self, pids: set[int], timeout: float, log: Any) -> float:
        """Seconds until no process of the old tree holds GPU memory (or the timeout)."""
        started = time.perf_counter()
        deadline = started + timeout
        while time.perf_counter() < deadline:
            held = await asyncio.to_thread(self.probe.memory_by_pid)
            if not pids & held.keys():
                return time.perf_counter() - started
            await asyncio.sleep(0.1)
        log.warning("GPU memory of %s not released after %.0f s", pids, timeout)
        return time.perf_counter() - started
