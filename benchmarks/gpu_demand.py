"""More notebook users than GPU memory: a kernel that demands a GPU gets it by the
suspension of idle kernels (GPU demand, DESIGN section 5), through a real jupyter server.

On one GPU whose free memory is BUDGET (a filler process holds the rest, and counts as
used, as any process not of the server would):

- baseline: a fresh kernel on the empty GPU asks for half of BUDGET
  (``jupyter_ckpt.kernel.request_gpu``), allocates it and prints a result; timed from
  its start (POST /api/kernels) to that result;
- three kernels each hold a third of BUDGET and go idle;
- a fourth kernel runs the baseline's cell: the server suspends the longest-idle kernels
  it needs (two) and the cell goes on; timed the same way;
- the suspended kernels are used again: each restore is itself a demand (the kernels
  idle longest by then make room), and their tensors come back with the same checksum.

    python benchmarks/gpu_demand.py --budget 12G
    python benchmarks/gpu_demand.py --cpu     # the same path, NVML played by a stand-in

With ``--cpu`` the kernels hold numpy arrays and say how much "GPU memory" they hold in
files that the test suite's NVML stand-in (tests/server/server_helpers.py ``FakeNvml``,
installed in the server as ``pynvml``) reports as one GPU's processes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import human_size, parse_size, report_check, report_figure
from benchserver import Server
from gpu_roundtrip import NO_GPU, cuda_device_count

ROOT = Path(__file__).resolve().parent.parent
MIB = 2**20
# what a CUDA context and the allocator's rounding take per process, left out of a third
CONTEXT_MARGIN = 768 * MIB

POLICY = """
c.SuspendPolicy.gpu_only = True
c.SuspendPolicy.check_interval = 2  # the GPU utilization window: the allocations end in it
c.SuspendPolicy.min_idle_on_demand = 3
c.SuspendPolicy.demand_timeout = 300
"""

# The NVML stand-in for --cpu: one GPU of `total` bytes; its processes are the files in
# `held` (name: pid, text: bytes), which the kernels write for themselves.
STAND_IN = """
import os, sys
sys.path.insert(0, {tests!r})
from server_helpers import FakeNvml


class FileNvml(FakeNvml):
    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle):
        self.processes = {{0: [
            (int(name), int(open(os.path.join({held!r}, name)).read()))
            for name in os.listdir({held!r})
        ]}}
        return super().nvmlDeviceGetComputeRunningProcesses_v2(handle)


nvml = FileNvml({{}}, live=True)
nvml.total = {total}
sys.modules["pynvml"] = nvml
"""

HOLD = {
    "gpu": """
import json, torch
x = torch.full(({n},), {k}, dtype=torch.uint8, device="cuda:0")
torch.cuda.synchronize()
""",
    "cpu": """
