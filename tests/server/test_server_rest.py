"""The /api/ckpt REST API on a real server (DESIGN section 5)."""

from __future__ import annotations

import json

from jupyter_ckpt_server.storehealth import StoreHealth
from server_helpers import action_events, fails_with, get_json, poll, start_session, text_of


async def test_checkpoint_list_show_delete(jp_fetch, connect, events):
    _, kernel_id = await start_session(jp_fetch)
    await (await connect(kernel_id)).execute("a = [1, 2, 3]\ngen = (i for i in a)")
    r = await jp_fetch(
        "api", "ckpt", "kernels", kernel_id, "checkpoint", method="POST", body='{"name": "v1"}'
    )
    saved = json.loads(r.body)
    assert r.code == 201 and saved["name"] == "v1" and "gen" in saved["lost"]

    images = await get_json(jp_fetch, "api", "ckpt", "images")
    assert [(i["id"], i["state"], i["variables_count"]) for i in images] == [
        (saved["id"], "saved", 2)
    ]
    assert images[0]["compatibility"]["verdict"] == "compatible"
    image = await get_json(jp_fetch, "api", "ckpt", "images", "v1")
    assert {v["name"]: v["status"] for v in image["variables"]} == {"a": "saved", "gen": "lost"}

    r = await jp_fetch("api", "ckpt", "images", saved["id"], method="DELETE")
    assert r.code == 204
    assert await get_json(jp_fetch, "api", "ckpt", "images") == []
    await poll(lambda: len(action_events(events)) == 2, what="the events")
    outcomes = action_events(events)
    assert [(e["action"], e["status"], e["image_id"]) for e in outcomes] == [
        ("checkpoint", "success", saved["id"]),
        ("delete", "success", saved["id"]),
    ]


async def test_clear_errors_for_unknown_ids_and_bad_input(jp_fetch):
    unknown = "00000000-0000-0000-0000-000000000000"
    for action in ("checkpoint", "suspend"):
        message = await fails_with(
            404, jp_fetch, "api", "ckpt", "kernels", unknown, action, method="POST", body=""
        )
        assert unknown in message
    assert "no image" in await fails_with(404, jp_fetch, "api", "ckpt", "images", "nothing")
    await fails_with(404, jp_fetch, "api", "ckpt", "images", "nothing", method="DELETE")
    await fails_with(
        400, jp_fetch, "api", "ckpt", "images", "x", "resume", method="POST", body="[1]"
    )
    _, kernel_id = await start_session(jp_fetch)
    for bad in ('{"name": "../etc"}', '{"name": 7}', "{not json"):
        await fails_with(
            400,
            jp_fetch,
            "api",
            "ckpt",
            "kernels",
            kernel_id,
            "checkpoint",
            method="POST",
            body=bad,
        )
    await fails_with(
        400, jp_fetch, "api", "ckpt", "images", "x", "resume", method="POST", body='{"path": 3}'
    )


async def test_requests_without_credentials_are_refused(jp_fetch):
    for parts in (("api", "ckpt", "status"), ("api", "ckpt", "images")):
        await fails_with(403, jp_fetch, *parts, headers={"Authorization": "token wrong"})


async def test_an_image_a_suspended_kernel_needs_cannot_be_deleted(jp_fetch, connect, manager):
    _, kernel_id = await start_session(jp_fetch)
    await (await connect(kernel_id)).execute("x = 1")
    r = await jp_fetch("api", "ckpt", "suspend-all", method="POST", body="")
    assert json.loads(r.body) == {
        "suspended": [kernel_id],
        "failed": {},
        "nothing_to_save": {},
        "excluded": [],
    }
    image_id = manager.records.get(kernel_id)["image_id"]
    images = await get_json(jp_fetch, "api", "ckpt", "images")
    assert [(i["id"], i["state"], i["kernel_id"]) for i in images] == [
        (image_id, "suspended", kernel_id)
    ]
    message = await fails_with(409, jp_fetch, "api", "ckpt", "images", image_id, method="DELETE")
    assert kernel_id in message
    status = await get_json(jp_fetch, "api", "ckpt", "status")
    assert status["kernels"][0]["state"] == "suspended"
    assert status["policy"]["restore_on"] == "first-message" and "gpus" in status["node"]
    # shutting the suspended kernel down for good releases its image
    await jp_fetch("api", "kernels", kernel_id, method="DELETE")
    assert await get_json(jp_fetch, "api", "kernels") == []
    await jp_fetch("api", "ckpt", "images", image_id, method="DELETE")


