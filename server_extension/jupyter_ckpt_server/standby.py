"""A kernel process started ahead, for the next restore to take over.

A restore's first result used to wait for a kernel process to start (Python, ipykernel,
then jupyter_ckpt imported: a second or more) before the image was even opened. While
kernels are suspended, the server keeps one process of each of their kernel specs
started, with ``jupyter_ckpt.kernel`` (and numpy) imported, and a restore adopts it under the
suspended kernel's id (:meth:`Standby.take`), then tells it whose kernel it now is (its id
and notebook, see :func:`jupyter_ckpt.kernel.restore`). Another is started behind it while
kernels of that spec stay suspended. A standby is taken only once it has answered (see
:func:`_answered`).

A standby runs no user code and is not a kernel of the kernels API: it is not listed,
culled or connected to. It is started only for a Python kernel spec run by ipykernel
(``--IPKernelApp.exec_lines`` warms it up), only with the environment a restore of that
spec would have (save the notebook's name, which the restore sets), and it goes when no
kernel of its spec is suspended, or when the server stops. One whose process holds GPU
memory (a startup file that initializes CUDA) is stopped, and none is started for its
spec again: a standby must never hold the GPU that suspending freed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import uuid
from collections.abc import Iterable
from typing import Any

from jupyter_core.utils import ensure_async

from jupyter_ckpt.kernel.state import WARM_UP_OPTION

from . import compat

# what a standby imports at its start: what every restore imports first, and numpy where
# it is installed (what array data is restored into; a cold import of it takes ~0.5 s).
# As the command line's code, run after the kernel's own setup (startup files, the user's
# exec_lines and exec_files, extensions), which it leaves as a cold start has it.
WARM_UP = WARM_UP_OPTION + "\n".join(
    [
        "import importlib.util, jupyter_ckpt.kernel",
        "if importlib.util.find_spec('numpy'): import numpy; del numpy",
        "del importlib, jupyter_ckpt",  # imported, not names of the user's
    ]
)
# how long a standby may take to answer before it is given up (a restore meanwhile starts
# a kernel of its own)
READY_TIMEOUT = 120.0
# set per kernel, as the restore will: left out when comparing environments
PER_KERNEL_ENV = ("JPY_SESSION_NAME",)


def _shared(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in PER_KERNEL_ENV}


async def _adopted(manager: Any, **kw: Any) -> None:
    """The standby's start, once, when a restore takes it: its process runs already. It
    takes the kernel's id and the connection file a cold start would have written
    (``kernel-<id>.json``, which ``jupyter console --existing <id>`` looks for), and the
    launch a restart will repeat becomes the kernel's own (its environment and working
    directory); its later starts are its class's again."""
    del manager.start_kernel
    manager.kernel_id = kw["kernel_id"]
    named = os.path.join(os.path.dirname(manager.connection_file), f"kernel-{kw['kernel_id']}.json")
    os.replace(manager.connection_file, named)
    # its command line still names the file it started with (see work.kernel_process)
    manager.launched_connection_file = manager.connection_file
    manager.connection_file = named
    if manager.provisioner is not None:
        manager.provisioner.kernel_id = kw["kernel_id"]
    launch = {k: kw[k] for k in ("env", "cwd") if k in kw}
    compat.set_launch_args(manager, **launch, extra_arguments=[])


async def _answered(manager: Any) -> None:
    """Once the started process answers: it has read its connection file (which the
    adoption moves to the kernel's name: a process that had not would choose ports of its
    own, where the server never finds it) and run its warm-up."""
    client = manager.client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=READY_TIMEOUT)
    finally:
        client.stop_channels()


