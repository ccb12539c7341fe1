"""Idle means idle: a kernel that runs no cell but still works in the background (a thread,
an asyncio task, a child process, a busy GPU) is not suspended mid-work, says why, and is
suspended once the work is over and the idle timeout has passed since."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from server_helpers import FakeNvml, poll, python_kernelspec, text_of
from tornado.httpclient import HTTPClientError

from jupyter_ckpt.gpu import GpuProbe

IDLE_TIMEOUT = 1.0
CHECK_INTERVAL = 0.5  # the check window: each tick measures the kernel's threads over it
STEPS = 50  # of 0.15 s: the work lasts 7.5 s, seven idle timeouts

WORK = {
    "thread": (
        "import threading\n"
        "def _train():\n"
        "    for _ in range(STEPS):\n"
        "        time.sleep(0.1)\n"
        "        step()\n"
        "threading.Thread(target=_train).start()\n",
        "a thread started by `_train` is running",
    ),
    "asyncio task": (
        "import asyncio\n"
        "async def _fetch():\n"
        "    for _ in range(STEPS):\n"
        "        await asyncio.sleep(0.1)\n"
        "        step()\n"
        "asyncio.ensure_future(_fetch())\n",
        "an asyncio task running `_fetch` is pending (",
    ),
    "child process": (
        "import subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-c', 'import time\\n'\n"
        "    f'for i in range({STEPS}):\\n'\n"
        "    f'    time.sleep(0.1); open({str(PROGRESS)!r}, \"w\").write(str(i + 1))'])\n"
        "progress['n'] = STEPS  # the child counts in the file only\n",
        "1 child process: python",
    ),
}

SETUP = """\
import time
from pathlib import Path
STEPS, PROGRESS = {steps}, Path({progress!r})
progress = {{"n": 0}}
def spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
def step():
    spin(0.05)  # work: half of each step computes, half sleeps
    progress["n"] += 1
    PROGRESS.write_text(str(progress["n"]))
