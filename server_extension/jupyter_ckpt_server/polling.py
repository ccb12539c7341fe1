"""Waiting for what no event announces: jupyter_server keeps its view of a kernel (its
``execution_state``, ``last_activity``, a connection's streams) in plain attributes and
signals no change, so the server's waits on them poll. (lifecycle/start.py has its own.)"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def poll(condition: Callable[[], bool], timeout: float, interval: float = 0.01) -> bool:
    """Wait until ``condition()`` holds, checking every ``interval`` seconds, for at most
    ``timeout`` seconds; whether it holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(interval)
    return True
