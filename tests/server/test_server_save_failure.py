"""A save that fails inside the kernel, asked for through the server: the client gets the
cause, the kernel keeps its state, and nothing of the failed save stays alive in it (an
exception IPython keeps in ``sys.last_value`` holds every frame of the save, and with
them the copies it made)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from server_helpers import start_session, text_of
from tornado.httpclient import HTTPClientError


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
    assert "NotADirectoryError" in json.loads(failed.value.response.body)["message"]

    reply, outputs = await client.execute("import sys\nprint(len(x), hasattr(sys, 'last_value'))")
    assert reply["status"] == "ok"
    assert text_of(outputs) == "100000 False\n"
