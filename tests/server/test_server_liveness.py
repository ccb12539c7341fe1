"""What keeps every open JupyterLab current without polling: a ``state`` event for each
change of a kernel's state as clients see it, a ``store`` event for each change of the
store's health, both sent only to authorized subscribers of the server's event socket;
and a status that does not call a kernel busy for the server's own silent calls."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from deadlines import scaled
from harness import read_only
from jupyter_ckpt_server.app import SCHEMA_ID
from jupyter_ckpt_server.storehealth import StoreHealth
from server_helpers import ServerProcess, next_event, poll, start_session
from tornado.httpclient import HTTPClientError, HTTPRequest
from tornado.websocket import websocket_connect


def states(events: list[dict[str, Any]], kernel_id: str) -> list[str]:
    return [e["state"] for e in events if e["action"] == "state" and e["kernel_id"] == kernel_id]


async def kernel_status(jp_fetch: Any, kernel_id: str) -> dict[str, Any]:
    reply = json.loads((await jp_fetch("api", "ckpt", "status")).body)
    return next(k for k in reply["kernels"] if k["kernel_id"] == kernel_id)


async def test_state_events_follow_a_kernel_from_start_to_shutdown(jp_fetch, connect, events):
    _, kernel_id = await start_session(jp_fetch, "live.ipynb")
    client = await connect(kernel_id)
    await client.execute("x = 1")
    await jp_fetch("api", "ckpt", "kernels", kernel_id, "checkpoint", method="POST", body="{}")
    await jp_fetch("api", "ckpt", "kernels", kernel_id, "suspend", method="POST", body="{}")
    # the state is told as it changes, before the suspend's own event
    assert states(events, kernel_id) == ["running", "suspending", "suspended"]
    client = await connect(kernel_id)
    reply, _ = await client.execute("x + 1")
    assert reply["status"] == "ok"
    await next_event(events, "restore", kernel_id=kernel_id)
    await jp_fetch("api", "kernels", kernel_id, method="DELETE")
    expected = ["running", "suspending", "suspended", "restoring", "running", "gone"]
    await poll(lambda: states(events, kernel_id) == expected, what=f"states {expected}")


async def test_a_cell_that_ran_a_ckpt_command_is_told_once_it_ended(jp_fetch, connect, events):
    """`%ckpt save` writes from the kernel, which the server does not see: an ``images``
    event follows the end of each cell that names the command."""
    _, kernel_id = await start_session(jp_fetch, "magic.ipynb")
    client = await connect(kernel_id)

    def told() -> int:
        return sum(e["action"] == "images" and e.get("kernel_id") == kernel_id for e in events)

    reply, _ = await client.execute("%load_ext jupyter_ckpt")
    assert reply["status"] == "ok"
    await poll(lambda: told() == 1, what="the images event of the first cell")
    reply, _ = await client.execute("import time; time.sleep(0.5)\n%ckpt save by-magic")
    assert reply["status"] == "ok"
    await poll(lambda: told() == 2, what="the images event of the save")


async def test_a_store_event_says_when_writes_fail_and_when_they_work_again(
    tmp_path: Path,
) -> None:
    server = ServerProcess(tmp_path)
    await server.start()
    events = await websocket_connect(
        HTTPRequest(
            f"ws://127.0.0.1:{server.port}/api/events/subscribe",
            headers={"Authorization": f"token {server.token}"},
        )
    )

    async def store_event() -> dict[str, Any]:
        while True:
            event = json.loads(await asyncio.wait_for(events.read_message(), scaled(60)))
            if event["schema_id"] == SCHEMA_ID and event["action"] == "store":
                return event

    try:
        kernel_id = (await server.fetch("POST", "kernels", {"name": "python3"}))["id"]
        await server.run_cell(kernel_id, "x = 41")
        checkpoint = f"ckpt/kernels/{kernel_id}/checkpoint"
        with read_only(tmp_path / "store"):
            with pytest.raises(HTTPClientError):
                await server.fetch("POST", checkpoint, {})
            failed = await store_event()
            assert failed["status"] == "error" and "read-only" in failed["msg"], failed
        await server.fetch("POST", checkpoint, {})
        assert (await store_event())["status"] == "success"
    finally:
        events.close()
        server.kill()


def test_store_health_tells_each_change_once() -> None:
    told: list[tuple[bool, str | None]] = []
    health = StoreHealth(
        "file:///s", logging.getLogger("test"), on_change=lambda h: told.append((h.ok, h.error))
    )
    health.record(None, "a save")  # ok, as it was
    health.record(OSError("read-only"), "a save")
    health.record(OSError("read-only"), "a save")  # the same: said already
    health.record(OSError("disk full"), "a save")  # another reason: shown
    health.record(None, "a save")
    assert told == [(False, "read-only"), (False, "disk full"), (True, None)]


async def test_the_event_socket_refuses_who_may_not_see_the_events(
    jp_fetch, jp_ws_fetch, jp_http_port, jp_base_url
):
    url = f"ws://127.0.0.1:{jp_http_port}{jp_base_url}api/events/subscribe"
    with pytest.raises(HTTPClientError) as refused:
        await websocket_connect(url)
    assert refused.value.code == 403
    # an authorized subscriber gets them
    ws = await jp_ws_fetch("api", "events", "subscribe")
    try:
        _, kernel_id = await start_session(jp_fetch, "socket.ipynb")
        while True:
            event = json.loads(await asyncio.wait_for(ws.read_message(), 30))
            if event["schema_id"] == SCHEMA_ID and event.get("kernel_id") == kernel_id:
                break
        assert (event["action"], event["state"]) == ("state", "running")
    finally:
        ws.close()


async def test_the_status_does_not_call_a_kernel_busy_for_the_servers_own_calls(
    jp_fetch, connect, manager
):
    _, kernel_id = await start_session(jp_fetch, "busy.ipynb")
    client = await connect(kernel_id)
    await client.execute("import time")
    kernel = manager.kernel_manager.get_kernel(kernel_id)
    # a silent request of the server's own, as the idle check or a restore's last steps
    ours = asyncio.ensure_future(
        manager.rpc.request(
            kernel_id, "execute", 60, code="time.sleep(3)", silent=True, store_history=False
        )
    )
    await poll(lambda: kernel.execution_state == "busy", what="the server to see it busy")
    assert "the kernel is busy" not in (await kernel_status(jp_fetch, kernel_id))["blocked_by"]
    await ours
    # its "idle" may come after its reply: the client's cell must not be taken for it
    await poll(lambda: kernel.execution_state == "idle", what="the server to see it idle")
    # a client's cell is the user's work: shown
    client.send("execute_request", {"code": "time.sleep(30)", "silent": False})
    await poll(lambda: kernel.execution_state == "busy", what="the client's cell to run")
    assert "the kernel is busy" in (await kernel_status(jp_fetch, kernel_id))["blocked_by"]
    await jp_fetch("api", "kernels", kernel_id, "interrupt", method="POST", body="")
