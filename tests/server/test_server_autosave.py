"""Background checkpoints (autosave) in a real server with real kernels.

The autosave loop is driven directly (``autosaver.start``) so that what is asserted does
not depend on timing; the test of an autosave that fails verification runs the real loop
in a server process and checks it through the API and the store only, as do the crash
tests (test_server_crash.py).
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from jupyter_ckpt_server.autosave import Autosaver
from server_helpers import (
    NOTEBOOK,
    ServerProcess,
    get_json,
    next_event,
    poll,
    start_session,
    text_of,
)

from jupyter_ckpt.errors import ImageNotFound
from jupyter_ckpt.store import CHUNK_SIZE, chunk_hash, chunk_path

TESTS_DIR = Path(__file__).parent.parent


@pytest.fixture
def jp_server_config(jp_server_config: dict[str, Any]) -> dict[str, Any]:
    # the loop never finds a kernel idle long enough: the tests start autosaves
    jp_server_config["SuspendPolicy"]["autosave_idle"] = 3600
    return jp_server_config


@pytest.fixture
def autosaver(jp_serverapp: Any) -> Autosaver:
    return jp_serverapp.web_app.settings["jupyter_ckpt_autosaver"]


async def _kernel_that_ran(
    jp_fetch: Any, connect: Any, autosaver: Autosaver, code: str
) -> tuple[str, Any]:
    """A new session's kernel, with its client, once the autosaver has seen it run ``code``."""
    _, kernel_id = await start_session(jp_fetch)
    client = await connect(kernel_id)
    await client.execute(code)
    await _cell_seen(autosaver, kernel_id)
    return kernel_id, client


async def _cell_seen(autosaver: Autosaver, kernel_id: str) -> None:
    lifecycles = autosaver.manager.lifecycles
    await poll(lambda: lifecycles[kernel_id].executed, what="the cell to be seen")


async def _autosaved(autosaver: Autosaver, kernel_id: str, events: list, n: int = 1) -> dict:
    """Run one autosave of ``kernel_id`` to its end; its (n-th) success event."""
    await _cell_seen(autosaver, kernel_id)
    await autosaver.start(kernel_id)
    found = [e for e in events if e.get("trigger") == "autosave"]
    assert len(found) == n, found
    assert found[-1]["status"] == "success", found[-1]
    return found[-1]


async def test_the_kernel_answers_while_a_forked_child_writes_its_image(
    jp_fetch, manager, autosaver, connect, events
):
    kernel_id, client = await _kernel_that_ran(
        jp_fetch,
        connect,
        autosaver,
        "import numpy as np\nbig = np.random.default_rng(0).random(2**24)",
    )
    task = autosaver.start(kernel_id)
    await poll(lambda: manager.saver.job(kernel_id).child, what="the child to be forked")
    started = time.perf_counter()
    reply, outputs = await client.execute("1 + 1")
    print(f"latency of 1 + 1 during an autosave of 128 MiB: {time.perf_counter() - started:.3f} s")
    assert (reply["status"], text_of(outputs)) == ("ok", "2")
    await task
    event = await next_event(events, "checkpoint", trigger="autosave")
    assert (event["status"], event["mode"]) == ("success", "fork"), event
    assert event["bytes"] >= 2**27 and event["written"] >= 2**27
    manifest = manager.store.verify(event["image_id"])  # the child's image is whole
    assert manifest["kernel"]["execution_count"] == 2  # the next cell: In[2]
    record = manager.records.get(kernel_id)
    assert (record["state"], record["image_id"], record["execution_count"]) == (
        "running",
        event["image_id"],
        2,
    )

    # a small change: the dedupe writes only its chunk, and the first image is dropped
    await client.execute("big[:10] = 0\nsmall = 5")
    second = await _autosaved(autosaver, kernel_id, events, n=2)
    assert second["written"] <= CHUNK_SIZE + 2**20 and second["bytes"] >= 2**27, second
    assert manager.records.get(kernel_id)["written"] == second["written"]
    assert manager.store.open(second["image_id"])["parent"] == event["image_id"]
    with pytest.raises(ImageNotFound):
        manager.store.open(event["image_id"])
    model = await get_json(jp_fetch, "api", "kernels", kernel_id)
    assert model["ckpt"]["state"] == "running"


