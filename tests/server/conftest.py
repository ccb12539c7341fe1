"""A real jupyter server with the jupyter_ckpt extension and real ipykernel kernels.

The idle monitor's own loop is slowed right down here; tests drive it with
``monitor.tick()`` so that what they assert does not depend on timing, except the one test
that checks the loop itself.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from deadlines import scaled
from jupyter_ckpt_server.app import SCHEMA_ID
from jupyter_ckpt_server.manager import CkptManager
from jupyter_ckpt_server.monitor import IdleMonitor
from jupyter_client.session import Session
from pytest_jupyter.jupyter_server import *  # noqa: F403
from server_helpers import Client, ServerProcess, python_kernelspec

# pytest-jupyter's request fixture, under a name of its own: jp_fetch below wraps it
upstream_fetch = jp_fetch  # noqa: F405

# seconds a request to the test server may take on an idle machine: a restore or a kernel
# start behind a slow launcher answers in seconds there
REQUEST_TIMEOUT = 30

SERVER_CONFIG = {
    "ServerApp": {
        "jpserver_extensions": {"jupyter_ckpt_server": True},
        "kernel_manager_class": "jupyter_ckpt_server.kernelmanager.CkptKernelManager",
    },
    "SuspendPolicy": {
        "idle_timeout": 3600,
        "check_interval": 3600,
        "gpu_only": False,
        "suspend_on_shutdown": False,
    },
}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    """A failing test's report ends with the logs of the servers it ran as processes."""
    report = (yield).get_result()
    if report.failed:
        for server in ServerProcess.of_test:
            if server.log_path.exists():
                report.sections.append((f"server log {server.tmp}", server.log()[-20_000:]))
    if report.when == "teardown":
        ServerProcess.of_test.clear()


@pytest.fixture
def jp_fetch(upstream_fetch: Callable[..., Any]) -> Callable[..., Any]:
    """pytest-jupyter's, with a request deadline that scales with the machine: its fixed
    20 s is shorter than a restore behind a kernel start on a loaded one."""

    def fetch(*parts: str, **kwargs: Any) -> Any:
        kwargs.setdefault("request_timeout", scaled(REQUEST_TIMEOUT))
        return upstream_fetch(*parts, **kwargs)

    return fetch


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return json.loads(json.dumps(SERVER_CONFIG))


@pytest.fixture
def manager(jp_serverapp: Any) -> CkptManager:
    return jp_serverapp.web_app.settings["jupyter_ckpt_manager"]


@pytest.fixture
def monitor(jp_serverapp: Any) -> IdleMonitor:
    return jp_serverapp.web_app.settings["jupyter_ckpt_monitor"]


@pytest.fixture
def events(jp_serverapp: Any) -> list[dict[str, Any]]:
    received: list[dict[str, Any]] = []

    async def listener(logger: Any, schema_id: str, data: dict[str, Any]) -> None:
        received.append(data)

    jp_serverapp.event_logger.add_listener(schema_id=SCHEMA_ID, listener=listener)
    return received


@pytest.fixture
def no_ckpt_kernel(jp_data_dir: Path) -> str:
    """A python kernel whose environment cannot import jupyter_ckpt."""
    launcher = (
        "import sys; sys.modules['jupyter_ckpt'] = None; "
        "from ipykernel.kernelapp import launch_new_instance; launch_new_instance()"
    )
    argv = [sys.executable, "-c", launcher, "-f", "{connection_file}"]
    return python_kernelspec(jp_data_dir, "no-ckpt", "Python without jupyter_ckpt", argv)


@pytest.fixture
def connect(
    jp_ws_fetch: Any, manager: CkptManager
) -> AsyncIterator[Callable[..., Awaitable[Client]]]:
    clients: list[Client] = []

    async def open_client(
        kernel_id: str, session_id: str | None = None, v1: bool = False
    ) -> Client:
        session = Session(session=session_id) if session_id else Session()
        subprotocols = ["v1.kernel.websocket.jupyter.org"] if v1 else None
        ws = await jp_ws_fetch(
            "api",
            "kernels",
            kernel_id,
            "channels",
            params={"session_id": session.session},
            subprotocols=subprotocols,
        )
        km = manager.kernel_manager
        client = Client(
            ws,
            session,
            ws.selected_subprotocol,
            lambda: km.get_kernel(kernel_id) if km.is_running(kernel_id) else None,
        )
        clients.append(client)
        return client

    yield open_client
    for client in clients:
        client.close()
