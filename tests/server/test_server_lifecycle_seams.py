"""Where two paths of a kernel's lifecycle meet, no state is lost.

Each test drives one seam through the server's public surfaces (the REST routes, the
kernels and sessions API, kernel websockets, a server process stopped by a signal) and
reads the outcome as a new server would: through a fresh ``ImageStore`` on the same
store. Where a window between two steps must be held open, a real mechanism is used (a
cell that sleeps, a variable whose pickling waits, a full tmpfs); the tests that need
a suspend or restore held at a precise step use :func:`hold_step` alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from deadlines import scaled
from harness import tmpfs
from jupyter_ckpt_server.lifecycle import State
from jupyter_ckpt_server.manager import CkptManager
from jupyter_client.asynchronous import AsyncKernelClient
from server_helpers import (
    GATE_MODULE,
    GATED_STATE,
    NOTEBOOK,
    ServerProcess,
    at_step,
    get_json,
    poll,
    python_kernelspec,
    start_session,
    stored_record,
    text_of,
)
from test_server_crash import AUTOSAVE
from tornado.httpclient import HTTPClientError
from tornado.websocket import WebSocketClosedError

from jupyter_ckpt.errors import CkptError, ImageNotFound
from jupyter_ckpt.store import ImageStore


def fresh_store(manager: CkptManager) -> ImageStore:
    """The server's store as a new server (or another process) opens it."""
    store = manager.store
    return ImageStore(url=store.root_url, secret_file=store.signer.secret_file, user=store.user)


def store_at(tmp: Path) -> ImageStore:
    """The store of a :class:`ServerProcess` run in ``tmp``, as a new server opens it."""
    return ImageStore(url=str(tmp / "store"), secret_file=str(tmp / "secret"))


def variables_of(store: ImageStore, image_id: str) -> list[str]:
    return [v["name"] for v in store.open(image_id)["variables"]]


def records_without(store: ImageStore, name: str) -> dict[str, str]:
    """Kernel id -> why its record fails to bring ``name`` back (a missing image, or an
    image without it), for every record in the store."""
    records, errors = store.records.all()
    bad = dict(errors)
    for kernel_id, record in records.items():
        try:
            names = variables_of(store, record["image_id"])
        except CkptError as exc:
            bad[kernel_id] = f"its image {record['image_id']} is unreadable: {exc}"
            continue
        if name not in names:
            bad[kernel_id] = f"its image {record['image_id']} holds only {names}"
    return bad


async def status_of(request: Awaitable[Any]) -> tuple[int, Any]:
    """(HTTP status, JSON body) of a request that may fail."""
    try:
        response = await request
    except HTTPClientError as exc:
        assert exc.response is not None, exc
        response = exc.response
    return response.code, json.loads(response.body) if response.body else None


async def suspended_kernel(jp_fetch: Any, connect: Any) -> tuple[str, str]:
    """(session id, kernel id) of a notebook whose kernel set ``x = 41`` and was then
    suspended through the API."""
    session_id, kernel_id = await start_session(jp_fetch)
    client = await connect(kernel_id)
    reply, _ = await client.execute("x = 41")
    assert reply["status"] == "ok", reply
    client.close()
    await jp_fetch("api", "ckpt", "kernels", kernel_id, "suspend", method="POST", body="")
    return session_id, kernel_id


async def value_in(connect: Any, kernel_id: str, expression: str) -> str:
    """What ``expression`` shows when run in the kernel (restoring it if suspended)."""
    client = await connect(kernel_id)
    _, outputs = await client.execute(expression)
    client.close()
    return text_of(outputs)


# -- 1. an orderly stop while a kernel is busy ----------------------------------------------


async def _busy(server: ServerProcess, kernel_id: str) -> None:
    """A cell is running in the kernel when the server is stopped."""
    client = await server.connect(kernel_id)
    client.send("execute_request", {"code": "import time\ntime.sleep(300)", "silent": False})

    async def busy() -> bool:
        return (await server.get(f"kernels/{kernel_id}"))["execution_state"] == "busy"

    await poll(busy, what="the server to see the cell running")


async def _unsaveable(server: ServerProcess, kernel_id: str) -> None:
    """The kernel's suspend at stop cannot finish: pickling ``g`` waits past
    shutdown_timeout (the autosave before it found the gate open)."""
    (server.tmp / "gate-open").unlink()


@pytest.mark.parametrize("stop_while", [_busy, _unsaveable], ids=["busy", "suspend-fails"])
async def test_an_orderly_stop_keeps_the_last_autosave_recoverable(tmp_path, stop_while):
    """A server stopped by SIGTERM while it cannot suspend a kernel (a cell runs, or the
    suspend fails) keeps that kernel's last autosave recorded and its image: a new
    server on the store lists the kernel as suspended on that image, as after a crash."""
    (tmp_path / "gate.py").write_text(GATE_MODULE)
    (tmp_path / "gate-open").touch()
    server = ServerProcess(tmp_path, {**AUTOSAVE, "shutdown_timeout": 3})
    await server.start()
    try:
        kernel_id = (await server.fetch("POST", "sessions", NOTEBOOK))["kernel"]["id"]
        await server.run_cell(kernel_id, GATED_STATE)
        autosaved = await poll(lambda: stored_record(tmp_path, kernel_id), what="an autosave")
        await stop_while(server, kernel_id)
        server.terminate()
    finally:
        server.kill()
        (tmp_path / "gate-open").touch()

    record = stored_record(tmp_path, kernel_id)
    assert record is not None, "the stop removed the record of the kernel's last autosave"
    assert record["image_id"] == autosaved["image_id"], record
    assert "x" in variables_of(store_at(tmp_path), record["image_id"])
    await server.start()
    try:
        kernels = await poll(lambda: server.get("kernels"), what="the kernel to be listed")
        assert [(k["id"], k["ckpt"]["state"], k["ckpt"]["image"]) for k in kernels] == [
            (kernel_id, "suspended", autosaved["image_id"])
        ]
    finally:
        server.terminate()


