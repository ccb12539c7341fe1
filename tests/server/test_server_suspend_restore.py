"""Suspend a real kernel to an image and bring it back under the same id."""

from __future__ import annotations

import asyncio
import json
import os

import pytest
from jupyter_ckpt_server.manager import SuspendFailed
from server_helpers import (
    alter_chunks,
    fails_with,
    get_json,
    next_event,
    poll,
    start_session,
    text_of,
)

WHERE = "import os; print(os.getcwd(), os.environ['JPY_SESSION_NAME'], os.environ['RUN'])"


async def test_suspended_kernel_keeps_id_and_session_then_restores_on_execute(
    jp_fetch, jp_root_dir, connect, manager
):
    (jp_root_dir / "sub").mkdir()
    session_id, kernel_id = await start_session(jp_fetch, "sub/work.ipynb")
    client = await connect(kernel_id)
    code = "import os\nimport numpy as np\nx = np.arange(10)\ny = 'kept'\nos.environ['RUN'] = '7'"
    reply, _ = await client.execute(code)
    assert reply["status"] == "ok"
    _, outputs = await client.execute(WHERE)
    where = text_of(outputs)
    assert where.startswith(str(jp_root_dir / "sub"))
    count = reply["execution_count"]
    pid = manager.kernel_pid(kernel_id)

    r = await jp_fetch("api", "ckpt", "kernels", kernel_id, "suspend", method="POST", body="")
    image_id = json.loads(r.body)["id"]
    await poll(lambda: not _alive(pid), what="the kernel process to exit")

    kernels = await get_json(jp_fetch, "api", "kernels")
    assert [k["id"] for k in kernels] == [kernel_id]
    assert kernels[0]["ckpt"]["state"] == "suspended"
    assert kernels[0]["ckpt"]["image"] == image_id
    model = await get_json(jp_fetch, "api", "kernels", kernel_id)
    assert model["ckpt"]["state"] == "suspended"
    sessions = await get_json(jp_fetch, "api", "sessions")
    assert [(s["id"], s["kernel"]["id"]) for s in sessions] == [(session_id, kernel_id)]
    assert sessions[0]["kernel"]["ckpt"]["state"] == "suspended"

    # what a frontend sends on connect is answered without waking the kernel
    client = await connect(kernel_id)
    info = await client.reply_to(client.send("kernel_info_request", {}))
    assert info["content"]["implementation"] == "ipython"
    # JupyterLab's debugger asks for its state: answered from what the kernel said at
    # suspend, as not started (a restored kernel's debugger starts off)
    ask = {"type": "request", "seq": 7, "command": "debugInfo", "arguments": {}}
    debug = await client.reply_to(
        client.send("debug_request", ask, channel="control"), channel="control"
    )
    assert debug["content"]["request_seq"] == 7 and debug["content"]["success"]
    assert debug["content"]["body"]["hashMethod"] == "Murmur2"
    assert debug["content"]["body"]["isStarted"] is False
    comms = await client.reply_to(client.send("comm_info_request", {}))
    assert comms["content"] == {"status": "ok", "comms": {}}
    # JupyterLab 4 asks for the input history on connect: answered from the image
    tail = {"output": False, "raw": True, "hist_access_type": "tail", "n": 2}
    history = await client.reply_to(client.send("history_request", tail))
    assert [entry[2] for entry in history["content"]["history"]] == [code, WHERE]
    assert manager.kernel_manager.is_suspended(kernel_id)

    reply, outputs = await client.execute("print(y, x.sum())")
    assert reply["status"] == "ok", reply
    assert text_of(outputs) == "kept 45\n"
    assert reply["execution_count"] == count + 2
    _, outputs = await client.execute(WHERE)
    assert text_of(outputs) == where, "same working directory and environment"
    model = await get_json(jp_fetch, "api", "kernels", kernel_id)
    assert model["ckpt"]["state"] == "running"
    sessions = await get_json(jp_fetch, "api", "sessions")
    assert [(s["id"], s["kernel"]["id"]) for s in sessions] == [(session_id, kernel_id)]
    # the suspended record goes once the kernel runs again; with autosave on, a running
    # record names the image it came back from, so a crash now is still recoverable (it
    # is written while the first cell runs: the suspended one names the same image)
    await poll(
        lambda: (
            [(r["state"], r["image_id"]) for r in manager.records.all()[0].values()]
            == [("running", image_id)]
        ),
        what="the running record",
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_concurrent_reconnects_restore_once(jp_fetch, connect, manager):
    _, kernel_id = await start_session(jp_fetch)
    client = await connect(kernel_id)
    await client.execute("z = 41")
    await manager.suspend(kernel_id)
    first, second, idle = [await connect(kernel_id) for _ in range(3)]
    (r1, o1), (r2, o2) = await asyncio.gather(first.execute("z + 1"), second.execute("z + 2"))
    assert (r1["status"], r2["status"]) == ("ok", "ok")
    assert (text_of(o1), text_of(o2)) == ("42", "43")
    assert manager.restore_count == 1
    # a client that slept through the restore reaches the restored kernel
    info = await idle.reply_to(idle.send("kernel_info_request", {}))
    assert info["content"]["status"] == "ok"
    reply, outputs = await idle.execute("z")
    assert (reply["status"], text_of(outputs), manager.restore_count) == ("ok", "41", 1)


async def test_a_failed_restore_starts_the_kernel_and_says_what_is_missing(
    jp_fetch, connect, manager, events
):
    _, kernel_id = await start_session(jp_fetch)
    client = await connect(kernel_id)
    await client.execute("weights = list(range(5000))\nname = 'run-7'")
    image_id = (await manager.suspend(kernel_id))["id"]
    alter_chunks(manager)

    client = await connect(kernel_id, v1=True)
    reply, outputs = await client.execute("print('running')")
    assert reply["status"] == "ok"
    shown = text_of(outputs)
    assert f"restoring image {image_id} failed" in shown and "altered" in shown
    assert "weights:" in shown and "name:" in shown
    assert shown.endswith("running\n")
    ckpt = (await get_json(jp_fetch, "api", "kernels", kernel_id))["ckpt"]
    assert (ckpt["state"], ckpt["image"]) == ("restore-failed", image_id)
    assert "altered" in ckpt["error"]
    restore = await next_event(events, "restore")
    assert restore["status"] == "error" and "altered" in restore["msg"]

    # the record, and so the image's pin, stays: neither retention nor DELETE removes it
    assert manager.records.get(kernel_id)["image_id"] == image_id
    await manager.checkpoint(kernel_id, "newer")
    manager.store.max_images = 1
    await manager.enforce_retention()
    assert image_id in manager.store.image_ids(), "retention keeps the pinned image"
    message = await fails_with(409, jp_fetch, "api", "ckpt", "images", image_id, method="DELETE")
    assert kernel_id in message
    images = await get_json(jp_fetch, "api", "ckpt", "images")
    assert {i["id"]: i["state"] for i in images}[image_id] == "restore-failed"

    # shutting the kernel down releases the image
    await jp_fetch("api", "kernels", kernel_id, method="DELETE")
    assert manager.records.all() == ({}, {})
    await jp_fetch("api", "ckpt", "images", image_id, method="DELETE")


async def test_variables_left_out_on_purpose_are_no_failure_after_the_restore(
    jp_fetch, connect, manager, events
):
    """What "Suspend anyway" does (exclude, then suspend): the restore writes nothing
    into the cell that woke the kernel about them, and its event names them, with the
    cell that made each, for the client to say so in plain words."""
    _, kernel_id = await start_session(jp_fetch)
    client = await connect(kernel_id)
    reply, _ = await client.execute("gen = (i for i in range(3))\nkept = 1")
    await client.execute("%load_ext jupyter_ckpt\n%ckpt exclude gen")
    image_id = (await manager.suspend(kernel_id))["id"]

    client = await connect(kernel_id)
    reply, outputs = await client.execute("print(kept, 'gen' in globals())")
    assert reply["status"] == "ok"
    assert text_of(outputs) == "1 False\n", "no block about the variable left out"
    restore = await next_event(events, "restore", status="success")
    assert restore["excluded"] == ["gen"]
    assert restore["cells"] == {"gen": 1}
    assert "gen" in restore["missing"]
    (image,) = [i for i in await get_json(jp_fetch, "api", "ckpt", "images") if i["id"] == image_id]
    assert (image["excluded"], image["lost"]) == (["gen"], [])


async def test_resuming_the_image_of_a_failed_restore_releases_it(jp_fetch, connect, manager):
    _, kernel_id = await start_session(jp_fetch)
    await (await connect(kernel_id)).execute("kept = 'yes'")
    image_id = (await manager.suspend(kernel_id))["id"]
    originals = alter_chunks(manager)
    await manager.restore(kernel_id)
    assert manager.kernel_manager.kernel_model(kernel_id)["ckpt"]["state"] == "restore-failed"
    for chunk, data in originals.items():  # the store is repaired
        chunk.write_bytes(data)

    r = await jp_fetch("api", "ckpt", "images", image_id, "resume", method="POST", body="{}")
    resumed = json.loads(r.body)
    assert resumed["restore"]["restored"] == ["kept"]
    # the state is back: the pin goes, and only the new kernel's running record names it
    records, broken = manager.records.all()
    assert [(k, r["state"]) for k, r in records.items()] == [(resumed["kernel"]["id"], "running")]
    assert not broken
    assert manager.kernel_manager.kernel_model(kernel_id)["ckpt"]["state"] == "running"


async def test_restore_on_connect(jp_fetch, connect, manager, events):
    _, kernel_id = await start_session(jp_fetch)
    await (await connect(kernel_id)).execute("answer = 42")
    await manager.suspend(kernel_id)
    manager.policy.restore_on = "connect"
    client = await connect(kernel_id)
    await poll(lambda: manager.kernel_manager.is_running(kernel_id), what="restore on connect")
    await poll(lambda: not manager.kernel_manager.suspended, what="the restore to finish")
    reply, outputs = await client.execute("answer")
    assert (reply["status"], text_of(outputs)) == ("ok", "42")
    restore = await next_event(events, "restore")
    assert (restore["status"], restore["trigger"], restore["missing"]) == ("success", "connect", [])


async def test_restart_and_interrupt_of_a_suspended_kernel(jp_fetch, connect, manager):
    _, kernel_id = await start_session(jp_fetch)
    await (await connect(kernel_id)).execute("old = 1")
    await manager.suspend(kernel_id)
    r = await jp_fetch("api", "kernels", kernel_id, "interrupt", method="POST", body="")
    assert r.code == 204 and manager.kernel_manager.is_suspended(kernel_id)
    r = await jp_fetch("api", "kernels", kernel_id, "restart", method="POST", body="")
    assert json.loads(r.body)["ckpt"]["state"] == "running"
    assert manager.records.all() == ({}, {})
    reply, _ = await (await connect(kernel_id)).execute("old")
    assert reply["status"] == "error" and reply["ename"] == "NameError", "a restart drops state"


async def test_a_client_message_during_suspend_keeps_the_kernel(jp_fetch, connect, manager):
    _, kernel_id = await start_session(jp_fetch)
    client = await connect(kernel_id)
    await client.execute("import numpy as np\nbig = np.ones(32 << 20)")
    suspending = asyncio.ensure_future(manager.suspend(kernel_id))
    await poll(lambda: manager.kernel_manager.ckpt_states.get(kernel_id) == "suspending")
    reply, outputs = await client.execute("print(big.shape)")
    assert (reply["status"], text_of(outputs)) == ("ok", "(33554432,)\n")
    with pytest.raises(SuspendFailed, match="used the kernel while it was being suspended"):
        await suspending
    assert manager.kernel_manager.is_running(kernel_id)
    assert manager.store.image_ids() == []


async def test_suspending_an_unchanged_kernel_keeps_its_image(jp_fetch, connect, manager):
    _, kernel_id = await start_session(jp_fetch)
    client = await connect(kernel_id)
    await client.execute("w = 3")
    first = (await manager.suspend(kernel_id))["id"]
    client = await connect(kernel_id)
    # completion while typing wakes the kernel but changes nothing in it
    request = {"code": "w", "cursor_pos": 1}
    reply = await client.reply_to(client.send("complete_request", request))
    assert reply["content"]["status"] == "ok"
    kernel = manager.kernel_manager.get_kernel(kernel_id)
    await poll(lambda: kernel.execution_state == "idle", what="the kernel to be idle")
    assert (await manager.suspend(kernel_id))["id"] == first
    assert [i["id"] for i in await get_json(jp_fetch, "api", "ckpt", "images")] == [first]
    # once the kernel changed, its next suspend writes a new image
    await (await connect(kernel_id)).execute("w = 4")
    second = (await manager.suspend(kernel_id))["id"]
    images = {i["id"] for i in await get_json(jp_fetch, "api", "ckpt", "images")}
    assert second != first and images == {first, second}


async def test_a_restoring_process_without_activity_markers_is_listed_from_its_record(
    jp_fetch, manager
):
    """A restore's new process enters the kernel manager a moment before jupyter_server
    gives it its activity markers: a listing in that moment must still answer."""
    _, kernel_id = await start_session(jp_fetch)
    await manager.suspend(kernel_id)
    km = manager.kernel_manager
    km._kernels[kernel_id] = km.kernel_manager_factory(kernel_name="python3")
    try:
        kernels = await get_json(jp_fetch, "api", "kernels")
        model = await get_json(jp_fetch, "api", "kernels", kernel_id)
    finally:
        del km._kernels[kernel_id]
    assert [(k["id"], k["ckpt"]["state"]) for k in kernels] == [(kernel_id, "suspended")]
    assert model["last_activity"] == km.suspended[kernel_id]["last_activity"]


async def test_a_busy_kernel_is_not_suspended_on_request(jp_fetch, connect, manager, tmp_path):
    """Busy means a cell is running: a suspend asked for meanwhile (REST, hub, shutdown of
    one kernel) is refused, and the cell finishes in the same process."""
    _, kernel_id = await start_session(jp_fetch)
    client = await connect(kernel_id)
    release = tmp_path / "release"
    cell = client.send(
        "execute_request",
        {
            "code": "import os, time\nt = time.monotonic()\n"
            f"while not os.path.exists({str(release)!r}) and time.monotonic() < t + 120:\n"
            "    time.sleep(0.02)\nx = 'finished'",
            "silent": False,
        },
    )
    kernel = manager.kernel_manager.get_kernel(kernel_id)
    await poll(lambda: kernel.execution_state == "busy", what="the cell to start")
    pid = manager.kernel_pid(kernel_id)
    with pytest.raises(SuspendFailed, match="busy"):
        await manager.suspend(kernel_id)
    release.touch()
    assert (await client.reply_to(cell))["content"]["status"] == "ok"
    _, outputs = await client.execute("print(x)")
    assert text_of(outputs) == "finished\n"
    assert manager.kernel_pid(kernel_id) == pid and manager.store.image_ids() == []


async def test_the_launch_environment_comes_back_with_the_kernel(connect, manager):
    """A kernel started with its own environment (a spawner's or an API caller's, not in
    the server's) gets it again when it is restored: it is not in the image, which keeps
    only what the user changed."""
    km = manager.kernel_manager
    kernel_id = await km.start_kernel(
        kernel_name="python3", env={**os.environ, "CKPT_LAUNCH_ONLY": "from-the-launcher"}
    )
    client = await connect(kernel_id)
    await client.execute("v = 5")
    await manager.suspend(kernel_id)
    client = await connect(kernel_id)
    _, outputs = await client.execute("import os; print(v, os.environ.get('CKPT_LAUNCH_ONLY'))")
    assert text_of(outputs) == "5 from-the-launcher\n"


async def test_the_widget_managers_probe_on_connect_does_not_wake_the_kernel(
    jp_fetch, connect, manager
):
    """ipywidgets 8 opens its control comm on every connect and asks for the widget
    states: answered as a kernel without widgets answers (the comm is closed), while a
    widget's own comm still wakes the kernel."""
    _, kernel_id = await start_session(jp_fetch)
    await (await connect(kernel_id)).execute("z = 11")
    await manager.suspend(kernel_id)
    client = await connect(kernel_id)
    control = {"comm_id": "c0ffee", "target_name": "jupyter.widget.control", "data": {}}
    opened = client.send("comm_open", control)
    client.send("comm_msg", {"comm_id": "c0ffee", "data": {"method": "request_states"}})
    info = await client.reply_to(client.send("kernel_info_request", {}))
    assert info["content"]["implementation"] == "ipython"
    closes = [
        m for m in client.received
        if m["header"]["msg_type"] == "comm_close" and m["parent_header"].get("msg_id") == opened
    ]  # fmt: skip
    assert [m["content"]["comm_id"] for m in closes] == ["c0ffee"]
    assert manager.kernel_manager.is_suspended(kernel_id) and manager.restore_count == 0

    client.send("comm_open", {"comm_id": "w1", "target_name": "jupyter.widget", "data": {}})
    await poll(lambda: manager.kernel_manager.is_running(kernel_id), what="the restore")
    _, outputs = await client.execute("print(z)")
    assert text_of(outputs) == "11\n"
