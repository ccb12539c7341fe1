"""Talking to a kernel: silent requests on the server's own streams, and its process.

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

from jupyter_ckpt.errors import (
    CkptError,
    StoreError,
    StoreFull,
    StorePermission,
    StoreReadOnly,
    StoreUnavailable,
)
from jupyter_ckpt.gpu import GpuProbe, GpuSnapshot, GpuUsage

from . import compat
from .polling import poll

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


class StoreFailed(SuspendFailed):
    """The store failed the kernel's save or restore (unreachable, read-only, full, or
    refusing the user): the store's failure, not the kernel's. ``kind``: the name of the
    :class:`~jupyter_ckpt.errors.StoreError` the kernel (or the server) met."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


# the StoreErrors a kernel may name, by their type's name
_STORE_ERRORS = frozenset(
    cls.__name__
    for cls in (StoreError, StoreUnavailable, StoreReadOnly, StorePermission, StoreFull)
)


def _failed(message: str, kind: str) -> SuspendFailed:
    return StoreFailed(message, kind) if kind in _STORE_ERRORS else SuspendFailed(message)


class NothingToSave(SuspendFailed):
    """The kernel holds no state to save: its process has died or is gone already, or it
    is suspended already. Stopping its server loses nothing."""


class Aborted(SuspendFailed):
    """A client or a kernels-API action needed the kernel: the suspend or restore stops."""


class _Channel:
    """One stream to a kernel's shell or control channel, shared by the server's requests
    on it (the kernel replies to the socket that asked); a reply finds its request by
    message id. Opening a stream per request cost the server more than the rest of the
    call: a socket, a TCP connection and its handshake each time.

    Its session is ours, not a copy of the manager's (as ``kernel.client()`` makes): a
    copy numbers its messages from where it was made, so two requests at once (an
    autosave and a checkpoint) could send the same message id and take each other's
    replies."""

    def __init__(self, kernel: Any, channel: str) -> None:
        self.channel = channel
        self.port = getattr(kernel, f"{channel}_port")
        self.session = Session(
            key=kernel.session.key, signature_scheme=kernel.session.signature_scheme
        )
        self.waiting: dict[str, asyncio.Future[dict]] = {}
        self.stream = getattr(kernel, f"connect_{channel}")()
        self.stream.on_recv(self._on_reply)

    def serves(self, kernel: Any) -> bool:
        """Whether this stream reaches the kernel's process now (a restart or a restore
        starts one on other ports, with another key)."""
        return (
            not self.stream.closed()
            and self.port == getattr(kernel, f"{self.channel}_port")
            and self.session.key == kernel.session.key
        )

    def send(self, msg_type: str, content: dict) -> tuple[str, asyncio.Future[dict]]:
        """Send a request; its id and the future of its reply's content."""
        request = self.session.msg(msg_type, content)
        msg_id = request["header"]["msg_id"]
        reply = self.waiting[msg_id] = asyncio.get_running_loop().create_future()
        self.session.send(self.stream, request)
        return msg_id, reply

    def _on_reply(self, msg_list: list[bytes]) -> None:
        _, parts = self.session.feed_identities(msg_list)
        reply = self.session.deserialize(parts)
        waiting = self.waiting.pop(reply["parent_header"].get("msg_id"), None)
        if waiting is not None and not waiting.done():
            waiting.set_result(reply["content"])

    def close(self) -> None:
        self.stream.close(linger=0)
        for waiting in self.waiting.values():
            if not waiting.done():
                waiting.set_exception(SuspendFailed("the kernel's process stopped"))


