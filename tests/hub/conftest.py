"""A real JupyterHub per test; async tests run as pytest-jupyter runs them, and drive
notebook kernels with the server tests' websocket client."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))

from harness import MotoServer
from hub_helpers import Hub
from pytest_jupyter.jupyter_core import (  # noqa: F401
    jp_asyncio_loop,
    pytest_pycollect_makeitem,
    pytest_pyfunc_call,
)

# The culler's idle timeout and round interval (seconds): short, but long enough that a
# user's next step on a loaded machine comes well within the timeout.
CULL_TIMEOUT = 15
CULL_EVERY = 2


@pytest.fixture
def hub(moto: MotoServer, tmp_path: Path) -> Iterator[Hub]:
    """A hub (not started yet) whose servers share a store on the S3 server."""
    hub = Hub(tmp_path, moto.url, CULL_TIMEOUT, CULL_EVERY)
    yield hub
    hub.stop()
