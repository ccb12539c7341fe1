"""The idle monitor on real kernels: what gets suspended, what keeps running and why."""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from server_helpers import FakeNvml, next_event, poll

from jupyter_ckpt.gpu import GpuProbe


@pytest.fixture
def start_kernel(jp_fetch: Any, connect: Any) -> Callable[..., Awaitable[str]]:
    """Start a kernel and run one cell in it, as a user would, then disconnect."""

    async def start(name: str = "python3") -> str:
        r = await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": name}))
        kernel_id = json.loads(r.body)["id"]
        client = await connect(kernel_id)
        await client.execute("pass")
        client.close()
        return kernel_id

    return start


async def idle_for_a_moment(manager: Any, kernel_id: str) -> None:
    """Wait until the kernel is idle past a tiny idle_timeout."""
    manager.policy.idle_timeout = 0.2
    kernel = manager.kernel_manager.get_kernel(kernel_id)

    def idle_long_enough() -> bool:
        idle = datetime.now(timezone.utc) - kernel.last_activity
        return kernel.execution_state == "idle" and idle.total_seconds() > 0.3

    await poll(idle_long_enough, what="the kernel to be idle")


async def status_of(jp_fetch: Any, kernel_id: str) -> dict[str, Any]:
    status = json.loads((await jp_fetch("api", "ckpt", "status")).body)
    return next(k for k in status["kernels"] if k["kernel_id"] == kernel_id)


async def test_the_monitor_loop_suspends_an_idle_kernel(
    jp_fetch, start_kernel, manager, monitor, events
):
    kernel_id = await start_kernel()
    await monitor.stop()
    manager.policy.check_interval = 0.2
    await idle_for_a_moment(manager, kernel_id)
    monitor.start()
    await poll(lambda: manager.kernel_manager.is_suspended(kernel_id), what="suspension")
    event = await next_event(events, "suspend")
    assert (event["status"], event["trigger"], event["kernel_id"]) == ("success", "idle", kernel_id)
    assert event["image_id"] == manager.records.get(kernel_id)["image_id"]
    assert (await status_of(jp_fetch, kernel_id))["state"] == "suspended"


async def test_busy_kernels_are_never_suspended(
    jp_fetch, start_kernel, connect, manager, monitor, tmp_path
):
    kernel_id = await start_kernel()
    client = await connect(kernel_id)
    await idle_for_a_moment(manager, kernel_id)
    # the cell runs until the test lets it end, however slow the machine
    release = tmp_path / "release"
    code = f"import os, time\nwhile not os.path.exists({str(release)!r}): time.sleep(0.01)"
    cell = client.send("execute_request", {"code": code, "silent": False})
    kernel = manager.kernel_manager.get_kernel(kernel_id)
    await poll(lambda: kernel.execution_state == "busy", what="the kernel to be busy")
    assert await monitor.tick() == []
    assert "the kernel is busy" in (await status_of(jp_fetch, kernel_id))["blocked_by"]
    with pytest.raises(Exception, match="busy"):
        await manager.suspend(kernel_id)
    assert not manager.kernel_manager.is_suspended(kernel_id)
    release.touch()
    assert (await client.reply_to(cell))["content"]["status"] == "ok"


async def test_unsaveable_variables_with_keep_keep_the_kernel(
    jp_fetch, start_kernel, connect, manager, monitor, events
):
    kernel_id = await start_kernel()
    client = await connect(kernel_id)
    await client.execute("gen = (i for i in range(3))\nkept = 1")
    await idle_for_a_moment(manager, kernel_id)
    assert await monitor.tick() == []
    assert manager.kernel_manager.is_running(kernel_id)
    failure = (await status_of(jp_fetch, kernel_id))["last_failure"]
    assert "on_unsaveable=keep" in failure["reason"] and "gen (" in failure["reason"]
    await next_event(events, "suspend", status="error")
    assert [e["status"] for e in events if e["action"] == "suspend"] == ["error"]
    assert manager.store.image_ids() == [], "the partial image is not left behind"

    manager.policy.on_unsaveable = "suspend"
    await idle_for_a_moment(manager, kernel_id)
    assert await monitor.tick() == [kernel_id]


