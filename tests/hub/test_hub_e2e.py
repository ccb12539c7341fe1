"""End to end with a real JupyterHub: the idle culler suspends a user's kernels before it
stops the server, the user comes back to a server on another node, and the notebook's
first cell finds its variables; a kernel that cannot be saved keeps its server."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from server_helpers import poll, start_session

# Node facts of the two "nodes" servers start on (jupyter_ckpt.compat reads them instead
# of probing): images without GPU tensors restore on either.
CPU_NODE = {"available": False, "reason": "no GPU", "driver": None, "cuda": None, "gpus": []}
A10_NODE = {
    "available": True,
    "driver": "535.104.05",
    "cuda": "12.2",
    "gpus": [
        {"index": 0, "name": "NVIDIA A10", "compute_capability": "8.6", "memory_total": 23609475072}
    ],
}

# culled, respawned, restored and two refused rounds, on a loaded 2-core machine
pytestmark = pytest.mark.timeout(900)


async def next_restore(events: Any) -> dict[str, Any]:
    while True:
        message = await asyncio.wait_for(events.read_message(), 120)
        assert message is not None, "the event stream closed"
        event = json.loads(message)
        if event.get("action") == "restore":
            return event


async def test_the_culler_saves_kernels_and_a_respawn_elsewhere_restores_them(hub, capsys):
    hub.describe_node("a", CPU_NODE)
    hub.describe_node("b", A10_NODE)
    await hub.start()
    for user in ("alice", "bob"):
        await hub.api("POST", f"users/{user}")
    # each user works right after their server is up: the culler's timeout runs from there
    await hub.start_server("alice", node="a")
    session_id, kernel_id = await start_session(hub.user_fetch("alice"), "work.ipynb")
    await hub.run_cell("alice", kernel_id, "x = 41")
    await hub.start_server("bob", node="a")
    _, bob_kernel = await start_session(hub.user_fetch("bob"), "data.ipynb")
    await hub.run_cell("bob", bob_kernel, "y = 1\nf = open(__import__('os').devnull)")

    # once idle, alice's server is culled: its kernel was suspended first, by the arbiter
    await poll(lambda: hub.stopped("alice"), timeout=240, what="the culler to stop alice")
    log = hub.log()
    assert log.count("Server alice/: kernels suspended, culling allowed") == 1
    assert f"Suspended kernel {kernel_id} to image" in log
    assert f"Kernel {kernel_id} was not suspended" not in log

    # alice returns; her server starts on another node, with another root directory
    returned = time.perf_counter()
    spawn = await hub.start_server("alice", node="b")
    status = await hub.user_json("alice", "api", "ckpt", "status")
    assert status["node"]["gpus"] == A10_NODE["gpus"]
    sessions = await hub.user_json("alice", "api", "sessions")
    assert [
        (s["id"], s["path"], s["kernel"]["id"], s["kernel"]["ckpt"]["state"]) for s in sessions
    ] == [(session_id, "work.ipynb", kernel_id, "suspended")]
    events = await hub.events("alice")
    try:
        assert await hub.run_cell("alice", kernel_id, "x + 1") == "42"
        first_result = time.perf_counter() - returned
        restore = await next_restore(events)
    finally:
        events.close()
    assert restore["status"] == "success" and restore["kernel_id"] == kernel_id
    cwd = await hub.run_cell("alice", kernel_id, "import os; print(os.getcwd())")
    assert cwd.strip() == str(hub.work / "nodes" / "b" / "home" / "alice")

    kernel_start = restore["seconds"] - restore["write_seconds"]
    with capsys.disabled():
        print(
            f"\nuser returns -> first cell result: {first_result:.1f} s = spawn {spawn:.1f} s"
            f" + kernel start {kernel_start:.1f} s + restore {restore['write_seconds']:.2f} s"
            f" + the rest {first_result - spawn - restore['seconds']:.1f} s"
        )

    # bob's open file cannot be saved (on_unsaveable = "keep"): the arbiter refuses the
    # cull round after round and his kernel keeps running with its state
    refusal = "Not culling server bob/: kernel"
    await poll(lambda: hub.log().count(refusal) >= 2, timeout=240, what="two refused culls of bob")
    server = await hub.server("bob")
    assert server is not None and server["ready"]
    assert "Culling server bob" not in hub.log()
    assert await hub.run_cell("bob", bob_kernel, "print(y, f.closed)") == "1 False\n"

    # an admin stops bob's server: its own stop suspends the kernel, giving up the open
    # file (lost with the process anyway), and his next server restores the rest
    await hub.api("DELETE", "users/bob/server")
    await poll(lambda: hub.stopped("bob"), timeout=240, what="the hub to stop bob's server")
    assert f"Suspended kernel {bob_kernel} to image" in hub.log()
    await hub.start_server("bob", node="b")
    out = await hub.run_cell("bob", bob_kernel, "print(y, 'f' in globals())")
    assert "1 False\n" in out and "not restored" in out, out
