"""What the kernel says of its threads and tasks when the server saw them awake: whether
the user's code runs in them (then waking is work), and which tasks ran since the last
ask. In-process, on real threads and a real asyncio loop."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from jupyter_ckpt.kernel import activity


def _park(event: threading.Event, running: threading.Event | None = None) -> None:
    if running is not None:
        running.set()
    event.wait()


@pytest.fixture
def released() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


def started(thread: threading.Thread) -> threading.Thread:
    thread.start()
    return thread


def verdict_of(thread: threading.Thread, ignore: tuple[str, ...] = ()) -> dict[str, object]:
    return activity.verdict(thread, sys._current_frames()[thread.ident or -1], ignore)


def test_a_thread_of_the_users_code_is_judged_for_good(released):
    thread = started(threading.Thread(target=_park, args=(released,)))
    assert verdict_of(thread) == {
        "name": "a thread started by `_park` is running",
        "user": True,
        "fixed": True,
    }


def test_a_library_thread_is_not_the_users_code(released):
    # a thread of the standard library's, waiting: its stack holds no code of the user's
    thread = started(threading.Thread(target=released.wait))
    assert verdict_of(thread) == {"name": None, "user": False, "fixed": False}
    timer = started(threading.Timer(3600, print))
    try:
        assert verdict_of(timer)["user"] is False
    finally:
        timer.cancel()


def test_a_pool_worker_is_judged_by_the_job_it_runs_now(released):
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(int, "1").result() == 1
        (worker,) = pool._threads
        assert verdict_of(worker) == {"name": None, "user": False, "fixed": False}
        running = threading.Event()
        job = pool.submit(_park, released, running)
        try:
            assert running.wait(30)
            parked = "a pool thread is running `_park`"
            assert verdict_of(worker) == {"name": parked, "user": True, "fixed": False}
        finally:
            released.set()
        job.result()


def test_work_marked_idle_ok_is_not_work(released):
    thread = started(threading.Thread(target=_park, args=(released,), name="poller"))
    try:
        assert activity.idle_ok(_park) == ["_park"]
        judged = activity.describe([thread.native_id or 0])["threads"]
        assert judged == {str(thread.native_id): {"name": None, "user": False, "fixed": False}}
        assert activity.idle_ok(_park, undo=True) == []
        assert verdict_of(thread, ("poll*",))["name"] is None  # a pattern, on its name
    finally:
        activity.IDLE_OK.clear()
    with pytest.raises(TypeError, match="not int"):
        activity.idle_ok(3)


def test_a_task_woke_when_it_waits_on_another_future():
    asyncio.run(two_asks())


async def two_asks() -> None:
    parked = asyncio.Event()
    steps = []

    async def _parked() -> None:
        await parked.wait()

    async def _paced() -> None:
        while True:
            await asyncio.sleep(0.01)
            steps.append(1)

    tasks = [asyncio.ensure_future(_parked()), asyncio.ensure_future(_paced())]
    try:
        await asyncio.sleep(0)
        first = activity.describe([])
        pending = sorted(
            f"an asyncio task running `{f.__qualname__}` is pending" for f in (_paced, _parked)
        )
        assert first["tasks"] == first["woken_tasks"] == pending  # new since the last ask
        count = len(steps)
        while len(steps) < count + 2:
            await asyncio.sleep(0.01)
        assert activity.describe([])["woken_tasks"] == [pending[0]]  # _paced alone
    finally:
        parked.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def test_a_timer_of_the_users_code_woke_when_it_re_armed():
    asyncio.run(timers())


def _later() -> None:
    pass


async def timers() -> None:
    loop = asyncio.get_running_loop()
    far = loop.call_later(3600, _later)  # not due: it does not run

    def _again() -> None:
        ticks.append(loop.call_later(0.01, _again))

    ticks = [loop.call_later(0.01, _again)]
    try:
        words = {
            f"a callback `{f.__qualname__}` is scheduled on the kernel's loop": f
            for f in (_later, _again)
        }
        first = activity.describe([])
        assert sorted(first["woken_tasks"]) == sorted(words)  # new since the last ask
        count = len(ticks)
        while len(ticks) < count + 2:
            await asyncio.sleep(0.01)
        (again,) = [w for w, f in words.items() if f is _again]
        assert activity.describe([])["woken_tasks"] == [again]
    finally:
        far.cancel()
        ticks[-1].cancel()
