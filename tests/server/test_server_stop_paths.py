"""Every way a real `jupyter server` stops suspends its kernels first.

Each test starts a server process, gives a kernel some state, stops the server one way,
starts a new server on the same store and checks the kernel is listed under its id and
its state comes back through the websocket.
"""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import subprocess
import sys
import termios
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from jupyter_ckpt_server.policy import STOP_GRACE_ENV, SuspendPolicy
from jupyter_ckpt_server.shutdown import grace_period_warning
from jupyterhub.spawner import LocalProcessSpawner
from server_helpers import GATE_MODULE, GATED_STATE, ServerProcess, poll
from traitlets import TraitError


async def kernel_with_state(
    server: ServerProcess, code: str = "x = 41", path: str = "nb.ipynb"
) -> dict[str, Any]:
    """A notebook session whose kernel ran ``code``."""
    body = {"path": path, "name": path, "type": "notebook", "kernel": {}}
    session = await server.fetch("POST", "sessions", body)
    await server.run_cell(session["kernel"]["id"], code)
    return session


async def assert_restores(server: ServerProcess, session: dict[str, Any]) -> None:
    """A new server on the same store lists the kernel as suspended, attached to its
    notebook's session as before, and restores it."""
    kernel_id = session["kernel"]["id"]
    # the sessions database does not outlive the server (the default keeps it in memory;
    # a respawn on another node has none): the sessions come back from the records
    (server.tmp / "sessions.db").unlink()
    await server.start()
    try:
        # records load once the event loop runs, a moment after the server answers
        kernels = await poll(lambda: server.get("kernels"), what="the kernel to be listed")
        assert [(k["id"], k["ckpt"]["state"]) for k in kernels] == [(kernel_id, "suspended")]
        sessions = [(s["id"], s["path"], s["kernel"]["id"]) for s in await server.get("sessions")]
        assert sessions == [(session["id"], session["path"], kernel_id)]
        assert await server.run_cell(kernel_id, "x + 1") == "42"
    finally:
        server.terminate()


def signal_stop(sig: int) -> Callable[[ServerProcess], Awaitable[None]]:
    async def stop(server: ServerProcess) -> None:
        server.send_signal(sig)
        assert await server.exited() == 0

    return stop


async def api_shutdown(server: ServerProcess) -> None:
    await server.fetch("POST", "shutdown")
    assert await server.exited() == 0


async def jupyter_server_stop(server: ServerProcess) -> None:
    """`jupyter server stop PORT`: POST /api/shutdown, SIGTERM after 5 s, SIGKILL after 10."""
    command = [sys.executable, "-m", "jupyter_server", "stop", str(server.port)]
    stopper = subprocess.Popen(command, env=server.env, stderr=subprocess.PIPE)
    # reap the server as soon as it exits: its pid must vanish for the command to see it gone
    done = lambda: server.process.poll() is not None and stopper.poll() is not None  # noqa: E731
    await poll(done, timeout=60, what="jupyter server stop")
    assert stopper.returncode == 0, stopper.stderr.read()  # type: ignore[union-attr]
    assert await server.exited() == 0  # by itself, not by the command's SIGTERM or SIGKILL


@pytest.mark.parametrize(
    "stop",
    [
        signal_stop(signal.SIGTERM),
        signal_stop(signal.SIGINT),
        api_shutdown,
        jupyter_server_stop,
    ],
    # SIGTERM is also how docker stop, a pod deletion and systemctl stop begin
    ids=["SIGTERM", "SIGINT", "api-shutdown", "jupyter-server-stop"],
)
async def test_stop_suspends_and_a_new_server_restores(tmp_path, stop):
    server = ServerProcess(tmp_path)
    await server.start(stdin=subprocess.DEVNULL)
    try:
        session = await kernel_with_state(server)
        await stop(server)
    finally:
        server.kill()
    await assert_restores(server, session)