async def test_cells_run_after_the_autosave_are_kept_in_the_record(
    jp_fetch, manager, autosaver, connect, events
):
    _, kernel_id = await start_session(jp_fetch)
    client = await connect(kernel_id)
    await client.execute("x = 41")
    await _autosaved(autosaver, kernel_id, events)
    assert manager.records.get(kernel_id)["cells_after"] == []
    await client.execute("y = 1")
    await client.execute("z = 2")

    def cells() -> list[int]:
        return manager.records.get(kernel_id).get("cells_after")

    assert await poll(lambda: cells() == [2, 3], what="the record to list In[2], In[3]")


async def test_a_thread_holding_a_lock_does_not_stop_the_autosave(
    jp_fetch, manager, autosaver, connect, events
):
    _, kernel_id = await start_session(jp_fetch)
    client = await connect(kernel_id)
    await client.execute(
        "import threading\n"
        "lock, release = threading.Lock(), threading.Event()\n"
        "def hold():\n"
        "    with lock:\n"
        "        release.wait()\n"
        "holder = threading.Thread(target=hold, daemon=True)\n"
        "holder.start()\n"
        "x = 41"
    )
    event = await _autosaved(autosaver, kernel_id, events)
    assert {"lock", "release", "holder"} <= set(event["missing"])
    assert "a thread started by `hold` is running" in event["msg"], event
    assert manager.store.open(event["image_id"])["variables"]  # x is in it

    # an object whose pickling waits on the held lock: the child's alarm stops it
    manager.policy.checkpoint_timeout = 3
    await client.execute(
        "class NeedsLock:\n"
        "    def __reduce__(self):\n"
        "        with lock:\n"
        "            return (int, (1,))\n"
        "stuck = NeedsLock()"
    )
    await autosaver.start(kernel_id)
    failed = await next_event(events, "checkpoint", trigger="autosave", status="error")
    assert "time limit" in failed["msg"], failed
    _, outputs = await client.execute("x + 1")
    assert text_of(outputs) == "42"
    await client.execute("release.set()")


async def test_an_autosave_that_fails_verification_keeps_the_one_before(tmp_path):
    """A chunk in the store was altered (a failing disk) and the next autosave reuses it,
    so its image fails verification: no record may name that image, and the kernel stays
    recoverable from the autosave before, whose record and image are kept. A server
    process with its own autosave loop, checked through its API and its store."""
    policy = {"autosave_interval": 2, "autosave_idle": 0.2, "check_interval": 0.5}
    server = ServerProcess(tmp_path, {**policy, "suspend_on_shutdown": False})
    await server.start()
    try:
        kernel_id = (await server.fetch("POST", "sessions", NOTEBOOK))["kernel"]["id"]
        await server.run_cell(kernel_id, "x = 41")
        kept = await poll(lambda: server.record(kernel_id), what="the first autosave")
        store = server.open_store()
        sevens = b"\x07" * CHUNK_SIZE  # the one chunk of the array the next cell makes
        store.backend.write_atomic(chunk_path(chunk_hash(sevens)), b"altered" + sevens[7:])
        await server.run_cell(
            kernel_id, f"import numpy\nsevens = numpy.full({CHUNK_SIZE}, 7, 'u1')"
        )

        async def failure() -> dict[str, Any] | None:
            [kernel] = (await server.get("ckpt/status"))["kernels"]
            return kernel["last_failure"]

        failed = await poll(failure, what="the second autosave to fail")
        assert "failed verification" in failed["reason"] and "altered" in failed["reason"]
        records, errors = store.records.all()
        assert errors == {} and list(records) == [kernel_id]
        assert records[kernel_id]["image_id"] == kept["image_id"], "a record names the bad image"
        assert records[kernel_id]["autosave_at"] == kept["autosave_at"]
        store.verify(kept["image_id"])
    finally:
        server.terminate()


