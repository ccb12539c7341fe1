"""A restore takes over a kernel process started ahead (see jupyter_ckpt_server.standby):
the kernel it brings back is the suspended one in every way a user or the server sees."""

from __future__ import annotations

import asyncio
import json
import os

import psutil
from deadlines import scaled
from server_helpers import FakeNvml, get_json, poll, start_session, text_of

from jupyter_ckpt.gpu import GpuProbe

WHO = (
    "import os; from jupyter_ckpt.kernel.state import kernel_id; "
    "print(x + 1, os.getpid(), __session__, os.environ['JPY_SESSION_NAME'], kernel_id())"
)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def test_a_restore_takes_over_the_process_standing_by(jp_fetch, connect, manager):
    _, kernel_id = await start_session(jp_fetch, "standby.ipynb")
    client = await connect(kernel_id)
    await client.execute("x = 41")
    await jp_fetch("api", "ckpt", "kernels", kernel_id, "suspend", method="POST", body="")
    standby = manager.lifecycles.standby
    pid = await poll(lambda: standby.pids().get("python3"), what="a process standing by")
    # a standby is no kernel of the kernels API
    assert [k["id"] for k in await get_json(jp_fetch, "api", "kernels")] == [kernel_id]

    client = await connect(kernel_id)  # the suspend closed the first socket
    reply, outputs = await client.execute(WHO)
    assert reply["status"] == "ok", reply
    answer, process, session, notebook, said_id = text_of(outputs).split()
    assert (answer, process, said_id) == ("42", str(pid), kernel_id)
    assert session == notebook and notebook.endswith("/standby.ipynb")
    assert manager.kernel_pid(kernel_id) == pid
    assert standby.pids() == {}
    # the next image is named for its notebook, as any kernel's is
    r = await jp_fetch("api", "ckpt", "kernels", kernel_id, "checkpoint", method="POST", body="")
    assert json.loads(r.body)["name"] == "standby"

    # a restart launches the kernel as it would have been launched: a new process
    await jp_fetch("api", "kernels", kernel_id, "restart", method="POST", body="")
    await poll(lambda: manager.kernel_pid(kernel_id) not in (None, pid), what="a new process")
    reply, outputs = await client.execute("import os; print(os.environ['JPY_SESSION_NAME'])")
    assert text_of(outputs).strip() == notebook


async def test_no_process_stands_by_without_a_suspended_kernel(jp_fetch, connect, manager):
    _, kernel_id = await start_session(jp_fetch)
    await (await connect(kernel_id)).execute("x = 1")
    await jp_fetch("api", "ckpt", "kernels", kernel_id, "suspend", method="POST", body="")
    standby = manager.lifecycles.standby
    pid = await poll(lambda: standby.pids().get("python3"), what="a process standing by")
    # the user shuts the suspended kernel down: nothing is left to restore
    await jp_fetch("api", "kernels", kernel_id, method="DELETE")
    manager.lifecycles.keep_standby()
    await poll(lambda: _gone(pid), what="the standby stopped")
    assert standby.pids() == {}


async def test_the_process_standing_by_stops_with_the_server(jp_fetch, connect, manager):
    _, kernel_id = await start_session(jp_fetch)
    await (await connect(kernel_id)).execute("x = 1")
    await jp_fetch("api", "ckpt", "kernels", kernel_id, "suspend", method="POST", body="")
    pid = await poll(lambda: manager.lifecycles.standby.pids().get("python3"), what="a standby")
    await manager.kernel_manager.shutdown_all()
    assert _gone(pid)


async def test_a_process_standing_by_that_holds_gpu_memory_is_never_used(
    jp_fetch, connect, manager
):
    """A startup file that initializes CUDA would make every standby hold GPU memory: the
    restore starts its kernel as before, and no standby is kept for that spec again."""
    _, kernel_id = await start_session(jp_fetch)
    await (await connect(kernel_id)).execute("x = 41")
    await jp_fetch("api", "ckpt", "kernels", kernel_id, "suspend", method="POST", body="")
    standby = manager.lifecycles.standby
    pid = await poll(lambda: standby.pids().get("python3"), what="a process standing by")
    manager.probe = GpuProbe(FakeNvml({0: [(pid, 512 * 2**20)]}))

    client = await connect(kernel_id)
    reply, outputs = await client.execute("import os; print(x + 1, os.getpid())")
    assert reply["status"] == "ok", reply
    answer, process = text_of(outputs).split()
    assert answer == "42" and process != str(pid), "a kernel of its own, not the standby"
    await poll(lambda: _gone(pid), what="the standby stopped")
    await jp_fetch("api", "ckpt", "kernels", kernel_id, "suspend", method="POST", body="")
    manager.lifecycles.keep_standby()
    assert standby.pids() == {} and not standby._starting, "none started for that spec again"


