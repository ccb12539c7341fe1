"""The steps that keep a suspend from losing state, each checked by what it prevents: the
image is verified before the kernel goes, the GPU memory is waited for, messages to a
suspended kernel wait for it, and clients reconnecting together start one kernel."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from typing import Any

import psutil
import pytest
from jupyter_ckpt_server.manager import SuspendFailed
from server_helpers import FakeNvml, poll, start_session, text_of

from jupyter_ckpt.gpu import GpuProbe
from jupyter_ckpt.store import ImageStore, chunk_path


class AlteringStore(ImageStore):
    """A store whose bytes change between the kernel's write and the server's check, as a
    failing disk or a bad object store would: one chunk of the image is altered first."""

    altered = 0

    def verify(self, ref: str) -> dict[str, Any]:
        digest = self.open(ref)["segments"][0]["chunks"][0][0]
        data = bytearray(self.backend.read_bytes(chunk_path(digest)))
        data[0] ^= 0xFF
        self.backend.write_atomic(chunk_path(digest), bytes(data))
        AlteringStore.altered += 1
        return super().verify(ref)


class LingeringNvml(FakeNvml):
    """A driver that goes on reporting a process's GPU memory for ``linger`` polls after
    the process exited (``None``: for ever), as drivers do while they tear a context down.
    ``after_exit`` holds when each of those polls came."""

    def __init__(self, pid: int, linger: int | None) -> None:
        super().__init__({0: [(pid, 2 << 30)]})
        self.pid = pid
        self.linger = linger
        self.after_exit: list[float] = []

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: int) -> list[Any]:
        if handle == 0 and not psutil.pid_exists(self.pid):
            if self.linger is not None and len(self.after_exit) >= self.linger:
                return []
            self.after_exit.append(time.perf_counter())
        return super().nvmlDeviceGetComputeRunningProcesses_v2(handle)


class Messages(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def kernel_processes(kernel_id: str, manager: Any) -> set[int]:
    """Processes under this server (the test process) running kernel ``kernel_id``: its
    command line names the kernel's connection file (``kernel-<id>.json``, or, for a
    process that stood by and that a restore took over, the file it started with)."""
    names = {f"kernel-{kernel_id}.json"}
    km = manager.kernel_manager
    if km.is_running(kernel_id):
        launched = getattr(km.get_kernel(kernel_id), "launched_connection_file", None)
        if launched:
            names.add(os.path.basename(launched))
    found = set()
    for proc in psutil.Process().children(recursive=True):
        try:
            if any(name in arg for arg in proc.cmdline() for name in names):
                found.add(proc.pid)
        except psutil.Error:
            continue
    return found


async def test_an_image_that_fails_verification_keeps_the_kernel_running(
    jp_fetch, connect, manager, events
):
    _, kernel_id = await start_session(jp_fetch)
    client = await connect(kernel_id)
    await client.execute("state = list(range(1000))")
    pid = manager.kernel_pid(kernel_id)
    manager.store = AlteringStore(parent=manager.store.parent)
    AlteringStore.altered = 0

    with pytest.raises(SuspendFailed, match=r"failed verification.*altered"):
        await manager.suspend(kernel_id)

    assert AlteringStore.altered == 1
    km = manager.kernel_manager
    assert km.is_running(kernel_id) and not km.is_suspended(kernel_id)
    assert kernel_processes(kernel_id, manager) == {pid}, "the same process, never shut down"
    reply, outputs = await client.execute("print(sum(state))")
    assert (reply["status"], text_of(outputs)) == ("ok", "499500\n")
    assert manager.records.all() == ({}, {})
    assert manager.store.image_ids() == [], "the image that failed verification is removed"
    failed = [e for e in events if e["action"] == "suspend"]
    assert [e["status"] for e in failed] == ["error"]
    assert "failed verification" in failed[0]["msg"]


async def test_suspend_waits_until_the_gpu_memory_is_released(jp_fetch, manager, events):
    _, kernel_id = await start_session(jp_fetch)
    nvml = LingeringNvml(manager.kernel_pid(kernel_id), linger=4)
    manager.probe = GpuProbe(nvml)

    await manager.suspend(kernel_id)

    assert len(nvml.after_exit) == 4, "polled until the driver stopped reporting it"
    event = next(e for e in events if e["action"] == "suspend")
    assert event["status"] == "success"
    lingered = nvml.after_exit[-1] - nvml.after_exit[0]
    assert event["gpu_release_seconds"] >= lingered > 0
    assert manager.records.get(kernel_id)["gpu"]["bytes"] == 2 << 30


async def test_a_gpu_release_that_never_comes_is_reported(jp_fetch, manager, events):
    _, kernel_id = await start_session(jp_fetch)
    nvml = LingeringNvml(manager.kernel_pid(kernel_id), linger=None)
    manager.probe = GpuProbe(nvml)
    manager.gpu_release_timeout = 1
    log = Messages()
    manager.log.addHandler(log)
    try:
        await manager.suspend(kernel_id)
    finally:
        manager.log.removeHandler(log)

    assert len(nvml.after_exit) >= 2
    event = next(e for e in events if e["action"] == "suspend")
    assert event["gpu_release_seconds"] >= 1
    assert any("not released after 1 s" in line for line in log.lines), log.lines


async def test_control_messages_to_a_suspended_kernel_are_answered_after_restore(
    jp_fetch, connect, manager
):
    _, kernel_id = await start_session(jp_fetch)
    await (await connect(kernel_id)).execute("kept = 'yes'")
    await manager.suspend(kernel_id)
    km = manager.kernel_manager

    client = await connect(kernel_id)
    # (not debugInfo: that one is answered from what the kernel said at suspend)
    debug = {"command": "inspectVariables", "seq": 1, "type": "request", "arguments": {}}
    debug_id = client.send("debug_request", debug, channel="control")
    # messages are handled in order: once this is answered, the control message was seen
    await client.reply_to(client.send("kernel_info_request", {}))
    assert km.is_suspended(kernel_id), "a control message does not wake the kernel"
    assert not _replies_to(client, debug_id), "nor is it answered without the kernel"

    reply, _ = await client.execute("pass")  # needs the kernel: restores it
    assert reply["status"] == "ok"

    async def debug_reply() -> list[dict[str, Any]]:
        if not _replies_to(client, debug_id):
            with contextlib.suppress(TimeoutError):
                await client.receive(timeout=1)
        return _replies_to(client, debug_id)

    (answer,) = await poll(debug_reply, what="the held debug_request's reply")
    assert answer["channel"] == "control"
    assert answer["content"]["success"] and answer["content"]["command"] == "inspectVariables"
    reply, outputs = await client.execute("print(kept)")
    assert (reply["status"], text_of(outputs)) == ("ok", "yes\n"), "the state came back"


def _replies_to(client: Any, msg_id: str) -> list[dict[str, Any]]:
    return [
        m
        for m in client.received
        if m["parent_header"].get("msg_id") == msg_id and m["header"]["msg_type"] != "status"
    ]


async def test_clients_reconnecting_together_start_one_kernel_process(jp_fetch, connect, manager):
    _, kernel_id = await start_session(jp_fetch)
    await (await connect(kernel_id)).execute("z = 40\nhits = []")
    old = kernel_processes(kernel_id, manager)
    assert len(old) == 1
    await manager.suspend(kernel_id)
    await poll(lambda: not kernel_processes(kernel_id, manager), what="the kernel process to exit")

    clients = [await connect(kernel_id) for _ in range(3)]
    together = asyncio.gather(*(c.execute(f"hits.append(z + {n})") for n, c in enumerate(clients)))
    started: set[int] = set()
    while not together.done():  # every kernel process that lives while they reconnect
        started |= kernel_processes(kernel_id, manager)
        await asyncio.sleep(0.02)
    results = await together
    started |= kernel_processes(kernel_id, manager)

    assert [reply["status"] for reply, _ in results] == ["ok"] * 3
    _, outputs = await clients[0].execute("print(sorted(hits))")
    assert text_of(outputs) == "[40, 41, 42]\n", "each cell ran once, on the restored state"
    assert started == {manager.kernel_pid(kernel_id)} and not started & old