async def test_resume_starts_a_new_kernel_with_a_session(jp_fetch, connect, events):
    _, kernel_id = await start_session(jp_fetch)
    await (await connect(kernel_id)).execute("total = 99")
    await jp_fetch(
        "api", "ckpt", "kernels", kernel_id, "checkpoint", method="POST", body='{"name": "t"}'
    )
    body = json.dumps({"path": "copy.ipynb"})
    r = await jp_fetch("api", "ckpt", "images", "t", "resume", method="POST", body=body)
    resumed = json.loads(r.body)
    assert resumed["restore"]["restored"] == ["total"]
    new_id = resumed["kernel"]["id"]
    assert new_id != kernel_id and resumed["session"]["path"] == "copy.ipynb"
    reply, outputs = await (await connect(new_id)).execute("total")
    assert (reply["status"], text_of(outputs)) == ("ok", "99")
    resume = [e for e in events if e["action"] == "resume"]
    assert [(e["status"], e["kernel_id"]) for e in resume] == [("success", new_id)]
    # the resumed kernel's own images name its notebook
    r = await jp_fetch("api", "ckpt", "kernels", new_id, "checkpoint", method="POST", body="{}")
    later = await get_json(jp_fetch, "api", "ckpt", "images", json.loads(r.body)["id"])
    assert later["notebook_path"].endswith("copy.ipynb")


async def test_resume_into_a_notebook_with_a_kernel_replaces_that_kernel(
    jp_fetch, connect, manager
):
    session_id, kernel_id = await start_session(jp_fetch, "mine.ipynb")
    client = await connect(kernel_id)
    await client.execute("v = 1")
    await jp_fetch(
        "api", "ckpt", "kernels", kernel_id, "checkpoint", method="POST", body='{"name": "one"}'
    )
    await client.execute("v = 2")
    await manager.suspend(kernel_id)

    body = json.dumps({"path": "mine.ipynb"})
    r = await jp_fetch("api", "ckpt", "images", "one", "resume", method="POST", body=body)
    new_id = json.loads(r.body)["kernel"]["id"]
    # one session, the notebook's own, now on the restored kernel; the old one is gone
    sessions = await get_json(jp_fetch, "api", "sessions")
    assert [(s["id"], s["kernel"]["id"]) for s in sessions] == [(session_id, new_id)]
    assert [k["id"] for k in await get_json(jp_fetch, "api", "kernels")] == [new_id]
    # the suspended kernel's record went with it; the new kernel's names the image it resumed
    records = manager.records.all()[0]
    assert [(k, r["state"]) for k, r in records.items()] == [(new_id, "running")]
    _, outputs = await (await connect(new_id)).execute("v")
    assert text_of(outputs) == "1"


async def test_an_image_a_running_kernels_autosave_names_is_listed_as_such(
    jp_fetch, connect, manager
):
    _, kernel_id = await start_session(jp_fetch)
    await (await connect(kernel_id)).execute("x = 1")
    r = await jp_fetch(
        "api", "ckpt", "kernels", kernel_id, "checkpoint", method="POST", body='{"name": "a"}'
    )
    image_id = json.loads(r.body)["id"]
    # as the autosaver leaves it: the running kernel's crash-recovery record names the image
    manager.records.put({"kernel_id": kernel_id, "image_id": image_id, "state": "running"})
    images = await get_json(jp_fetch, "api", "ckpt", "images")
    assert [(i["id"], i["state"], i["kernel_id"]) for i in images] == [
        (image_id, "autosave", kernel_id)
    ]
    assert images[0]["variable_names"] == ["x"]
    image = await get_json(jp_fetch, "api", "ckpt", "images", image_id)
    assert image["state"] == "autosave"
    await fails_with(409, jp_fetch, "api", "ckpt", "images", image_id, method="DELETE")
    # once the kernel and its record are gone, the image is only saved, and deletable
    manager.records.delete(kernel_id)
    images = await get_json(jp_fetch, "api", "ckpt", "images")
    assert [i["state"] for i in images] == ["saved"]
    await jp_fetch("api", "ckpt", "images", image_id, method="DELETE")


async def test_the_status_says_how_much_of_its_room_the_store_uses(
    jp_fetch, jp_serverapp, connect, manager
):
    # what the extension sets once the server runs its event loop
    service = jp_serverapp.web_app.settings["jupyter_ckpt_service"]
    service.store_health = StoreHealth(manager.store.backend.url, manager.log)

    async def usage() -> dict:
        return (await get_json(jp_fetch, "api", "ckpt", "status"))["store"]["usage"]

    before = await usage()
    assert (before["images"], before["bytes"], before["quota_bytes"]) == (0, 0, None)
    assert before["disk_bytes"] > before["disk_free_bytes"] > 0, before
    _, kernel_id = await start_session(jp_fetch)
    await (await connect(kernel_id)).execute("data = bytes(300_000)")
    manager.store.quota_bytes = 10_000_000
    saved = await manager.checkpoint(kernel_id)

    async def counted() -> dict | None:
        found = await usage()
        return found if found["images"] else None

    # the save's event has the store read again: well before MAX_AGE
    after = await poll(counted, timeout=10, what="the save in the store's use")
    assert after["quota_bytes"] == 10_000_000, after
    assert 300_000 <= after["bytes"] <= saved["bytes"] + 100_000, (after, saved)
