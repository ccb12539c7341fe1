"""Saves asked for through the server: the server's memory setting reaches the kernels,
a save that fails inside the kernel gives the client its cause while the kernel keeps
its state and nothing of the failed save stays alive in it (an exception IPython keeps in
``sys.last_value`` holds every frame of the save, and with them the copies it made), and
a save that finds the kernel's newest state unchanged writes no image, whatever asked
for it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import SERVER_CONFIG
from server_helpers import at_step, fails_with, get_json, poll, start_session, text_of
from tornado.httpclient import HTTPClientError

BUFFER = 32 << 20


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    config = json.loads(json.dumps(SERVER_CONFIG))
    config["ImageStore"] = {"buffer_bytes": BUFFER}
    config["SuspendPolicy"]["autosave_idle"] = 3600  # the tests start autosaves themselves
    return config


async def test_kernels_use_the_servers_buffer_setting(jp_fetch, connect):
    _, kernel_id = await start_session(jp_fetch)
    client = await connect(kernel_id)
    _, outputs = await client.execute(
        "from jupyter_ckpt.kernel import session\nprint(session().store.buffer_bytes)"
    )
    assert text_of(outputs) == f"{BUFFER}\n"


async def test_failed_checkpoint_is_a_result_not_a_kept_exception(jp_fetch, connect, manager):
    _, kernel_id = await start_session(jp_fetch)
    client = await connect(kernel_id)
    await client.execute("x = list(range(100_000))")
    chunks = Path(manager.store.backend.url) / "chunks"
    chunks.parent.mkdir(parents=True, exist_ok=True)
    chunks.write_text("a file where the chunks directory belongs")  # every write fails

    with pytest.raises(HTTPClientError) as failed:
        await jp_fetch("api", "ckpt", "kernels", kernel_id, "checkpoint", method="POST", body="")
    assert failed.value.code == 503  # the store refuses the save: the kernel runs on
    message = json.loads(failed.value.response.body)["message"]
    assert f"{chunks}: it is not a directory; move it away" in message, message

    reply, outputs = await client.execute("import sys\nprint(len(x), hasattr(sys, 'last_value'))")
    assert reply["status"] == "ok"
    assert text_of(outputs) == "100000 False\n"


async def test_a_save_of_an_unchanged_state_writes_no_image(
    jp_fetch, connect, manager, jp_serverapp
):
    """Each trigger (Save Now, autosave, idle suspend, shutdown suspend) returns the
    kernel's newest image when nothing changed since; the listing labels every image with
    the trigger that wrote it and names the kernel that runs from it."""
    autosaver = jp_serverapp.web_app.settings["jupyter_ckpt_autosaver"]
    lifecycles = manager.lifecycles
    _, kernel_id = await start_session(jp_fetch)
    client = await connect(kernel_id)

    async def autosave() -> None:
        await poll(lambda: lifecycles[kernel_id].executed, what="the cell to be seen")
        # started once no other action (a record refresh) holds the kernel
        while (task := autosaver.start(kernel_id)) is None:
            await asyncio.sleep(0.05)
        await task

    async def listing() -> dict[str, dict[str, Any]]:
        return {i["id"]: i for i in await get_json(jp_fetch, "api", "ckpt", "images")}

    await client.execute("w = 3")
    first = await manager.checkpoint(kernel_id)
    assert (first["unchanged"], first["trigger"]) == (False, "manual")
    # a cell that changes nothing, then an autosave and a Save Now: the same image
    await client.execute("print(w)")
    await autosave()
    again = await manager.checkpoint(kernel_id)
    assert (again["id"], again["unchanged"], again["written"]) == (first["id"], True, 0)
    assert manager.store.image_ids() == [first["id"]]
    assert manager.records.get(kernel_id)["image_id"] == first["id"]
    # a name asks for an image of its own, even of the same state
    named = await manager.checkpoint(kernel_id, "kept")
    assert named["id"] != first["id"] and not named["unchanged"]

    await client.execute("w = 4")
    await autosave()
    autosaved = manager.records.get(kernel_id)["image_id"]
    assert (await manager.checkpoint(kernel_id))["id"] == autosaved
    # the next autosave replaces its own images only, not one a Save Now returned
    await client.execute("w = 5")
    await autosave()
    newest = manager.records.get(kernel_id)["image_id"]
    images = await listing()
    assert set(images) == {first["id"], named["id"], autosaved, newest}
    assert [images[i]["trigger"] for i in (first["id"], named["id"], autosaved, newest)] == [
        "manual",
        "manual",
        "autosave",
        "autosave",
    ]
    assert images[newest]["in_use_by"] == [
        {
            "kernel_id": kernel_id,
            "sessions": [{"name": "work.ipynb", "path": "work.ipynb", "type": "notebook"}],
        }
    ]
    assert [i["id"] for i in images.values() if i["in_use_by"]] == [newest]

    # an idle suspend of the unchanged kernel: suspended on its newest image
    assert (await manager.suspend(kernel_id, trigger="idle"))["id"] == newest
    assert manager.records.get(kernel_id)["image_id"] == newest
    images = await listing()
    assert len(images) == 4 and images[newest]["state"] == "suspended"
    assert not images[newest]["in_use_by"]
    # restored without a change, it runs from that image; a shutdown suspend of a
    # changed state writes one labelled so
    client = await connect(kernel_id)
    await client.reply_to(client.send("complete_request", {"code": "w", "cursor_pos": 1}))
    await poll(lambda: lifecycles.running_from().get(newest) == [kernel_id])
    kernel = manager.kernel_manager.get_kernel(kernel_id)
    await poll(lambda: kernel.execution_state == "idle", what="the kernel to be idle")
    assert (await manager.suspend(kernel_id, trigger="shutdown"))["id"] == newest
    await (await connect(kernel_id)).execute("w = 6")
    last = await manager.suspend(kernel_id, trigger="shutdown")
    images = await listing()
    assert last["id"] not in (newest, first["id"]) and len(images) == 5
    assert (images[last["id"]]["trigger"], images[last["id"]]["state"]) == (
        "shutdown",
        "suspended",
    )


async def test_a_store_gone_during_the_verify_answers_503(jp_fetch, connect, manager):
    """The store's directory stops being one while the server verifies a checkpoint: the
    answer is a 503 that says so (not a 500), and the image is kept for when the store
    is back."""
    _, kernel_id = await start_session(jp_fetch)
    await (await connect(kernel_id)).execute("data = list(range(1000))")
    root = Path(manager.store.backend.root)
    away = root.with_name(f"{root.name}.away")

    async def replace_the_store() -> None:
        root.rename(away)
        root.write_text("no longer the store")

    at_step(manager, "verify", replace_the_store)
    checkpoint = ("api", "ckpt", "kernels", kernel_id, "checkpoint")
    message = await fails_with(503, jp_fetch, *checkpoint, method="POST", body="")
    assert "is not a directory any more" in message, message
    root.unlink()
    away.rename(root)
    assert len(manager.store.image_ids()) == 1


async def test_the_servers_save_reports_a_variable_that_would_not_load(jp_fetch, connect):
    """Save Now (as a suspend and the save at a stop) loads what it wrote back first: a
    variable that pickles but would not load is reported not saved, not saved."""
    _, kernel_id = await start_session(jp_fetch)
    client = await connect(kernel_id)
    reply, _ = await client.execute(
        "class Fragile:\n"
        "    def __setstate__(self, state):\n"
        "        raise RuntimeError('refusing to come back')\n"
        "fragile = Fragile()\n"
        "fragile.v = 1\n"
        "kept = 2"
    )
    assert reply["status"] == "ok", reply
    response = await jp_fetch(
        "api", "ckpt", "kernels", kernel_id, "checkpoint", method="POST", body=""
    )
    summary = json.loads(response.body)
    assert "kept" in summary["saved"], summary
    assert "would not load" in summary["lost"].get("fragile", ""), summary


async def test_the_first_save_after_a_restore_keeps_the_restored_image(jp_fetch, connect, manager):
    """A kernel restored from an image (woken by a cell that changes nothing, or resumed
    into its notebook) holds that image's state: its next save writes no new image."""
    _, kernel_id = await start_session(jp_fetch)
    await (await connect(kernel_id)).execute(
        "w = 3\nimport json\nimport numpy as np\na = np.arange(10**6)\nimport pandas as pd\n"
        "df = pd.DataFrame({'x': range(1000)})\ndef f(x):\n    return x + w\n"
    )
    suspended = (await manager.suspend(kernel_id, trigger="idle"))["id"]
    reply, _ = await (await connect(kernel_id)).execute("print(w)")
    assert reply["status"] == "ok"
    again = await manager.checkpoint(kernel_id)
    assert (again["id"], again["unchanged"]) == (suspended, True)

    r = await jp_fetch(
        "api", "ckpt", "images", suspended, "resume", method="POST",
        body=json.dumps({"path": "work.ipynb"}),
    )  # fmt: skip
    resumed = json.loads(r.body)["kernel"]["id"]
    reply, _ = await (await connect(resumed)).execute("print(w)")
    assert reply["status"] == "ok"
    after = await manager.checkpoint(resumed)
    assert (after["id"], after["unchanged"]) == (suspended, True)