class Standby:
    """At most one started, unused kernel process per kernel spec."""

    def __init__(self, kernel_manager: Any, rpc: Any, log: Any) -> None:
        self.kernel_manager = kernel_manager  # the server's CkptKernelManager
        self.rpc = rpc  # its GPU probe
        self.log = log
        self.enabled = True
        self._ready: dict[str, tuple[Any, dict[str, str]]] = {}  # spec -> (manager, env)
        self._starting: dict[str, asyncio.Task[None]] = {}
        self._refused: set[str] = set()  # specs whose standby held GPU memory

    def want(self, kernel_names: Iterable[str], env: dict[str, str]) -> None:
        """Keep one process standing by for each of ``kernel_names`` (the specs of the
        suspended kernels), started with ``env``; stop the others."""
        wanted = {name for name in kernel_names if self._suits(name)} if self.enabled else set()
        for name in wanted - self._ready.keys() - self._starting.keys():
            self._starting[name] = asyncio.ensure_future(self._start(name, env))
        for name in set(self._ready) - wanted:
            self._stop_later(self._ready.pop(name)[0])

    def pids(self) -> dict[str, int]:
        """Kernel spec -> the pid of the process standing by for it."""
        return {
            name: manager.provisioner.pid
            for name, (manager, _) in self._ready.items()
            if manager.provisioner is not None
        }

    async def started(self, kernel_name: str, timeout: float = 10) -> None:
        """Wait for a standby of ``kernel_name`` still starting: it is further on than a
        start begun now would be."""
        starting = self._starting.get(kernel_name)
        if starting is not None:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(starting), timeout)

    def take(self, kernel_name: str, env: dict[str, str]) -> Any | None:
        """The standby of ``kernel_name``, if it runs and was started with ``env`` (but
        for :data:`PER_KERNEL_ENV`); else None. It is the caller's now, and its next
        ``start_kernel`` (the kernels manager's start, see
        ``CkptKernelManager.pre_start_kernel``) takes the process over rather than
        launching one."""
        ready = self._ready.pop(kernel_name, None)
        if ready is None:
            return None
        manager, started_with = ready
        if _shared(started_with) != _shared(env):  # the next one starts with the new env
            differ = sorted(
                k for k in _shared(env).keys() | _shared(started_with).keys()
                if env.get(k) != started_with.get(k)
            )  # fmt: skip
            self.log.info(
                "jupyter-ckpt: standby kernel not used: environment differs in %s", differ
            )
            self._stop_later(manager)
            return None
        if not manager.has_kernel or manager.provisioner is None:
            return None
        pid = manager.provisioner.pid
        if pid and self.rpc.probe.memory_by_pid().get(pid):
            self.log.warning(
                "jupyter-ckpt: the standby kernel of %s holds GPU memory (a startup file?): "
                "it is stopped, and no standby is kept for this kernel spec",
                kernel_name,
            )
            self._refused.add(kernel_name)
            self._stop_later(manager)
            return None
        manager.start_kernel = functools.partial(_adopted, manager)
        return manager

    async def close(self) -> None:
        """The server stops: so do the standbys, and those still starting."""
        self.enabled = False
        for task in list(self._starting.values()):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        managers = [manager for manager, _ in self._ready.values()]
        self._ready.clear()
        await asyncio.gather(*(self._stop(m) for m in managers), return_exceptions=True)

    def _suits(self, kernel_name: str) -> bool:
        if kernel_name in self._refused:
            return False
        try:
            spec = self.kernel_manager.kernel_spec_manager.get_kernel_spec(kernel_name)
        except Exception:
            return False
        return spec.language.lower() == "python" and "ipykernel" in " ".join(spec.argv)

    async def _start(self, kernel_name: str, env: dict[str, str]) -> None:
        try:
            manager = await self._launch(kernel_name, env)
        finally:
            self._starting.pop(kernel_name, None)
        if manager is not None:
            self._ready[kernel_name] = (manager, env)

    async def _launch(self, kernel_name: str, env: dict[str, str]) -> Any | None:
        km = self.kernel_manager
        manager = km.kernel_manager_factory(
            connection_file=os.path.join(km.connection_dir, f"kernel-{uuid.uuid4()}.json"),
            parent=km,
            log=self.log,
            kernel_name=kernel_name,
            kernel_spec_manager=km.kernel_spec_manager,
        )
        try:
            await ensure_async(
                manager.start_kernel(env=env, cwd=km.root_dir, extra_arguments=[WARM_UP])
            )
            await _answered(manager)
        except asyncio.CancelledError:
            await self._stop(manager)
            raise
        except Exception as exc:
            self.log.warning("jupyter-ckpt: no standby kernel for %s: %s", kernel_name, exc)
            await self._stop(manager)
            return None
        if not self.enabled:
            await self._stop(manager)
            return None
        return manager

    def _stop_later(self, manager: Any) -> None:
        task = asyncio.ensure_future(self._stop(manager))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _stop(self, manager: Any) -> None:
        with contextlib.suppress(Exception):
            await ensure_async(manager.shutdown_kernel(now=True))