"""


async def tick_fast(manager: Any, monitor: Any) -> None:
    """The monitor's own loop, ticking fast, with a short idle timeout (the server
    stops it with the extension)."""
    await monitor.stop()
    manager.policy.idle_timeout = IDLE_TIMEOUT
    manager.policy.check_interval = CHECK_INTERVAL
    monitor.start()


async def status_of(jp_fetch: Any, kernel_id: str) -> dict[str, Any]:
    status = json.loads((await jp_fetch("api", "ckpt", "status")).body)
    return next(k for k in status["kernels"] if k["kernel_id"] == kernel_id)


async def start_kernel(jp_fetch: Any, name: str = "python3") -> str:
    r = await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": name}))
    return json.loads(r.body)["id"]


def progress_of(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except FileNotFoundError:
        return 0


async def kept_running_until_done(
    jp_fetch: Any, manager: Any, kernel_id: str, reason: str, progress: Path
) -> None:
    """While the work runs the kernel is never suspended and the status names the work;
    after it, the kernel is suspended."""
    km = manager.kernel_manager
    seen: list[str] = []
    idle_while_working: list[float] = []

    async def done() -> bool:
        assert not km.is_suspended(kernel_id), f"suspended at step {progress_of(progress)}"
        status = await status_of(jp_fetch, kernel_id)
        working = [b for b in status["blocked_by"] if b.startswith(reason)]
        seen.extend(working)
        if working:
            idle_while_working.append(status["idle_seconds"])
        return progress_of(progress) == STEPS

    await poll(done, timeout=60, what="the work to end")
    assert seen, f"the status never said {reason!r}"
    # work seen is activity: the idle clock restarts at every sighting, so it never runs
    # up to the work's 5 s (it would with the last cell as its only start)
    assert max(idle_while_working) < STEPS * 0.1 / 2, idle_while_working
    await poll(lambda: km.is_suspended(kernel_id), timeout=30, what="the suspension")
    # and let the suspend finish (shutdown, retention) before the server stops
    await poll(
        lambda: manager.lifecycles[kernel_id].suspend_task is None, what="the suspend to finish"
    )


@pytest.mark.parametrize("kind", list(WORK))
async def test_background_work_keeps_the_kernel_until_it_ends(
    kind, jp_fetch, connect, manager, monitor, tmp_path
):
    await tick_fast(manager, monitor)
    code, reason = WORK[kind]
    progress = tmp_path / "progress"
    kernel_id = await start_kernel(jp_fetch)
    client = await connect(kernel_id)
    reply, _ = await client.execute(SETUP.format(steps=STEPS, progress=str(progress)) + code)
    assert reply["status"] == "ok"
    client.close()
    await kept_running_until_done(jp_fetch, manager, kernel_id, reason, progress)
    await monitor.stop()  # the restored kernel below stays up

    # the work was not cut short: the restored kernel counted every step
    client = await connect(kernel_id)
    _, outputs = await client.execute("print(progress['n'])")
    assert text_of(outputs).strip() == str(STEPS)


async def test_threads_named_as_helpers_do_not_count(jp_fetch, connect, manager, monitor, tmp_path):
    await tick_fast(manager, monitor)
    manager.policy.background_thread_ignore = ["prefetch-*"]
    progress = tmp_path / "progress"
    kernel_id = await start_kernel(jp_fetch)
    client = await connect(kernel_id)
    helper = (
        "def _refill():\n"
        "    while True:\n"
        "        spin(0.05)\n"
        "        time.sleep(0.05)\n"
        "threading.Thread(target=_refill, name='prefetch-0', daemon=True).start()\n"
    )
    code = SETUP.format(steps=STEPS, progress=str(progress)) + WORK["thread"][0] + helper
    await client.execute(code)
    client.close()

    async def only_train_named() -> bool:
        blocked = (await status_of(jp_fetch, kernel_id))["blocked_by"]
        return [b.split(" (")[0] for b in blocked] == ["a thread started by `_train` is running"]

    await poll(only_train_named, what="the status to name _train alone")
    await kept_running_until_done(
        jp_fetch, manager, kernel_id, "a thread started by `_train`", progress
    )


async def test_a_busy_gpu_keeps_the_kernel(jp_fetch, connect, manager, monitor, events):
    await tick_fast(manager, monitor)
    kernel_id = await start_kernel(jp_fetch)
    await (await connect(kernel_id)).execute("x = 1")
    nvml = FakeNvml({0: [(manager.kernel_pid(kernel_id), 2 << 30)]}, live=True)
    nvml.utilization = {0: [(manager.kernel_pid(kernel_id), 87)]}
    manager.probe = GpuProbe(nvml)

    async def blocked_by_gpu_alone() -> bool:
        # (a kernel slow to answer its first check, under load, is busy meanwhile)
        return (await status_of(jp_fetch, kernel_id))["blocked_by"] == ["GPU 0 is 87% busy"]

    await poll(blocked_by_gpu_alone, what="the busy GPU as the one blocker")
    manager.policy.gpu_busy_percent = 90  # 87% is below it now: not work
    await poll(lambda: any(e["action"] == "suspend" for e in events), what="the suspension")
    assert manager.records.get(kernel_id)["gpu"]["busy"] == {"0": 87}


async def test_a_kernel_that_does_not_answer_counts_as_busy(jp_fetch, connect, manager, monitor):
    kernel_id = await start_kernel(jp_fetch)
    await (await connect(kernel_id)).execute("x = 1")
    pid = manager.kernel_pid(kernel_id)
    manager.policy.idle_timeout = 0.1
    manager.policy.activity_timeout = 0.5
    stopped = await asyncio.create_subprocess_exec("kill", "-STOP", str(pid))
    await stopped.wait()
    try:
        await poll(lambda: manager.kernel_manager.get_kernel(kernel_id).execution_state == "idle")
        await poll(lambda: monitor.assess_all()[0].due, what="the kernel due")
        assert await monitor.tick() == []
        blocked = (await status_of(jp_fetch, kernel_id))["blocked_by"]
        assert blocked == ["the kernel did not answer the activity check"]
    finally:
        await (await asyncio.create_subprocess_exec("kill", "-CONT", str(pid))).wait()


async def test_idleness_is_checked_again_right_before_each_suspend(
    jp_fetch, connect, manager, monitor, tmp_path
):
    """Two kernels are due; while the first is being written, a cell starts work in the
    second: the tick's earlier decision about it is stale and must not be acted on."""
    first, second = await start_kernel(jp_fetch), await start_kernel(jp_fetch)
    await (await connect(first)).execute("blob = 1")
    client = await connect(second)
    await client.execute(SETUP.format(steps=STEPS, progress=str(tmp_path / "p")))
    manager.policy.idle_timeout = 0.1
    km = manager.kernel_manager
    await poll(lambda: all(a.due for a in monitor.assess_all()), what="both kernels due")
    started: list[Any] = []

    async def work_in_second(step: str, kernel_id: str) -> None:
        if step == "checkpoint" and kernel_id == first and not started:
            started.append(await client.execute(WORK["thread"][0]))

    manager.step_hook = work_in_second
    assert await monitor.tick() == [first]
    assert started, "the first kernel's image was not written"
    assert km.is_running(second) and not km.is_suspended(second)


