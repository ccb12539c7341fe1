"""What arrives while a suspend or restore is under way wins: a client's message, a
restart, an interrupt or a shutdown through the kernels API. Each window is held open with
``CkptManager.step_hook`` so that the racing request lands exactly at that step."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from jupyter_ckpt_server.manager import CkptManager, SuspendFailed
from server_helpers import (
    alter_chunks,
    at_step,
    fails_with,
    get_json,
    poll,
    start_session,
    text_of,
)

SUSPEND_STEPS = ["kernel_info", "checkpoint", "verify", "record", "recorded"]


def racing(
    manager: CkptManager, kernel_id: str, request: Callable[[], Awaitable[Any]]
) -> Callable[[], Awaitable[Any]]:
    """An action that sends a kernels-API request and returns once the server has told the
    suspend or restore in progress to stop (the request itself waits for it to stop)."""

    async def action() -> asyncio.Future[Any]:
        sent = asyncio.ensure_future(request())
        await poll(lambda: manager.aborting(kernel_id), what="the request to reach the server")
        return sent

    return action


async def nothing_kept(manager: CkptManager) -> None:
    assert manager.records.all() == ({}, {})
    assert manager.store.image_ids() == []
    assert not manager.kernel_manager.suspended


@pytest.mark.parametrize("step", SUSPEND_STEPS)
async def test_a_cell_run_at_any_step_of_a_suspend_aborts_it(step, jp_fetch, connect, manager):
    _, kernel_id = await start_session(jp_fetch)
    client = await connect(kernel_id)
    await client.execute("n = 1")
    ran = at_step(manager, step, lambda: client.execute("n += 1\nprint(n)"))
    with pytest.raises(SuspendFailed, match="a client used the kernel"):
        await manager.suspend(kernel_id)
    [(reply, outputs)] = ran
    assert (reply["status"], text_of(outputs)) == ("ok", "2\n")
    assert manager.kernel_manager.is_running(kernel_id)
    await nothing_kept(manager)
    manager.step_hook = None
    reply, outputs = await client.execute("print(n)")
    assert text_of(outputs) == "2\n", "the kernel keeps the state the cell left"


async def test_an_aborted_suspend_keeps_the_pin_of_a_failed_restore(jp_fetch, connect, manager):
    _, kernel_id = await start_session(jp_fetch)
    await (await connect(kernel_id)).execute("old = 1")
    image_id = (await manager.suspend(kernel_id))["id"]
    alter_chunks(manager)
    await manager.restore(kernel_id)
    client = await connect(kernel_id)
    at_step(manager, "recorded", lambda: client.execute("new = 2"))
    with pytest.raises(SuspendFailed, match="a client used the kernel"):
        await manager.suspend(kernel_id)
    assert manager.records.get(kernel_id)["image_id"] == image_id
    assert manager.kernel_manager.kernel_model(kernel_id)["ckpt"]["state"] == "restore-failed"


async def test_a_control_message_during_the_record_write_aborts_the_suspend(
    jp_fetch, connect, manager
):
    _, kernel_id = await start_session(jp_fetch)
    client = await connect(kernel_id)
    ran = at_step(
        manager,
        "record",
        lambda: client.reply_to(
            client.send("kernel_info_request", {}, channel="control"), channel="control"
        ),
    )
    with pytest.raises(SuspendFailed, match="a client used the kernel"):
        await manager.suspend(kernel_id)
    assert ran[0]["content"]["status"] == "ok"
    assert manager.kernel_manager.is_running(kernel_id)
    await nothing_kept(manager)


@pytest.mark.parametrize("step", ["checkpoint", "recorded"])
async def test_a_restart_during_a_suspend_wins(step, jp_fetch, connect, manager):
    _, kernel_id = await start_session(jp_fetch)
    await (await connect(kernel_id)).execute("old = 1")

    def restart() -> Awaitable[Any]:
        return jp_fetch("api", "kernels", kernel_id, "restart", method="POST", body="")

    sent = at_step(manager, step, racing(manager, kernel_id, restart))
    with pytest.raises(SuspendFailed, match="restarted"):
        await manager.suspend(kernel_id)
    r = await sent[0]
    assert json.loads(r.body)["ckpt"]["state"] == "running"
    await nothing_kept(manager)
    manager.step_hook = None
    reply, _ = await (await connect(kernel_id)).execute("old")
    assert reply["ename"] == "NameError", "the restart happened, and nothing undoes it"
    assert manager.kernel_manager.is_running(kernel_id)


async def test_a_shutdown_during_a_suspend_leaves_nothing(jp_fetch, connect, manager):
    _, kernel_id = await start_session(jp_fetch)
    await (await connect(kernel_id)).execute("old = 1")

    def delete() -> Awaitable[Any]:
        return jp_fetch("api", "kernels", kernel_id, method="DELETE")

    sent = at_step(manager, "recorded", racing(manager, kernel_id, delete))
    with pytest.raises(SuspendFailed, match="shut down"):
        await manager.suspend(kernel_id)
    assert (await sent[0]).code == 204
    assert await get_json(jp_fetch, "api", "kernels") == []
    await nothing_kept(manager)


async def test_an_interrupt_during_a_suspend_keeps_the_kernel(jp_fetch, connect, manager):
    _, kernel_id = await start_session(jp_fetch)
    client = await connect(kernel_id)
    await client.execute("kept = 5")

    def interrupt() -> Awaitable[Any]:
        return jp_fetch("api", "kernels", kernel_id, "interrupt", method="POST", body="")

    sent = at_step(manager, "record", racing(manager, kernel_id, interrupt))
    with pytest.raises(SuspendFailed, match="interrupted"):
        await manager.suspend(kernel_id)
    assert (await sent[0]).code == 204
    await nothing_kept(manager)
    _, outputs = await client.execute("kept")
    assert text_of(outputs) == "5"


async def test_a_shutdown_during_a_restore_leaves_no_kernel_and_no_record(
    jp_fetch, connect, manager
):
    _, kernel_id = await start_session(jp_fetch)
    await (await connect(kernel_id)).execute("old = 1")
    await manager.suspend(kernel_id)

    def delete() -> Awaitable[Any]:
        return jp_fetch("api", "kernels", kernel_id, method="DELETE")

    sent = at_step(manager, "restore", racing(manager, kernel_id, delete))
    report = await manager.restore(kernel_id)
    assert "shut down" in report["error"]
    assert (await sent[0]).code == 204
    assert await get_json(jp_fetch, "api", "kernels") == []
    assert manager.records.all() == ({}, {})
    # a new server run on the same store does not bring the kernel back
    await manager.load_records()
    assert await get_json(jp_fetch, "api", "kernels") == []


async def test_interrupt_reaches_a_running_kernel(jp_fetch, connect, manager):
    _, kernel_id = await start_session(jp_fetch)
    client = await connect(kernel_id)
    msg_id = client.send("execute_request", {"code": "import time\ntime.sleep(120)"})
    kernel = manager.kernel_manager.get_kernel(kernel_id)
    await poll(lambda: kernel.execution_state == "busy", what="the cell to start")
    r = await jp_fetch("api", "kernels", kernel_id, "interrupt", method="POST", body="")
    assert r.code == 204
    reply = await client.reply_to(msg_id)
    assert reply["content"]["ename"] == "KeyboardInterrupt"


async def test_a_dead_kernel_is_not_suspended(jp_fetch, manager):
    _, kernel_id = await start_session(jp_fetch)
    kernel = manager.kernel_manager.get_kernel(kernel_id)
    kernel.autorestart = False
    os.kill(manager.kernel_pid(kernel_id), signal.SIGKILL)
    await poll(lambda: _not(kernel.is_alive()), what="the kernel to die")
    with pytest.raises(SuspendFailed, match="died"):
        await manager.suspend(kernel_id)


async def _not(value: Awaitable[bool]) -> bool:
    return not await value


async def test_no_wait_is_longer_than_the_policy_allows(jp_fetch, manager):
    _, kernel_id = await start_session(jp_fetch)
    manager.policy.checkpoint_timeout = 1
    pid = manager.kernel_pid(kernel_id)
    os.kill(pid, signal.SIGSTOP)  # alive, but answers nothing
    try:
        with pytest.raises(SuspendFailed, match="did not answer within 1 s"):
            await manager.suspend(kernel_id)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert manager.kernel_manager.is_running(kernel_id)


async def test_an_image_that_fails_verification_is_removed(jp_fetch, connect, manager):
    _, kernel_id = await start_session(jp_fetch)
    await (await connect(kernel_id)).execute("data = list(range(1000))")

    async def alter() -> None:
        alter_chunks(manager)

    at_step(manager, "verify", alter)
    message = await fails_with(
        409, jp_fetch, "api", "ckpt", "kernels", kernel_id, "checkpoint", method="POST", body=""
    )
    assert "failed verification and was removed" in message
    assert manager.store.image_ids() == []
