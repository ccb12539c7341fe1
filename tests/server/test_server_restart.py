"""SIGTERM a real `jupyter server`, start it again: the kernel is listed and restores.

The in-process tests drive the extension directly; this one checks the real signal path
(the extension suspends kernels before the server stops them) and a real second start.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from jupyter_client.session import Session
from server_helpers import Client, poll, text_of
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.websocket import websocket_connect


class ServerProcess:
    """`jupyter server` with the extension on a private store and sessions database."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.token = uuid.uuid4().hex
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        config = {
            "ServerApp": {
                "jpserver_extensions": {"jupyter_ckpt_server": True},
                "kernel_manager_class": "jupyter_ckpt_server.kernelmanager.CkptKernelManager",
                "root_dir": str(tmp),
            },
            "SessionManager": {"database_filepath": str(tmp / "sessions.db")},
            "IdentityProvider": {"token": self.token},
            "SuspendPolicy": {"gpu_only": False, "idle_timeout": 3600},
        }
        (tmp / "config.json").write_text(json.dumps(config))
        self.env = {
            **os.environ,
            "JUPYTER_CKPT_STORE": str(tmp / "store"),
            "JUPYTER_CKPT_SECRET_FILE": str(tmp / "secret"),
            "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
            "JUPYTER_CONFIG_DIR": str(tmp / "config"),
            "JUPYTER_DATA_DIR": str(tmp / "data"),
        }
        self.process: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable, "-m", "jupyter_server", f"--config={self.tmp / 'config.json'}",
                f"--port={self.port}", "--no-browser", "--allow-root",
            ],
            env=self.env,
            stderr=open(self.tmp / "server.log", "ab"),  # noqa: SIM115 (lives with the process)
        )  # fmt: skip
        await poll(self._ready, timeout=60, what="the server to start")

    async def _ready(self) -> bool:
        assert self.process is not None and self.process.poll() is None, "the server exited"
        try:
            await self.get("status")
        except (OSError, HTTPClientError):
            return False
        return True

    async def fetch(self, method: str, path: str, body: Any = None) -> Any:
        request = HTTPRequest(
            f"http://127.0.0.1:{self.port}/api/{path}",
            method=method,
            body=None if body is None else json.dumps(body),
            headers={"Authorization": f"token {self.token}"},
        )
        response = await AsyncHTTPClient().fetch(request)
        return json.loads(response.body) if response.body else None

    async def get(self, path: str) -> Any:
        return await self.fetch("GET", path)

    async def connect(self, kernel_id: str) -> Client:
        session = Session()
        ws = await websocket_connect(
            HTTPRequest(
                f"ws://127.0.0.1:{self.port}/api/kernels/{kernel_id}/channels"
                f"?session_id={session.session}",
                headers={"Authorization": f"token {self.token}"},
            )
        )
        return Client(ws, session, None, lambda: None)

    def terminate(self) -> float:
        """SIGTERM, as a pod eviction or hub cull does; seconds until the server exited."""
        assert self.process is not None
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(120)
        return time.monotonic() - started


async def test_sigterm_suspends_and_the_restarted_server_restores(tmp_path):
    server = ServerProcess(tmp_path)
    await server.start()
    try:
        body = {"path": "nb.ipynb", "name": "nb.ipynb", "type": "notebook", "kernel": {}}
        session = await server.fetch("POST", "sessions", body)
        kernel_id = session["kernel"]["id"]
        client = await server.connect(kernel_id)
        await client.execute("import numpy as np\nsteps = np.arange(5)")
        client.close()
    finally:
        server.terminate()
    records = list((tmp_path / "store").glob("users/*/kernels/*.json"))
    assert [r.stem for r in records] == [kernel_id]

    await server.start()
    try:
        kernels = await server.get("kernels")
        assert [(k["id"], k["ckpt"]["state"]) for k in kernels] == [(kernel_id, "suspended")]
        sessions = await server.get("sessions")
        assert [(s["id"], s["kernel"]["id"]) for s in sessions] == [(session["id"], kernel_id)]
        client = await server.connect(kernel_id)
        reply, outputs = await client.execute("int(steps.sum())")
        assert (reply["status"], text_of(outputs)) == ("ok", "10")
        client.close()
    finally:
        server.terminate()
