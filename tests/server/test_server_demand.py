"""GPU demand on real kernels, with the NVML stand-in as the GPUs: which kernels are
suspended to make room, the queue's order and what its users see, and the metrics."""

from __future__ import annotations

import asyncio
import json
import os
import re
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from deadlines import scaled
from jupyter_ckpt_server.demand import GpuDemand
from server_helpers import (
    FakeNvml,
    fails_with,
    next_event,
    poll,
    python_kernelspec,
    text_of,
)

from jupyter_ckpt.errors import GpuUnavailable
from jupyter_ckpt.gpu import GpuProbe

GiB = 1 << 30


@pytest.fixture
def demand(jp_serverapp: Any) -> GpuDemand:
    return jp_serverapp.web_app.settings["jupyter_ckpt_demand"]


@pytest.fixture
def gpus(manager: Any) -> FakeNvml:
    """Two 5 GiB GPUs (1 GiB and 2 GiB of each held by no kernel), nothing else on them."""
    nvml = FakeNvml({0: [], 1: []}, live=True)
    nvml.total = 5 * GiB
    manager.probe = GpuProbe(nvml)
    manager.policy.min_idle_on_demand = 120
    return nvml


async def start(jp_fetch: Any, name: str = "python3") -> str:
    r = await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": name}))
    return json.loads(r.body)["id"]


def hold(nvml: FakeNvml, manager: Any, kernel_id: str, nbytes: int, device: int = 0) -> None:
    """The kernel's process holds ``nbytes`` on ``device`` (until it ends)."""
    nvml.processes[device].append((manager.kernel_pid(kernel_id), nbytes))


def idle_since(manager: Any, kernel_id: str, seconds: float) -> None:
    """The kernel's last message was ``seconds`` ago (the monitor's idle clock)."""
    kernel = manager.kernel_manager.get_kernel(kernel_id)
    kernel.last_activity = datetime.now(timezone.utc) - timedelta(seconds=seconds)


async def metric(jp_fetch: Any, name: str, **labels: str) -> float:
    """A sample's value on the server's /metrics (0 if it has none yet)."""
    text = (await jp_fetch("metrics")).body.decode()
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    pattern = rf"^{re.escape(name)}(?:\{{([^}}]*)\}})? (\S+)$"
    for line in text.splitlines():
        match = re.match(pattern, line)
        if match and ",".join(sorted((match.group(1) or "").split(","))) == wanted:
            return float(match.group(2))
    return 0.0


async def above(jp_fetch: Any, name: str, value: float) -> bool:
    return await metric(jp_fetch, name) > value