# -- 2. a failed record write during an autosave ---------------------------------------------


@contextlib.contextmanager
def small_disk(directory: Path) -> Iterator[Callable[[bool], None]]:
    """``directory`` on a 1 MiB tmpfs; the context gives ``fill``: True fills it (every
    write there fails with ENOSPC), False frees it."""
    filler = directory / ".filler"

    def fill(full: bool) -> None:
        if not full:
            filler.unlink()
            return
        with contextlib.suppress(OSError), open(filler, "wb", buffering=0) as out:
            while True:  # until ENOSPC
                out.write(b"\0" * 4096)

    directory.mkdir(exist_ok=True)
    with tmpfs(directory, "1m"):
        yield fill


async def test_a_failed_record_write_keeps_the_previous_autosave(tmp_path):
    """An autosave whose record cannot be written (the disk is full) leaves the kernel's
    record naming its previous autosave, whose image is kept: no later rewrite of the
    record names the image the failed autosave removed."""
    # the next autosave comes an interval after the first, long after a record refresh
    server = ServerProcess(tmp_path, {**AUTOSAVE, "autosave_interval": 10})
    await server.start()
    store = store_at(tmp_path)
    try:
        with small_disk(Path(store.backend.url) / "kernels") as fill:
            kernel_id = (await server.fetch("POST", "sessions", NOTEBOOK))["kernel"]["id"]
            client = await server.connect(kernel_id)
            await client.execute("x = 1")
            first = await poll(lambda: stored_record(tmp_path, kernel_id), what="an autosave")
            fill(True)
            await client.execute("y = 2")

            async def failed() -> bool:
                status = await server.get(f"ckpt/status?kernel_id={kernel_id}")
                return bool(status["kernels"][0]["last_failure"])

            await poll(failed, timeout=60, what="the autosave to fail on the full disk")
            fill(False)
            await client.execute("z = 3")  # In[3]: the record is rewritten to list it
            await poll(
                lambda: 3 in (stored_record(tmp_path, kernel_id) or {}).get("cells_after", []),
                what="the record to list In[3]",
            )
            # the first autosave's record, or a later autosave's that succeeded
            assert records_without(store, "x") == {}, f"the first autosave: {first['image_id']}"
            client.close()
    finally:
        server.terminate()


# -- 3. suspend-all while a suspended kernel is being restored ------------------------------


async def test_suspend_all_during_a_restore_does_not_save_an_empty_kernel(
    jp_fetch, connect, manager
):
    """``POST /api/ckpt/suspend-all`` while a kernel is being restored (its new process
    started, its image not yet loaded) never checkpoints the empty new process: no record
    names an image without the kernel's variables, and the kernel still has them."""
    _, kernel_id = await suspended_kernel(jp_fetch, connect)

    async def suspend_all() -> tuple[int, Any]:
        sent = asyncio.ensure_future(
            status_of(jp_fetch("api", "ckpt", "suspend-all", method="POST", body=""))
        )
        # a suspend-all that waits for the restore is answered once the hold ends
        await asyncio.wait([sent], timeout=15)
        return sent

    held = at_step(manager, "restore", suspend_all)
    client = await connect(kernel_id)
    client.send("execute_request", {"code": "x", "silent": False})
    await poll(lambda: held, timeout=60, what="the restore to reach its image")
    answer = await held[0]

    async def settled() -> bool:
        model = await get_json(jp_fetch, "api", "kernels", kernel_id)
        return model["ckpt"]["state"] in ("running", "suspended", "restore-failed")

    await poll(settled, timeout=60, what="the restore to end")
    assert records_without(fresh_store(manager), "x") == {}, f"suspend-all answered {answer}"
    manager.step_hook = None
    assert await value_in(connect, kernel_id, "x") == "41"


# -- 4. a websocket closed while its cell restores the kernel --------------------------------


async def test_a_cell_sent_before_the_websocket_dropped_is_answered_on_reconnect(
    jp_fetch, connect, manager
):
    """A cell sent to a suspended kernel whose websocket closes while the restore runs
    still runs, and its reply reaches the client that reconnects with the same session
    id, as jupyter_server replays buffered replies for a running kernel."""
    _, kernel_id = await suspended_kernel(jp_fetch, connect)
    first = await connect(kernel_id)
    session_id = first.session.session

    async def drop() -> None:
        first.close()
        # the server answered the close (after what it sent before): it saw the socket go
        while await asyncio.wait_for(first.ws.read_message(), 30) is not None:
            pass

    dropped = at_step(manager, "restore", drop)
    msg_id = first.send("execute_request", {"code": "x + 1", "silent": False})
    await poll(lambda: dropped, timeout=60, what="the websocket to close during the restore")

    async def restored() -> bool:
        model = await get_json(jp_fetch, "api", "kernels", kernel_id)
        return model["ckpt"]["state"] == "running"

    await poll(restored, timeout=60, what="the restore to end")
    second = await connect(kernel_id, session_id=session_id)
    try:
        reply = await second.reply_to(msg_id, timeout=30)
    except asyncio.TimeoutError:
        pytest.fail("the cell sent before the websocket closed got no reply on reconnect")
    assert reply["content"]["status"] == "ok", reply["content"]