async def test_a_suspend_waits_for_the_autosave_in_progress(
    jp_fetch, manager, autosaver, connect, events
):
    kernel_id, client = await _kernel_that_ran(
        jp_fetch, connect, autosaver, "import numpy as np\ndata = np.ones(2**23)"
    )
    autosave = autosaver.start(kernel_id)
    await poll(lambda: manager.saver.job(kernel_id).child, what="the child to be forked")
    client.close()
    summary = await manager.suspend(kernel_id)
    assert autosave.done()
    actions = [(e["action"], e.get("trigger")) for e in events]
    assert actions.index(("checkpoint", "autosave")) < actions.index(("suspend", "api"))
    saved = await next_event(events, "checkpoint", trigger="autosave")
    # the suspend took the autosave's image over: nothing changed since
    assert summary["id"] == saved["image_id"]
    record = manager.records.get(kernel_id)
    # a suspended record (no "running" state) replaced the running one
    assert (record.get("state"), record["image_id"]) == (None, saved["image_id"])


async def test_a_checkpoint_while_an_autosave_starts_gets_its_own_reply(
    jp_fetch, manager, autosaver, connect, events
):
    # two server calls into one kernel at once: each must read its own reply
    kernel_id, _ = await _kernel_that_ran(jp_fetch, connect, autosaver, "y = 7")
    checkpoint = jp_fetch(
        "api", "ckpt", "kernels", kernel_id, "checkpoint", method="POST", body="{}"
    )
    _, reply = await asyncio.gather(autosaver.start(kernel_id), checkpoint)
    assert reply.code == 201
    saved = json.loads(reply.body)
    assert saved["saved"] == ["y"]
    autosaved = await next_event(events, "checkpoint", trigger="autosave")
    assert autosaved["status"] == "success"
    # one state saved twice: whichever came second found it unchanged and wrote no image
    assert autosaved["image_id"] == saved["id"]
    assert manager.store.image_ids() == [saved["id"]]
    # the record names the image of the one that finished last
    last = [e for e in events if e["action"] == "checkpoint" and e["status"] == "success"][-1]
    assert manager.records.get(kernel_id)["image_id"] == last["image_id"]


async def test_a_shutdown_or_restart_drops_the_running_record(
    jp_fetch, manager, autosaver, connect, events
):
    _, kernel_id = await start_session(jp_fetch)
    client = await connect(kernel_id)
    await client.execute("x = 1")
    await _autosaved(autosaver, kernel_id, events)
    assert manager.records.get(kernel_id)["state"] == "running"
    await jp_fetch("api", "kernels", kernel_id, "restart", method="POST", body="{}")
    with pytest.raises(ImageNotFound):
        manager.records.get(kernel_id)

    client = await connect(kernel_id)
    await client.execute("x = 2")
    await _autosaved(autosaver, kernel_id, events, n=2)
    await jp_fetch("api", "kernels", kernel_id, method="DELETE")
    with pytest.raises(ImageNotFound):
        manager.records.get(kernel_id)
    assert manager.records.all() == ({}, {})


async def test_autosave_skips_when_free_memory_is_below_the_state(
    jp_fetch, manager, autosaver, connect, events
):
    # the state's size as the kernel knows it: far beyond any machine's memory
    code = "import jupyter_ckpt.kernel as k\nk.session().last_bytes = 1 << 60\nx = 1"
    kernel_id, _ = await _kernel_that_ran(jp_fetch, connect, autosaver, code)
    await autosaver.start(kernel_id)
    event = await next_event(events, "checkpoint", trigger="autosave")
    assert event["status"] == "skipped" and "free memory" in event["msg"], event
    assert manager.records.all() == ({}, {})


