"""Saves asked for through the server: the server's memory setting reaches the kernels,
and a save that fails inside the kernel gives the client its cause while the kernel keeps
its state and nothing of the failed save stays alive in it (an exception IPython keeps in
``sys.last_value`` holds every frame of the save, and with them the copies it made)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import SERVER_CONFIG
from server_helpers import start_session, text_of
from tornado.httpclient import HTTPClientError

BUFFER = 32 << 20


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    config = json.loads(json.dumps(SERVER_CONFIG))
    config["ImageStore"] = {"buffer_bytes": BUFFER}
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
    assert failed.value.code == 409
    message = json.loads(failed.value.response.body)["message"]
    assert f"{chunks}: it is not a directory; move it away" in message, message

    reply, outputs = await client.execute("import sys\nprint(len(x), hasattr(sys, 'last_value'))")
    assert reply["status"] == "ok"
    assert text_of(outputs) == "100000 False\n"
