"""``POST /api/ckpt/images/{id}/resume`` creates a kernel and a session: it is authorized
for both, and keeps the session's notebook inside the server's root directory."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import SERVER_CONFIG
from server_helpers import DenyingAuthorizer, fails_with, get_json, start_session


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    config = json.loads(json.dumps(SERVER_CONFIG))
    config["ServerApp"]["authorizer_class"] = "server_helpers.DenyingAuthorizer"
    return config


@pytest.fixture
def denied() -> Iterator[set[str]]:
    yield DenyingAuthorizer.denied
    DenyingAuthorizer.denied.clear()


async def saved_image(jp_fetch: Any, connect: Any) -> str:
    _, kernel_id = await start_session(jp_fetch)
    await (await connect(kernel_id)).execute("total = 99")
    r = await jp_fetch(
        "api", "ckpt", "kernels", kernel_id, "checkpoint", method="POST", body='{"name": "t"}'
    )
    return json.loads(r.body)["id"]


async def resume(jp_fetch: Any, status: int, image: str, path: str) -> str:
    body = json.dumps({"path": path})
    return await fails_with(
        status, jp_fetch, "api", "ckpt", "images", image, "resume", method="POST", body=body
    )


async def test_resume_needs_permission_to_create_sessions(jp_fetch, connect, denied):
    image = await saved_image(jp_fetch, connect)
    kernels = await get_json(jp_fetch, "api", "kernels")
    denied.add("sessions")
    await resume(jp_fetch, 403, image, "copy.ipynb")
    denied.clear()
    assert await get_json(jp_fetch, "api", "kernels") == kernels, "no kernel was started"
    r = await jp_fetch(
        "api", "ckpt", "images", image, "resume", method="POST", body='{"path": "c.ipynb"}'
    )
    assert r.code == 201


async def test_resume_refuses_a_path_outside_the_root(jp_fetch, jp_root_dir, tmp_path, connect):
    image = await saved_image(jp_fetch, connect)
    kernels = await get_json(jp_fetch, "api", "kernels")
    (jp_root_dir / "link").symlink_to(tmp_path)
    for path in ("../outside.ipynb", "sub/../../outside.ipynb", "link/outside.ipynb"):
        message = await resume(jp_fetch, 400, image, path)
        assert "outside the server's root directory" in message and path in message
    assert await get_json(jp_fetch, "api", "kernels") == kernels, "no kernel was started"
