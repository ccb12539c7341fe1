"""Cost of one idle-monitor tick with many kernels (DESIGN section 8: under 1% of a core
with 100 kernels at the default check_interval), with and without the background-work
checks.

Kernels are stand-ins holding real processes: each a Python process with ``--threads``
threads (a kernel at rest has about ten: IOPub, heartbeat, control, history, ...), half
of them with a ``sleep`` child, so that the tick measures real threads' CPU times and I/O
counters and walks real process trees. NVML is answered by a stand-in reporting GPU
memory and utilization for half of them, as on a busy GPU node. The tick is measured
alone, on the stand-ins.

The kernel is asked (a silent call into a real kernel) only about threads found busy or
awake that it has not judged for good, at most ``MAX_ASKS_PER_TICK`` kernels per tick
(the stand-ins' threads sleep: a tick asks none of them, as with kernels at rest). The
call is measured on ``--real`` real ipykernel kernels, wired as in the server, and scaled
to the most kernels one tick asks: the worst case, every kernel starting work at once.
(The figure for every kernel asked in one tick is printed too.)

    python benchmarks/bench_monitor.py --kernels 100 --ticks 50 --real 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
from jupyter_ckpt_server import work
from jupyter_ckpt_server.kernelmanager import CkptKernelManager
from jupyter_ckpt_server.manager import CkptManager
from jupyter_ckpt_server.monitor import MAX_ASKS_PER_TICK, IdleMonitor
from jupyter_ckpt_server.policy import BACKGROUND_KINDS, SuspendPolicy

from jupyter_ckpt.gpu import GpuProbe
from jupyter_ckpt.store import ImageStore


class StandInNvml:
    """One GPU; every pid in ``holders`` holds 1 GiB and keeps it 50% busy."""

    def __init__(self, holders: list[int]) -> None:
        self.procs = [SimpleNamespace(pid=p, usedGpuMemory=1 << 30) for p in holders]
        self.samples = [
            SimpleNamespace(pid=p, timeStamp=time.time_ns() // 1000, smUtil=50) for p in holders
        ]

    def nvmlDeviceGetProcessUtilization(self, handle: int, since: int) -> list[Any]:
        return self.samples

    def nvmlInit(self) -> None: ...

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: int) -> list[Any]:
        return self.procs

    def nvmlDeviceGetGraphicsRunningProcesses_v3(self, handle: int) -> list[Any]:
        return []


def stand_in_kernel(pid: int) -> Any:
    return SimpleNamespace(
        kernel_name="python3",
        last_activity=datetime.now(timezone.utc),
        execution_state="idle",
        kernel_spec=SimpleNamespace(metadata={}),
        provisioner=SimpleNamespace(pid=pid),
        # not in the stand-in's command line: every tick looks for the kernel below it
        connection_file=f"/nonexistent/kernel-{pid}.json",
    )


STAND_IN = """
import subprocess, sys, threading, time
for _ in range(int(sys.argv[1]) - 1):
    threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
if sys.argv[2] == "child":
    subprocess.Popen(["sleep", "600"])
