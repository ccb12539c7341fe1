"""A kernel that keeps a real GPU busy from a thread is not suspended; then it is.

On a node with an NVIDIA GPU and CUDA torch: starts a real ipykernel, runs a cell that
starts a thread looping matrix products on the GPU for ``--seconds`` and returns (the
kernel is idle as Jupyter sees it), and drives the idle monitor with a short idle timeout:

- while the loop runs, NVML's utilization path must report the kernel's GPU busy
  ("GPU 0 is 97% busy") and the monitor must not suspend the kernel;
- with the thread check turned off, the GPU check alone must still keep it;
- once the loop ends, the kernel must be suspended within a few idle timeouts.

Exits 0 when every check holds, 1 naming the one that failed, 2 when the node has no GPU.

    python benchmarks/gpu_idle_work.py
    python benchmarks/gpu_idle_work.py --seconds 20 --idle-timeout 3
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

from benchlib import report_check
from jupyter_ckpt_server.kernelmanager import CkptKernelManager
from jupyter_ckpt_server.manager import CkptManager
from jupyter_ckpt_server.monitor import IdleMonitor
from jupyter_ckpt_server.policy import SuspendPolicy

from jupyter_ckpt.gpu import GpuProbe
from jupyter_ckpt.store import ImageStore

CHECK = "a kernel busy on the GPU from a thread is kept, then suspended once idle"
LOOP = """
import threading, time, torch
a = torch.rand(4096, 4096, device="cuda")
def _cuda_loop(seconds={seconds}):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(20):
            b = a @ a
        torch.cuda.synchronize()
threading.Thread(target=_cuda_loop).start()
"""


def fail(message: str) -> None:
    report_check("gpu_idle_work", CHECK, False)
    print(f"FAILED: {message}")
    sys.exit(1)


async def run(seconds: float, idle_timeout: float, tmp: Path) -> None:
    probe = GpuProbe()
    node = probe.node()
    if not node["available"] or not node["gpus"]:
        print(f"no NVIDIA GPU here ({node.get('reason')}); nothing to check")
        sys.exit(2)
    print(f"GPU 0: {node['gpus'][0]['name']}, driver {node['driver']}")
    km = CkptKernelManager(root_dir=str(tmp))
    store = ImageStore(url=str(tmp / "store"), secret_file=str(tmp / "secret"))
    policy = SuspendPolicy(idle_timeout=idle_timeout, check_interval=0.5, gpu_only=True)
    manager = CkptManager(policy=policy, store=store, kernel_manager=km, probe=probe)
    # the server's wiring: the lifecycles own the kernels' state (a suspend needs them)
    env = {"JUPYTER_CKPT_STORE": store.url, "JUPYTER_CKPT_SECRET_FILE": str(tmp / "secret")}
    km.attach(manager.lifecycles, env)
    monitor = IdleMonitor(manager)
    kernel_id = await km.start_kernel(kernel_name="python3")
    try:
        await manager.rpc.ready(kernel_id)
        code = LOOP.format(seconds=seconds)
        started = time.monotonic()
        await manager.kernel_call(kernel_id, "describe([])", 30)  # the kernel answers
        reply = await manager.rpc.request(kernel_id, "execute", 120, code=code, silent=False)
        if reply.get("status") != "ok":
            fail(f"the CUDA loop did not start: {reply.get('evalue')}")
        busy_seen, gpu_alone = [], False
        while time.monotonic() - started < seconds - 1:
            if await monitor.tick():
                fail(f"suspended {time.monotonic() - started:.1f} s into {seconds} s of GPU work")
            (a,) = await monitor.assess([kernel_id])
            busy_seen += [b for b in a.blocked_by if b.startswith("GPU ")]
            # the loop's thread, measured: CUDA's synchronize spins or sleeps by driver setting
            print(f"threads: {[b for b in a.background_work if 'thread' in b]}")
            if busy_seen and not gpu_alone:  # the GPU check alone also keeps it
                policy.background_work = ["gpu"]
                (b,) = await monitor.assess([kernel_id])
                gpu_alone = any(w.startswith("GPU ") for w in b.background_work)
                print(f"GPU check alone: {b.background_work}")
                policy.background_work = ["threads", "tasks", "children", "gpu"]
            await asyncio.sleep(0.5)
        if not busy_seen:
            usage = manager.gpu_usage(kernel_id, probe.snapshot(2))
            fail(f"NVML never reported the kernel's GPU busy (usage: {usage.to_json()})")
        if not gpu_alone:
            fail("with background_work=['gpu'] the busy GPU was not seen")
        print(f"while working: {sorted(set(busy_seen))}")
        deadline = time.monotonic() + seconds + 10 * idle_timeout + 30
        while not km.is_suspended(kernel_id):
            if time.monotonic() > deadline:
                (a,) = await monitor.assess([kernel_id])
                fail(f"not suspended after the work ended: {a.blocked_by}")
            await monitor.tick()
            await asyncio.sleep(0.5)
        print(f"suspended {time.monotonic() - started:.1f} s after the {seconds} s loop started")
        report_check("gpu_idle_work", CHECK, True)
        print("OK")
    finally:
        await km.shutdown_all(now=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=12)
    parser.add_argument("--idle-timeout", type=float, default=2)
    parser.add_argument("--cpu", action="store_true", help="say that there is no CPU path")
    args = parser.parse_args()
    if args.cpu:  # the check is NVML's view of a busy GPU: no stand-in would test it
        print("gpu_idle_work has no CPU path: it needs NVML and a GPU kept busy")
        sys.exit(2)
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(run(args.seconds, args.idle_timeout, Path(tmp)))


if __name__ == "__main__":
    main()
