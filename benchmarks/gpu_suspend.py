"""Suspend a GPU kernel through a real jupyter server and bring it back (DESIGN section 8).

Starts ``jupyter server`` with the jupyter_ckpt extension on a private store, starts a
kernel that holds SIZE of tensors on the GPU, then through the server's API:

- suspends it (POST /api/ckpt/kernels/{id}/suspend) and times the call;
- times until NVML no longer lists the kernel's process on the GPU (memory released);
- reconnects and runs a cell, which restores the kernel; times until the cell's reply,
  and checks the tensors came back on the GPU with the same checksum;
- compares the image write and restore throughput with the host<->device copy bandwidth
  measured in the same kernel, in the same run.

    python benchmarks/gpu_suspend.py --size 8G
    python benchmarks/gpu_suspend.py --size 256M --cpu   # the same path, no GPU
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

from benchlib import GB, human_size, parse_size, report_check, report_figure
from benchserver import Server
from gpu_roundtrip import NO_GPU, cuda_device_count

from jupyter_ckpt.gpu import GpuProbe

SETUP = """
import json, os, time, torch
device = {device!r}
n = {size} // 4 // 4
tensors = [torch.rand(n, device=device) for _ in range(4)]
checksum = float(sum(t.double().sum() for t in tensors))
bandwidth = {{}}
if device != "cpu":
    host = torch.empty({size} // 4, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty_like(host, device=device)
    for name, dst, src in (("h2d", dev, host), ("d2h", host, dev)):
        dst.copy_(src); torch.cuda.synchronize()
        t = time.perf_counter(); dst.copy_(src); torch.cuda.synchronize()
        bandwidth[name] = host.numel() / (time.perf_counter() - t)
    del host, dev, dst, src  # the loop's names hold the buffers too
    torch.cuda.empty_cache()
print(json.dumps({{"pid": os.getpid(), "checksum": checksum, "bandwidth": bandwidth}}))
"""
CHECK = (
    "print(json.dumps({'checksum': float(sum(t.double().sum() for t in tensors)), "
    "'devices': sorted({str(t.device) for t in tensors})}))"
)


async def execute(server: Server, kernel_id: str, code: str) -> tuple[float, str]:
    """Run a cell over a fresh websocket: (seconds until its reply, its stdout)."""
    ws = await server.connect(kernel_id)
    try:
        return await server.execute(ws, code)
    finally:
        ws.close()


async def run(size: int, device: str, tmp: Path) -> None:
    server = Server(tmp, f"c.SuspendPolicy.gpu_only = {device != 'cpu'}\n")
    try:
        await server.wait_ready()
        kernel_id = (await server.api("POST", "kernels", {"name": "python3"}))["id"]
        _, out = await execute(server, kernel_id, SETUP.format(device=device, size=size))
        facts = json.loads(out.strip().splitlines()[-1])
        probe = GpuProbe()

        started = time.perf_counter()
        suspended = await server.api("POST", f"ckpt/kernels/{kernel_id}/suspend", {})
        suspend_s = time.perf_counter() - started
        while facts["pid"] in probe.memory_by_pid():
            await asyncio.sleep(0.01)
        freed_s = time.perf_counter() - started

        restore_s, out = await execute(server, kernel_id, CHECK)
        back = json.loads(out.strip().splitlines()[-1])
        ok = abs(back["checksum"] - facts["checksum"]) <= 1e-6 * abs(facts["checksum"])
    finally:
        server.stop()

    nbytes = suspended["bytes"]
    print(f"device                    {device} ({', '.join(back['devices'])})")
    print(f"state                     {human_size(nbytes)} in {len(suspended['saved'])} vars")
    print(f"suspend (write + verify)  {suspend_s:.2f} s  {nbytes / suspend_s / GB:.2f} GB/s")
    print(f"  of which image write    {suspended['seconds']:.2f} s")
    print(f"until GPU memory is free  {freed_s:.2f} s")
    print(f"restore + first cell      {restore_s:.2f} s  {nbytes / restore_s / GB:.2f} GB/s")
    for name, rate in facts["bandwidth"].items():
        print(f"{name} copy bandwidth        {rate / GB:.2f} GB/s")
    print(f"checksum after restore    {'same' if ok else 'DIFFERENT'}")
    report_check("gpu_suspend", "tensors back on their device with the same checksum", ok)
    bandwidth = facts["bandwidth"]
    if bandwidth:  # on a GPU: against the bus, measured in the same kernel
        state = human_size(nbytes)
        for figure, seconds, copy in (
            (f"suspend of {state} until its GPU memory is free", freed_s, "d2h"),
            (f"restore of {state} and the first cell", restore_s, "h2d"),
        ):
            name = "device->host" if copy == "d2h" else "host->device"
            report_figure(
                "gpu_suspend", figure, seconds, f"pinned {name} copy", nbytes / bandwidth[copy]
            )
    if not ok:
        raise SystemExit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=parse_size, default=parse_size("4G"))
    parser.add_argument("--device", default="cuda:0", help="cuda:N, or cpu for a dry run")
    parser.add_argument("--cpu", action="store_true", help="the same as --device cpu")
    args = parser.parse_args()
    device = "cpu" if args.cpu else args.device
    if device != "cpu":
        import torch

        if cuda_device_count(torch, "gpu_suspend", cpu=False) is None:
            sys.exit(NO_GPU)
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(run(args.size, device, Path(tmp)))


if __name__ == "__main__":
    main()