time.sleep(600)
"""


def start_stand_ins(kernels: int, threads: int) -> list[subprocess.Popen[bytes]]:
    """Python processes with ``threads`` threads; half with a child process (as a kernel
    running a subprocess), half without."""
    return [
        subprocess.Popen(
            [sys.executable, "-S", "-c", STAND_IN, str(threads), "child" if i % 2 else "-"]
        )
        for i in range(kernels)
    ]


async def measure(
    kernels: int, threads: int, ticks: int, store_dir: Path, kinds: list[str]
) -> float:
    """CPU seconds per tick with ``background_work=kinds``."""
    processes = start_stand_ins(kernels, threads)
    try:
        km = CkptKernelManager(root_dir=str(store_dir))
        for process in processes:
            km._kernels[str(uuid.uuid4())] = stand_in_kernel(process.pid)
        store = ImageStore(url=str(store_dir / "store"), secret_file=str(store_dir / "s"))
        manager = CkptManager(
            # idle_timeout 1800: nothing is due, pure monitoring cost
            policy=SuspendPolicy(background_work=kinds),
            store=store,
            kernel_manager=km,
            probe=GpuProbe(StandInNvml([p.pid for p in processes[::2]])),
        )
        monitor = IdleMonitor(manager)
        await monitor.tick()  # warm up (imports, first process-table pass)
        cpu = time.process_time()
        for _ in range(ticks):
            assert await monitor.tick() == []
        return (time.process_time() - cpu) / ticks
    finally:
        for process in processes:
            with contextlib.suppress(psutil.Error):
                for child in psutil.Process(process.pid).children():
                    child.kill()
            process.kill()
            process.wait()


async def kernel_side_cost(real: int, calls: int, store_dir: Path) -> tuple[float, float]:
    """(server CPU seconds, wall seconds) of one call that asks a kernel to name its busy
    threads (here: its main thread and its pending tasks), on real kernels."""
    km = CkptKernelManager(root_dir=str(store_dir))
    store = ImageStore(url=str(store_dir / "store"), secret_file=str(store_dir / "s"))
    manager = CkptManager(policy=SuspendPolicy(), store=store, kernel_manager=km)
    km.attach(manager.lifecycles, {})  # the server's wiring: its own iopub watch too
    ids = [await km.start_kernel(kernel_name="python3") for _ in range(real)]
    try:
        pids = {k: manager.kernel_pid(k) or 0 for k in ids}

        def ask(kernel_id: str) -> Any:
            return work.ask_kernel(manager, kernel_id, manager.policy, [pids[kernel_id]])

        for kernel_id in ids:
            await manager.rpc.ready(kernel_id)
            await manager.kernel_call(kernel_id, "describe([])", 60)  # imports, once
            answer = await ask(kernel_id)
            assert answer == {"threads": {}, "tasks": [], "woken_tasks": []}, answer
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(calls):
            await asyncio.gather(*(ask(k) for k in ids))
        n = calls * real
        return (time.process_time() - cpu) / n, (time.perf_counter() - wall) / calls
    finally:
        await km.shutdown_all(now=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=100)
    parser.add_argument("--ticks", type=int, default=50)
    parser.add_argument("--threads", type=int, default=10, help="threads per stand-in")
    parser.add_argument("--real", type=int, default=3, help="real kernels for the call cost")
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    interval = SuspendPolicy().check_interval
    with tempfile.TemporaryDirectory() as tmp:
        kinds = list(BACKGROUND_KINDS)
        before = asyncio.run(measure(args.kernels, args.threads, args.ticks, Path(tmp), []))
        after = asyncio.run(measure(args.kernels, args.threads, args.ticks, Path(tmp), kinds))
        call_cpu, call_wall = asyncio.run(kernel_side_cost(args.real, args.calls, Path(tmp)))
    asked = min(args.kernels, MAX_ASKS_PER_TICK)
    worst = after + asked * call_cpu
    everyone = after + args.kernels * call_cpu

    def tick(label: str, seconds: float) -> None:
        share = 100 * seconds / interval
        print(f"{label:<40}{seconds * 1000:8.2f} ms CPU  {share:.3f} % of a core")

    print(f"kernels                                 {args.kernels}")
    tick("tick, checks off (background_work=[])", before)
    print(f"threads per kernel                      {args.threads}")
    tick("tick, all checks (nothing busy or due)", after)
    print(f"kernel-side check, per kernel           {call_cpu * 1000:8.2f} ms CPU (server)")
    print(f"kernel-side check, {args.real} at once, wall       {call_wall * 1000:8.2f} ms")
    tick(f"tick, {asked} kernels asked (worst case)", worst)
    tick(f"tick, if all {args.kernels} were asked", everyone)
    print(f"ratio nothing due / checks off          {after / before:8.2f}")
    print(f"ratio worst case / checks off           {worst / before:8.2f}")
    print(f"check_interval                          {interval:g} s")


if __name__ == "__main__":
    main()
