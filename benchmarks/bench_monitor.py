"""Cost of one idle-monitor tick with many kernels (DESIGN section 8: under 1% of a core
with 100 kernels at the default check_interval).

Kernels are stand-ins holding real processes (``sleep``), so the /proc scan sees a real
process table; NVML is answered by a stand-in reporting GPU memory for half of them, as on
a busy GPU node. Nothing here starts a server or a kernel: the tick is measured alone.

    python benchmarks/bench_monitor.py --kernels 100 --ticks 50
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import tempfile
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from jupyter_ckpt_server.kernelmanager import CkptKernelManager
from jupyter_ckpt_server.manager import CkptManager
from jupyter_ckpt_server.monitor import IdleMonitor
from jupyter_ckpt_server.policy import SuspendPolicy

from jupyter_ckpt.gpu import GpuProbe
from jupyter_ckpt.store import ImageStore


class StandInNvml:
    """One GPU; every pid in ``holders`` holds 1 GiB."""

    def __init__(self, holders: list[int]) -> None:
        self.procs = [SimpleNamespace(pid=p, usedGpuMemory=1 << 30) for p in holders]

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
    )


async def measure(kernels: int, ticks: int, store_dir: Path) -> float:
    sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(kernels)]
    try:
        km = CkptKernelManager(root_dir=str(store_dir))
        for process in sleepers:
            km._kernels[str(uuid.uuid4())] = stand_in_kernel(process.pid)
        store = ImageStore(url=str(store_dir / "store"), secret_file=str(store_dir / "s"))
        manager = CkptManager(
            policy=SuspendPolicy(),  # idle_timeout 1800: nothing is due, pure monitoring cost
            store=store,
            kernel_manager=km,
            probe=GpuProbe(StandInNvml([p.pid for p in sleepers[::2]])),
        )
        monitor = IdleMonitor(manager)
        await monitor.tick()  # warm up (imports, first /proc scan)
        cpu = time.process_time()
        for _ in range(ticks):
            assert await monitor.tick() == []
        return (time.process_time() - cpu) / ticks
    finally:
        for process in sleepers:
            process.kill()
            process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=100)
    parser.add_argument("--ticks", type=int, default=50)
    args = parser.parse_args()
    interval = SuspendPolicy().check_interval
    with tempfile.TemporaryDirectory() as tmp:
        per_tick = asyncio.run(measure(args.kernels, args.ticks, Path(tmp)))
    print(f"kernels            {args.kernels}")
    print(f"CPU per tick       {per_tick * 1000:.2f} ms")
    print(f"share of one core  {100 * per_tick / interval:.3f} % at check_interval={interval:g} s")


if __name__ == "__main__":
    main()
