"""A notebook frontend on the kernels websocket, and polling with a deadline."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from jupyter_client.jsonutil import json_default
from jupyter_client.session import Session
from jupyter_server.auth.authorizer import Authorizer
from jupyter_server.services.kernels.connection.base import (
    deserialize_msg_from_ws_v1,
    serialize_msg_to_ws_v1,
)
from tornado.httpclient import HTTPClientError


async def poll(condition: Callable[[], Any], timeout: float = 30, what: str = "") -> Any:
    """Wait for ``condition()`` to be truthy (awaiting it if it returns an awaitable)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if isinstance(value, Awaitable):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        await asyncio.sleep(0.05)


class Client:
    """A notebook frontend on the kernels websocket (legacy JSON or v1 protocol)."""

    def __init__(
        self, ws: Any, session: Session, subprotocol: str | None, kernel: Callable[[], Any]
    ) -> None:
        self.ws = ws
        self.session = session
        self.subprotocol = subprotocol
        self.kernel = kernel  # the server's KernelManager of this kernel, or None
        self.received: list[dict[str, Any]] = []

    def send(self, msg_type: str, content: dict[str, Any], channel: str = "shell") -> str:
        msg = self.session.msg(msg_type, content)
        if self.subprotocol:
            self.ws.write_message(serialize_msg_to_ws_v1(msg, channel, self.session.pack), True)
        else:
            self.ws.write_message(json.dumps({**msg, "channel": channel}, default=json_default))
        return msg["header"]["msg_id"]

    async def receive(self, timeout: float = 60) -> dict[str, Any]:
        raw = await asyncio.wait_for(self.ws.read_message(), timeout)
        if raw is None:
            raise ConnectionError("the server closed the websocket")
        if self.subprotocol:
            channel, parts = deserialize_msg_from_ws_v1(raw)
            header, parent, metadata, content = (json.loads(p) for p in parts[:4])
            msg = {
                "channel": channel,
                "header": header,
                "parent_header": parent,
                "metadata": metadata,
                "content": content,
            }
        else:
            msg = json.loads(raw)
        self.received.append(msg)
        return msg

    async def reply_to(
        self, msg_id: str, timeout: float = 60, channel: str = "shell"
    ) -> dict[str, Any]:
        """The reply to ``msg_id``; iopub messages meanwhile stay in ``received``."""
        deadline = time.monotonic() + timeout
        while True:
            msg = await self.receive(max(0.1, deadline - time.monotonic()))
            if msg["channel"] == channel and msg["parent_header"].get("msg_id") == msg_id:
                return msg

    async def execute(self, code: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """(execute_reply content, iopub output messages of this cell) once it is idle."""
        msg_id = self.send("execute_request", {"code": code, "silent": False})
        reply, outputs, idle = None, [], False
        while reply is None or not idle:
            msg = await self.receive()
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["channel"] == "shell":
                reply = msg["content"]
            elif msg["header"]["msg_type"] == "status":
                idle = msg["content"]["execution_state"] == "idle"
            else:
                outputs.append(msg)
        # the server sees the idle status on its own socket, a moment later
        await poll(lambda: getattr(self.kernel(), "execution_state", "idle") == "idle")
        return reply, outputs

    def close(self) -> None:
        self.ws.close()


def text_of(outputs: list[dict[str, Any]]) -> str:
    """Everything a cell showed: streams, results and errors."""
    parts = []
    for msg in outputs:
        content = msg["content"]
        if "text" in content:
            parts.append(content["text"])
        if "data" in content:
            parts.append(content["data"].get("text/plain", ""))
        if "evalue" in content:
            parts.append(f"{content['ename']}: {content['evalue']}")
    return "".join(parts)


async def start_session(jp_fetch: Any, path: str = "work.ipynb") -> tuple[str, str]:
    """A notebook session as JupyterLab creates it: (session id, kernel id)."""
    body = {"path": path, "name": path, "type": "notebook", "kernel": {"name": "python3"}}
    r = await jp_fetch("api", "sessions", method="POST", body=json.dumps(body))
    model = json.loads(r.body)
    return model["id"], model["kernel"]["id"]


async def get_json(jp_fetch: Any, *parts: str) -> Any:
    return json.loads((await jp_fetch(*parts)).body)


def alter_chunks(manager: Any) -> dict[Path, bytes]:
    """Alter every chunk of the manager's (local) store; their original bytes."""
    originals = {}
    for chunk in Path(manager.store.backend.url).rglob("*"):
        if "chunks" in chunk.parts and chunk.is_file():
            originals[chunk] = chunk.read_bytes()
            chunk.write_bytes(b"altered" + originals[chunk][7:])
    return originals


async def fails_with(status: int, jp_fetch: Any, *parts: str, **kwargs: Any) -> str:
    """The error message of a request that must fail with HTTP ``status``."""
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch(*parts, **kwargs)
    assert info.value.code == status, info.value.response.body
    return json.loads(info.value.response.body).get("message", "")


class FunctionNotFound(Exception):
    """What pynvml raises for an entry point the driver lacks."""


class FakeNvml:
    """Two GPUs; ``processes`` maps device index -> [(pid, bytes)]. Like drivers before
    470, it has no ``_v3`` process calls unless ``v3`` is set."""

    NVMLError_FunctionNotFound = FunctionNotFound

    def __init__(
        self,
        processes: dict[int, list[tuple[int, int | None]]],
        v3: bool = False,
        live: bool = False,
    ) -> None:
        self.processes = processes
        self.live = live  # report a pid only while its process exists, as the driver does
        self.init_calls = 0
        if not v3:
            self.nvmlDeviceGetComputeRunningProcesses_v3 = self._missing
            self.nvmlDeviceGetGraphicsRunningProcesses_v3 = self._missing

    def _missing(self, handle: Any) -> list[Any]:
        raise FunctionNotFound("nvmlDeviceGetComputeRunningProcesses_v3")

    def nvmlInit(self) -> None:
        self.init_calls += 1

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return f"GPU-{handle:08d}"

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        return SimpleNamespace(total=80 << 30, used=(handle + 1) << 30)

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:
        return 9, 0

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: int) -> list[Any]:
        return [
            SimpleNamespace(pid=p, usedGpuMemory=m)
            for p, m in self.processes.get(handle, [])
            if not self.live or os.path.exists(f"/proc/{p}")
        ]

    def nvmlDeviceGetGraphicsRunningProcesses_v2(self, handle: int) -> list[Any]:
        return []


class DenyingAuthorizer(Authorizer):
    """Allows every action except on the resources a test lists in ``denied``."""

    denied: ClassVar[set[str]] = set()

    def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> bool:
        return resource not in self.denied