async def test_a_socket_reconnecting_before_the_restore_starts_its_kernel_joins_it(
    jp_fetch, connect, manager
):
    """As above, with the new socket open before the restore has started the kernel's
    process (while it checks the image's compatibility): it joins the restore, and gets
    the reply without sending anything."""
    _, kernel_id = await suspended_kernel(jp_fetch, connect)
    first = await connect(kernel_id)
    session_id = first.session.session
    second: list[Any] = []

    async def reconnect() -> None:
        first.close()
        second.append(await connect(kernel_id, session_id=session_id))

    held = at_step(manager, "compatibility", reconnect)
    msg_id = first.send("execute_request", {"code": "x + 1", "silent": False})
    await poll(lambda: held, timeout=60, what="the reconnect during the restore")
    try:
        reply = await second[0].reply_to(msg_id, timeout=60)
    except asyncio.TimeoutError:
        pytest.fail("a socket that reconnected before the restore started got no reply")
    assert reply["content"]["status"] == "ok", reply["content"]


async def test_a_cell_run_while_the_restore_writes_the_record_is_listed_in_it(
    jp_fetch, connect, manager
):
    """The first cell after a restore runs while the restore replaces the suspended
    record with a running one: the record lists it soon after, so that a crash names the
    cell whose effects are lost."""
    _, kernel_id = await suspended_kernel(jp_fetch, connect)
    lc = manager.lifecycles[kernel_id]

    async def cell_seen() -> None:  # the record is made already; the cell runs now
        await poll(lambda: lc.executed, timeout=60, what="the cell to run")

    at_step(manager, "running-record", cell_seen)
    client = await connect(kernel_id)
    reply, _ = await client.execute("y = x + 1")
    client.close()
    count = reply["execution_count"]

    def listed() -> bool:
        record = fresh_store(manager).records.get(kernel_id)  # the suspended one at first
        return record.get("state") == "running" and record["cells_after"] == [count]

    await poll(listed, timeout=30, what=f"the record to list In[{count}]")


# -- 5. the old id of a suspended kernel that was shut down ----------------------------------


async def test_opening_a_shut_down_suspended_kernel_does_not_start_an_empty_one(jp_fetch, connect):
    """After ``DELETE /api/kernels/<id>`` of a suspended kernel, a session asked for with
    that id (the saved sessions panel's Open) does not start an empty kernel under it,
    and the notebook's newest image still holds its variables."""
    _, kernel_id = await suspended_kernel(jp_fetch, connect)
    await jp_fetch("api", "kernels", kernel_id, method="DELETE")
    body = {"path": "work.ipynb", "type": "notebook", "kernel": {"id": kernel_id}}
    status, session = await status_of(
        jp_fetch("api", "sessions", method="POST", body=json.dumps(body))
    )
    kernels = [k["id"] for k in await get_json(jp_fetch, "api", "kernels")]
    if kernel_id in kernels:  # brought back: with its state, never empty
        shown = await value_in(connect, kernel_id, "x")
        assert shown == "41", f"POST /api/sessions answered {status} {session}; x: {shown}"
    images = [
        i for i in await get_json(jp_fetch, "api", "ckpt", "images")
        if (i["notebook_path"] or "").endswith("/work.ipynb")
    ]  # fmt: skip
    newest = max(images, key=lambda i: i["created"])
    assert "x" in newest["variable_names"], newest


# -- 6. two resumes of one image into one notebook at once -----------------------------------


async def test_two_resumes_into_one_notebook_at_once_restore_once(jp_fetch, connect):
    """Two ``POST /api/ckpt/images/<id>/resume`` for the same notebook at once end with
    one kernel for the notebook, holding the image's variables: the second request gets
    a 409 or the first's kernel, and never shuts the first's kernel down."""
    _, source = await start_session(jp_fetch)
    client = await connect(source)
    await client.execute("y = 7")
    body = json.dumps({"name": "seven"})
    await jp_fetch("api", "ckpt", "kernels", source, "checkpoint", method="POST", body=body)
    resume = json.dumps({"path": "twice.ipynb"})
    request = ("api", "ckpt", "images", "seven", "resume")
    answers = await asyncio.gather(
        *(status_of(jp_fetch(*request, method="POST", body=resume)) for _ in range(2))
    )
    assert sorted(code for code, _ in answers) in ([201, 201], [201, 409]), answers
    resumed = {body["kernel"]["id"] for code, body in answers if code == 201}
    assert len(resumed) == 1, f"two kernels were started for one notebook: {answers}"
    sessions = [
        s for s in await get_json(jp_fetch, "api", "sessions") if s["path"] == "twice.ipynb"
    ]
    assert [s["kernel"]["id"] for s in sessions] == list(resumed), sessions
    running = {k["id"] for k in await get_json(jp_fetch, "api", "kernels")}
    assert running == {source, *resumed}, "a resumed kernel was left running, or shut down"
    assert await value_in(connect, resumed.pop(), "y") == "7"


