"""Soak: one kernel suspended and restored many times through the real server. Every
cycle must give back what it took (file descriptors, threads, memory), and the kernel's
state must be whole at the end."""

from __future__ import annotations

import gc
import json
import time
from statistics import mean

import psutil
from deadlines import scaled
from server_helpers import start_session, text_of

CYCLES = 20  # a kernel starts on every restore: about 2 min on a loaded 2-core machine
WINDOW = 6  # cycles averaged at the start and at the end
# Server memory a cycle may add (logs kept by the test run, allocator slack); a leak of
# a kernel's client or an image's bytes per cycle is far more.
RSS_PER_CYCLE = 512 << 10


async def test_suspend_restore_cycles_keep_server_resources_flat(jp_fetch, connect, manager):
    # jupyter_server keeps every websocket connection, and the kernel manager it served,
    # until its kernel_info wait times out (a timer it never cancels; 60 s by default):
    # a short wait lets the figures show what a cycle keeps for good, not for a minute
    manager.kernel_manager.kernel_info_timeout = 2
    _, kernel_id = await start_session(jp_fetch)
    client = await connect(kernel_id)
    reply, _ = await client.execute("import numpy as np\nw = np.arange(100_000)\nn = 0")
    assert reply["status"] == "ok"
    server = psutil.Process()  # the server runs in this process
    figures = []
    started = time.perf_counter()
    for _ in range(CYCLES):
        r = await jp_fetch("api", "ckpt", "kernels", kernel_id, "suspend", method="POST", body="")
        assert json.loads(r.body)["kernel_id"] == kernel_id
        client.close()
        client = await connect(kernel_id)  # the first message restores the kernel
        reply, _ = await client.execute("n += 1")
        assert reply["status"] == "ok", reply
        # a standby still starting holds its start's resources for a moment: count what
        # the cycle keeps once it is up
        await manager.lifecycles.standby.started("python3", scaled(60))
        gc.collect()
        figures.append((server.num_fds(), server.num_threads(), server.memory_info().rss))
    seconds = time.perf_counter() - started

    _, outputs = await client.execute("print(n, int(w.sum()))")
    assert text_of(outputs) == f"{CYCLES} {sum(range(100_000))}\n"
    assert manager.restore_count == CYCLES
    first = [mean(f[i] for f in figures[:WINDOW]) for i in range(3)]
    last = [mean(f[i] for f in figures[-WINDOW:]) for i in range(3)]
    print(
        f"\n{CYCLES} suspend/restore cycles in {seconds:.0f} s; server, first vs last "
        f"{WINDOW} cycles: fds {first[0]:.1f} -> {last[0]:.1f}, threads {first[1]:.1f} -> "
        f"{last[1]:.1f}, RSS {first[2] / 2**20:.1f} -> {last[2] / 2**20:.1f} MiB"
    )
    # A leak of one per cycle would show as CYCLES - WINDOW more.
    assert last[0] <= first[0] + 3, "file descriptors grow with cycles"
    assert last[1] <= first[1] + 2, "threads grow with cycles"
    assert last[2] - first[2] <= RSS_PER_CYCLE * (CYCLES - WINDOW), "server memory grows"
