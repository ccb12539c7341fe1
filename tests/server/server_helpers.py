"""A notebook frontend on the kernels websocket, and polling with a deadline."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import psutil
import pytest
from deadlines import scaled
from jupyter_client.jsonutil import json_default
from jupyter_client.session import Session
from jupyter_server.auth.authorizer import Authorizer
from jupyter_server.services.kernels.connection.base import (
    deserialize_msg_from_ws_v1,
    serialize_msg_to_ws_v1,
)
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.websocket import websocket_connect

from jupyter_ckpt.errors import ImageNotFound
from jupyter_ckpt.store import ImageStore


async def poll(condition: Callable[[], Any], timeout: float = 30, what: str = "") -> Any:
    """Wait for ``condition()`` to be truthy (awaiting it if it returns an awaitable);
    ``timeout``: seconds on an idle machine (see :mod:`deadlines`)."""
    deadline = time.monotonic() + scaled(timeout)
    while True:
        value = condition()
        if isinstance(value, Awaitable):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        await asyncio.sleep(0.05)


def action_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events that end an action (a checkpoint, a delete...): not those that say how
    far one is, nor what a kernel's state or the store's health changed to."""
    return [e for e in events if e["action"] not in ("progress", "state", "store")]


async def next_event(events: list[dict[str, Any]], action: str, **expected: Any) -> dict:
    """The first event of ``action`` with the ``expected`` fields: event listeners run as
    tasks, so an event may arrive a moment after the step that emitted it."""

    def found() -> dict[str, Any] | None:
        return next(
            (
                e
                for e in events
                if e["action"] == action and all(e.get(k) == v for k, v in expected.items())
            ),
            None,
        )

    return await poll(found, what=f"a {action} event with {expected}")


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
        # a unique id, as JupyterLab's: jupyter_client numbers ids by session and pid, and
        # the server's own connection for this session (its nudges, in this same process)
        # would number its requests alike, so their replies could pass for ours
        msg["header"]["msg_id"] = msg["msg_id"] = uuid.uuid4().hex
        if self.subprotocol:
            self.ws.write_message(serialize_msg_to_ws_v1(msg, channel, self.session.pack), True)
        else:
            self.ws.write_message(json.dumps({**msg, "channel": channel}, default=json_default))
        return msg["header"]["msg_id"]

    async def receive(self, timeout: float = 60) -> dict[str, Any]:
        raw = await asyncio.wait_for(self.ws.read_message(), scaled(timeout))
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
        deadline = time.monotonic() + scaled(timeout)
        while True:
            msg = await self.receive(max(0.1, deadline - time.monotonic()))
            if msg["channel"] == channel and msg["parent_header"].get("msg_id") == msg_id:
                return msg

    async def message(
        self, match: Callable[[dict[str, Any]], bool], timeout: float = 60
    ) -> dict[str, Any]:
        """The first message received, or to come, that ``match`` accepts (an iopub
        message may come after the shell reply to the same request: two channels)."""
        deadline = time.monotonic() + scaled(timeout)
        seen = 0
        while True:
            for msg in self.received[seen:]:
                if match(msg):
                    return msg
            seen = len(self.received)
            await self.receive(max(0.1, deadline - time.monotonic()))

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


async def connect_kernel(
    base_url: str, token: str, kernel_id: str, session: Session | None = None
) -> Client:
    """A notebook frontend on a kernel's websocket; ``base_url`` is the server's
    ``ws://host:port`` plus its base path (``/user/<name>`` behind JupyterHub)."""
    session = session or Session()
    ws = await websocket_connect(
        HTTPRequest(
            f"{base_url}/api/kernels/{kernel_id}/channels?session_id={session.session}",
            headers={"Authorization": f"token {token}"},
        )
    )
    return Client(ws, session, None, lambda: None)


def open_store(tmp: Path) -> ImageStore:
    """The store of a ServerProcess in ``tmp``, opened afresh, as another server would."""
    return ImageStore(url=str(tmp / "store"), secret_file=str(tmp / "secret"))


def stored_record(tmp: Path, kernel_id: str) -> dict[str, Any] | None:
    """A kernel's record in that store, or None if it has none."""
    try:
        return open_store(tmp).records.get(kernel_id)
    except ImageNotFound:
        return None


# the server alone: the other extensions of the environment only slow its start
OTHER_EXTENSIONS_OFF = dict.fromkeys(
    ("jupyterlab", "jupyter_lsp", "jupyter_server_terminals", "notebook_shim"), False
)


