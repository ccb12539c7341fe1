"""Idle, measured, against the libraries notebooks use: a kernel training in a thread, a
task or a child is never suspended, whoever started the thread; a kernel at rest with the
threads tqdm, logging, thread pools, matplotlib or widgets leave behind, a thread parked
for ever, or a loop the user marked idle-ok, is suspended.

Each case runs in a real kernel of a real server, with the default thresholds; the cases
share a kernel one after the other (each stops its work before the next starts), so that
the whole set costs two kernel starts. The table of verdicts, with the reason the user is
shown, is printed with the test's output.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import pytest
from server_helpers import poll
from test_server_idle_work import start_kernel

SETUP = """\
import asyncio, threading, time
stop = threading.Event()
def burn(*_):
    # a training step's worth of CPU, again and again until stopped
    while not stop.is_set():
        sum(i * i for i in range(20000))
"""


@dataclass
class Case:
    name: str
    start: str
    # what the status must say while the work runs (a regular expression)
    reason: str = ""
    # what ends the work, so that the next case starts from a kernel at rest
    stop: str = ""


BUSY = [
    Case(
        "a thread training scikit-learn",
        "import numpy as np\n"
        "from sklearn.linear_model import SGDClassifier\n"
        "def _fit():\n"
        "    X, y = np.random.rand(2000, 20), np.random.randint(0, 2, 2000)\n"
        "    model = SGDClassifier()\n"
        "    while not stop.is_set():\n"
        "        model.partial_fit(X, y, classes=[0, 1])\n"
        "fitting = threading.Thread(target=_fit); fitting.start()\n",
        r"a thread started by `_fit` is running \(\d+% CPU",
        "stop.set(); fitting.join()",
    ),
    *(
        Case(
            f"multiprocessing.Process ({method})",
            "import multiprocessing as mp\n"
            f"proc = mp.get_context({method!r}).Process(target=time.sleep, args=(60,))\n"
            "proc.start()\n",
            rf"1 child process: {shown}",
            "proc.terminate(); proc.join()",
        )
        for method, shown in [
            ("fork", r"a fork of the kernel \(pid \d+\)"),
            ("spawn", r"python\S*( -\w)* -c from multiprocessing\.spawn"),
            ("forkserver", r"python\S*( -\w)* -c from multiprocessing\.forkserver"),
        ]
    ),
    *(
        Case(
            f"multiprocessing.Pool ({method})",
            "import multiprocessing as mp\n"
            f"pool = mp.get_context({method!r}).Pool(2)\n"
            "jobs = pool.map_async(time.sleep, [60, 60])\n",
            r"2 child processes: ",
            "pool.terminate(); pool.join()",
        )
        for method in ("fork", "spawn", "forkserver")
    ),
    Case(
        "ProcessPoolExecutor",
        "from concurrent.futures import ProcessPoolExecutor\n"
        "processes = ProcessPoolExecutor(1)\n"
        "job = processes.submit(time.sleep, 3)\n",
        r"1 child process: a fork of the kernel",
        "processes.shutdown(wait=True)",
    ),
    Case(
        "ThreadPoolExecutor",
        "from concurrent.futures import ThreadPoolExecutor\n"
        "threads = ThreadPoolExecutor(2)\n"
        "job = threads.submit(burn)\n",
        r"a pool thread is running `burn` \(\d+% CPU",
        "stop.set(); threads.shutdown(wait=True)",
    ),
    Case(
        "joblib.Parallel (loky)",
        "from joblib import Parallel, delayed\n"
        "def _parallel():\n"
        "    Parallel(n_jobs=2, backend='loky')(delayed(time.sleep)(3) for _ in range(2))\n"
        "parallel = threading.Thread(target=_parallel); parallel.start()\n",
        r"2 child processes: ",
        "from joblib.externals.loky import get_reusable_executor\n"
        "parallel.join(); get_reusable_executor().shutdown(wait=True)",
    ),
    Case(
        "joblib.Parallel (threading)",
        "from joblib import Parallel, delayed\n"
        "def _parallel():\n"
        "    Parallel(n_jobs=2, backend='threading')(delayed(burn)() for _ in range(2))\n"
        "parallel = threading.Thread(target=_parallel); parallel.start()\n",
        r"a pool thread is running `burn` \(\d+% CPU",
        "stop.set(); parallel.join()",
    ),
    Case(
        "IPython BackgroundJobManager",
        "from IPython.lib.backgroundjobs import BackgroundJobManager\n"
        "job = BackgroundJobManager().new(burn)\n",
        r"a thread is running `burn` \(\d+% CPU",
        "stop.set(); job.join()",
    ),
    Case(
        "anyio.to_thread",
        "import anyio\ntask = asyncio.ensure_future(anyio.to_thread.run_sync(burn))\n",
        r"a thread is running `burn` \(\d+% CPU",
        "stop.set(); await task",
    ),
    Case(
        "an asyncio task that computes",
        "async def crunch():\n"
        "    while not stop.is_set():\n"
        "        end = time.perf_counter() + 0.05\n"
        "        while time.perf_counter() < end:\n"
        "            pass\n"
        "        await asyncio.sleep(0.05)\n"
        "task = asyncio.ensure_future(crunch())\n",
        r"an asyncio task running `crunch` is pending \(\d+% CPU",
        "stop.set(); await task",
    ),
    Case(
        "subprocess.Popen",
        "import subprocess\nchild = subprocess.Popen(['sleep', '60'])\n",
        r"1 child process: sleep 60",
        "child.kill(); child.wait()",
    ),
    Case(
        "torch DataLoader, num_workers=2, in a thread",
        "import torch\n"
        "from torch.utils.data import DataLoader, Dataset\n"
        "class Numbers(Dataset):\n"
        "    def __len__(self):\n"
        "        return 10**6\n"
        "    def __getitem__(self, i):\n"
        "        time.sleep(0.01)\n"
        "        return torch.tensor(i)\n"
        "def _load():\n"
        "    for batch in DataLoader(Numbers(), batch_size=4, num_workers=2):\n"
        "        if stop.is_set():\n"
        "            break\n"
        "loading = threading.Thread(target=_load); loading.start()\n",
        r"[12] child process(es)?: a fork of the kernel",  # the workers start one by one
        "stop.set(); loading.join()",
    ),
    Case(
        "a download in a thread (loopback socket to a file)",
        "import socket, tempfile\n"
        "server = socket.create_server(('127.0.0.1', 0))\n"
        "def _serve():\n"
        "    conn, _ = server.accept()\n"
        "    with conn:\n"
        "        while not stop.is_set():\n"
        "            conn.sendall(bytes(65536)); time.sleep(0.02)\n"
        "def _download(port):\n"
        "    with socket.create_connection(('127.0.0.1', port)) as s, "
        "tempfile.TemporaryFile() as f:\n"
        "        while chunk := s.recv(65536):\n"
        "            f.write(chunk); f.flush()\n"
        "serving = threading.Thread(target=_serve); serving.start()\n"
        "download = threading.Thread(target=_download, args=(server.getsockname()[1],))\n"
        "download.start()\n",
        r"a thread started by `_download` is running \(.*[KM]B/s I/O",
        "stop.set(); serving.join(); download.join(); server.close()",
    ),
]

IDLE = [
    Case(
        "a cell that raised inside a tqdm loop",
        "from tqdm import tqdm\n"
        "for i in tqdm(range(100), mininterval=0):\n"
        "    if i == 5:\n"
        "        raise ValueError('raised inside the loop')\n",
    ),
    Case(
        "logging with a QueueListener",
        "import logging, logging.handlers, queue\n"
        "records = queue.Queue()\n"
        "listener = logging.handlers.QueueListener(records, logging.NullHandler())\n"
        "listener.start()\n"
        "logging.getLogger('train').addHandler(logging.handlers.QueueHandler(records))\n"
        "logging.getLogger('train').warning('epoch done')\n",
    ),
    Case("a threading.Timer not yet due", "threading.Timer(3600, print).start()\n"),
    Case(
        "an idle ThreadPoolExecutor",
        "from concurrent.futures import ThreadPoolExecutor\n"
        "idle_pool = ThreadPoolExecutor(4)\n"
        "assert [idle_pool.submit(int, '1').result() for _ in range(4)] == [1] * 4\n",
    ),
    Case(
        "a metrics writer marked idle-ok",
        "def _flush_now_and_then():\n"
        "    while True:\n"
        "        time.sleep(0.5)\n"
        "threading.Thread(target=_flush_now_and_then, daemon=True).start()\n"
        "%load_ext jupyter_ckpt\n"
        "%ckpt idle-ok _flush_now_and_then\n",
    ),
    Case(
        "a thread parked on Event.wait() for ever",
        "parked = threading.Event()\nthreading.Thread(target=parked.wait, daemon=True).start()\n",
    ),
    Case(
        "matplotlib figures left open (Agg)",
        "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
        "figures = [plt.figure() for _ in range(3)]\nplt.plot([1, 2, 3])\n",
    ),
    Case(
        "ipywidgets comms open",
        "import ipywidgets\nsliders = [ipywidgets.IntSlider(value=i) for i in range(3)]\n"
        "display(*sliders)\n",
    ),
]


class Table:
    """The cases' verdicts and what the user is shown, printed with the test output."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.rows: list[tuple[str, str, str]] = []

    def add(self, case: str, verdict: str, shown: str) -> None:
        self.rows.append((case, verdict, shown))

    def lines(self) -> Iterator[str]:
        width = max((len(r[0]) for r in self.rows), default=0)
        yield f"\n{self.title}"
        for case, verdict, shown in self.rows:
            yield f"  {case:<{width}}  {verdict:<9}  {shown}"


