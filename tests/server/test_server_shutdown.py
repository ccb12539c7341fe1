"""Server shutdown suspends kernels that would lose state; a new server run restores them."""

from __future__ import annotations

from server_helpers import get_json, start_session, text_of


async def test_shutdown_suspends_and_the_next_server_run_restores(
    jp_fetch, jp_serverapp, connect, manager
):
    session_id, kernel_id = await start_session(jp_fetch)
    client = await connect(kernel_id)
    await client.execute("state = {'epoch': 12}")
    manager.policy.suspend_on_shutdown = True

    # what ServerApp does on SIGTERM, before it stops the kernels
    await jp_serverapp.extension_manager.stop_all_extensions()
    assert manager.records.get(kernel_id)["trigger"] == "shutdown"
    assert not manager.kernel_manager.is_running(kernel_id)

    # a new server run knows the kernel only from the store
    manager.kernel_manager.suspended.clear()
    await manager.load_records()
    kernels = await get_json(jp_fetch, "api", "kernels")
    assert [(k["id"], k["ckpt"]["state"]) for k in kernels] == [(kernel_id, "suspended")]
    sessions = await get_json(jp_fetch, "api", "sessions")
    assert [s["id"] for s in sessions] == [session_id]

    client = await connect(kernel_id)
    reply, outputs = await client.execute("state['epoch']")
    assert (reply["status"], text_of(outputs)) == ("ok", "12")


async def test_shutdown_without_suspend_on_shutdown_writes_nothing(jp_fetch, jp_serverapp, manager):
    _, kernel_id = await start_session(jp_fetch)
    await jp_serverapp.extension_manager.stop_all_extensions()
    assert manager.records.all() == ({}, {})
    assert manager.kernel_manager.is_running(kernel_id)
