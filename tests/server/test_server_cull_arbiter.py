"""What `POST /api/ckpt/suspend-all` answers per kernel, and the hub's cull arbiter deciding
from it, against a real server (the full hub flow is in tests/hub)."""

from __future__ import annotations

import json
import os
import signal
from datetime import timedelta
from typing import Any

import pytest
from server_helpers import action_events, get_json, poll, start_session

from jupyter_ckpt.hub import make_cull_arbiter

IDLE = {"inactive": timedelta(seconds=600), "inactive_limit": 300}


@pytest.fixture
def jp_server_config(jp_server_config: dict[str, Any]) -> dict[str, Any]:
    jp_server_config["SuspendPolicy"]["exclude_kernel_names"] = ["no-ckpt"]
    return jp_server_config


@pytest.fixture
def server_model(jp_base_url: str) -> dict[str, Any]:
    """The server as the hub describes it to the culler."""
    return {"name": "", "full_name": "alice/", "url": jp_base_url, "full_url": None}


@pytest.fixture
def arbiter(jp_serverapp: Any, jp_http_port: int, jp_fetch: Any) -> Any:
    """An arbiter that reaches the server (listening once jp_fetch is set up)."""
    return make_cull_arbiter(
        public_url=f"http://localhost:{jp_http_port}",
        api_token=jp_serverapp.identity_provider.token,
        request_timeout=120,
    )


async def test_suspend_all_says_which_kernels_hold_state(
    jp_fetch, connect, manager, no_ckpt_kernel
):
    _, saved = await start_session(jp_fetch, "saved.ipynb")
    await (await connect(saved)).execute("x = 41")
    _, keeps = await start_session(jp_fetch, "file.ipynb")
    await (await connect(keeps)).execute("f = open(__import__('os').devnull)")
    _, died = await start_session(jp_fetch, "died.ipynb")
    kernel = manager.kernel_manager.get_kernel(died)
    kernel.stop_restarter()  # no automatic restart: the kernel stays dead
    os.kill(manager.kernel_pid(died), signal.SIGKILL)

    async def dead() -> bool:
        return not await kernel.is_alive()

    await poll(dead, what="the kernel to die")
    r = await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": no_ckpt_kernel}))
    excluded = json.loads(r.body)["id"]

    r = await jp_fetch("api", "ckpt", "suspend-all", method="POST", body="")
    result = json.loads(r.body)
    assert result["suspended"] == [saved]
    assert list(result["failed"]) == [keeps]
    assert "on_unsaveable=keep" in result["failed"][keeps] and "f (" in result["failed"][keeps]
    assert result["nothing_to_save"] == {
        died: "the kernel's process has died: there is no state to save"
    }
    assert result["excluded"] == [excluded]
    states = {k["id"]: k["ckpt"]["state"] for k in await get_json(jp_fetch, "api", "kernels")}
    assert (states[saved], states[keeps], states[excluded]) == ("suspended", "running", "running")


async def test_the_arbiter_culls_only_once_every_kernel_is_saved(
    jp_fetch, connect, manager, arbiter, server_model, events
):
    _, kernel_id = await start_session(jp_fetch)
    client = await connect(kernel_id)
    await client.execute("x = 41\nf = open(__import__('os').devnull)")

    # a server not idle long enough is not touched
    recent = {"inactive": timedelta(seconds=10), "inactive_limit": 300}
    assert await arbiter(**recent, server=server_model) is False
    assert await arbiter(inactive=None, inactive_limit=300, server=server_model) is False
    assert not [e for e in events if e["action"] == "suspend"]

    # an idle one with an unsaveable variable is kept, and its kernel runs on
    assert await arbiter(**IDLE, server=server_model) is False
    assert manager.kernel_manager.ckpt_field(kernel_id)["state"] == "running"
    await poll(lambda: [e for e in events if e["action"] == "suspend"], what="an event")
    outcomes = action_events(events)
    assert [(e["status"], e["trigger"]) for e in outcomes] == [("error", "api")]

    # once nothing would be lost, the cull goes ahead
    await client.execute("f.close()\ndel f")
    assert await arbiter(**IDLE, server=server_model) is True
    assert manager.kernel_manager.is_suspended(kernel_id)
    # a server with nothing left to save is culled at once
    assert await arbiter(**IDLE, server=server_model) is True


async def test_the_arbiter_keeps_servers_it_cannot_ask(arbiter, server_model, free_tcp_port):
    wrong_token = make_cull_arbiter(arbiter.public_url, "wrong", request_timeout=30)
    assert await wrong_token(**IDLE, server=server_model) is False
    nobody = make_cull_arbiter(f"http://127.0.0.1:{free_tcp_port}", "x", request_timeout=30)
    assert await nobody(**IDLE, server=server_model) is False
    no_url = make_cull_arbiter(api_token="x")
    assert await no_url(**IDLE, server=server_model) is False
    # the hub's full_url is used when no URL is configured
    full = {**server_model, "full_url": arbiter.public_url + server_model["url"]}
    assert await make_cull_arbiter(api_token=arbiter.api_token)(**IDLE, server=full) is True