@pytest.fixture
def table(capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest) -> Iterator[Table]:
    made = Table(request.node.name)
    yield made
    with capsys.disabled():
        print("\n".join(made.lines()))


async def run(client: Any, code: str, ok: bool = True) -> None:
    reply, outputs = await client.execute(code)
    if ok:
        assert reply["status"] == "ok", (code, reply, outputs)


async def names(monitor: Any, kernel_id: str, case: Case, seen: list[str]) -> bool:
    """Whether the kernel's status names the case's work (which shows once it runs: a
    pool's workers start in the background); ``seen`` gets what the status said."""
    (status,) = await monitor.assess([kernel_id])
    seen[:] = status.blocked_by
    return any(re.match(case.reason, w) for w in status.background_work)


async def at_rest(monitor: Any, kernel_id: str, what: str) -> Any:
    """The kernel's status once the monitor measures no work in it."""

    async def status() -> Any:
        (a,) = await monitor.assess([kernel_id])
        return a if not a.background_work else None

    return await poll(status, timeout=60, what=f"no work after {what}")


async def test_work_in_threads_tasks_and_children_keeps_the_kernel(
    jp_fetch, connect, manager, monitor, table
):
    kernel_id = await start_kernel(jp_fetch)
    client = await connect(kernel_id)
    await run(client, SETUP)
    manager.policy.idle_timeout = 0.1  # due at once, but for its work
    km = manager.kernel_manager
    for case in BUSY:
        await run(client, "stop.clear()\n" + case.start)
        seen: list[str] = []
        try:
            await poll(partial(names, monitor, kernel_id, case, seen), what=f"{case.name} named")
        finally:
            table.add(case.name, "busy" if seen else "IDLE", "; ".join(seen))
        assert await monitor.tick() == [], case.name
        assert km.is_running(kernel_id) and not km.is_suspended(kernel_id)
        await run(client, case.stop)
        await at_rest(monitor, kernel_id, case.name)


async def test_a_kernel_at_rest_with_library_threads_is_suspended(
    jp_fetch, connect, manager, monitor, table
):
    kernel_id = await start_kernel(jp_fetch)
    client = await connect(kernel_id)
    await run(client, SETUP)
    for case in IDLE:
        await run(client, case.start, ok=not case.name.startswith("a cell that raised"))
        status = await at_rest(monitor, kernel_id, case.name)
        assert status.blocked_by == [], (case.name, status.blocked_by)
        table.add(case.name, "idle", f"suspends in {status.seconds_until_suspend:.0f} s")
    # the variables these leave (threads, figures, widgets) cannot all be saved: accept it
    manager.policy.on_unsaveable = "suspend"
    manager.policy.idle_timeout = 0.5
    km = manager.kernel_manager

    async def suspended() -> bool:
        await monitor.tick()
        return km.is_suspended(kernel_id)

    await poll(suspended, timeout=60, what="the suspension")
    table.add("all of the above at once", "suspended", "Suspended · run a cell to resume")