async def test_a_failure_on_unsaveable_variables_ends_when_they_are_deleted(
    jp_fetch, start_kernel, connect, manager, monitor
):
    kernel_id = await start_kernel()
    client = await connect(kernel_id)
    await client.execute(
        "gen = (i for i in range(3))\nimport tempfile\nfh = tempfile.TemporaryFile('w')\nkept = 1"
    )
    await idle_for_a_moment(manager, kernel_id)
    assert await monitor.tick() == []

    async def failure() -> dict[str, Any] | None:
        r = await jp_fetch("api", "ckpt", "status", params={"kernel_id": kernel_id})
        (kernel,) = json.loads(r.body)["kernels"]
        return kernel["last_failure"]

    assert set((await failure())["lost"]) == {"fh", "gen"}
    # rebinding and excluding end a variable's part as well as deleting it
    await client.execute("gen = 2\n%load_ext jupyter_ckpt")
    assert set((await failure())["lost"]) == {"fh"}, "asked at once, not at the next attempt"
    await client.execute("%ckpt exclude fh")
    kernel = manager.kernel_manager.get_kernel(kernel_id)
    idle_since = kernel.last_activity
    assert await failure() is None
    assert kernel.last_activity == idle_since, "asking the kernel kept its idle clock"


async def test_a_variable_that_cannot_be_saved_is_announced_after_its_cell(
    jp_fetch, start_kernel, connect, manager
):
    """Asked after the cell (as the status bar does), not at the next save: no image is
    written, and the kernel's idle clock stays where the cell left it."""
    kernel_id = await start_kernel()
    client = await connect(kernel_id)

    async def blocked_by() -> list[str]:
        r = await jp_fetch("api", "ckpt", "status", params={"kernel_id": kernel_id})
        (kernel,) = json.loads(r.body)["kernels"]
        return kernel["blocked_by"]

    await client.execute("import threading\ngen = (i for i in range(3))\nlock = threading.Lock()")
    await client.execute("data = list(range(10))\nkept = 1")
    kernel = manager.kernel_manager.get_kernel(kernel_id)
    idle_since = kernel.last_activity
    assert "Won't suspend: gen, lock cannot be saved" in await blocked_by()
    assert manager.store.image_ids() == [], "found without a save"
    assert kernel.last_activity == idle_since, "asking the kernel kept its idle clock"
    await client.execute("del gen\nlock = 2")
    assert not [b for b in await blocked_by() if "cannot be saved" in b]


async def test_a_kernel_without_jupyter_ckpt_keeps_running(
    jp_fetch, start_kernel, no_ckpt_kernel, manager, monitor, events
):
    kernel_id = await start_kernel(no_ckpt_kernel)
    await idle_for_a_moment(manager, kernel_id)
    assert await monitor.tick() == []
    (blocker,) = (await status_of(jp_fetch, kernel_id))["blocked_by"]
    assert blocker.startswith("the activity check failed") and "lacks jupyter_ckpt" in blocker

    # asked nothing, the kernel is suspended, and the failed save says why it stays
    manager.policy.background_work = ["children"]

    async def suspend_tried() -> Any:
        assert await monitor.tick() == []
        return (await status_of(jp_fetch, kernel_id))["last_failure"]

    reason = (await poll(suspend_tried, what="a suspend attempt"))["reason"]
    assert "lacks jupyter_ckpt" in reason
    failed = await next_event(events, "suspend", status="error")
    assert "lacks jupyter_ckpt" in failed["msg"]


async def test_a_failed_write_keeps_the_kernel(jp_fetch, start_kernel, connect, manager, monitor):
    kernel_id = await start_kernel()
    await (await connect(kernel_id)).execute("data = list(range(1000))")
    # the store cannot take chunks: a file sits where their directory goes
    chunks = Path(manager.store.backend.url, "chunks")
    chunks.write_text("in the way")
    await idle_for_a_moment(manager, kernel_id)
    assert await monitor.tick() == []
    assert manager.kernel_manager.is_running(kernel_id)
    reason = (await status_of(jp_fetch, kernel_id))["last_failure"]["reason"]
    assert f"{chunks}: it is not a directory; move it away" in reason, reason