class ServerProcess:
    """`jupyter server` with the extension on a private store and sessions database.

    ``policy`` adds SuspendPolicy settings, ``env`` environment variables, ``extensions``
    turns other server extensions on (the environment's JupyterLab, LSP, terminals and
    notebook shim are off unless asked for: they double a server's start); ``start()``
    takes Popen arguments (a terminal as stdin, a new session) for the stop paths."""

    # the servers of the running test: a failing test's report shows their logs
    of_test: ClassVar[list[ServerProcess]] = []

    def __init__(
        self,
        tmp: Path,
        policy: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        extensions: dict[str, bool] | None = None,
    ) -> None:
        self.tmp = tmp
        self.token = uuid.uuid4().hex
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        config = {
            "ServerApp": {
                "jpserver_extensions": {
                    **OTHER_EXTENSIONS_OFF,
                    **(extensions or {}),
                    "jupyter_ckpt_server": True,
                },
                "kernel_manager_class": "jupyter_ckpt_server.kernelmanager.CkptKernelManager",
                "root_dir": str(tmp),
            },
            "SessionManager": {"database_filepath": str(tmp / "sessions.db")},
            "IdentityProvider": {"token": self.token},
            "SuspendPolicy": {"gpu_only": False, "idle_timeout": 3600, **(policy or {})},
        }
        (tmp / "config.json").write_text(json.dumps(config))
        self.env = {
            **os.environ,
            "JUPYTER_CKPT_STORE": str(tmp / "store"),
            "JUPYTER_CKPT_SECRET_FILE": str(tmp / "secret"),
            "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
            "JUPYTER_CONFIG_DIR": str(tmp / "config"),
            "JUPYTER_DATA_DIR": str(tmp / "data"),
            **(env or {}),
        }
        self.log_path = tmp / "server.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.of_test.append(self)

    async def start(self, **popen: Any) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable, "-m", "jupyter_server", f"--config={self.tmp / 'config.json'}",
                f"--port={self.port}", "--no-browser", "--allow-root",
            ],
            env=self.env,
            stderr=open(self.log_path, "ab"),  # noqa: SIM115 (lives with the process)
            **popen,
        )  # fmt: skip
        await poll(self._ready, timeout=60, what="the server to start")

    async def _ready(self) -> bool:
        """Serving, on the port its info file names: another process may have taken the
        free port picked for it meanwhile, and the server then listens on another."""
        process = self.process
        assert process is not None and process.poll() is None, "the server exited"
        info = Path(self.env["JUPYTER_RUNTIME_DIR"]) / f"jpserver-{process.pid}.json"
        try:
            self.port = json.loads(info.read_text())["port"]
        except (OSError, ValueError, KeyError):
            return False
        try:
            await self.get("status")
        except (OSError, HTTPClientError):
            return False
        return True

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    async def fetch(self, method: str, path: str, body: Any = None) -> Any:
        request = HTTPRequest(
            f"http://127.0.0.1:{self.port}/api/{path}",
            method=method,
            body=None if body is None else json.dumps(body),
            headers={"Authorization": f"token {self.token}"},
            allow_nonstandard_methods=True,
        )
        response = await AsyncHTTPClient().fetch(request)
        return json.loads(response.body) if response.body else None

    async def get(self, path: str) -> Any:
        return await self.fetch("GET", path)

    async def connect(self, kernel_id: str, session: Session | None = None) -> Client:
        """A frontend on the kernel; ``session`` as a reconnecting JupyterLab passes it."""
        return await connect_kernel(f"ws://127.0.0.1:{self.port}", self.token, kernel_id, session)

    async def run_cell(self, kernel_id: str, code: str) -> str:
        """Run one cell in the kernel through the websocket; its output text, once the
        server has seen the kernel idle again (a suspend refuses a busy kernel)."""
        client = await self.connect(kernel_id)
        try:
            reply, outputs = await client.execute(code)
        finally:
            client.close()
        assert reply["status"] == "ok", text_of(outputs)
        await self.wait_idle(kernel_id)
        return text_of(outputs)

    async def wait_idle(self, kernel_id: str) -> None:
        async def idle() -> bool:
            return (await self.get(f"kernels/{kernel_id}"))["execution_state"] == "idle"

        await poll(idle, what=f"the server to see kernel {kernel_id} idle")

    def send_signal(self, sig: int) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    async def exited(self, timeout: float = 120) -> int:
        """The server's exit code, once it has exited by itself."""
        process = self.process
        assert process is not None
        await poll(lambda: process.poll() is not None, timeout=timeout, what="the server to exit")
        return process.returncode

    def open_store(self) -> ImageStore:
        """The server's store, opened afresh in the test process, as another server would."""
        return open_store(self.tmp)

    def record(self, kernel_id: str) -> dict[str, Any] | None:
        """The kernel's record in the server's store, or None if it has none."""
        return stored_record(self.tmp, kernel_id)

    def kill(self) -> None:
        """SIGKILL the server if it still runs (a test that failed midway)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def crash(self) -> None:
        """SIGKILL the server and its kernels at once, as the OOM killer or a dead node would."""
        assert self.process is not None
        root = psutil.Process(self.process.pid)
        processes = [root, *root.children(recursive=True)]
        for process in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGKILL)
        psutil.wait_procs(processes, timeout=30)
        self.process.wait()

    def terminate(self) -> float:
        """SIGTERM, as a pod eviction or hub cull does; seconds until the server exited."""
        assert self.process is not None
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(scaled(120))
        return time.monotonic() - started


# A notebook session as a frontend creates it, for POST /api/sessions.
NOTEBOOK = {"path": "nb.ipynb", "name": "nb.ipynb", "type": "notebook", "kernel": {}}

# A module (gate.py in the server's root, the kernel's working directory) whose object's
# pickling says so (the file gate-waiting) and then waits until the test opens the gate
# (the file gate-open): it holds a save in progress for as long as the test needs, without
# timing assumptions.
GATE_MODULE = """
import os, time