async def test_a_demand_suspends_only_the_longest_idle_kernels_it_needs(
    jp_fetch, connect, manager, demand, gpus, events, tmp_path
):
    oldest, busy, young = [await start(jp_fetch) for _ in range(3)]
    for kernel_id in (oldest, busy, young):
        hold(gpus, manager, kernel_id, GiB)
    gpus.processes[0].append((os.getpid(), GiB))  # a process that is no kernel of ours
    # GPU 0 is full: 1 GiB before, 3 kernels and that process 1 GiB each, of 5 GiB
    idle_since(manager, oldest, 1000)
    idle_since(manager, young, 200)
    # the busy one has been idle longest, but runs a cell until the test lets it end
    release = tmp_path / "release"
    client = await connect(busy)
    code = f"import os, time\nwhile not os.path.exists({str(release)!r}): time.sleep(0.01)"
    cell = client.send("execute_request", {"code": code, "silent": False})
    kernel = manager.kernel_manager.get_kernel(busy)
    await poll(lambda: kernel.execution_state == "busy", what="the kernel to be busy")
    idle_since(manager, busy, 5000)
    before = {
        "suspends": await metric(
            jp_fetch, "jupyter_ckpt_suspends_total", reason="demand", status="success"
        ),
        "freed": await metric(
            jp_fetch, "jupyter_ckpt_gpu_memory_freed_bytes_total", reason="demand"
        ),
        "granted": await metric(
            jp_fetch, "jupyter_ckpt_demand_wait_seconds_count", outcome="granted"
        ),
        "refused": await metric(
            jp_fetch, "jupyter_ckpt_demand_wait_seconds_count", outcome="refused"
        ),
    }

    # 1 GiB lacking: the longest idle kernel is enough, and the only one to go
    assert await demand.request("new-1", GiB, "kernel", device=0) == 0
    assert manager.kernel_manager.is_suspended(oldest)
    assert manager.kernel_manager.is_running(busy) and manager.kernel_manager.is_running(young)
    idle_since(manager, young, 30)  # now under min_idle_on_demand
    suspended = await next_event(events, "suspend", kernel_id=oldest)
    assert (suspended["status"], suspended["trigger"]) == ("success", "demand")

    # the freed GiB is set aside for new-1: another demand finds no room, and neither the
    # busy kernel nor the young one is suspended for it
    manager.policy.demand_timeout = 1
    with pytest.raises(GpuUnavailable) as refused:
        await demand.request("new-2", GiB, "kernel", device=0)
    line = str(refused.value)
    assert "\n" not in line and "needs 1024 MiB on GPU 0, 0 MiB free" in line, line
    assert f"kernel {busy[:8]} holds 1024 MiB (the kernel is busy)" in line, line
    young_why = rf"kernel {young[:8]} holds 1024 MiB \(idle 3\d s, under min_idle_on_demand=120\)"
    assert re.search(young_why, line), line
    assert manager.kernel_manager.is_running(busy) and manager.kernel_manager.is_running(young)

    # the young kernel passes the floor: now it is the one to go
    idle_since(manager, young, 200)
    manager.policy.demand_timeout = 60
    assert await demand.request("new-3", GiB, "kernel", device=0) == 0
    assert manager.kernel_manager.is_suspended(young)
    assert manager.kernel_manager.is_running(busy), "a busy kernel is never suspended"
    assert [e["kernel_id"] for e in events if e["action"] == "suspend"] == [oldest, young]

    after_suspends = await metric(
        jp_fetch, "jupyter_ckpt_suspends_total", reason="demand", status="success"
    )
    assert after_suspends - before["suspends"] == 2
    freed = await metric(jp_fetch, "jupyter_ckpt_gpu_memory_freed_bytes_total", reason="demand")
    assert freed - before["freed"] == 2 * GiB
    granted = await metric(jp_fetch, "jupyter_ckpt_demand_wait_seconds_count", outcome="granted")
    refused_count = await metric(
        jp_fetch, "jupyter_ckpt_demand_wait_seconds_count", outcome="refused"
    )
    assert (granted - before["granted"], refused_count - before["refused"]) == (2, 1)
    assert await metric(jp_fetch, "jupyter_ckpt_demand_queue_length") == 0
    assert (
        await metric(jp_fetch, "jupyter_ckpt_suspend_duration_seconds_count", reason="demand") >= 2
    )
    await poll(lambda: above(jp_fetch, "jupyter_ckpt_store_images", 1), what="the store's images")
    release.touch()
    assert (await client.reply_to(cell))["content"]["status"] == "ok"


