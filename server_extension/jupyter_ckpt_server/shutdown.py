"""Every stop signal runs the server's one suspending stop, once, to the end.

jupyter_server stops through ``ServerApp.stop()``: its cleanup stops the extensions (where
kernels are suspended) before it shuts the kernels down. SIGTERM, ``POST /api/shutdown``
and the terminal's Ctrl-C confirmation take that path. Three stops do not:

- SIGINT without a terminal (JupyterHub's LocalProcessSpawner, ``kill -INT``) keeps
  Python's default handler: KeyboardInterrupt unwinds the event loop, no cleanup runs, and
  the kernels die with the server;
- SIGHUP (the terminal or ssh session that started the server closes) ends the process;
- a second signal (a spawner's SIGTERM after its SIGINT, a repeated Ctrl-C) starts a second
  cleanup next to the first.

``StopGuard`` owns those signals through the event loop's ``add_signal_handler``: the
handler runs in the loop, where ``ServerApp.stop()`` is safe to call, and no ServerApp
method is replaced. It leaves SIGINT to jupyter_server while the server asks for
confirmation in a terminal, since that path already ends in ``stop()``. Once a stop has
begun, by any path, every further SIGINT, SIGTERM and SIGHUP is logged and otherwise
ignored until the suspend is over: the suspend runs to ``shutdown_timeout``, and only
SIGKILL (which no process can catch) cuts it short.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Mapping
from typing import Any

from . import compat
from .policy import SuspendPolicy

# SIGHUP does not exist on Windows, where the event loop takes no signal handlers anyway.
STOP_SIGNALS = tuple(
    getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n)
)

# Seconds a server needs after the suspend: shut the kernels down, close, exit.
STOP_MARGIN = 10.0

# Kubernetes' terminationGracePeriodSeconds when a pod spec does not set it; the pod itself
# cannot read the value its spec sets.
KUBERNETES_DEFAULT_GRACE = 30.0


class StopGuard:
    """Turns SIGINT, SIGTERM and SIGHUP into one ``ServerApp.stop()`` and holds later
    signals off while kernels are being suspended."""

    def __init__(self, serverapp: Any, policy: SuspendPolicy, log: logging.Logger) -> None:
        self.serverapp = serverapp
        self.policy = policy
        self.log = log
        self._loop: asyncio.AbstractEventLoop | None = None
        self._installed: set[int] = set()
        self._deadline: float | None = None  # monotonic end of the suspend, once stopping

    @property
    def stopping(self) -> bool:
        return self._deadline is not None

    def install(self) -> None:
        """Handle the stop signals; call from the running event loop, main thread."""
        self._loop = asyncio.get_running_loop()
        try:
            for sig in STOP_SIGNALS:
                if sig == signal.SIGINT and self._server_confirms_sigint():
                    continue
                self._handle(sig)
        except NotImplementedError:  # an event loop without signal handlers (Windows)
            self._loop = None
            self.log.warning(
                "This event loop takes no signal handlers: only the stops of jupyter_server "
                "itself (SIGTERM, the shutdown API) suspend kernels"
            )

    def _server_confirms_sigint(self) -> bool:
        # jupyter_server installs its confirmation handler only with a terminal on stdin
        # (JupyterHub's single-user server makes that handler stop at once); either way
        # it ends in ServerApp.stop().
        return compat.confirms_sigint(self.serverapp)

    def _handle(self, sig: int) -> None:
        assert self._loop is not None
        self._loop.add_signal_handler(sig, self._on_signal, sig)
        self._installed.add(sig)

    def _on_signal(self, sig: int) -> None:
        name = signal.Signals(sig).name
        if self.stopping:
            self.log.warning(
                "Received %s while suspending kernels: the suspend goes on for at most "
                "%.0f s more (SIGKILL would stop it and lose the kernels not yet saved)",
                name,
                max(0.0, self._deadline - time.monotonic()),  # type: ignore[operator]
            )
            return
        self.log.critical("Received %s: suspending kernels, then stopping", name)
        self.begin()
        self.serverapp.stop()

    def begin(self) -> None:
        """A stop has begun (a signal, the shutdown API, a confirmed Ctrl-C): from now on
        the stop signals only log until ``end()``."""
        if self.stopping or self._loop is None:
            return
        self._deadline = time.monotonic() + self.policy.shutdown_timeout
        for sig in STOP_SIGNALS:
            self._handle(sig)

    def end(self) -> None:
        """The suspend is over: a further signal stops the process as it would without
        the extension (nothing is left to save)."""
        if self._loop is None:
            return
        for sig in self._installed:
            with contextlib.suppress(RuntimeError):  # the loop may already be closed
                self._loop.remove_signal_handler(sig)
        self._installed.clear()


def grace_period_warning(policy: SuspendPolicy, environ: Mapping[str, str]) -> str | None:
    """Why the server may be killed before its kernels are suspended, if it can tell.

    The grace period is the time between the first stop signal and SIGKILL. A process
    cannot read it: Kubernetes does not show a pod its terminationGracePeriodSeconds, and a
    hub does not tell its spawner's timeouts. So it is ``stop_grace_period`` when the
    deployment sets it, else Kubernetes' default inside a pod, else unknown (a hint under
    JupyterHub, nothing otherwise).
    """
    needed = policy.shutdown_timeout + STOP_MARGIN
    advice = (
        f"give the server at least {needed:.0f} s between the first stop signal and SIGKILL "
        "(see the README's table of stop paths) and set SuspendPolicy.stop_grace_period "
        "(or JUPYTER_CKPT_STOP_GRACE_PERIOD) to it, or lower SuspendPolicy.shutdown_timeout"
    )
    if policy.stop_grace_period > 0:
        if policy.stop_grace_period >= needed:
            return None
        return (
            f"SuspendPolicy.stop_grace_period is {policy.stop_grace_period:.0f} s, less than "
            f"shutdown_timeout + {STOP_MARGIN:.0f} s = {needed:.0f} s: kernels still being "
            f"suspended when SIGKILL comes lose their state; {advice}"
        )
    if "KUBERNETES_SERVICE_HOST" in environ:
        if needed <= KUBERNETES_DEFAULT_GRACE:
            return None
        return (
            "This server runs in a Kubernetes pod, whose terminationGracePeriodSeconds it "
            f"cannot read (default {KUBERNETES_DEFAULT_GRACE:.0f} s, less than "
            f"shutdown_timeout + {STOP_MARGIN:.0f} s = {needed:.0f} s); {advice}"
        )
    if "JUPYTERHUB_API_URL" in environ:
        return (
            "This server was started by JupyterHub, whose spawner decides when SIGKILL "
            "follows the stop signal (LocalProcessSpawner: interrupt_timeout + term_timeout; "
            f"KubeSpawner: terminationGracePeriodSeconds) and does not tell the server; {advice}"
        )
    return None