class Terminal:
    """A pseudo-terminal that the server runs in, as in a shell: its stdin and stdout and
    its session's controlling terminal."""

    def __init__(self) -> None:
        self.master, self.slave = pty.openpty()
        self.shown = bytearray()

    async def start(self, server: ServerProcess) -> None:
        def controlling_terminal() -> None:
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        await server.start(
            stdin=self.slave,
            stdout=self.slave,
            start_new_session=True,
            preexec_fn=controlling_terminal,
        )
        os.close(self.slave)

    def type(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def shows(self, text: bytes) -> bool:
        while select.select([self.master], [], [], 0)[0]:
            self.shown.extend(os.read(self.master, 4096))
        return text in self.shown

    def close(self) -> None:
        """Hang up, as a closed terminal window or ssh session does."""
        if self.master >= 0:
            os.close(self.master)
            self.master = -1


async def test_ctrl_c_in_a_terminal_confirmed_with_y(tmp_path):
    """Ctrl-C in the terminal running the server, 'y' at the server's question, then
    Ctrl-C again while the kernel is being saved."""
    (tmp_path / "gate.py").write_text(GATE_MODULE)
    server = ServerProcess(tmp_path)
    terminal = Terminal()
    await terminal.start(server)
    try:
        session = await kernel_with_state(server, GATED_STATE)
        terminal.type(b"\x03")  # the terminal sends SIGINT to its foreground group
        await poll(lambda: terminal.shows(b"Shut down this Jupyter server (y/[n])?"))
        terminal.type(b"y\n")
        await poll(lambda: "Suspending up to 1 kernel" in server.log(), what="the suspend")
        terminal.type(b"\x03")
        await poll(lambda: "Received SIGINT while suspending" in server.log())
        (tmp_path / "gate-open").touch()
        assert await server.exited() == 0
    finally:
        server.kill()
        terminal.close()
    await assert_restores(server, session)


async def test_closing_the_terminal(tmp_path):
    """The terminal (or ssh session) the server runs in closes: SIGHUP."""
    server = ServerProcess(tmp_path)
    terminal = Terminal()
    await terminal.start(server)
    try:
        session = await kernel_with_state(server)
        terminal.close()
        assert await server.exited() == 0
    finally:
        server.kill()
        terminal.close()
    await assert_restores(server, session)


async def test_stop_signals_during_the_suspend_do_not_cut_it_short(tmp_path):
    """A spawner's SIGTERM after its SIGINT (and a repeated SIGINT, a SIGHUP) arrive while
    the kernel is being saved: the suspend goes on and the state is kept."""
    (tmp_path / "gate.py").write_text(GATE_MODULE)
    server = ServerProcess(tmp_path)
    await server.start(stdin=subprocess.DEVNULL)
    try:
        session = await kernel_with_state(server, GATED_STATE)
        server.send_signal(signal.SIGINT)
        await poll(lambda: "Suspending up to 1 kernel" in server.log(), what="the suspend")
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            server.send_signal(sig)
            name = signal.Signals(sig).name
            await poll(lambda n=name: f"Received {n} while suspending" in server.log())
        assert server.process.poll() is None
        (tmp_path / "gate-open").touch()
        assert await server.exited() == 0
    finally:
        server.kill()
    await assert_restores(server, session)


async def test_kernels_not_suspended_in_time_are_logged_with_the_reason(tmp_path):
    (tmp_path / "gate.py").write_text(GATE_MODULE)
    server = ServerProcess(tmp_path, policy={"shutdown_timeout": 1})
    await server.start(stdin=subprocess.DEVNULL)
    try:
        session = await kernel_with_state(server, "import gate\ng = gate.Gate()")
        server.send_signal(signal.SIGTERM)
        assert await server.exited() == 0
    finally:
        server.kill()
    kernel_id = session["kernel"]["id"]
    assert f"Kernel {kernel_id} was not suspended before shutdown: not done within 1" in (
        server.log()
    )


async def test_jupyterhub_local_process_spawner_stop(tmp_path):
    """JupyterHub's own LocalProcessSpawner.stop() with its default timeouts: SIGINT, then
    SIGTERM after interrupt_timeout, then SIGKILL after term_timeout."""
    hub_env = {"JUPYTERHUB_API_URL": "http://127.0.0.1:8081/hub/api", "JUPYTERHUB_USER": "u"}
    server = ServerProcess(tmp_path, env=hub_env)
    # as the spawner starts it: a session of its own, no terminal
    await server.start(stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        await poll(lambda: "This server was started by JupyterHub" in server.log())
        session = await kernel_with_state(server)
        spawner = LocalProcessSpawner()
        spawner.proc, spawner.pid = server.process, server.process.pid
        await spawner.stop()
        assert server.process.returncode == 0  # exited by itself, before any SIGKILL
    finally:
        server.kill()
    assert "Received SIGINT: suspending kernels" in server.log()
    await assert_restores(server, session)


def test_grace_period_warning_says_when_sigkill_may_come_first(monkeypatch):
    policy = SuspendPolicy(shutdown_timeout=120)
    assert grace_period_warning(policy, {}) is None  # unknown: a terminal, a service
    in_pod = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "JUPYTERHUB_API_URL": "http://hub"}
    assert "Kubernetes pod" in grace_period_warning(policy, in_pod)
    assert "started by JupyterHub" in grace_period_warning(policy, {"JUPYTERHUB_API_URL": "x"})

    policy.stop_grace_period = 60
    assert "stop_grace_period is 60 s, less than" in grace_period_warning(policy, in_pod)
    policy.stop_grace_period = 130
    assert grace_period_warning(policy, in_pod) is None
    assert grace_period_warning(SuspendPolicy(shutdown_timeout=15), in_pod) is None

    monkeypatch.setenv(STOP_GRACE_ENV, "45")
    assert SuspendPolicy().stop_grace_period == 45
    for bad in ("soon", "-5"):
        monkeypatch.setenv(STOP_GRACE_ENV, bad)
        with pytest.raises(TraitError, match=f"{STOP_GRACE_ENV} must be a number of seconds"):
            SuspendPolicy().stop_grace_period  # noqa: B018


async def test_jupyterhub_sigkill_keeps_the_kernels_already_suspended(tmp_path):
    """LocalProcessSpawner with the timeouts of older JupyterHub releases (SIGTERM after
    10 s, SIGKILL 5 s later) and one kernel still saving at SIGKILL: SIGTERM does not cut
    the suspend, SIGKILL does, and the kernel suspended before it is kept."""
    (tmp_path / "gate.py").write_text(GATE_MODULE)
    server = ServerProcess(tmp_path)
    await server.start(stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        kept = await kernel_with_state(server)
        await kernel_with_state(server, GATED_STATE, path="slow.ipynb")
        spawner = LocalProcessSpawner(interrupt_timeout=10, term_timeout=5)
        spawner.proc, spawner.pid = server.process, server.process.pid
        await spawner.stop()
        assert server.process.returncode == -signal.SIGKILL
    finally:
        server.kill()
        (tmp_path / "gate-open").touch()  # lets the orphaned saving kernel end
    log = server.log()
    assert f"Suspended kernel {kept['kernel']['id']} to image" in log
    assert "Received SIGTERM while suspending" in log
    await assert_restores(server, kept)