async def test_a_kernel_restored_in_the_standby_ran_its_own_setup_and_has_its_file(
    jp_fetch, connect, manager, tmp_path, monkeypatch
):
    """The kernel's own setup (here the user's ``IPKernelApp.exec_lines``) ran in the
    process standing by as in a cold start, and the restored kernel's connection file is
    the one a cold start writes: ``kernel-<id>.json``, found by its id."""
    profile = tmp_path / "ipython" / "profile_default"
    profile.mkdir(parents=True)
    (profile / "ipython_kernel_config.py").write_text(
        "c.IPKernelApp.exec_lines = "
        "['import json', 'json.setup_ran_in = __import__(\"os\").getpid()']\n"
    )
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    _, kernel_id = await start_session(jp_fetch, "setup.ipynb")
    client = await connect(kernel_id)
    await client.execute("x = 1")
    await jp_fetch("api", "ckpt", "kernels", kernel_id, "suspend", method="POST", body="")
    pid = await poll(lambda: manager.lifecycles.standby.pids().get("python3"), what="a standby")

    client = await connect(kernel_id)
    reply, outputs = await client.execute(
        "import json, os\nfrom jupyter_client import find_connection_file\n"
        "from ipykernel.connect import get_connection_file\n"
        f"print(json.setup_ran_in == os.getpid(), os.getpid(), "
        f"os.path.basename(get_connection_file()), "
        f"os.path.basename(find_connection_file({kernel_id!r})), "
        "json.dumps([os.path.basename(a) for a in __import__('sys').argv[1:]]))"
    )
    assert reply["status"] == "ok", text_of(outputs)
    ran, process, own_file, found, argv = text_of(outputs).split(maxsplit=4)
    assert (ran, process) == ("True", str(pid))
    assert own_file == found == f"kernel-{kernel_id}.json"
    # as a cold start's command line: the kernel's file, no warm-up
    assert json.loads(argv) == ["-f", f"kernel-{kernel_id}.json"]
    kernel = manager.kernel_manager.get_kernel(kernel_id)
    assert os.path.basename(kernel.connection_file) == f"kernel-{kernel_id}.json"


async def test_a_process_standing_by_with_other_values_in_its_environment_is_not_used(
    jp_fetch, connect, manager, monkeypatch
):
    """The server's environment changed a value since the process standing by started
    (the same names, another value): the restore starts a process of its own, which
    sees the value a kernel started now sees."""
    monkeypatch.setenv("CKPT_STANDBY_PROBE", "before")
    _, kernel_id = await start_session(jp_fetch, "env.ipynb")
    await (await connect(kernel_id)).execute("x = 41")
    await jp_fetch("api", "ckpt", "kernels", kernel_id, "suspend", method="POST", body="")
    standby = manager.lifecycles.standby
    pid = await poll(lambda: standby.pids().get("python3"), what="a process standing by")
    monkeypatch.setenv("CKPT_STANDBY_PROBE", "after")
    client = await connect(kernel_id)
    _, outputs = await client.execute(
        "import os; print(os.environ['CKPT_STANDBY_PROBE'], os.getpid())"
    )
    value, process = text_of(outputs).split()[-2:]
    assert (value, process != str(pid)) == ("after", True)


async def test_a_restore_never_takes_a_standby_that_has_not_read_its_connection_file(
    jp_fetch, connect, manager, tmp_path, monkeypatch
):
    """A standby still starting has not read its connection file yet (a cold import, a
    loaded node): were it handed to a restore, the file's move to the kernel's name would
    leave the process to choose ports of its own, and the kernel would never answer. Only
    a standby that answered is taken."""
    site = tmp_path / "slow-standby"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import sys, time\nif any('code_to_run' in arg for arg in sys.argv):\n    time.sleep(4)\n"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    _, kernel_id = await start_session(jp_fetch, "slow.ipynb")
    await (await connect(kernel_id)).execute("x = 41")
    await jp_fetch("api", "ckpt", "kernels", kernel_id, "suspend", method="POST", body="")
    client = await connect(kernel_id)  # restores while the standby sleeps
    reply, outputs = await asyncio.wait_for(client.execute("print(x + 1)"), scaled(60))
    assert (reply["status"], text_of(outputs).strip()) == ("ok", "42")