# -- 7. a session change on a suspended kernel -----------------------------------------------


async def test_a_session_change_on_a_suspended_kernel_succeeds(jp_fetch, connect):
    """``PATCH /api/sessions/<id>`` with a new path (as JupyterLab sends for a renamed
    notebook, or one whose file is gone) on a session whose kernel is suspended answers
    200, and the session stays the only one, on the suspended kernel, under its new path."""
    session_id, kernel_id = await suspended_kernel(jp_fetch, connect)
    change = json.dumps({"path": "renamed.ipynb", "name": "renamed.ipynb"})
    status, model = await status_of(
        jp_fetch("api", "sessions", session_id, method="PATCH", body=change)
    )
    assert status == 200, model
    sessions = await get_json(jp_fetch, "api", "sessions")
    assert [(s["id"], s["path"], s["kernel"]["id"]) for s in sessions] == [
        (session_id, "renamed.ipynb", kernel_id)
    ]
    assert await value_in(connect, kernel_id, "x") == "41"


# -- 8. a cell from a client that does not use the websocket, sent during a suspend ----------


async def test_a_cell_sent_over_zmq_during_a_suspend_is_not_killed(
    jp_fetch, connect, manager, jp_runtime_dir
):
    """A cell sent straight to the kernel's ZMQ shell (``jupyter console --existing``)
    while a suspend is under way runs to its end: the suspend, whose image was written
    before the cell, must not shut the kernel down under it."""
    _, kernel_id = await start_session(jp_fetch)
    client = await connect(kernel_id)
    await client.execute("x = 41")
    client.close()
    console = AsyncKernelClient(connection_file=str(jp_runtime_dir / f"kernel-{kernel_id}.json"))
    console.load_connection_file()
    console.start_channels(stdin=False, hb=False, control=False)
    await console.wait_for_ready(timeout=30)  # its iopub subscription is live

    async def run_cell() -> str:
        msg_id = console.execute("import time\ntime.sleep(1)\ny = 1")
        # Running once the kernel says busy for this cell. The server's view of the kernel
        # is no proof: it may still be busy from the suspend's own save, while the cell
        # has not reached the kernel, which would then only get it after the shutdown.
        while True:
            msg = await console.get_iopub_msg(timeout=30)
            mine = msg["parent_header"].get("msg_id") == msg_id
            if mine and msg["content"].get("execution_state") == "busy":
                return msg_id

    sent = at_step(manager, "record", run_cell)
    suspend = ("api", "ckpt", "kernels", kernel_id, "suspend")
    answer = await status_of(jp_fetch(*suspend, method="POST", body=""))
    try:
        reply = await console.get_shell_msg(timeout=30)
    except queue.Empty:
        pytest.fail(f"the suspend (answered {answer}) killed the cell sent during it")
    finally:
        console.stop_channels()
    assert reply["parent_header"]["msg_id"] == sent[0]
    assert reply["content"]["status"] == "ok", reply["content"]


# -- 9. what an autosave leaves in the kernel's temporary directory ---------------------------


async def test_a_shut_down_kernel_leaves_no_autosave_directory(tmp_path):
    """The temporary directory where an autosave's child writes its result does not
    outlive the kernel: none is left once the kernel is shut down."""
    kernel_tmp = tmp_path / "kernel-tmp"
    kernel_tmp.mkdir()
    server = ServerProcess(tmp_path, AUTOSAVE, env={"TMPDIR": str(kernel_tmp)})
    await server.start()
    try:
        kernel_id = (await server.fetch("POST", "sessions", NOTEBOOK))["kernel"]["id"]
        await server.run_cell(kernel_id, "x = 41")
        await poll(lambda: stored_record(tmp_path, kernel_id), what="an autosave")
        await server.fetch("DELETE", f"kernels/{kernel_id}")
    finally:
        server.terminate()
    assert sorted(p.name for p in kernel_tmp.glob("ckpt-autosave-*")) == []


# -- 10. an automatic restart after the kernel's process died ---------------------------------


