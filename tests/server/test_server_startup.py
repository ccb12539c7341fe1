"""Kernel, session and ckpt requests that arrive before the records of suspended kernels
are loaded wait for them (the server listens before its extensions start)."""

from __future__ import annotations

import asyncio

from jupyter_ckpt_server import startup
from server_helpers import poll


async def test_requests_wait_until_the_records_are_loaded(jp_serverapp, jp_fetch):
    loaded = jp_serverapp.web_app.settings[startup.SETTING] = asyncio.Event()
    requests = [
        asyncio.ensure_future(jp_fetch(*path))
        for path in (("api", "sessions"), ("api", "kernels"), ("api", "ckpt", "status"))
    ]
    # answered at once without the gate; held while the records load
    await asyncio.wait(requests, timeout=1)
    assert not any(r.done() for r in requests)
    # other routes are not held
    assert (await jp_fetch("api", "status")).code == 200
    loaded.set()
    await poll(lambda: all(r.done() for r in requests), what="the held requests")
    assert [r.result().code for r in requests] == [200, 200, 200]