async def test_suspend_now_sees_the_work_and_remains_the_users_choice(
    jp_fetch, connect, manager, tmp_path
):
    """What "Suspend Kernel Now" asks first: the status of this one kernel, its work
    checked at once (idle_timeout is an hour here). The REST suspend still obeys."""
    kernel_id = await start_kernel(jp_fetch)
    client = await connect(kernel_id)
    await client.execute(
        SETUP.format(steps=10 * STEPS, progress=str(tmp_path / "p")) + WORK["thread"][0]
    )
    r = await jp_fetch("api", "ckpt", "status", params={"kernel_id": kernel_id})
    (status,) = json.loads(r.body)["kernels"]
    (work,) = status["background_work"]
    assert work.startswith("a thread started by `_train` is running ("), work
    assert status["kernel_id"] == kernel_id and status["state"] == "running"

    with pytest.raises(HTTPClientError) as unknown:
        await jp_fetch("api", "ckpt", "status", params={"kernel_id": "no-such-kernel"})
    assert unknown.value.code == 404

    r = await jp_fetch("api", "ckpt", "kernels", kernel_id, "suspend", method="POST", body="{}")
    assert json.loads(r.body)["kernel_id"] == kernel_id
    assert manager.kernel_manager.is_suspended(kernel_id)


@pytest.fixture
def launched_kernel(jp_data_dir: Path) -> str:
    """A kernel started through a launcher that stays its parent (as ``conda run`` does)."""
    launcher = (
        "import subprocess, sys; sys.exit(subprocess.call("
        "[sys.executable, '-m', 'ipykernel_launcher', '-f', sys.argv[1]]))"
    )
    argv = [sys.executable, "-c", launcher, "{connection_file}"]
    return python_kernelspec(jp_data_dir, "launched", "Python behind a launcher", argv)


async def test_a_kernel_behind_a_launcher_is_not_a_child_process(
    jp_fetch, connect, manager, monitor, launched_kernel
):
    kernel_id = await start_kernel(jp_fetch, launched_kernel)
    client = await connect(kernel_id)
    await client.execute("import subprocess")
    (status,) = await monitor.assess([kernel_id])
    assert status.background_work == []
    await client.execute("p = subprocess.Popen(['sleep', '30'])")
    (status,) = await monitor.assess([kernel_id])
    assert status.background_work == ["1 child process: sleep 30"]
    await client.execute("p.kill(); p.wait()")


async def test_idle_thread_pools_do_not_count_and_busy_ones_do(jp_fetch, connect, monitor):
    kernel_id = await start_kernel(jp_fetch)
    client = await connect(kernel_id)
    await client.execute(
        SETUP.format(steps=STEPS, progress="unused") + "import concurrent.futures\n"
        "pool = concurrent.futures.ThreadPoolExecutor(3)\n"
        "assert [pool.submit(int, '1').result() for _ in range(3)] == [1, 1, 1]\n"
    )
    (status,) = await monitor.assess([kernel_id])
    assert status.background_work == []
    await client.execute("job = pool.submit(spin, 10)")
    (status,) = await monitor.assess([kernel_id])
    (work,) = status.background_work
    assert work.startswith("a pool thread is running `spin` ("), work
    await client.execute("pool.shutdown(wait=False, cancel_futures=True)")


