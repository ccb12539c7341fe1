"""SIGTERM a real `jupyter server`, start it again: the kernel is listed and restores.

The in-process tests drive the extension directly; this one checks the real signal path
(the extension suspends kernels before the server stops them) and a real second start.
"""

from __future__ import annotations

from server_helpers import ServerProcess, poll, text_of


async def test_sigterm_suspends_and_the_restarted_server_restores(tmp_path):
    server = ServerProcess(tmp_path)
    await server.start()
    try:
        body = {"path": "nb.ipynb", "name": "nb.ipynb", "type": "notebook", "kernel": {}}
        session = await server.fetch("POST", "sessions", body)
        kernel_id = session["kernel"]["id"]
        client = await server.connect(kernel_id)
        await client.execute("import numpy as np\nsteps = np.arange(5)")
        client.close()
        await server.wait_idle(kernel_id)
    finally:
        server.terminate()
    records = list((tmp_path / "store").glob("users/*/kernels/*.json"))
    assert [r.stem for r in records] == [kernel_id]
    # as after a respawn on another node: the sessions database is gone, the record
    # alone brings the notebook's session back
    (tmp_path / "sessions.db").unlink()

    await server.start()
    try:
        # records load once the event loop runs, a moment after the server answers
        kernels = await poll(lambda: server.get("kernels"), what="the kernel to be listed")
        assert [(k["id"], k["ckpt"]["state"]) for k in kernels] == [(kernel_id, "suspended")]
        sessions = await server.get("sessions")
        assert [(s["id"], s["kernel"]["id"]) for s in sessions] == [(session["id"], kernel_id)]
        client = await server.connect(kernel_id)
        reply, outputs = await client.execute("int(steps.sum())")
        assert (reply["status"], text_of(outputs)) == ("ok", "10")
        client.close()
    finally:
        server.terminate()