async def test_the_scheduler_autosaves_idle_kernels_that_ran_a_cell(
    jp_fetch, manager, autosaver, connect, events
):
    await autosaver.stop()  # this test runs the ticks itself
    manager.policy.autosave_idle = 0
    _, kernel_id = await start_session(jp_fetch)
    assert autosaver.tick() == []  # nothing ran yet
    client = await connect(kernel_id)
    await client.execute("x = 1")
    await _cell_seen(autosaver, kernel_id)
    assert autosaver.tick() == [kernel_id]
    await manager.lifecycles[kernel_id].autosave
    assert autosaver.tick() == []  # at most once per interval
    assert manager.records.get(kernel_id)["state"] == "running"


async def test_a_restored_kernel_is_autosaved_an_interval_after_its_restore(
    jp_fetch, manager, autosaver, connect
):
    # the image it was restored from is its last save: a cell run after the restore does
    # not make an autosave due at once (it would write the same state again)
    await autosaver.stop()  # this test runs the ticks itself
    manager.policy.autosave_idle = 0
    _, kernel_id = await start_session(jp_fetch)
    await jp_fetch("api", "ckpt", "kernels", kernel_id, "suspend", method="POST", body="")
    client = await connect(kernel_id)  # restores it
    await client.execute("x = 1")
    await _cell_seen(autosaver, kernel_id)
    assert manager.records.get(kernel_id)["state"] == "running"  # its restore's record
    assert autosaver.tick() == []
    manager.saver.job(kernel_id).saved_at -= manager.policy.autosave_interval
    assert autosaver.tick() == [kernel_id]  # once the interval has passed
    await manager.lifecycles[kernel_id].autosave


async def test_a_resumed_kernel_is_recoverable_from_its_image_at_once(
    jp_fetch, manager, autosaver, connect
):
    _, kernel_id = await start_session(jp_fetch)
    client = await connect(kernel_id)
    await client.execute("y = 7")
    saved = await manager.checkpoint(kernel_id, "seven")
    r = await jp_fetch("api", "ckpt", "images", "seven", "resume", method="POST", body="{}")
    resumed = json.loads(r.body)["kernel"]["id"]
    record = manager.records.get(resumed)  # a crash before its first autosave loses nothing
    assert (record["state"], record["image_id"]) == ("running", saved["id"])
    assert manager.lifecycles[resumed].autosave_image is None  # the user's image: never dropped


async def test_kernels_of_excluded_specs_are_never_autosaved(jp_fetch, manager, autosaver, connect):
    await autosaver.stop()  # this test runs the ticks itself
    manager.policy.autosave_idle = 0
    _, kernel_id = await start_session(jp_fetch)
    manager.policy.exclude_kernel_names = [manager.kernel_manager.get_kernel(kernel_id).kernel_name]
    client = await connect(kernel_id)
    await client.execute("x = 1")
    await _cell_seen(autosaver, kernel_id)
    assert autosaver.tick() == []
    manager.policy.exclude_kernel_names = []
    assert autosaver.tick() == [kernel_id]  # the same kernel, once its spec is not excluded
    await manager.lifecycles[kernel_id].autosave


FAKE_GPU = (
    f"import sys\nsys.path.insert(0, {str(TESTS_DIR)!r})\n"
    "import fake_devices, torch\n"
    "ops = fake_devices.install(gpus=1)\n"
    "weights = torch.ones(1 << 20)\n"  # 4 MiB on the stand-in's cuda:0
    "ops.pretend(weights, 'cuda:0')\n"
)
# an object whose pickling (in the autosave's child) waits until the file exists
GATE = """
import os, time
class Gate:
    def __reduce__(self):
        while not os.path.exists({path!r}):
            time.sleep(0.01)
        return (int, (1,))
gate = Gate()
"""


