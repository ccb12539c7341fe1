"""A real `jupyter server` with autosave, killed with its kernel: the next server on the
same store lists the kernel as recovered, and the first cell restores the autosave and
names the cells that ran after it. A clean stop leaves no such kernel behind."""

from __future__ import annotations

import signal

import pytest
from server_helpers import GATE_MODULE, NOTEBOOK, ServerProcess, poll, text_of

AUTOSAVE = {"autosave_interval": 3600, "autosave_idle": 0.2, "check_interval": 0.5}


async def test_a_crashed_kernel_is_recovered_from_its_autosave(tmp_path):
    server = ServerProcess(tmp_path, AUTOSAVE)
    await server.start()
    try:
        session = await server.fetch("POST", "sessions", NOTEBOOK)
        kernel_id = session["kernel"]["id"]
        client = await server.connect(kernel_id)
        await client.execute("x = 41")
        record = await poll(lambda: server.record(kernel_id), what="an autosave")
        assert (record["state"], record["execution_count"]) == ("running", 2)
        await client.execute("y = x + 1")
        await client.execute("z = 0")

        def cells_after() -> list[int]:
            return (server.record(kernel_id) or {}).get("cells_after")

        await poll(lambda: cells_after() == [2, 3], what="the record to list In[2], In[3]")
        client.close()
    finally:
        server.crash()
    (tmp_path / "sessions.db").unlink()  # as on another node: no session database

    await server.start()
    try:
        kernels = await poll(lambda: server.get("kernels"), what="the kernel to be listed")
        assert [(k["id"], k["ckpt"]["state"]) for k in kernels] == [(kernel_id, "suspended")]
        recovered = kernels[0]["ckpt"]["recovered"]
        assert recovered["autosave_at"] == record["autosave_at"]
        assert recovered["crashed_after"] >= record["autosave_at"]
        sessions = await server.get("sessions")
        assert [(s["id"], s["kernel"]["id"]) for s in sessions] == [(session["id"], kernel_id)]

        client = await server.connect(kernel_id)
        reply, outputs = await client.execute("x + 1")
        text = text_of(outputs)
        assert reply["status"] == "ok" and "42" in text, text
        assert "restored from the autosave of" in text
        assert "cells run after it, whose effects are lost: In[2], In[3]" in text
        reply, _ = await client.execute("y")  # ran after the autosave: lost
        assert reply["ename"] == "NameError"
        client.close()
    finally:
        server.terminate()


async def test_a_server_killed_while_it_suspends_at_stop_keeps_the_autosave(tmp_path):
    """An orderly stop begins (SIGTERM) and its suspend is under way when SIGKILL comes, as
    when a grace period is too short: until the suspend's record replaces it, the running
    record of the last autosave must stay, so the next server recovers the kernel from it."""
    (tmp_path / "gate.py").write_text(GATE_MODULE)
    server = ServerProcess(tmp_path, {**AUTOSAVE, "shutdown_timeout": 60})
    await server.start()
    try:
        kernel_id = (await server.fetch("POST", "sessions", NOTEBOOK))["kernel"]["id"]
        await server.run_cell(kernel_id, "x = 41")
        record = await poll(lambda: server.record(kernel_id), what="an autosave")
        # after the autosave (the next comes an hour later): only the suspend pickles it
        await server.run_cell(kernel_id, "import gate\ng = gate.Gate()")
        server.send_signal(signal.SIGTERM)
        await poll((tmp_path / "gate-waiting").exists, what="the suspend at stop to begin")
    finally:
        server.crash()
    kept = server.record(kernel_id)
    assert kept is not None, "the running record was dropped before the suspend replaced it"
    assert (kept["state"], kept["image_id"]) == ("running", record["image_id"])

    await server.start()
    try:
        kernels = await poll(lambda: server.get("kernels"), what="the kernel to be listed")
        assert [(k["id"], k["ckpt"]["state"]) for k in kernels] == [(kernel_id, "suspended")]
        assert kernels[0]["ckpt"]["recovered"]["autosave_at"] == record["autosave_at"]
        assert kernels[0]["ckpt"]["image"] == record["image_id"]
    finally:
        server.terminate()


@pytest.mark.parametrize("suspend_on_shutdown", [False, True])
async def test_an_orderly_stop_keeps_every_kernel_recoverable(tmp_path, suspend_on_shutdown):
    """Suspended at the stop, or, where the stop does not suspend, recoverable from its
    last autosave: a server stop never gives a kernel's state up (only its user does)."""
    server = ServerProcess(tmp_path, {**AUTOSAVE, "suspend_on_shutdown": suspend_on_shutdown})
    await server.start()
    try:
        kernel_id = (await server.fetch("POST", "sessions", NOTEBOOK))["kernel"]["id"]
        await server.run_cell(kernel_id, "x = 41")
        await poll(lambda: server.record(kernel_id), what="an autosave")
    finally:
        server.terminate()

    await server.start()
    try:
        if suspend_on_shutdown:
            kernels = await poll(lambda: server.get("kernels"), what="the kernel listed")
            assert [(k["id"], k["ckpt"]["state"]) for k in kernels] == [(kernel_id, "suspended")]
            assert "recovered" not in kernels[0]["ckpt"]
        else:  # stopped without a suspend: back from its autosave, saying so
            kernels = await poll(lambda: server.get("kernels"), what="the kernel listed")
            assert [(k["id"], k["ckpt"]["state"]) for k in kernels] == [(kernel_id, "suspended")]
            assert "stopped_at" in kernels[0]["ckpt"]["recovered"]
            output = await server.run_cell(kernel_id, "x + 1")
            assert "the server stopped at" in output and output.endswith("42"), output
    finally:
        server.terminate()


async def test_a_kernel_that_crashes_after_a_restore_is_recovered_from_that_image(tmp_path):
    # no autosave comes by itself: the running record is the one the restore wrote
    server = ServerProcess(tmp_path, {**AUTOSAVE, "autosave_idle": 3600})
    await server.start()
    try:
        kernel_id = (await server.fetch("POST", "sessions", NOTEBOOK))["kernel"]["id"]
        await server.run_cell(kernel_id, "x = 41")
        image_id = (await server.fetch("POST", f"ckpt/kernels/{kernel_id}/suspend", {}))["id"]
        assert await server.run_cell(kernel_id, "y = x + 1\ny") == "42"  # restores
        record = server.record(kernel_id)
        assert (record["state"], record["image_id"], record["execution_count"]) == (
            "running",
            image_id,
            2,
        )

        def cells_after() -> list[int]:
            return (server.record(kernel_id) or {}).get("cells_after")

        await poll(lambda: cells_after() == [2], what="the record to list In[2]")
    finally:
        server.crash()

    await server.start()
    try:
        kernels = await poll(lambda: server.get("kernels"), what="the kernel to be listed")
        assert [(k["id"], k["ckpt"]["state"]) for k in kernels] == [(kernel_id, "suspended")]
        assert "recovered" in kernels[0]["ckpt"]
        text = await server.run_cell(kernel_id, "x")
        assert "41" in text and "it was last restored from" in text, text
        assert "cells run after it, whose effects are lost: In[2]" in text
    finally:
        server.terminate()
