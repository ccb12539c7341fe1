"""A store outage while a cell wakes a suspended kernel never costs the user's state.

A real server on an S3 store (moto's server behind a forwarder the tests stop and start
again), real kernels: an outage of seconds is waited out by the restore while the cell
waits; a longer one leaves the kernel running without its state, and then the image it
failed on stays pinned, and restored by the kernel's record, until the kernel holds a
newer state of it (the user restored it and saved); what the kernel did without it is
kept beside it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from harness import S3_TIMEOUTS, Outage, S3Paths
from server_helpers import NOTEBOOK, ServerProcess, poll, text_of

# a restore gives up on a store that stays down after this many seconds
RESTORE_PATIENCE = 8


def s3_server(
    tmp_path: Path, outage: Outage, policy: dict[str, Any]
) -> tuple[ServerProcess, S3Paths]:
    paths = S3Paths(tmp_path, outage.url, S3_TIMEOUTS)
    return ServerProcess(tmp_path, policy, paths.env()), paths


async def suspended_with_x(server: ServerProcess) -> tuple[str, str]:
    """(kernel id, image id) of a notebook's kernel that set ``x = 41``, suspended."""
    kernel_id = (await server.fetch("POST", "sessions", NOTEBOOK))["kernel"]["id"]
    await server.run_cell(kernel_id, "x = 41")
    image_id = (await server.fetch("POST", f"ckpt/kernels/{kernel_id}/suspend", {}))["id"]
    return kernel_id, image_id


async def restore_failed(server: ServerProcess, outage: Outage, kernel_id: str) -> str:
    """A cell wakes the kernel while the store stays down: what the cell shows."""
    outage.stop()
    try:
        text = await server.run_cell(kernel_id, "print('x' in globals())")
    finally:
        outage.start()
    model = await server.get(f"kernels/{kernel_id}")
    assert model["ckpt"]["state"] == "restore-failed", model
    return text


async def test_a_short_outage_during_a_restore_is_waited_out(tmp_path: Path, outage: Outage):
    """The store is down for a few seconds while a cell wakes the kernel: the restore
    tries again once it answers, and the cell runs on the kernel's variables."""
    server, _ = s3_server(tmp_path, outage, {})
    await server.start()
    try:
        kernel_id, _ = await suspended_with_x(server)
        outage.stop()
        try:
            client = await server.connect(kernel_id)
            cell = asyncio.ensure_future(client.execute("x + 1"))
            await poll(
                lambda: cell.done() or "the store did not answer" in server.log(),
                timeout=120,
                what="the restore to find the store down",
            )
        finally:
            outage.start()
        _, outputs = await asyncio.wait_for(cell, 120)
        assert text_of(outputs) == "42", text_of(outputs)
    finally:
        server.kill()


async def test_a_failed_restore_keeps_its_image_through_a_suspend(tmp_path: Path, outage: Outage):
    """The restore fails on an outage; the kernel, empty, is suspended (as the idle
    monitor, suspend-all or a server stop would): its record still restores the user's
    image, which retention keeps, and what the empty kernel held is kept beside it."""
    server, paths = s3_server(tmp_path, outage, {"checkpoint_timeout": RESTORE_PATIENCE})
    await server.start()
    try:
        kernel_id, image_id = await suspended_with_x(server)
        shown = await restore_failed(server, outage, kernel_id)
        assert shown.splitlines()[-1] == "False", shown
        await server.run_cell(kernel_id, "z = 3")
        suspended = await server.fetch("POST", f"ckpt/kernels/{kernel_id}/suspend", {})
        store = paths.open_store()
        store.max_images = 1
        store.enforce_retention(collect=None)
        record = store.records.get(kernel_id)
        assert record["image_id"] == image_id, "the empty kernel's image replaced the user's"
        assert set(store.image_ids()) == {image_id, suspended["id"]}
        shown = await server.run_cell(kernel_id, "print(x)")
        assert shown.splitlines()[-1] == "41", shown
    finally:
        server.kill()


async def test_work_after_restoring_by_hand_survives_a_crash(tmp_path: Path, outage: Outage):
    """The restore fails; the user restores the image with ``%ckpt restore``, works on and
    saves: that state is the kernel's newest, and a new server after a crash brings it
    back, with the cells run since the restore."""
    server, _ = s3_server(tmp_path, outage, {"checkpoint_timeout": RESTORE_PATIENCE})
    await server.start()
    try:
        kernel_id, image_id = await suspended_with_x(server)
        await restore_failed(server, outage, kernel_id)
        await server.run_cell(kernel_id, f"%load_ext jupyter_ckpt\n%ckpt restore {image_id}")
        await server.run_cell(kernel_id, "y = x + 1")
        await server.fetch("POST", f"ckpt/kernels/{kernel_id}/checkpoint", {})
        model = await server.get(f"kernels/{kernel_id}")
        assert model["ckpt"]["state"] == "running", model
        server.crash()
        await server.start()
        shown = await server.run_cell(kernel_id, "print(x, y)")
        assert shown.splitlines()[-1] == "41 42", shown
    finally:
        server.kill()
