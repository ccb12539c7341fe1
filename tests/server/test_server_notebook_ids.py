"""An image names its notebook by the file's id (jupyter_server_fileid), which follows
renames and moves; the image list gives the file's current path, and a new notebook
that takes an old name is another notebook."""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import SERVER_CONFIG
from server_helpers import get_json, start_session


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    config = json.loads(json.dumps(SERVER_CONFIG))
    config["ServerApp"]["jpserver_extensions"]["jupyter_server_fileid"] = True
    return config


async def save(jp_fetch: Any, kernel_id: str, name: str) -> str:
    r = await jp_fetch(
        "api",
        "ckpt",
        "kernels",
        kernel_id,
        "checkpoint",
        method="POST",
        body=json.dumps({"name": name}),
    )
    return json.loads(r.body)["id"]


async def listed(jp_fetch: Any, image_id: str) -> dict[str, Any]:
    return next(i for i in await get_json(jp_fetch, "api", "ckpt", "images") if i["id"] == image_id)


async def new_notebook(jp_fetch: Any) -> str:
    r = await jp_fetch("api", "contents", method="POST", body=json.dumps({"type": "notebook"}))
    return json.loads(r.body)["path"]


async def test_images_follow_their_notebook_through_a_rename(jp_fetch):
    path = await new_notebook(jp_fetch)
    assert path == "Untitled.ipynb"
    _, kernel_id = await start_session(jp_fetch, path)
    before = await save(jp_fetch, kernel_id, "before-rename")
    first = await listed(jp_fetch, before)
    assert first["notebook_id"], first
    assert first["notebook_current_path"] == "Untitled.ipynb"

    # renamed as JupyterLab does: the file, then its session
    await jp_fetch("api", "contents", path, method="PATCH", body=json.dumps({"path": "A.ipynb"}))
    [session] = await get_json(jp_fetch, "api", "sessions")
    await jp_fetch(
        "api", "sessions", session["id"], method="PATCH",
        body=json.dumps({"path": "A.ipynb", "name": "A.ipynb"}),
    )  # fmt: skip
    # the kernel was started as Untitled.ipynb's: its next image names the same file
    after = await save(jp_fetch, kernel_id, "after-rename")
    for image_id in (before, after):
        image = await listed(jp_fetch, image_id)
        assert image["notebook_id"] == first["notebook_id"]
        assert image["notebook_current_path"] == "A.ipynb"
    detail = await get_json(jp_fetch, "api", "ckpt", "images", before)
    assert detail["notebook_current_path"] == "A.ipynb"

    # a new notebook takes the old name: a file of its own, not the renamed one's
    assert await new_notebook(jp_fetch) == "Untitled.ipynb"
    _, other_kernel = await start_session(jp_fetch, "Untitled.ipynb")
    other = await listed(jp_fetch, await save(jp_fetch, other_kernel, "new-untitled"))
    assert other["notebook_id"] not in (None, first["notebook_id"])
    assert other["notebook_current_path"] == "Untitled.ipynb"

    # the renamed notebook deleted: its images say so (no current path)
    await jp_fetch("api", "contents", "A.ipynb", method="DELETE")
    gone = await listed(jp_fetch, before)
    assert gone["notebook_id"] == first["notebook_id"]
    assert gone["notebook_current_path"] is None
