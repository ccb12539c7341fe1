"""Work that waits between its steps is still work: a thread or task running the user's
code that woke during the check window keeps the kernel, whatever little CPU it uses (a
poll, a paced loop, a socket or queue read, a worker that sleeps); threads that only sleep,
or that belong to a library and wake on its own timer, do not.

The monitor runs its own loop here, as in a server, with an idle timeout shorter than the
check window: a kernel is kept only if every window sees its work. Each kept case counts
its steps in a file; a suspend would stop the count short.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from jupyter_ckpt_server import work
from server_helpers import poll, text_of
from test_server_idle_work import progress_of, start_kernel, status_of

IDLE_TIMEOUT = 0.5  # shorter than a window: only work seen in every window keeps the kernel
SETUP = """\
import asyncio, threading, time
from pathlib import Path
PROGRESS = Path({progress!r})
progress = {{"n": 0}}
counting = threading.Lock()  # workers step at once
def step():
    # a step that costs almost nothing: what it does is wait
    with counting:
        progress["n"] += 1
        PROGRESS.write_text(str(progress["n"]))
def paced(seconds, steps):
    for _ in range(steps):
        time.sleep(seconds)
        step()
"""


@dataclass
class Case:
    name: str
    code: str  # starts the work: {steps} steps, each calling step()
    reason: str  # what the status says while it runs (a regular expression)
    # the check window (check_interval) it is watched with: a few steps long, so that a
    # step delayed on a loaded machine still falls in every window
    window: float = 1.5
    steps: int = 30


KEPT = [
    *(
        Case(
            f"a thread sleeping {seconds} s per step",
            f"threading.Thread(target=paced, args=({seconds}, {{steps}})).start()",
            r"a thread started by `paced` is running \(",
            steps=steps,
        )
        for seconds, steps in ((0.05, 60), (0.5, 8))
    ),
    Case(
        "an asyncio task awaiting asyncio.sleep",
        "async def _fetch():\n"
        "    for _ in range({steps}):\n"
        "        await asyncio.sleep(0.1)\n"
        "        step()\n"
        "fetching = asyncio.ensure_future(_fetch())\n",
        r"an asyncio task running `_fetch` is pending \(",
    ),
    Case(
        "a callback that re-arms itself on the kernel's loop",
        "def _again(left):\n"
        "    step()\n"
        "    if left > 1:\n"
        "        asyncio.get_event_loop().call_later(0.1, _again, left - 1)\n"
        "asyncio.get_event_loop().call_later(0.1, _again, {steps})\n",
        r"a callback `_again` is scheduled on the kernel's loop \(",
    ),
    Case(
        "a tornado PeriodicCallback",
        "from tornado.ioloop import PeriodicCallback\n"
        "def _count():\n"
        "    step()\n"
        "    if progress['n'] >= {steps}:\n"
        "        periodic.stop()\n"
        "periodic = PeriodicCallback(_count, 100)\n"
        "periodic.start()\n",
        r"a callback `_count` is scheduled on the kernel's loop \(",
    ),
    Case(
        "a concurrent.futures worker",
        "from concurrent.futures import ThreadPoolExecutor\n"
        "pool = ThreadPoolExecutor(2)\n"
        "job = pool.submit(paced, 0.1, {steps})\n",
        r"a pool thread is running `paced` \(",
    ),
    Case(
        "joblib threading workers",
        "from joblib import Parallel, delayed\n"
        "def _parallel():\n"
        "    Parallel(n_jobs=2, backend='threading')(\n"
        "        delayed(paced)(0.2, {steps} // 2) for _ in range(2))\n"
        "threading.Thread(target=_parallel).start()\n",
        r"a pool thread is running `paced` \(",
    ),
    Case(
        "an IPython BackgroundJobManager job",
        "from IPython.lib.backgroundjobs import BackgroundJobManager\n"
        "BackgroundJobManager().new(paced, 0.1, {steps})\n",
        r"a thread is running `paced` \(",
    ),
    Case(
        "an anyio.to_thread worker",
        "import anyio\n"
        "worker = asyncio.ensure_future(anyio.to_thread.run_sync(paced, 0.1, {steps}))\n",
        r"a thread is running `paced` \(",
    ),
    Case(
        "a requests poll against a local HTTP server",
        "import requests\n"
        "def _poll(url):\n"
        "    with requests.Session() as http:\n"
        "        for _ in range({steps}):\n"
        "            http.get(url, timeout=5).raise_for_status()\n"
        "            step()\n"
        "            time.sleep(0.1)\n"
        "threading.Thread(target=_poll, args=({http_url!r},)).start()\n",
        r"a thread started by `_poll` is running \(",
    ),
    Case(
        "a socket receive loop fed by a remote sender",
        "import socket\n"
        "def _receive(address):\n"
        "    with socket.create_connection(address) as s:\n"
        "        s.settimeout(5)\n"
        "        for _ in range({steps}):\n"
        "            assert s.recv(64)\n"
        "            step()\n"
        "threading.Thread(target=_receive, args=({sender!r},)).start()\n",
        r"a thread started by `_receive` is running \(",
    ),
    Case(
        "a threading.Timer that re-arms itself",
        "def _tick(left):\n"
        "    step()\n"
        "    if left > 1:\n"
        "        threading.Timer(0.1, _tick, args=(left - 1,)).start()\n"
        "threading.Timer(0.1, _tick, args=({steps},)).start()\n",
        r"a thread started by `_tick` is running \(",
    ),
    Case(
        "a queue.Queue consumer fed by a producer",
        "import queue\n"
        "items = queue.Queue()\n"
        "def _produce():\n"
        "    for i in range({steps}):\n"
        "        time.sleep(0.1)\n"
        "        items.put(i)\n"
        "def _consume():\n"
        "    for _ in range({steps}):\n"
        "        items.get()\n"
        "        step()\n"
        "threading.Thread(target=_produce).start()\n"
        "threading.Thread(target=_consume).start()\n",
        r"a thread started by `_consume` is running \(",
    ),
]

SLOW = Case(
    "a thread sleeping 5 s per step",
    "threading.Thread(target=paced, args=(5, {steps})).start()",
    # when it last ran, within the step it sleeps (where Linux keeps the scheduler's file)
    r"a thread started by `paced` is running \(woke [^,]+, last active \d\.\d s ago\)",
    window=7,
    steps=3,
)


@pytest.fixture
def http_url() -> Iterator[str]:
    """A local HTTP server, outside the kernel, answering every GET."""

    class Ok(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture
def sender() -> Iterator[tuple[str, int]]:
    """A remote end, outside the kernel, that sends a few bytes every 0.1 s to each
    connection until it closes."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def feed(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            while not stop.wait(0.1):
                conn.sendall(b"data")

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                threading.Thread(target=feed, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield listener.getsockname()[:2]
    stop.set()
    listener.close()


async def watch(monitor: Any, manager: Any, window: float) -> None:
    """The monitor's own loop, with check windows of ``window`` seconds."""
    await monitor.stop()
    manager.policy.check_interval = window
    monitor.start()


async def kept_until_done(
    jp_fetch: Any, manager: Any, kernel_id: str, case: Case, progress: Path
) -> list[str]:
    """Watch the case's work to its last step with a short idle timeout: the kernel must
    not be suspended meanwhile. What the status said while it ran."""
    km = manager.kernel_manager
    said: list[str] = []

    async def done() -> bool:
        assert not km.is_suspended(kernel_id), (
            f"{case.name}: suspended at step {progress_of(progress)} of {case.steps}"
        )
        said.extend((await status_of(jp_fetch, kernel_id))["background_work"])
        return progress_of(progress) >= case.steps

    manager.policy.idle_timeout = IDLE_TIMEOUT
    try:
        await poll(done, timeout=60 + 3 * case.steps, what=f"{case.name} to end")
    finally:
        manager.policy.idle_timeout = 3600  # between cases: the work has ended
    return said


async def run_cases(
    jp_fetch: Any,
    connect: Any,
    manager: Any,
    monitor: Any,
    tmp_path: Path,
    cases: list[Case],
    **where: Any,
) -> None:
    kernel_id = await start_kernel(jp_fetch)
    client = await connect(kernel_id)
    for number, case in enumerate(cases):
        progress = tmp_path / f"progress-{number}"
        reply, _ = await client.execute(SETUP.format(progress=str(progress)))
        assert reply["status"] == "ok"
        await watch(monitor, manager, case.window)
        reply, outputs = await client.execute(case.code.format(steps=case.steps, **where))
        assert reply["status"] == "ok", (case.name, outputs)
        said = await kept_until_done(jp_fetch, manager, kernel_id, case, progress)
        assert any(re.match(case.reason, s) for s in said), (case.name, sorted(set(said)))


async def test_waiting_work_keeps_the_kernel(
    jp_fetch, connect, manager, monitor, tmp_path, http_url, sender
):
    await run_cases(
        jp_fetch, connect, manager, monitor, tmp_path, KEPT, http_url=http_url, sender=sender
    )


async def test_a_loop_sleeping_most_of_a_window_keeps_the_kernel(
    jp_fetch, connect, manager, monitor, tmp_path
):
    await run_cases(jp_fetch, connect, manager, monitor, tmp_path, [SLOW])


# a cell that raised inside a tqdm loop keeps the bar, and so tqdm's monitor thread
RAISED_IN_TQDM = """\
from tqdm import tqdm
for i in tqdm(range(100), mininterval=0):
    if i == 5:
        raise ValueError("raised inside the loop")
"""
SLEEPERS = """\
import asyncio, logging, logging.handlers, queue, threading, time
from concurrent.futures import ThreadPoolExecutor
records = queue.Queue()
listener = logging.handlers.QueueListener(records, logging.NullHandler())
listener.start()
logging.getLogger("train").addHandler(logging.handlers.QueueHandler(records))
logging.getLogger("train").warning("epoch done")
idle_pool = ThreadPoolExecutor(4)
assert [idle_pool.submit(int, "1").result() for _ in range(4)] == [1] * 4
threading.Timer(3600, print).start()
parked = threading.Event()
def _wait_for_ever():
    parked.wait()
threading.Thread(target=_wait_for_ever, daemon=True).start()
async def _await_for_ever():
    await asyncio.Event().wait()
waiting = asyncio.ensure_future(_await_for_ever())
def _metrics():
    while True:
        time.sleep(0.2)
threading.Thread(target=_metrics, daemon=True).start()
%load_ext jupyter_ckpt
%ckpt idle-ok _metrics
"""


async def test_library_sleepers_and_parked_work_are_suspended(jp_fetch, connect, manager, monitor):
    """A kernel whose threads only sleep, or wake on a library's timer (tqdm's monitor,
    every 10 s), or run a loop the user marked idle-ok: a window in which they woke sees
    no work, and the kernel is suspended."""
    kernel_id = await start_kernel(jp_fetch)
    client = await connect(kernel_id)
    reply, outputs = await client.execute(SLEEPERS)
    assert reply["status"] == "ok", outputs
    reply, _ = await client.execute(RAISED_IN_TQDM)
    assert reply["status"] == "error"
    _, outputs = await client.execute("print(tqdm.monitor.native_id)")
    tqdm_tid = int(text_of(outputs))
    pid = manager.kernel_pid(kernel_id)
    assert pid is not None
    # the status asks the kernel at once: from then on, the task that awaits has not run
    await monitor.assess([kernel_id])
    # one window in which tqdm's monitor woke (every 10 s) and the other loop ran
    assert await monitor.tick() == []
    before = work.sample(pid)
    assert before is not None

    def tqdm_woke() -> bool:
        now = work.sample(pid)
        return now is not None and now.runs[tqdm_tid] > before.runs[tqdm_tid]

    await poll(tqdm_woke, timeout=30, what="tqdm's monitor to wake")
    assert await monitor.tick() == []
    (status,) = monitor.assess_all(kernel_ids=[kernel_id])
    assert status.blocked_by == [], status.blocked_by
    # the variables these leave (threads, a task) cannot all be saved: accept it
    manager.policy.on_unsaveable = "suspend"
    manager.policy.idle_timeout = IDLE_TIMEOUT
    km = manager.kernel_manager

    async def suspended() -> bool:
        await monitor.tick()
        return km.is_suspended(kernel_id)

    await poll(suspended, timeout=60, what="the suspension")


async def test_work_marked_idle_ok_after_it_was_seen_no_longer_keeps_the_kernel(
    jp_fetch, connect, manager, monitor
):
    kernel_id = await start_kernel(jp_fetch)
    client = await connect(kernel_id)
    reply, _ = await client.execute(
        "import threading, time\n"
        "def _refresh():\n"
        "    while True:\n"
        "        time.sleep(0.1)\n"
        "threading.Thread(target=_refresh, daemon=True).start()\n"
        "%load_ext jupyter_ckpt\n"
    )
    assert reply["status"] == "ok"
    manager.policy.on_unsaveable = "suspend"
    manager.policy.idle_timeout = IDLE_TIMEOUT
    km = manager.kernel_manager
    refreshing = "a thread started by `_refresh` is running (woke"

    async def named() -> bool:
        assert await monitor.tick() == []
        (status,) = monitor.assess_all(kernel_ids=[kernel_id])
        return any(w.startswith(refreshing) for w in status.background_work)

    await poll(named, what="the loop named")
    _, outputs = await client.execute("%ckpt idle-ok _refresh")
    assert "_refresh" in text_of(outputs)

    async def suspended() -> bool:
        await monitor.tick()
        return km.is_suspended(kernel_id)

    await poll(suspended, timeout=60, what="the suspension")