class Gate:
    def __getstate__(self):
        open("gate-waiting", "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists("gate-open") and time.monotonic() < deadline:
            time.sleep(0.02)
        return {}
"""
GATED_STATE = "x = 41\nimport gate\ng = gate.Gate()"


def python_kernelspec(data_dir: Path, name: str, display_name: str, argv: list[str]) -> str:
    """Install a Python kernel spec ``name`` started by ``argv`` (with the placeholder
    ``{connection_file}``) under a Jupyter data directory; its name."""
    spec_dir = data_dir / "kernels" / name
    spec_dir.mkdir(parents=True)
    spec = {"argv": argv, "display_name": display_name, "language": "python"}
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    return name


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


class NvmlError(Exception):
    """What pynvml raises; ``value`` is NVML's return code."""

    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class FakeNvml:
    """Two GPUs of ``total`` bytes; ``processes`` maps device index -> [(pid, bytes)],
    which count as used memory (on top of 1 GiB, 2 GiB held by no one we know). Like
    drivers before 470, it has no ``_v3`` process calls unless ``v3`` is set.

    GPU utilization: ``utilization`` maps a device to its per-process samples
    [(pid, SM %)] (a device without any answers NOT_FOUND, "no sample"); a device in
    ``device_utilization`` has no per-process samples (NOT_SUPPORTED, as under MIG) and
    reports its whole SM %.
    """

    NVML_ERROR_NOT_FOUND = 6
    NVML_ERROR_NOT_SUPPORTED = 3

    NVMLError_FunctionNotFound = FunctionNotFound

    def __init__(
        self,
        processes: dict[int, list[tuple[int, int | None]]],
        v3: bool = False,
        live: bool = False,
    ) -> None:
        self.processes = processes
        self.utilization: dict[int, list[tuple[int, int]]] = {}
        self.device_utilization: dict[int, int] = {}
        self.live = live  # report a pid only while its process exists, as the driver does
        self.total = 80 << 30  # each device's memory; its used memory counts the processes
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
        processes = self.nvmlDeviceGetComputeRunningProcesses_v2(handle)
        held = sum(p.usedGpuMemory or 0 for p in processes)
        return SimpleNamespace(total=self.total, used=((handle + 1) << 30) + held)

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

    def nvmlDeviceGetProcessUtilization(self, handle: int, since: int) -> list[Any]:
        if handle in self.device_utilization:
            raise NvmlError(self.NVML_ERROR_NOT_SUPPORTED)
        samples = self.utilization.get(handle)
        if not samples:
            raise NvmlError(self.NVML_ERROR_NOT_FOUND)
        stamp = time.time_ns() // 1000
        return [SimpleNamespace(pid=p, timeStamp=stamp, smUtil=u) for p, u in samples]

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        return SimpleNamespace(gpu=self.device_utilization.get(handle, 0), memory=0)


class DenyingAuthorizer(Authorizer):
    """Allows every action except on the resources a test lists in ``denied``."""

    denied: ClassVar[set[str]] = set()

    def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> bool:
        return resource not in self.denied


def at_step(manager: Any, step: str, action: Callable[[], Awaitable[Any]]) -> list[Any]:
    """Run ``action`` once, when the suspend or restore reaches ``step``; its results."""
    results: list[Any] = []

    async def hook(at: str, kernel_id: str) -> None:
        if at == step and not results:
            results.append(await action())

    manager.step_hook = hook
    return results