async def test_the_queue_is_first_come_first_served_one_place_per_user(
    jp_fetch, manager, demand, gpus
):
    gpus.processes[0].append((os.getpid(), 4 * GiB))  # GPU 0 full, by no kernel of ours
    gpus.processes[1].append((os.getpid(), 3 * GiB))  # GPU 1 too
    manager.policy.demand_timeout = 600
    waits = {
        kernel_id: asyncio.ensure_future(demand.request(kernel_id, GiB, "kernel", user, device=0))
        for kernel_id, user in [("a1", "ann"), ("b1", "bob"), ("a2", "ann"), ("c1", "cat")]
    }
    other_gpu = asyncio.ensure_future(demand.request("d1", GiB, "kernel", "dan", device=1))
    await poll(lambda: demand.status_of("d1") is not None, what="the demands to queue")
    # ann's second demand waits behind the other users' first ones
    assert demand.to_json()["queues"] == {"0": ["a1", "b1", "c1", "a2"], "1": ["d1"]}
    assert demand.status_of("c1")["message"] == "Waiting for a GPU: 2 ahead of you"
    assert demand.status_of("a2")["ahead"] == 3
    assert demand.status_of("d1")["message"] == "Waiting for a GPU: 0 ahead of you"
    assert await metric(jp_fetch, "jupyter_ckpt_demand_queue_length") == 5

    # one GiB comes free on GPU 0: the first in line gets it, no one jumps ahead
    gpus.processes[0] = [(os.getpid(), 3 * GiB)]
    assert await asyncio.wait_for(waits["a1"], 30) == 0
    await demand.serve()
    assert not any(waits[k].done() for k in ("b1", "a2", "c1"))
    assert demand.to_json()["queues"]["0"] == ["b1", "c1", "a2"]
    assert demand.status_of("a2")["message"] == "Waiting for a GPU: 2 ahead of you"
    # the other process ends: room for all three (a1's GiB is still set aside)
    gpus.processes[0] = []
    gpus.processes[1] = []
    for kernel_id in ("b1", "c1", "a2"):
        assert await asyncio.wait_for(waits[kernel_id], 30) == 0
    assert await asyncio.wait_for(other_gpu, 30) == 1
    assert demand.to_json()["queues"] == {}


async def test_two_demands_at_once_are_not_given_the_same_memory(manager, demand, gpus):
    # 4 GiB free on GPU 0: room for one of two 3 GiB demands
    first, second = (
        asyncio.ensure_future(demand.request(k, 3 * GiB, "kernel", k, device=0)) for k in "xy"
    )
    done, waiting = await asyncio.wait([first, second], timeout=30, return_when="FIRST_COMPLETED")
    assert len(done) == 1 and len(waiting) == 1
    await demand.serve()
    assert not waiting.pop().done(), "the memory granted to the first is set aside"
    # the first one's kernel ends without allocating: its memory is free again
    demand.withdraw("x" if first in done else "y")
    assert await asyncio.wait_for(asyncio.gather(first, second), 30) == [0, 0]


async def test_a_demand_during_an_idle_suspend_waits_for_its_memory(
    jp_fetch, manager, monitor, demand, gpus, events
):
    kernel_id = await start(jp_fetch)
    hold(gpus, manager, kernel_id, 2 * GiB)  # GPU 0: 3 of 5 GiB used
    idle_since(manager, kernel_id, 1000)
    manager.policy.idle_timeout = 500
    recorded, go_on = asyncio.Event(), asyncio.Event()

    async def step(name: str, kid: str) -> None:
        if name == "record":
            recorded.set()
            await go_on.wait()

    manager.step_hook = step
    idle_tick = asyncio.ensure_future(monitor.tick())
    await asyncio.wait_for(recorded.wait(), 60)
    wait = asyncio.ensure_future(demand.request("new", 3 * GiB, "kernel", device=0))
    await demand.serve()
    assert not wait.done(), "the kernel being suspended is not suspended twice"
    go_on.set()
    assert await idle_tick == [kernel_id]
    assert await asyncio.wait_for(wait, 30) == 0
    suspends = [e for e in events if e["action"] == "suspend"]
    assert [(e["trigger"], e["status"]) for e in suspends] == [("idle", "success")]