async def test_gpu_only_suspends_only_kernels_holding_gpu_memory(
    jp_fetch, start_kernel, manager, monitor, events
):
    with_gpu, without_gpu = await start_kernel(), await start_kernel()
    nvml = FakeNvml({0: [(manager.kernel_pid(with_gpu), 3 << 30)]}, live=True)
    manager.probe = GpuProbe(nvml)
    manager.policy.gpu_only = True
    manager.policy.min_gpu_memory_mb = 1024
    await idle_for_a_moment(manager, with_gpu)
    await idle_for_a_moment(manager, without_gpu)
    assert await monitor.tick() == [with_gpu]
    blocked = (await status_of(jp_fetch, without_gpu))["blocked_by"]
    assert blocked == ["holds no GPU memory (gpu_only=True)"]
    assert manager.records.get(with_gpu)["gpu"]["by_device"] == {"0": 3 << 30}
    released = (await next_event(events, "suspend"))["gpu_release_seconds"]
    assert released < manager.gpu_release_timeout, "the release was seen, not timed out"


async def test_connected_kernels_wait_when_suspend_connected_is_off(
    jp_fetch, start_kernel, connect, manager, monitor
):
    kernel_id = await start_kernel()
    await connect(kernel_id)
    manager.policy.suspend_connected = False
    await idle_for_a_moment(manager, kernel_id)
    await poll(lambda: manager.kernel_manager._kernel_connections[kernel_id] == 1)
    assert await monitor.tick() == []
    manager.policy.exclude_kernel_names = ["python3"]
    manager.policy.suspend_connected = True
    blocked = (await status_of(jp_fetch, kernel_id))["blocked_by"]
    assert blocked == ["kernel name 'python3' is in exclude_kernel_names"]


async def test_polling_status_is_not_user_activity(jp_fetch, jp_serverapp):
    settings = jp_serverapp.web_app.settings
    await jp_fetch("api", "kernels")
    before = settings["api_last_activity"]
    await jp_fetch("api", "ckpt", "status")
    await jp_fetch("api", "ckpt", "images")
    assert settings["api_last_activity"] == before


async def test_a_kernelspec_can_shorten_idle_timeout(jp_data_dir, start_kernel, manager, monitor):
    spec_dir = jp_data_dir / "kernels" / "short"
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python, suspended soon",
        "language": "python",
        "metadata": {"jupyter_ckpt": {"idle_timeout": 0.2}},
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    default, short = await start_kernel(), await start_kernel("short")
    await idle_for_a_moment(manager, default)
    await idle_for_a_moment(manager, short)
    manager.policy.idle_timeout = 3600
    assert await monitor.tick() == [short]
    assert manager.kernel_manager.is_running(default)


async def test_a_kernel_suspended_while_its_status_is_checked_is_reported_suspended(
    jp_fetch, connect, manager, monitor, monkeypatch
):
    """The status of one kernel measures it for half a second, then asks it: an idle
    suspend in between (the monitor's tick) took its process away. The status says so
    rather than failing."""
    r = await jp_fetch(
        "api", "sessions", method="POST",
        body=json.dumps({"path": "s.ipynb", "type": "notebook", "kernel": {"name": "python3"}}),
    )  # fmt: skip
    kernel_id = json.loads(r.body)["kernel"]["id"]
    await (await connect(kernel_id)).execute("x = 1")
    measure = monitor._measure_now

    async def suspended_meanwhile(kid: str) -> Any:
        loads = await measure(kid)
        await manager.suspend(kid, trigger="idle")
        return loads

    monkeypatch.setattr(monitor, "_measure_now", suspended_meanwhile)
    r = await jp_fetch("api", "ckpt", "status", params={"kernel_id": kernel_id})
    states = [k["state"] for k in json.loads(r.body)["kernels"] if k["kernel_id"] == kernel_id]
    assert "suspended" in states, states
