"""The private parts of jupyter_server and jupyter_client that the extension uses, in one
place: each is where a release of either can break the extension without an error at
import. (:mod:`jupyter_ckpt.compat` is another matter: whether an image runs on a node.)

Checked against jupyter_server 2.14.2 (the oldest that pyproject.toml allows) and 2.21.1,
with jupyter_client 8.10.0; ``tests/server/test_server_upstream_names.py`` checks that
each name below exists in the installed versions, and CI runs jupyter_server's own kernels
and sessions tests against both jupyter_server versions (.ci/run, whose suite has the
newest, and .ci/oldest-jupyter-server), which is what catches a changed meaning.

Names used through this module:

========================================================  ===================================
``MultiKernelManager._kernels``                           :func:`kernels`: the kernels that
                                                          have a process (``list_kernel_ids``
                                                          may also load external ones)
``MappingKernelManager._kernel_connections``              :func:`connections`: a kernel's
                                                          open websockets, in the idle
                                                          monitor (``kernel_model`` would
                                                          fail on a process just started)
``KernelManager._launch_args`` (jupyter_client)           :func:`set_launch_args`: what a
                                                          restart repeats, for a standby
                                                          process handed to a kernel
``ZMQChannelsWebsocketConnection._open_sessions``         :func:`open_sessions`: the live
                                                          websocket of each kernel session
``ServerApp._handle_sigint``                              :func:`confirms_sigint`
``_kernel_id_regex``, ``_kernel_action_regex``            :data:`KERNEL_ID`,
(``services.kernels.handlers``), ``_session_id_regex``    :data:`KERNEL_ACTION`,
(``services.sessions.handlers``)                          :data:`SESSION_ID`: the routes the
                                                          extension's handlers take over
========================================================  ===================================

Overridden in :class:`.kernelmanager.CkptKernelManager` (:data:`OVERRIDDEN`): the
``_async_*`` methods of ``AsyncMappingKernelManager`` whose assignments are its public
``start_kernel``, ``shutdown_kernel``, ``restart_kernel`` and ``shutdown_all``;
jupyter_client calls the private ones too (``_async_shutdown_all`` shuts each kernel down
with ``_async_shutdown_kernel``), which an override of the public names alone would miss.
``interrupt_kernel`` has no such twin and is overridden by its public name.
"""

from __future__ import annotations

import signal
from typing import Any

from jupyter_server.services.kernels.connection.channels import ZMQChannelsWebsocketConnection
from jupyter_server.services.kernels.handlers import _kernel_action_regex, _kernel_id_regex
from jupyter_server.services.sessions.handlers import _session_id_regex

KERNEL_ID: str = _kernel_id_regex
KERNEL_ACTION: str = _kernel_action_regex
SESSION_ID: str = _session_id_regex

#: AsyncMappingKernelManager's private methods that CkptKernelManager overrides.
OVERRIDDEN = (
    "_async_start_kernel",
    "_async_shutdown_kernel",
    "_async_restart_kernel",
    "_async_shutdown_all",
)


def kernels(kernel_manager: Any) -> dict[str, Any]:
    """Kernel id -> the ``KernelManager`` of each kernel that has a process."""
    found: dict[str, Any] = kernel_manager._kernels
    return found


def connections(kernel_manager: Any, kernel_id: str) -> int:
    """How many websockets are open to the kernel."""
    count: int = kernel_manager._kernel_connections.get(kernel_id, 0)
    return count


def set_launch_args(manager: Any, **updates: Any) -> None:
    """Change what a restart of the kernel's process passes to its launch."""
    manager._launch_args = {**manager._launch_args, **updates}


def open_sessions() -> dict[str, Any]:
    """``<kernel id>:<session id>`` -> the websocket handler of each live kernel session."""
    sessions: dict[str, Any] = ZMQChannelsWebsocketConnection._open_sessions
    return sessions


def confirms_sigint(serverapp: Any) -> bool:
    """Whether jupyter_server's own SIGINT handler, which asks for a confirmation on the
    terminal, is installed (it is only with a terminal on stdin)."""
    return bool(signal.getsignal(signal.SIGINT) == serverapp._handle_sigint)