class KernelRPC:
    """Requests to the running kernels of one kernel manager."""

    def __init__(self, kernel_manager: Any, probe: GpuProbe) -> None:
        self.kernel_manager = kernel_manager
        self.probe = probe
        self._in_flight: Counter[str] = Counter()  # our requests now, per kernel
        self._ended: dict[str, float] = {}  # when our last request to a kernel ended
        self._channels: dict[tuple[str, str], _Channel] = {}  # (kernel id, channel)

    async def request(
        self, kernel_id: str, send: str, timeout: float, channel: str = "shell", **kw: Any
    ) -> dict:
        """Send one request (on the shell channel, or ``control``) and return its reply's
        content. Fails as soon as the kernel's process dies or is replaced (an automatic
        restart loses the state and the request with it), not only after ``timeout``."""
        self._in_flight[kernel_id] += 1
        try:
            return await self._request(kernel_id, send, timeout, channel, **kw)
        finally:
            self._in_flight[kernel_id] -= 1
            if not self._in_flight[kernel_id]:
                del self._in_flight[kernel_id]
            self._ended[kernel_id] = time.monotonic()

    def forget(self, kernel_id: str) -> None:
        """The kernel is gone for good: drop what was kept about our requests to it."""
        self._ended.pop(kernel_id, None)
        self.release(kernel_id)

    def release(self, kernel_id: str) -> None:
        """The kernel's process stops: close our streams to it (ZMQ would otherwise keep
        reconnecting to its closed ports). Requests still waiting on them fail."""
        for key in [key for key in self._channels if key[0] == kernel_id]:
            self._channels.pop(key).close()

    def _channel(self, kernel_id: str, kernel: Any, channel: str) -> _Channel:
        """Our stream to the kernel's process now; a new one for a new process."""
        key = (kernel_id, channel)
        stream = self._channels.get(key)
        if stream is None or not stream.serves(kernel):
            self.release(kernel_id)
            stream = self._channels[key] = _Channel(kernel, channel)
        return stream

    async def _request(
        self, kernel_id: str, send: str, timeout: float, channel: str, **content: Any
    ) -> dict:
        kernel = self.kernel_manager.get_kernel(kernel_id)
        pid = self.pid(kernel_id)
        stream = self._channel(kernel_id, kernel, channel)
        msg_id, reply = stream.send(f"{send}_request", content)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            while True:
                left = deadline - loop.time()
                if left <= 0:
                    raise SuspendFailed(f"the kernel did not answer within {timeout:.0f} s")
                await asyncio.wait([reply], timeout=min(left, _LIVENESS_POLL))
                if reply.done():
                    return reply.result()
                alive = await ensure_async(kernel.is_alive())
                if not alive or self.pid(kernel_id) != pid:
                    # (an interrupt as a restarted process starts kills it, for one)
                    raise NothingToSave("the kernel's process died")
        finally:
            stream.waiting.pop(msg_id, None)

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
            raise _failed(f"{ename}: {evalue}", ename)
        # text/plain is the repr of the JSON string: literal_eval reads it, runs nothing
        value = json.loads(ast.literal_eval(result["data"]["text/plain"]))
        if isinstance(value, dict) and value.get("error"):  # failed, and said why
            raise _failed(value["error"], value.get("error_type", ""))
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

        def idle_or_not_ours() -> bool:
            if kernel.execution_state != "busy":
                return True
            ended = self._ended.get(kernel_id, float("-inf"))
            return not self._in_flight[kernel_id] and time.monotonic() - ended > _STATUS_LAG

        await poll(idle_or_not_ours, timeout)
        return kernel.execution_state == "busy"

    def serving_us(self, kernel_id: str) -> bool:
        """Whether one of our silent requests to the kernel runs now: the server sees it
        busy meanwhile, with nothing of the user's."""
        return bool(self._in_flight[kernel_id])

    async def settled(self, kernel_id: str, timeout: float = 10) -> None:
        """Wait until the server has seen the kernel go idle after our silent call. Until
        then it thinks the kernel busy, and a websocket connecting meanwhile skips the
        check that its iopub subscription is live, so a cell's first output could be lost."""
        kernel = self.kernel_manager.get_kernel(kernel_id)
        await poll(lambda: kernel.execution_state != "busy", timeout)

    async def ready(self, kernel_id: str) -> None:
        kernel = self.kernel_manager.get_kernel(kernel_id)
        ready = getattr(kernel, "ready", None)
        if ready is not None:
            await (ready if asyncio.isfuture(ready) else asyncio.wrap_future(ready))

    def close_clients(self, kernel_id: str) -> None:
        """Close open websockets; clients reconnect and land on the suspended kernel."""
        for key, handler in list(compat.open_sessions().items()):
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