import json, os, pathlib, numpy as np
x = np.full({n}, {k}, dtype=np.uint8)
pathlib.Path({held!r}, str(os.getpid())).write_text(str({n}))
""",
}
CHECK = {
    # summed in slices: a sum in int64 of the whole would take 8x its memory on the GPU
    "gpu": (
        "total = sum(int(s.sum(dtype=torch.int64)) for s in x.split(1 << 26))\n"
        "print(json.dumps({{'sum': total, 'device': str(x.device)}}))"
    ),
    "cpu": (
        "pathlib.Path({held!r}, str(os.getpid())).write_text(str(x.nbytes))\n"
        "print(json.dumps({{'sum': int(x.sum(dtype=np.int64)), 'device': 'cpu'}}))"
    ),
}
DEMAND = "from jupyter_ckpt.kernel import request_gpu\nrequest_gpu({mib}, device=0)\n"


async def run_cell(server: Server, kernel_id: str, code: str) -> tuple[float, str]:
    ws = await server.connect(kernel_id)
    try:
        return await server.execute(ws, code)
    finally:
        ws.close()


async def first_result(server: Server, cell: str) -> tuple[str, float]:
    """Start a kernel and run ``cell``: (its id, seconds from the start to the result)."""
    started = time.perf_counter()
    kernel_id = (await server.api("POST", "kernels", {"name": "python3"}))["id"]
    await run_cell(server, kernel_id, cell)
    return kernel_id, time.perf_counter() - started


def filler(nbytes: int) -> subprocess.Popen[str]:
    """A process (no kernel of the server's) holding ``nbytes`` of GPU 0."""
    code = (
        "import sys, torch\n"
        f"x = torch.empty({nbytes}, dtype=torch.uint8, device='cuda:0')\n"
        "torch.cuda.synchronize(); print('ready', flush=True); sys.stdin.read()"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    return process


async def run(budget: int, mode: str, tmp: Path) -> bool:
    held = tmp / "held"
    held.mkdir()
    config = POLICY
    filling = None
    if mode == "cpu":
        base = 1 << 30  # what the stand-in's GPU 0 holds for no one
        tests = str(ROOT / "tests" / "server")
        config += STAND_IN.format(tests=tests, held=str(held), total=base + budget)
    else:
        import torch

        free, _total = torch.cuda.mem_get_info(0)
        if free < budget + 2 * CONTEXT_MARGIN:
            raise SystemExit(f"GPU 0 has {human_size(free)} free, less than the budget")
        filling = filler(free - budget - CONTEXT_MARGIN)  # and its own CUDA context
    third = budget // 3 - (CONTEXT_MARGIN if mode == "gpu" else MIB)
    half_mib = budget // 2 // MIB
    ask = DEMAND.format(mib=half_mib) + HOLD[mode].format(n=half_mib * MIB, k=9, held=str(held))
    ask += CHECK[mode].format(held=str(held))
    server = Server(tmp, config)
    try:
        await server.wait_ready()
        fresh_id, fresh_s = await first_result(server, ask)
        await server.api("DELETE", f"kernels/{fresh_id}")
        holders = []
        for k in (1, 2, 3):
            kernel_id = (await server.api("POST", "kernels", {"name": "python3"}))["id"]
            await run_cell(server, kernel_id, HOLD[mode].format(n=third, k=k, held=str(held)))
            holders.append(kernel_id)
        # idle past min_idle_on_demand and the GPU utilization window
        await asyncio.sleep(4)
        _, demand_s = await first_result(server, ask)
        kernels = {k["id"]: k for k in await server.api("GET", "kernels")}
        suspended = [k for k in holders if kernels[k].get("ckpt", {}).get("state") == "suspended"]
        # the state of the suspended kernels comes back (their restores demand the GPU)
        await asyncio.sleep(4)
        back = {}
        for k in suspended:
            _, out = await run_cell(server, k, CHECK[mode].format(held=str(held)))
            back[k] = json.loads(out.strip().splitlines()[-1])
        status = await server.api("GET", "ckpt/status")
    finally:
        server.stop()
        if filling is not None:
            filling.kill()
    expected = {k: third * (i + 1) for i, k in enumerate(holders)}
    same = all(b["sum"] == expected[k] for k, b in back.items())
    on_gpu = all(b["device"] == ("cpu" if mode == "cpu" else "cuda:0") for b in back.values())
    print(f"GPU memory free (budget)        {human_size(budget)}")
    print(f"three idle kernels each hold    {human_size(third)} (+ their CUDA context)")
    print(f"the fourth demands              {human_size(half_mib * MIB)}")
    print(f"fresh kernel, empty GPU         {fresh_s:.2f} s to its first result")
    print(f"fourth kernel, full GPU         {demand_s:.2f} s to its first result")
    print(f"kernels suspended for it        {len(suspended)} of 3 (the longest idle)")
    print(f"their state back after restore  {'same' if same and on_gpu else 'DIFFERENT'}")
    print(f"demand queue at the end         {status['gpu_demand']}")
    report_figure(
        "gpu_demand",
        f"first result of a kernel demanding {human_size(half_mib * MIB)} on a full GPU",
        demand_s,
        "a fresh kernel's first result on an empty GPU",
        fresh_s,
    )
    checks = {
        "exactly the two longest-idle kernels were suspended": suspended == holders[:2],
        "the suspended kernels' tensors came back with the same checksum": same and on_gpu,
    }
    for check, ok in checks.items():
        report_check("gpu_demand", check, ok)
    return all(checks.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=parse_size, help="GPU memory free (default 12G)")
    parser.add_argument("--cpu", action="store_true", help="a dry run with the NVML stand-in")
    args = parser.parse_args()
    mode = "cpu" if args.cpu else "gpu"
    budget = args.budget or parse_size("96M" if args.cpu else "12G")
    if mode == "gpu":
        import torch

        if cuda_device_count(torch, "gpu_demand", cpu=False) is None:
            sys.exit(NO_GPU)
    with tempfile.TemporaryDirectory() as tmp:
        ok = asyncio.run(run(budget, mode, Path(tmp)))
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