def kernel_process(server: ServerProcess, kernel_id: str) -> psutil.Process | None:
    """The kernel's process among the server's children, if it runs."""
    assert server.process is not None
    for child in psutil.Process(server.process.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if any(f"kernel-{kernel_id}.json" in arg for arg in child.cmdline()):
                return child
    return None


async def test_an_automatic_restart_keeps_the_autosave_of_the_state_it_lost(tmp_path):
    """A kernel killed by the OOM killer is restarted empty by the server: the new
    process's autosaves must not remove the old process's last autosave, the only copy
    of the state that was lost."""
    # an interval short enough for the new process's autosave to come within the test
    server = ServerProcess(tmp_path, {**AUTOSAVE, "autosave_interval": 5})
    await server.start()
    try:
        kernel_id = (await server.fetch("POST", "sessions", NOTEBOOK))["kernel"]["id"]
        await server.run_cell(kernel_id, "x = 41")
        before = await poll(lambda: stored_record(tmp_path, kernel_id), what="an autosave")
        dead = kernel_process(server, kernel_id)
        assert dead is not None
        dead.kill()  # as the OOM killer does
        await poll(
            lambda: (p := kernel_process(server, kernel_id)) and p.pid != dead.pid,
            what="the automatic restart",
        )
        await server.run_cell(kernel_id, "y = 1")
        await poll(
            lambda: (
                (stored_record(tmp_path, kernel_id) or before)["image_id"] != before["image_id"]
            ),
            what="the new process's autosave",
        )
    finally:
        server.terminate()  # once the autosave in progress, if any, has ended
    try:
        names = variables_of(store_at(tmp_path), before["image_id"])
    except CkptError as exc:
        pytest.fail(f"the last autosave before the restart was removed: {exc}")
    assert "x" in names


# -- 11. two named servers of one user on one store -------------------------------------------


def named_server(tmp: Path, name: str, store: Path) -> ServerProcess:
    """Named server ``name`` of JupyterHub user ``u``, on the shared ``store``."""
    (tmp / name).mkdir()
    hub = {
        "JUPYTERHUB_API_URL": "http://127.0.0.1:8081/hub/api",
        "JUPYTERHUB_USER": "u",
        "JUPYTERHUB_SERVER_NAME": name,
        "JUPYTER_CKPT_STORE": str(store),
        "JUPYTER_CKPT_SECRET_FILE": str(tmp / "secret"),
    }
    return ServerProcess(tmp / name, env=hub)


async def test_named_servers_on_one_store_do_not_take_each_others_kernels(tmp_path):
    """Two named servers of one JupyterHub user on one store each list their own kernels
    only: a kernel suspended by one is not listed (nor restorable) by the other."""
    first, second = (named_server(tmp_path, n, tmp_path / "store") for n in ("a", "b"))
    await first.start()
    try:
        kernel_id = (await first.fetch("POST", "sessions", NOTEBOOK))["kernel"]["id"]
        await first.run_cell(kernel_id, "x = 41")
        await first.fetch("POST", f"ckpt/kernels/{kernel_id}/suspend", {})
        await second.start()
        try:
            assert [k["id"] for k in await second.get("kernels")] == []
        finally:
            second.terminate()
    finally:
        first.terminate()


# -- 12. the server's own silent call to a kernel when a suspend arrives ----------------------


async def test_a_suspend_waits_out_the_servers_own_call_but_not_a_cells(jp_fetch, connect, manager):
    """The server's own silent calls (an activity check, the start of an autosave) make
    the kernel look busy for a moment: a suspend arriving then waits it out and succeeds.
    A client's cell still makes it refuse, at once."""
    _, kernel_id = await start_session(jp_fetch)
    client = await connect(kernel_id)
    await client.execute("x = 41")
    suspend = ("api", "ckpt", "kernels", kernel_id, "suspend")

    async def busy() -> bool:
        model = await get_json(jp_fetch, "api", "kernels", kernel_id)
        return model["execution_state"] == "busy"

    cell = client.send("execute_request", {"code": "import time\ntime.sleep(3)", "silent": False})
    await poll(busy, what="the server to see the cell running")
    status, body = await status_of(jp_fetch(*suspend, method="POST", body=""))
    assert (status, "busy" in body["message"]) == (409, True), body
    await client.reply_to(cell, timeout=30)
    client.close()

    own = asyncio.ensure_future(
        manager.rpc.request(
            kernel_id, "execute", 30, code="import time\ntime.sleep(1)", silent=True
        )
    )
    await poll(busy, what="the server to see its own call running")
    status, body = await status_of(jp_fetch(*suspend, method="POST", body=""))
    await own
    assert status == 200, body
    assert await value_in(connect, kernel_id, "x") == "41"


# What the first process of a kernel does, once, before it says anything: find a port the
# server chose for it already taken (as another process may take it between the server's
# choice and the kernel's bind: ipykernel exits), or find one held by another process
# and hang (as ipykernel was seen to do after that same error on a loaded machine). The
# holder outlives a shell that exits at once: it is no process of the kernel's.
FIRST_PROCESS_FAULTS = {
    "port-held": (
        "import json, subprocess, sys, time\n"
        "    info = json.load(open(sys.argv[sys.argv.index('-f') + 1]))\n"
        "    hold = ('import socket, time; s = socket.socket(); s.bind((%r, %d)); '\n"
        "            's.listen(); time.sleep(120)') % (info['ip'], info['stdin_port'])\n"
        "    subprocess.run(['sh', '-c', '\"$0\" -S -c \"$1\" &', sys.executable, hold])\n"
        "    time.sleep(3600)"
    ),
    "port-taken": (
        "import json, socket, sys\n"
        "    info = json.load(open(sys.argv[sys.argv.index('-f') + 1]))\n"
        "    taken = socket.socket()\n"
        "    taken.bind((info['ip'], info['stdin_port']))"
    ),
}


@pytest.mark.parametrize(
    ("start", "fault"),
    [("restore", "port-taken"), ("restore", "port-held"), ("fresh", "port-held")],
)
async def test_a_kernel_process_that_cannot_answer_is_started_again(
    jp_fetch, connect, tmp_path, monkeypatch, start, fault
):
    """A kernel's first process, started fresh or for a restore, exits, or hangs with one
    of its ports held by another process, before it says anything: another process is
    started on new ports, and the kernel comes up (restored) in it."""
    if start == "restore":
        _, kernel_id = await suspended_kernel(jp_fetch, connect)
    site = tmp_path / "fails-once"
    site.mkdir()
    marker = site / "fail"
    (site / "sitecustomize.py").write_text(
        f"import os\nif os.path.exists({str(marker)!r}):\n    os.remove({str(marker)!r})\n"
        f"    {FIRST_PROCESS_FAULTS[fault]}\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.setattr("jupyter_ckpt_server.lifecycle.start.SILENT_AFTER", 2.0)
    marker.touch()
    if start == "fresh":
        _, kernel_id = await start_session(jp_fetch, "fresh.ipynb")
    expected = "42" if start == "restore" else "1"
    value = await asyncio.wait_for(
        value_in(connect, kernel_id, "x + 1" if start == "restore" else "1"), 25
    )
    assert (value, marker.exists()) == (expected, False)


def assert_started_once(starts: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The kernel's process was started once, but for starts made again because another
    process took one of its ports before it bound them (a race on a busy machine, which a
    new start rightly answers)."""
    again = [r.getMessage() for r in caplog.records if "starting it again" in r.getMessage()]
    assert all(" is held by " in message for message in again), again
    assert starts.read_text().splitlines() == ["started"] * (1 + len(again))


async def test_a_kernel_slow_to_start_is_waited_for(
    jp_fetch, connect, tmp_path, monkeypatch, caplog
):
    """A kernel whose startup files take longer than the server waits for its first
    message listens on its ports meanwhile: the server hands it out, never starts it
    again (which would run the startup files again, and kill them midway)."""
    startup = tmp_path / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)
    starts = tmp_path / "starts"
    (startup / "00-slow.py").write_text(
        f"import time\nopen({str(starts)!r}, 'a').write('started\\n')\ntime.sleep(4)\n"
    )
    monkeypatch.setenv("IPYTHONDIR", str(startup.parent.parent))
    monkeypatch.setattr("jupyter_ckpt_server.lifecycle.start.SILENT_AFTER", 0.5)
    monkeypatch.setattr("jupyter_ckpt_server.lifecycle.start.JOIN_TIMEOUT", 2.0)
    _, kernel_id = await start_session(jp_fetch, "slow.ipynb")
    assert await value_in(connect, kernel_id, "1 + 1") == "2"
    assert_started_once(starts, caplog)


# Publishes status messages signed with a key that is not the kernel's, on the iopub port
# of the connection file it is given, for half a minute: another process that took the
# kernel's port before the kernel could bind it.
IMPOSTOR = """
import json, sys, time, zmq
from jupyter_client.session import Session
info = json.load(open(sys.argv[1]))
publisher = zmq.Context().socket(zmq.PUB)
publisher.bind(f"tcp://{info['ip']}:{info['iopub_port']}")
open(sys.argv[2], "w").close()
session = Session(key=b"not the kernel's key")
for _ in range(600):
    session.send(publisher, "status", {"execution_state": "idle"})
    time.sleep(0.05)
"""


async def test_messages_on_the_kernel_s_port_not_signed_by_it_are_no_sign_of_it(
    jp_fetch, connect, jp_data_dir, manager, tmp_path
):
    """A suspended kernel is restarted (started fresh), and another process took the new
    process's iopub port first and publishes there: its messages do not make the server
    hand out the process, which cannot bind the port; the server starts it again on new
    ports, and the restart answers with a kernel that runs cells."""
    impostor, count, bound = tmp_path / "impostor.py", tmp_path / "count", tmp_path / "bound"
    impostor.write_text(IMPOSTOR)
    launcher = (
        f"n=$(($(cat {count} 2>/dev/null || echo 0) + 1)); echo $n > {count}; "
        # the second launch (the restart's) finds its port taken, by no child of its own
        f'if [ $n -eq 2 ]; then ("{sys.executable}" {impostor} "$0" {bound} &); '
        f"while [ ! -e {bound} ]; do sleep 0.05; done; fi; "
        f'exec "{sys.executable}" -m ipykernel_launcher -f "$0"'
    )
    python_kernelspec(
        jp_data_dir, "port-taken", "Port taken", ["sh", "-c", launcher, "{connection_file}"]
    )
    body = {"path": "taken.ipynb", "type": "notebook", "kernel": {"name": "port-taken"}}
    response = await jp_fetch("api", "sessions", method="POST", body=json.dumps(body))
    kernel_id = json.loads(response.body)["kernel"]["id"]
    assert await value_in(connect, kernel_id, "x = 1; x") == "1"
    await manager.suspend(kernel_id)
    await jp_fetch(
        "api", "kernels", kernel_id, "restart", method="POST", body="", request_timeout=scaled(90)
    )
    assert await value_in(connect, kernel_id, "1 + 1") == "2"
    assert int(count.read_text()) == 3


async def test_a_kernel_whose_launcher_is_slow_is_waited_for(
    jp_fetch, connect, jp_data_dir, tmp_path, monkeypatch, caplog
):
    """A kernelspec whose launcher takes a while before it starts ipykernel (a shell that
    prepares an environment): the process listens on nothing meanwhile, which is no
    evidence that it cannot answer; it is started once."""
    starts = tmp_path / "starts"
    launcher = (
        f'echo started >> {starts}; sleep 3; exec "{sys.executable}" -m ipykernel_launcher -f "$0"'
    )
    python_kernelspec(
        jp_data_dir, "slow-launcher", "Slow launcher", ["sh", "-c", launcher, "{connection_file}"]
    )
    monkeypatch.setattr("jupyter_ckpt_server.lifecycle.start.SILENT_AFTER", 0.5)
    body = {"path": "slow.ipynb", "type": "notebook", "kernel": {"name": "slow-launcher"}}
    response = await jp_fetch(
        "api", "sessions", method="POST", body=json.dumps(body), request_timeout=scaled(60)
    )
    kernel_id = json.loads(response.body)["kernel"]["id"]
    assert await value_in(connect, kernel_id, "1 + 1") == "2"
    assert_started_once(starts, caplog)


async def test_a_restarted_kernel_is_handed_out_once_its_new_process_is_heard(
    jp_fetch, connect, jp_data_dir, manager
):
    """A restart starts a new process on the same ports: what the server's watches saw
    of the old one must not count for it. The restart returns once the new process listens
    and has answered, so a first cell sent at once is seen (its record lists it)."""
    launcher = f'sleep 3; exec "{sys.executable}" -m ipykernel_launcher -f "$0"'
    python_kernelspec(
        jp_data_dir, "slow-launcher", "Slow launcher", ["sh", "-c", launcher, "{connection_file}"]
    )
    body = {"path": "slow.ipynb", "type": "notebook", "kernel": {"name": "slow-launcher"}}
    response = await jp_fetch(
        "api", "sessions", method="POST", body=json.dumps(body), request_timeout=scaled(60)
    )
    kernel_id = json.loads(response.body)["kernel"]["id"]
    assert await value_in(connect, kernel_id, "1 + 1") == "2"

    await jp_fetch(
        "api", "kernels", kernel_id, "restart", method="POST", body="{}",
        request_timeout=scaled(60),
    )  # fmt: skip
    kernel = manager.kernel_manager.get_kernel(kernel_id)
    listening = {
        c.laddr.port
        for c in psutil.Process(kernel.provisioner.pid).net_connections()
        if c.status == psutil.CONN_LISTEN
    }
    assert kernel.iopub_port in listening, (kernel.iopub_port, listening)
    assert await value_in(connect, kernel_id, "2 + 2") == "4"
    await poll(lambda: manager.lifecycles[kernel_id].executed == [1], what="In[1] to be seen")


# -- 13. a record put under way when the autosave that wrote it is cancelled ------------------


def slow_record_puts(monkeypatch: Any, manager: CkptManager, seconds: float) -> list[Any]:
    """Record writes to the server's store take ``seconds`` (an object store's latency);
    the list gets ``"begun"`` and then ``"landed"`` (or ``"failed"``) per write."""
    backend = manager.store.backend
    write = backend.write_atomic
    writes: list[Any] = []

    def slow(path: str, data: Any) -> None:
        if not path.startswith("kernels/"):
            return write(path, data)
        writes.append("begun")
        time.sleep(seconds)
        try:
            write(path, data)
        except BaseException:
            writes.append("failed")
            raise
        writes.append("landed")

    monkeypatch.setattr(backend, "write_atomic", slow)
    return writes


async def test_a_shutdown_during_an_autosaves_record_put_leaves_no_record(
    jp_fetch, connect, manager, monkeypatch
):
    """The user shuts a kernel down while its autosave's record is being put: once the
    shutdown answered, the put has landed or failed, and the shutdown removed what it
    wrote. A put that landed afterwards would make a new server list the shut-down
    kernel as crashed, and fail its restore (its image was removed)."""
    _, kernel_id = await start_session(jp_fetch)
    client = await connect(kernel_id)
    await client.execute("x = 41")
    client.close()
    writes = slow_record_puts(monkeypatch, manager, 2)
    assert manager.lifecycles.start_autosave(kernel_id) is not None
    await poll(lambda: writes, timeout=60, what="the autosave's record put to begin")
    await jp_fetch("api", "kernels", kernel_id, method="DELETE")
    answered_while = writes[-1]
    await poll(lambda: writes[-1] != "begun", timeout=30, what="the record put to end")
    assert answered_while != "begun", "the shutdown answered while the record put was under way"
    with pytest.raises(ImageNotFound):
        fresh_store(manager).records.get(kernel_id)


# -- 14. a socket opened while a suspend commits ----------------------------------------------


async def test_a_cell_on_a_socket_opened_during_a_suspend_is_answered(jp_fetch, connect, manager):
    """A websocket opened while a suspend is under way, whose cell comes once the suspend
    has committed (the process is being stopped), gets the cell's reply, from the
    restored kernel: the socket was never attached to the process being stopped, which
    would have run the cell and died under it."""
    _, kernel_id = await start_session(jp_fetch)
    client = await connect(kernel_id)
    await client.execute("x = 41")
    client.close()
    late: list[Any] = []

    async def open_socket() -> None:
        late.append(await connect(kernel_id))

    at_step(manager, "recorded", open_socket)
    suspend = ("api", "ckpt", "kernels", kernel_id, "suspend")
    answer = asyncio.ensure_future(status_of(jp_fetch(*suspend, method="POST", body="")))
    lifecycles = manager.lifecycles
    await poll(
        lambda: lifecycles.state(kernel_id) is State.SUSPENDED or answer.done(),
        timeout=60,
        what="the suspend to commit",
    )
    try:
        msg_id = late[0].send("execute_request", {"code": "x + 1", "silent": False})
        reply = await late[0].reply_to(msg_id, timeout=60)
    except (WebSocketClosedError, ConnectionError, asyncio.TimeoutError) as exc:
        pytest.fail(f"the suspend answered {await answer}; the cell got no reply: {exc!r}")
    assert reply["content"]["status"] == "ok", reply["content"]
    assert (await answer)[0] == 200


async def test_a_cell_sent_as_a_suspend_closes_its_socket_is_answered_on_reconnect(
    jp_fetch, connect, manager
):
    """A cell a client sends once the suspend has committed, before it has seen the
    server close its socket (the server's own calls left it messages to read first), runs
    in the restored kernel, and its reply reaches the client's reconnect with its session:
    the process the socket was attached to is being stopped, and would die under it."""
    _, kernel_id = await start_session(jp_fetch)
    client = await connect(kernel_id)
    await client.execute("x = 41")
    suspend = ("api", "ckpt", "kernels", kernel_id, "suspend")
    answer = asyncio.ensure_future(status_of(jp_fetch(*suspend, method="POST", body="")))
    await poll(
        lambda: manager.lifecycles.state(kernel_id) is State.SUSPENDED or answer.done(),
        timeout=60,
        what="the suspend to commit",
    )
    assert not answer.done(), f"the suspend answered {answer.result()} before it stopped the kernel"
    msg_id = client.send("execute_request", {"code": _SLOW_CELL, "silent": False})
    with contextlib.suppress(ConnectionError, asyncio.TimeoutError):
        while True:  # what the old socket brings, to its close
            await client.receive(timeout=30)
    replies = [m for m in client.received if m["parent_header"].get("msg_id") == msg_id]
    if not any(m["channel"] == "shell" for m in replies):
        again = await connect(kernel_id, session_id=client.session.session)
        try:
            await again.reply_to(msg_id, timeout=60)
        except asyncio.TimeoutError:
            pytest.fail(f"the suspend answered {await answer}; the cell got no reply")
    assert (await answer)[0] == 200


# a cell still running when a process that got it is told to stop
_SLOW_CELL = "import time\ntime.sleep(1)\nx + 1"


# -- 15. a restore whose kernel cannot start --------------------------------------------------


async def test_a_cell_whose_kernel_cannot_start_gets_an_error_reply(
    jp_fetch, connect, jp_data_dir, manager
):
    """The kernel a cell wakes cannot start (its kernel spec is gone, and no process
    stands by for it): the cell gets an error reply that says why, the socket stays
    open, and the kernel stays suspended with its image, restored by the next cell once
    it can start."""
    manager.standby_kernel = False
    spec = python_kernelspec(
        jp_data_dir,
        "goes-away",
        "Goes away",
        [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
    )
    body = {"path": "away.ipynb", "type": "notebook", "kernel": {"name": spec}}
    response = await jp_fetch("api", "sessions", method="POST", body=json.dumps(body))
    kernel_id = json.loads(response.body)["kernel"]["id"]
    assert await value_in(connect, kernel_id, "x = 41; x") == "41"
    await jp_fetch("api", "ckpt", "kernels", kernel_id, "suspend", method="POST", body="")
    spec_dir = jp_data_dir / "kernels" / spec
    kept = spec_dir.with_name("kept")
    spec_dir.rename(kept)
    client = await connect(kernel_id)
    msg_id = client.send("execute_request", {"code": "x + 1", "silent": False})
    try:
        reply = await client.reply_to(msg_id, timeout=60)
    except (ConnectionError, asyncio.TimeoutError) as exc:
        pytest.fail(f"the cell got no reply: {exc!r}")
    content = reply["content"]
    assert (content["status"], spec in content["evalue"]) == ("error", True), content
    model = await get_json(jp_fetch, "api", "kernels", kernel_id)
    assert model["ckpt"]["state"] == "suspended", model
    kept.rename(spec_dir)
    _, outputs = await client.execute("x + 1")
    assert text_of(outputs).splitlines()[-1] == "42"


async def test_a_cell_reaches_the_socket_that_replaced_its_stale_one(jp_fetch, connect, manager):
    """The client's socket dropped without the server seeing it (a network blip), with a
    cell that wakes the kernel sent; the client reconnects with the same session while
    the restore runs, and the server replaces the stale socket: the cell's reply reaches
    the new socket, not the stale one that the server closes."""
    _, kernel_id = await suspended_kernel(jp_fetch, connect)
    first = await connect(kernel_id)
    second: list[Any] = []

    async def reconnect() -> None:
        second.append(await connect(kernel_id, session_id=first.session.session))

    at_step(manager, "restore", reconnect)
    msg_id = first.send("execute_request", {"code": "x + 1", "silent": False})
    await poll(lambda: second, timeout=60, what="the reconnect during the restore")
    try:
        reply = await second[0].reply_to(msg_id, timeout=30)
    except (ConnectionError, asyncio.TimeoutError) as exc:
        pytest.fail(
            f"the cell's reply did not reach the socket that replaced the stale one: {exc!r}"
        )
    assert reply["content"]["status"] == "ok", reply["content"]
