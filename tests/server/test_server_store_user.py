"""The server's kernels write into the same user's part of the store as the server reads:
with ``ImageStore.user`` configured (not the login name), a suspend's image lands under
``users/<user>/`` and the kernel comes back from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import SERVER_CONFIG
from server_helpers import start_session, text_of

USER = "hub-user"


@pytest.fixture
def jp_server_config(tmp_path: Path) -> dict[str, Any]:
    return {**SERVER_CONFIG, "ImageStore": {"url": str(tmp_path / "shared"), "user": USER}}


async def test_kernels_use_the_servers_store_user(jp_fetch, connect, manager, tmp_path):
    _, kernel_id = await start_session(jp_fetch)
    client = await connect(kernel_id)
    await client.execute("z = 41")
    image_id = (await manager.suspend(kernel_id))["id"]
    prefix = tmp_path / "shared" / "users" / USER
    assert (prefix / "images" / image_id / "manifest.json").is_file()
    assert (prefix / "kernels" / f"{kernel_id}.json").is_file()

    client = await connect(kernel_id)
    reply, outputs = await client.execute("z + 1")
    assert (reply["status"], text_of(outputs)) == ("ok", "42")
