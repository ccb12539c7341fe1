"""The private jupyter_server and jupyter_client names the extension uses
(jupyter_ckpt_server.compat) are there, with the shape it uses, in the installed versions:
a release that drops or renames one fails here by name, not somewhere in a kernel's
suspend. CI runs this under the oldest supported jupyter_server and the newest."""

from __future__ import annotations

import inspect
import re

from jupyter_ckpt_server import compat
from jupyter_ckpt_server.kernelmanager import CkptKernelManager
from jupyter_client.manager import KernelManager
from jupyter_server.serverapp import ServerApp
from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager


def test_the_kernel_managers_private_state_is_there() -> None:
    km = AsyncMappingKernelManager()
    assert compat.kernels(km) == {}
    assert compat.connections(km, "no-such-kernel") == 0
    assert isinstance(compat.open_sessions(), dict)


def test_each_overridden_method_is_what_the_public_name_calls() -> None:
    """Overriding ``_async_x`` changes ``x`` only while upstream's ``x`` is ``_async_x``."""
    for name in compat.OVERRIDDEN:
        upstream = getattr(AsyncMappingKernelManager, name)
        assert inspect.iscoroutinefunction(upstream), name
        assert getattr(AsyncMappingKernelManager, name.removeprefix("_async_")) is upstream
        assert name in vars(CkptKernelManager), f"{name} is listed but not overridden"


def test_a_launch_repeats_what_set_launch_args_gives_it() -> None:
    manager = KernelManager()
    manager._launch_args = {"env": {"A": "1"}, "cwd": "/old"}
    compat.set_launch_args(manager, cwd="/new", extra_arguments=[])
    assert manager._launch_args == {"env": {"A": "1"}, "cwd": "/new", "extra_arguments": []}


def test_the_sigint_confirmation_and_routes_are_there() -> None:
    assert inspect.isfunction(ServerApp._handle_sigint)
    for pattern, example in [
        (compat.KERNEL_ID, "0b3a54e6-6e8c-4b0d-9b0e-3c1ad7a0d3a1"),
        (compat.KERNEL_ACTION, "restart"),
        (compat.SESSION_ID, "0b3a54e6-6e8c-4b0d-9b0e-3c1ad7a0d3a1"),
    ]:
        assert re.fullmatch(pattern, example), (pattern, example)
