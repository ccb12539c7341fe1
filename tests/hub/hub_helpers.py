"""A real JupyterHub on loopback, driven through its REST API as a returning user would."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

from harness import BUCKET, CREDENTIALS
from jupyter_client.session import Session
from server_helpers import Client, connect_kernel, poll, text_of
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest, HTTPResponse
from tornado.websocket import websocket_connect

HUB_DIR = Path(__file__).resolve().parent
REPO = HUB_DIR.parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proxy_command() -> str:
    """configurable-http-proxy from the repository's node modules (`npm ci`), else PATH."""
    local = REPO / "node_modules" / ".bin" / "configurable-http-proxy"
    found = str(local) if local.exists() else shutil.which("configurable-http-proxy")
    assert found, "configurable-http-proxy is missing: run `npm ci` in the repository"
    return found


class Hub:
    """`jupyterhub` with tests/hub/jupyterhub_config.py: its proxy, the idle culler (with
    the jupyter-ckpt arbiter) and the users' servers are its child processes, and all of
    them log to ``hub.log``. ``token`` is an admin service's token."""

    def __init__(self, work: Path, s3_endpoint: str, cull_timeout: int, cull_every: int) -> None:
        self.work = work
        self.token = uuid.uuid4().hex
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        storage = {"endpoint_url": s3_endpoint, **CREDENTIALS, "use_listings_cache": False}
        self.env = {
            **os.environ,
            "E2E_DIR": str(work),
            "E2E_PUBLIC_URL": self.url,
            "E2E_PORT": str(self.port),
            "E2E_HUB_PORT": str(free_port()),
            "E2E_PROXY_API_PORT": str(free_port()),
            "E2E_PROXY": proxy_command(),
            "E2E_TOKEN": self.token,
            "JUPYTER_CKPT_HUB_STORE": f"s3://{BUCKET}/{work.name}",
            "JUPYTER_CKPT_HUB_SECRET_FILE": str(self.master_secret(work)),
            "FSSPEC_S3": json.dumps(storage),
            "E2E_CULL_TIMEOUT": str(cull_timeout),
            "E2E_CULL_EVERY": str(cull_every),
            "CONFIGPROXY_AUTH_TOKEN": uuid.uuid4().hex,
        }
        self.log_path = work / "hub.log"
        self.process: subprocess.Popen[bytes] | None = None

    @staticmethod
    def master_secret(work: Path) -> Path:
        path = work / "master-secret"
        path.write_text(secrets.token_hex(32))
        path.chmod(0o400)
        return path

    def describe_node(self, node: str, facts: dict[str, Any]) -> None:
        """What the servers started on ``node`` take as their node facts."""
        path = self.work / "nodes" / node / "facts.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(facts))

    async def start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(HUB_DIR / "jupyterhub_config.py")],
            cwd=self.work,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=open(self.log_path, "ab"),  # noqa: SIM115 (lives with the process)
            # its own process group: teardown can end the hub's children too
            start_new_session=True,
        )
        await poll(self._ready, timeout=120, what="the hub to answer")

    async def _ready(self) -> bool:
        assert self.process is not None and self.process.poll() is None, self.log()[-3000:]
        try:
            await self.api("GET", "")
        except (OSError, HTTPClientError):
            return False
        return True

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    async def request(self, method: str, path: str, body: str | None = None) -> HTTPResponse:
        """A request through the proxy, with the admin token (``path`` after the host)."""
        if body is None and method in ("POST", "PUT", "PATCH"):
            body = ""
        return await AsyncHTTPClient().fetch(
            HTTPRequest(
                f"{self.url}/{path}",
                method=method,
                body=body,
                headers={"Authorization": f"token {self.token}"},
                follow_redirects=False,
                request_timeout=120,
            )
        )

    async def api(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body)
        response = await self.request(method, f"hub/api/{path}", data)
        return json.loads(response.body) if response.body else None

    async def server(self, user: str) -> dict[str, Any] | None:
        """The user's default server as the hub sees it; None when it is stopped."""
        return (await self.api("GET", f"users/{quote(user)}"))["servers"].get("")

    async def stopped(self, user: str) -> bool:
        return await self.server(user) is None

    async def start_server(self, user: str, **options: Any) -> float:
        """Start the user's server (``options`` become the spawner's user_options); seconds
        until the hub reports it ready."""
        started = time.perf_counter()
        await self.api("POST", f"users/{quote(user)}/server", options)

        async def ready() -> bool:
            server = await self.server(user)
            return bool(server and server["ready"])

        await poll(ready, timeout=180, what=f"the server of {user} to be ready")
        return time.perf_counter() - started

    def user_fetch(self, user: str) -> Any:
        """Like pytest-jupyter's ``jp_fetch``, for the user's server behind the proxy."""

        async def fetch(*parts: str, method: str = "GET", body: str | None = None) -> HTTPResponse:
            return await self.request(method, "/".join(["user", quote(user), *parts]), body)

        return fetch

    async def user_json(self, user: str, *parts: str) -> Any:
        return json.loads((await self.user_fetch(user)(*parts)).body)

    async def connect(self, user: str, kernel_id: str, session_id: str | None = None) -> Client:
        """A notebook frontend on the kernel's websocket, through the proxy."""
        return await connect_kernel(
            f"ws://127.0.0.1:{self.port}/user/{quote(user)}",
            self.token,
            kernel_id,
            Session(session=session_id) if session_id else None,
        )

    async def run_cell(self, user: str, kernel_id: str, code: str) -> str:
        """Run one cell in the kernel through the websocket; its output text."""
        client = await self.connect(user, kernel_id)
        try:
            reply, outputs = await client.execute(code)
        finally:
            client.close()
        assert reply["status"] == "ok", text_of(outputs)
        return text_of(outputs)

    async def events(self, user: str) -> Any:
        """The server's event stream (jupyter_server's /api/events/subscribe websocket)."""
        return await websocket_connect(
            HTTPRequest(
                f"ws://127.0.0.1:{self.port}/user/{quote(user)}/api/events/subscribe",
                headers={"Authorization": f"token {self.token}"},
            )
        )

    def stop(self) -> None:
        """Stop the hub (it stops the servers it started), then anything of its group left."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=120)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
