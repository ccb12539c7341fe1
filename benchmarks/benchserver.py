"""A jupyter server subprocess with the jupyter_ckpt extension, for the benchmarks that
measure through a real server: its REST API, cells on its kernels' websockets, and the
events it writes to a file."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from jupyter_client.jsonutil import json_default
from jupyter_client.session import Session
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.websocket import websocket_connect

CONFIG = """
import logging
c.ServerApp.jpserver_extensions = {{"jupyter_ckpt_server": True}}
c.ServerApp.kernel_manager_class = "jupyter_ckpt_server.kernelmanager.CkptKernelManager"
c.SuspendPolicy.idle_timeout = 86400
c.SuspendPolicy.gpu_only = False
c.EventLogger.handlers = [logging.FileHandler({events!r})]
"""


class Server:
    """A jupyter server subprocess with the extension, on a free port, whose events go to
    a file."""

    def __init__(self, tmp: Path, config: str = "") -> None:
        """``config``: lines of ``jupyter_server_config.py`` after the defaults."""
        self.token = uuid.uuid4().hex
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.events = tmp / "events.jsonl"
        config_file = tmp / "jupyter_server_config.py"
        config_file.write_text(CONFIG.format(events=str(self.events)) + config)
        env = {
            **os.environ,
            "JUPYTER_CKPT_STORE": str(tmp / "store"),
            "JUPYTER_CKPT_SECRET_FILE": str(tmp / "secret"),
        }
        self.process = subprocess.Popen(
            [
                sys.executable, "-m", "jupyter_server", f"--config={config_file}",
                f"--port={self.port}", "--no-browser", f"--ServerApp.root_dir={tmp}",
                f"--IdentityProvider.token={self.token}", "--ServerApp.log_level=WARN",
                "--allow-root",
            ],
            env=env,
        )  # fmt: skip
        self.http = AsyncHTTPClient()

    async def api(self, method: str, path: str, body: Any = None, timeout: float = 600) -> Any:
        request = HTTPRequest(
            f"http://127.0.0.1:{self.port}/api/{path}",
            method=method,
            body=None if body is None else json.dumps(body),
            headers={"Authorization": f"token {self.token}"},
            request_timeout=timeout,
        )
        response = await self.http.fetch(request)
        return json.loads(response.body) if response.body else None

    async def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                await self.api("GET", "status", timeout=2)
                return
            except (OSError, HTTPClientError):
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError("the jupyter server did not start") from None
                await asyncio.sleep(0.2)

    async def connect(self, kernel_id: str) -> Any:
        return await websocket_connect(
            HTTPRequest(
                f"ws://127.0.0.1:{self.port}/api/kernels/{kernel_id}/channels"
                f"?session_id={uuid.uuid4().hex}",
                headers={"Authorization": f"token {self.token}"},
            )
        )

    @staticmethod
    async def execute(ws: Any, code: str) -> tuple[float, str]:
        """Run a cell on an open websocket: (seconds from the request to its reply, stdout)."""
        session = Session()
        msg = session.msg("execute_request", {"code": code, "silent": False})
        started = time.perf_counter()
        ws.write_message(json.dumps({**msg, "channel": "shell"}, default=json_default))
        out: list[str] = []
        reply_at, idle = None, False
        # the shell reply and the iopub idle status come on different sockets, in any order
        while reply_at is None or not idle:
            incoming = json.loads(await ws.read_message())
            if incoming["parent_header"].get("msg_id") != msg["header"]["msg_id"]:
                continue
            content = incoming["content"]
            if incoming["channel"] == "shell":
                reply_at = time.perf_counter()
                if content["status"] != "ok":
                    raise RuntimeError(f"{content['ename']}: {content['evalue']}")
            elif incoming["msg_type"] == "stream":
                out.append(content["text"])
            elif incoming["msg_type"] == "status":
                idle = content["execution_state"] == "idle"
        return reply_at - started, "".join(out)

    async def restore_event(self, kernel_id: str, timeout: float = 30) -> dict[str, Any]:
        """The server's restore event of the kernel (written a moment after the reply)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.events.exists():
                for line in reversed(self.events.read_text().splitlines()):
                    event = json.loads(line)
                    if event.get("action") == "restore" and event.get("kernel_id") == kernel_id:
                        return event
            await asyncio.sleep(0.1)
        raise RuntimeError(f"no restore event for kernel {kernel_id}")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(30)