async def test_a_restore_waits_in_the_queue_then_gets_its_memory(
    jp_fetch, connect, manager, demand, gpus
):
    kernel_id = await start(jp_fetch)
    client = await connect(kernel_id)
    await client.execute("weights = 41")
    hold(gpus, manager, kernel_id, 3 * GiB)
    await manager.suspend(kernel_id)
    assert manager.records.get(kernel_id)["gpu"]["by_device"] == {"0": 3 * GiB}
    gpus.processes[0].append((os.getpid(), 2 * GiB))  # GPU 0: 2 GiB free of the 3 needed
    released_before = await metric(jp_fetch, "jupyter_ckpt_gpu_seconds_released_total")
    labels = {"reason": "message", "status": "success"}
    restores_before = await metric(jp_fetch, "jupyter_ckpt_restores_total", **labels)

    client = await connect(kernel_id)
    cell = client.send("execute_request", {"code": "weights + 1", "silent": False})

    async def waiting() -> dict[str, Any] | None:
        r = await jp_fetch("api", "ckpt", "status", params={"kernel_id": kernel_id})
        return json.loads(r.body)["kernels"][0]["gpu_demand"]

    place = await poll(waiting, what="the restore to wait for a GPU")
    assert (place["message"], place["source"], place["bytes"]) == (
        "Waiting for a GPU: 0 ahead of you",
        "restore",
        3 * GiB,
    )
    assert manager.kernel_manager.is_suspended(kernel_id)
    # its GPU-seconds count while it stays suspended, not only once it is back
    await poll(
        lambda: above(jp_fetch, "jupyter_ckpt_gpu_seconds_released_total", released_before),
        what="the GPU-seconds released so far",
    )
    released_while_suspended = await metric(jp_fetch, "jupyter_ckpt_gpu_seconds_released_total")
    gpus.processes[0] = [(os.getpid(), GiB)]  # the other process gives 1 GiB back
    reply = await client.reply_to(cell)
    assert reply["content"]["status"] == "ok"
    result = await client.message(lambda m: m["header"]["msg_type"] == "execute_result")
    assert result["content"]["data"]["text/plain"] == "42"
    released = await metric(jp_fetch, "jupyter_ckpt_gpu_seconds_released_total")
    assert released > released_while_suspended
    restores = await metric(jp_fetch, "jupyter_ckpt_restores_total", **labels)
    assert restores == restores_before + 1


async def test_a_shutdown_ends_a_restore_s_wait_for_gpu_memory(
    jp_fetch, connect, manager, demand, gpus
):
    """A user who gives up on a kernel waiting for GPU memory is not kept waiting behind
    the queue: the shutdown withdraws the demand at once."""
    kernel_id = await start(jp_fetch)
    await (await connect(kernel_id)).execute("weights = 41")
    hold(gpus, manager, kernel_id, 3 * GiB)
    await manager.suspend(kernel_id)
    gpus.processes[0].append((os.getpid(), 4 * GiB))  # nothing suspendable makes room
    manager.policy.demand_timeout = 600
    client = await connect(kernel_id)
    client.send("execute_request", {"code": "weights + 1", "silent": False})
    await poll(lambda: demand.status_of(kernel_id), what="the restore to wait for a GPU")

    await asyncio.wait_for(
        jp_fetch("api", "kernels", kernel_id, method="DELETE"), scaled(30)
    )  # fmt: skip
    assert kernel_id not in manager.kernel_manager
    assert (demand.status_of(kernel_id), demand.to_json()) == (None, {"queues": {}})


async def test_a_resume_waits_for_the_memory_its_image_held(
    jp_fetch, connect, manager, demand, gpus, monkeypatch
):
    source = await start(jp_fetch)
    await (await connect(source)).execute("weights = 41")
    body = json.dumps({"name": "weights"})
    await jp_fetch("api", "ckpt", "kernels", source, "checkpoint", method="POST", body=body)
    await jp_fetch("api", "kernels", source, method="DELETE")
    # the image's tensors lived on GPU 0 (the suite has no GPU to put them there)
    monkeypatch.setattr(
        "jupyter_ckpt_server.lifecycle.resume.image_device_bytes", lambda manifest: {"0": 3 * GiB}
    )
    gpus.processes[0].append((os.getpid(), 3 * GiB))  # 2 GiB free of the 3 needed
    manager.policy.demand_timeout = 600
    resume = asyncio.ensure_future(
        jp_fetch("api", "ckpt", "images", "weights", "resume", method="POST", body="{}")
    )
    waiting = await poll(
        lambda: next(iter(demand.to_json()["queues"].get("0", [])), None),
        what="the resume to wait for a GPU",
    )
    assert demand.status_of(waiting)["source"] == "restore"
    assert not resume.done()
    gpus.processes[0] = []
    answer = json.loads((await asyncio.wait_for(resume, scaled(60))).body)
    assert answer["kernel"]["id"] == waiting
    client = await connect(waiting)
    _, outputs = await client.execute("weights + 1")
    assert text_of(outputs) == "42"