async def test_a_gpu_kernel_runs_a_cell_while_its_child_writes_the_copied_device_state(
    jp_fetch, manager, autosaver, connect, events, tmp_path
):
    gate = tmp_path / "open"
    code = FAKE_GPU + GATE.format(path=str(gate))
    kernel_id, client = await _kernel_that_ran(jp_fetch, connect, autosaver, code)
    task = autosaver.start(kernel_id)
    await poll(lambda: manager.saver.job(kernel_id).child, what="the child to be forked")
    # the kernel was held for the device copy and the fork only: the cell runs while the
    # child is still held at the gate, before it has written anything
    reply, outputs = await client.execute("1 + 1")
    assert (reply["status"], text_of(outputs)) == ("ok", "2")
    assert not task.done() and not [e for e in events if e.get("trigger") == "autosave"]
    gate.touch()
    await task
    event = await next_event(events, "checkpoint", trigger="autosave")
    assert (event["status"], event["mode"], event["copy_bytes"]) == ("success", "fork", 4 << 20)
    assert event["stall_seconds"] >= event["copy_seconds"] > 0
    manifest = manager.store.verify(event["image_id"])
    assert manifest["devices"] == ["cuda:0"] and manifest["gpu"]["device_bytes"] == {
        "cuda:0": 4 << 20
    }


async def test_a_gpu_kernel_short_of_host_memory_is_saved_in_the_kernel_and_says_why(
    jp_fetch, manager, autosaver, connect, events
):
    # the host state's size as the kernel knows it: far beyond any machine's memory
    code = FAKE_GPU + "import jupyter_ckpt.kernel as k\nk.session().last_bytes = 1 << 50"
    kernel_id, _ = await _kernel_that_ran(jp_fetch, connect, autosaver, code)
    event = await _autosaved(autosaver, kernel_id, events)
    assert event["mode"] == "blocking" and event["stall_seconds"] > 0, event
    assert re.fullmatch(
        r"saved in the kernel: free memory \([\d,.]+ MiB, the .+\) is below the host copies "
        r"of the GPU state \(4\.0 MiB\) plus the state's size \(1,073,741,824\.0 MiB\), "
        r"which a forked save may have to copy",
        event["msg"],
    ), event["msg"]
    assert "copy_bytes" not in event
    assert manager.records.get(kernel_id)["state"] == "running"


async def test_a_kernelspec_can_turn_autosave_on_when_it_is_off_globally(
    jp_data_dir, manager, autosaver
):
    await autosaver.stop()
    manager.policy.autosave_interval = 0
    autosaver.begin()
    assert autosaver._task is None  # off everywhere: no loop
    spec = jp_data_dir / "kernels" / "autosaved"
    spec.mkdir(parents=True)
    metadata = {"jupyter_ckpt": {"autosave_interval": 60}}
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(
        json.dumps(
            {"argv": argv, "display_name": "Autosaved", "language": "python", "metadata": metadata}
        )
    )
    autosaver.begin()
    assert autosaver._task is not None


async def test_autosave_concurrency_caps_the_autosaves_running_at_once(
    jp_fetch, manager, autosaver, connect
):
    await autosaver.stop()  # this test runs the ticks itself
    manager.policy.autosave_idle = 0
    kernels = []
    for path in ("a.ipynb", "b.ipynb"):
        _, kernel_id = await start_session(jp_fetch, path)
        client = await connect(kernel_id)
        await client.execute("x = 1")
        await poll(lambda k=kernel_id: manager.lifecycles[k].executed, what="the cell to be seen")
        kernels.append(kernel_id)
    (first,) = await poll(autosaver.tick, what="an autosave to start")
    assert autosaver.tick() == []  # one runs: autosave_concurrency (1) is reached
    await manager.lifecycles[first].autosave
    (second,) = await poll(autosaver.tick, what="the other autosave to start")
    assert {first, second} == set(kernels)
    await manager.lifecycles[second].autosave