async def test_unsaveable_variables_say_wont_suspend_up_front(
    jp_fetch, connect, manager, monitor, events
):
    """Under on_unsaveable=keep, a kernel whose last image left variables out would fail
    every suspend: the status says so as soon as the image is written, instead of counting
    down to an attempt that fails, and the monitor does not try. A new image without them
    lifts it."""
    kernel_id = await start_kernel(jp_fetch)
    client = await connect(kernel_id)
    await client.execute(
        "import socket, threading\n"
        "gen, sock, lock, x = (i for i in range(3)), socket.socket(), threading.Lock(), 1\n"
    )

    async def checkpoint() -> None:  # what an autosave does too
        await jp_fetch("api", "ckpt", "kernels", kernel_id, "checkpoint", method="POST", body="{}")

    await checkpoint()
    wont = "Won't suspend: gen, lock, sock cannot be saved"

    async def status() -> dict[str, Any]:
        return await status_of(jp_fetch, kernel_id)

    async def first_blocker() -> str | None:
        return next(iter((await status())["blocked_by"]), None)

    async def blocker_is(expected: str | None) -> bool:
        # the kernel's own status, as the status bar asks for it: checked now
        reply = await jp_fetch("api", "ckpt", "status", params={"kernel_id": kernel_id})
        [kernel] = json.loads(reply.body)["kernels"]
        return next(iter(kernel["blocked_by"]), None) == expected

    # the image's event reaches the monitor through the server's event bus
    assert await poll(first_blocker, what=wont) == wont
    assert (await status())["seconds_until_suspend"] is None
    manager.policy.idle_timeout = 0.1
    assert await monitor.tick() == []
    assert not [e for e in events if e["action"] == "suspend"], "a doomed suspend was tried"

    manager.policy.on_unsaveable = "suspend"  # the user accepts the loss: nothing blocks
    assert wont not in (await status())["blocked_by"]
    manager.policy.on_unsaveable = "keep"

    # asked at once, not at the next save: only what the kernel still holds is named
    # (once the server has seen the kernel idle again)
    await client.execute("del gen, sock")
    lock = "Won't suspend: lock cannot be saved"
    await poll(lambda: blocker_is(lock), what=lock)
    # rebound: the cell's new value is looked at once it ran (a new lock: still named)
    await client.execute("lock = threading.Lock()")
    await poll(lambda: blocker_is(lock), what=lock)
    await client.execute("lock = 1")  # a value that saves
    await poll(lambda: blocker_is(None), what="no blocker")
    await client.execute("del lock")
    await checkpoint()
    km = manager.kernel_manager

    async def suspended() -> bool:
        await monitor.tick()
        return km.is_suspended(kernel_id)

    await poll(suspended, what="the suspension once the variables are gone")


async def test_a_busy_thread_shows_in_a_tick_that_does_not_ask_the_kernel(
    jp_fetch, connect, monitor, monkeypatch
):
    """A tick asks a few kernels at most to name their busy threads: one it does not ask
    still shows its busy thread in its status (as named before, or by its id), so the
    work is never taken for idleness."""
    monkeypatch.setattr("jupyter_ckpt_server.monitor.MAX_ASKS_PER_TICK", 0)
    kernel_id = await start_kernel(jp_fetch)
    client = await connect(kernel_id)
    reply, _ = await client.execute(
        SETUP.format(steps=STEPS, progress="unused")
        + "import threading\nthreading.Thread(target=spin, args=(60,), daemon=True).start()\n"
    )
    assert reply["status"] == "ok"

    async def shown() -> list[str]:
        await monitor.tick()
        (status,) = monitor.assess_all(kernel_ids=[kernel_id])
        return status.background_work

    work = await poll(shown, timeout=30, what="the busy thread in the status")
    assert any("thread" in w for w in work), work