async def test_the_kernel_asks_with_ckpt_gpu_and_sees_its_place(
    jp_fetch, connect, manager, demand, gpus
):
    gpus.processes[0].append((os.getpid(), 4 * GiB))
    manager.policy.demand_timeout = 600
    demand.start()  # reads the kernels' request files (as once the server has started)
    ahead = asyncio.ensure_future(demand.request("first", GiB, "kernel", "someone", device=0))
    kernel_id = await start(jp_fetch)
    client = await connect(kernel_id)
    code = "%load_ext jupyter_ckpt\n%ckpt gpu 1024 --device 0"
    cell = client.send("execute_request", {"code": code, "silent": False})

    async def place() -> Any:
        r = await jp_fetch("api", "ckpt", "status", params={"kernel_id": kernel_id})
        return json.loads(r.body)["kernels"][0]["gpu_demand"]

    assert (await poll(place, what="the kernel's demand"))["ahead"] == 1
    gpus.processes[0] = []
    assert await asyncio.wait_for(ahead, 30) == 0
    assert (await client.reply_to(cell))["content"]["status"] == "ok"
    await client.message(  # the cell's last output came before its idle, on iopub
        lambda m: (
            m["header"]["msg_type"] == "status"
            and m["content"]["execution_state"] == "idle"
            and m["parent_header"].get("msg_id") == cell
        )
    )
    printed = "".join(
        m["content"].get("text", "") for m in client.received if m["header"]["msg_type"] == "stream"
    )
    assert "Waiting for a GPU: 1 ahead of you" in printed
    assert "GPU memory free for this kernel: 1024 MiB on GPU 0" in printed
    assert await place() is None


async def test_a_kernel_spec_that_needs_a_gpu_waits_or_is_refused_with_the_reason(
    jp_fetch, jp_data_dir, manager, gpus
):
    spec = python_kernelspec(
        jp_data_dir,
        "gpu-python",
        "Python (GPU)",
        ["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
    )
    manager.policy.demand_kernel_specs = {spec: 8 * 1024}  # more than a GPU has
    manager.policy.demand_timeout = 1
    message = await fails_with(
        503, jp_fetch, "api", "kernels", method="POST", body=json.dumps({"name": spec})
    )
    assert "needs 8192 MiB on GPU 0, 4096 MiB free" in message, message
    manager.policy.demand_kernel_specs = {spec: 1024}
    kernel_id = await start(jp_fetch, spec)
    assert manager.kernel_manager.is_running(kernel_id)


async def test_memory_granted_to_a_kernel_shut_down_before_it_allocated_is_free_again(
    jp_fetch, manager, demand, gpus
):
    kernel_id = await start(jp_fetch)
    # 4 GiB free on GPU 0: granted, and set aside while the kernel has not allocated it
    assert await demand.request(kernel_id, 3 * GiB, "kernel", device=0) == 0
    manager.policy.demand_timeout = 1
    with pytest.raises(GpuUnavailable):
        await demand.request("other", 3 * GiB, "kernel", device=0)
    await jp_fetch("api", "kernels", kernel_id, method="DELETE")
    manager.policy.demand_timeout = 60
    assert await demand.request("other", 3 * GiB, "kernel", device=0) == 0


async def test_node_accounting_counts_the_free_memory_of_all_gpus_together(manager, demand, gpus):
    manager.policy.demand_accounting = "node"
    # 4 GiB free on GPU 0 and 3 GiB on GPU 1: 6 GiB fit on the node, not on one GPU
    assert await demand.request("big", 6 * GiB, "kernel") is None
    manager.policy.demand_timeout = 1
    with pytest.raises(GpuUnavailable, match="needs 2048 MiB on the node's GPUs, 1024 MiB free"):
        await demand.request("more", 2 * GiB, "kernel")
