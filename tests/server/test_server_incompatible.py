"""An image this node cannot restore (more GPU memory than it has, a missing package) is
refused before any kernel starts, with the reasons: resumed through the REST API, or
restored as a suspended kernel when its notebook runs a cell. The panel shows the same
reasons from the images listing. The node is described by a facts file
(``CkptManager.node_facts_file``), written by each test before the server first asks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import SERVER_CONFIG
from harness import NODES, node_file, save_on_node
from jupyter_ckpt_server.manager import SuspendFailed
from server_helpers import fails_with, get_json, start_session, text_of

MIB = 1 << 20


@pytest.fixture
def node(tmp_path: Path) -> Path:
    return tmp_path / "node.json"


@pytest.fixture
def jp_server_config(node: Path) -> dict[str, Any]:
    config = json.loads(json.dumps(SERVER_CONFIG))
    config["CkptManager"] = {"node_facts_file": str(node)}
    return config


def processes() -> set[int]:
    """This test process's descendants: the kernels the in-process server started."""
    return {p.pid for p in psutil.Process().children(recursive=True)}


async def test_resume_needing_more_gpu_memory_than_the_node_has_is_refused(
    jp_fetch, manager, node, tmp_path
):
    a10 = NODES["a10"]
    node.write_text(json.dumps({**a10, "gpus": [{**a10["gpus"][0], "memory_total": 2 * MIB}]}))
    manifest = save_on_node(manager.store, node_file(tmp_path, "a10"), 3 * MIB, name="big")
    kernels, before = await get_json(jp_fetch, "api", "kernels"), processes()

    message = await fails_with(
        409, jp_fetch, "api", "ckpt", "images", "big", "resume", method="POST", body="{}"
    )
    reason = (
        "needs 3.0 MiB of GPU memory on one GPU (cuda:0); the largest GPU here (NVIDIA A10) "
        "has 2.0 MiB"
    )
    assert f"image 'big' ({manifest['id'][:12]}) cannot be restored on this node" in message
    assert reason in message
    assert await get_json(jp_fetch, "api", "kernels") == kernels, "no kernel was started"
    assert processes() <= before, "no kernel process was started"

    # what the panel shows next to the image, before Resume
    images = await get_json(jp_fetch, "api", "ckpt", "images")
    listed = next(i for i in images if i["id"] == manifest["id"])
    assert listed["compatibility"] == {"verdict": "incompatible", "reasons": [reason]}
    shown = await get_json(jp_fetch, "api", "ckpt", "images", "big")
    assert shown["compatibility"] == listed["compatibility"]
    assert (await get_json(jp_fetch, "api", "ckpt", "status"))["node"]["gpus"][0]["name"] == (
        "NVIDIA A10"
    )


async def test_a_suspended_kernel_whose_package_is_missing_stays_suspended(
    jp_fetch, manager, node, connect
):
    node.write_text(json.dumps({"gpus": [], "packages": {"numpy": None}}))
    _, kernel_id = await start_session(jp_fetch)
    client = await connect(kernel_id)
    await client.execute("import numpy; x = numpy.arange(3)")
    await jp_fetch("api", "ckpt", "kernels", kernel_id, "suspend", method="POST", body="{}")
    km = manager.kernel_manager
    assert km.is_suspended(kernel_id)
    image_id = km.suspended[kernel_id]["image_id"]
    before = processes()

    with pytest.raises(SuspendFailed, match=r"numpy \S+ is not installed"):
        await manager.restore(kernel_id)

    # the notebook runs a cell: the restore is refused there too, and the cell says why
    notebook = await connect(kernel_id)
    msg_id = notebook.send("execute_request", {"code": "x", "silent": False})
    reply = await notebook.reply_to(msg_id)
    assert reply["content"]["status"] == "error", reply["content"]
    said = text_of(notebook.received)
    assert "the kernel could not be started again" in said
    assert f"({image_id[:12]}) cannot be restored on this node" in said
    assert "numpy" in said and "is not installed" in said

    assert processes() <= before, "no kernel process was started"
    assert km.is_suspended(kernel_id) and not km.is_running(kernel_id)
    model = await get_json(jp_fetch, "api", "kernels", kernel_id)
    assert model["ckpt"]["state"] == "suspended"
    assert manager.records.get(kernel_id)["image_id"] == image_id, "its image stays pinned"
