"""Progress events while a real kernel writes and reads an image of about 200 MB: bytes
done of the total, from the kernel's I/O threads, before the action's own event."""

from __future__ import annotations

import json
import os
import stat
from typing import Any

import pytest
from conftest import SERVER_CONFIG
from server_helpers import next_event, start_session

STATE = "import numpy as np\nstate = [np.random.default_rng(i).random(5_000_000) for i in range(5)]"
STATE_BYTES = 5 * 5_000_000 * 8


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    config = json.loads(json.dumps(SERVER_CONFIG))
    # polled more often than by default, so that even a fast disk shows a step between;
    # arrays read, not mapped (a mapped restore reads them after its first result)
    config["CkptManager"] = {"progress_interval": 0.01}
    config["ImageStore"] = {"map_buffers": False}
    return config


def progress_of(events: list[dict[str, Any]], phase: str, kernel_id: str) -> list[tuple[int, int]]:
    return [
        (e["bytes_done"], e["bytes_total"])
        for e in events
        if e["action"] == "progress" and e["phase"] == phase and e["kernel_id"] == kernel_id
    ]


def assert_progress(steps: list[tuple[int, int]], image_bytes: int) -> None:
    done = [d for d, _ in steps]
    assert done == sorted(done), f"bytes done never go back: {steps}"
    assert len(set(done)) >= 2, f"progress came while the image moved, not only at its end: {steps}"
    assert all(d <= t for d, t in steps)
    assert steps[-1] == (image_bytes, image_bytes)


async def test_suspend_and_restore_report_bytes_done_of_the_total(
    jp_fetch, connect, manager, events
):
    _, kernel_id = await start_session(jp_fetch)
    reply, _ = await (await connect(kernel_id)).execute(STATE)
    assert reply["status"] == "ok"

    await manager.suspend(kernel_id)
    suspend = await next_event(events, "suspend", kernel_id=kernel_id)
    assert suspend["status"] == "success" and suspend["bytes"] >= STATE_BYTES
    written = progress_of(events, "suspend", kernel_id)
    assert_progress(written, suspend["bytes"])
    assert events.index(suspend) > max(i for i, e in enumerate(events) if e["action"] == "progress")

    report = await manager.restore(kernel_id)
    assert report["error"] is None and "state" in report["restored"]
    restore = await next_event(events, "restore", kernel_id=kernel_id)
    assert restore["status"] == "success"
    assert_progress(progress_of(events, "restore", kernel_id), suspend["bytes"])

    # the kernel's files are private to the server's user, and gone once read
    assert stat.S_IMODE(os.stat(manager.progress_dir).st_mode) == 0o700
    assert os.listdir(manager.progress_dir) == []


async def test_without_a_progress_directory_a_checkpoint_sends_no_progress(
    jp_fetch, connect, manager, events, tmp_path
):
    """Progress is a courtesy: where its files cannot be kept, saves go on without it."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    manager.progress.directory = str(blocker / "progress")
    _, kernel_id = await start_session(jp_fetch)
    reply, _ = await (await connect(kernel_id)).execute("x = list(range(1000))")
    assert reply["status"] == "ok"
    summary = await manager.checkpoint(kernel_id)
    assert "x" in summary["saved"]
    await next_event(events, "checkpoint", kernel_id=kernel_id, status="success")
    assert [e for e in events if e["action"] == "progress"] == []
