"""A kernel process starts (fresh, restarted, or for a restore): (none) -> running. The
server's own iopub watch must hear it before it is handed out (the start handshake); a
process that cannot answer is started again; one that died and was restarted on its own
keeps its last autosave."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

from jupyter_client.session import Session
from jupyter_core.utils import ensure_async

from .. import kernelprocess
from ..polling import poll
from ..rpc import SuspendFailed
from .kernels import Kernels
from .records import RecordKeeper
from .states import KernelLifecycle, State

S = State
# how long the server waits for a started kernel's first message before it hands the
# kernel out all the same (it is slow, not stuck: see kernelprocess), and how often kernel
# info is asked for meanwhile
JOIN_TIMEOUT = 300.0
JOIN_NUDGE_SECONDS = 0.5
# how long a started kernel may say nothing before the server looks at who holds its
# ports, and how many processes it starts at most when one cannot answer
SILENT_AFTER = 10.0
START_ATTEMPTS = 3
# the end of the topic ipykernel publishes status messages under (kernel.<id>.status): two
# of every request's messages, our own silent calls' included, and never a cell's input
_STATUS_TOPIC = b".status"
# what a cell that may change the store from the kernel holds (`%ckpt save`, `%ckpt rm`,
# jupyter_ckpt.kernel's calls), and how long its images event may wait for the cell's end
COMMAND = "ckpt"
CELL_WAIT = 24 * 3600.0


async def _until(condition: Callable[[], bool], timeout: float) -> None:
    """Wait for ``condition``, which no event announces (the server's own view of a
    kernel); asyncio.TimeoutError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise asyncio.TimeoutError
        await asyncio.sleep(0.01)


class Start:
    """A kernel's processes: the server's watch on each, the start handshake, restarts."""

    def __init__(self, owner: Kernels, keeper: RecordKeeper) -> None:
        self.owner = owner
        self.keeper = keeper
        self._telling: set[asyncio.Future[None]] = set()  # images events waiting for a cell

    def watch(self, kernel_id: str, start: bool) -> None:
        """Follow a started kernel's ``execute_input`` messages on the server's own iopub
        subscription (stop on False): the cells run since its last image, and whether a
        client ran one during a suspend."""
        owner = self.owner
        if not start:
            owner.rpc.release(kernel_id)  # the process stops: so do our streams to it
        lc = owner.kernels.get(kernel_id)
        if lc is None and not start:
            return
        if lc is None:
            lc = owner.kernels[kernel_id] = owner.new_lifecycle(kernel_id, S.RUNNING)
        lc.close_stream()
        if not start:
            return
        lc.joined = asyncio.Event()
        kernel = owner.km.get_kernel(kernel_id)
        stream = lc.stream = kernel.connect_iopub()
        session = Session(config=kernel.session.config, key=kernel.session.key)

        def on_iopub(msg_list: list[bytes]) -> None:
            if lc.joined.is_set() and msg_list[0].endswith(_STATUS_TOPIC):
                return  # ipykernel names each message's type in its topic: skip the parse
            try:
                _, parts = session.feed_identities(msg_list)
                msg = session.deserialize(parts, content=False)
            except ValueError:
                # not signed with the kernel's key: another process took its iopub port
                # before it could bind it, which is no sign of the kernel (see _join)
                return
            lc.joined.set()
            if msg["header"]["msg_type"] == "execute_input":
                content = json.loads(msg["content"])
                lc.cells += 1
                lc.executed.append(content["execution_count"])
                self.keeper.schedule_refresh(lc)
                if COMMAND in content.get("code", ""):
                    self._images_after_cell(kernel_id, kernel)

        stream.on_recv(on_iopub)

    def _images_after_cell(self, kernel_id: str, kernel: Any) -> None:
        """The cell runs a ``%ckpt`` command, which writes or deletes images from the
        kernel, past the server: an ``images`` event once it ended (jupyter_server's view
        of the kernel is no longer busy), so that every page lists them again."""

        async def tell() -> None:
            await poll(lambda: kernel.execution_state != "busy", CELL_WAIT, interval=0.1)
            self.owner.events.images(kernel_id)

        task = asyncio.ensure_future(tell())
        self._telling.add(task)
        task.add_done_callback(self._telling.discard)

    async def started(self, kernel_id: str, launch: dict[str, Any]) -> None:
        """A kernel process started (fresh, restarted, or for a restore): wait until the
        server's watch receives its messages before it is handed out; start the process
        again, on new ports, only on evidence that it cannot answer (see
        :mod:`jupyter_ckpt_server.kernelprocess`: it holds no state yet, and every client
        would wait for it in vain). A silent process is slow: it is waited for, never
        killed."""
        owner = self.owner
        lc = owner.kernels.get(kernel_id)
        if lc is None:
            lc = owner.kernels[kernel_id] = owner.new_lifecycle(kernel_id, S.RUNNING)
        lc.launch = launch
        kernel = owner.km.get_kernel(kernel_id)
        for attempt in range(1, START_ATTEMPTS + 1):
            problem = await self._join(lc, kernel)
            if problem is None:
                return
            if attempt == START_ATTEMPTS:
                break
            owner.log.warning(
                "Kernel %s said nothing as it started: %s; starting it again", kernel_id, problem
            )
            owner.km.stop_watching_activity(kernel_id)
            await ensure_async(kernel.restart_kernel(now=True, newports=True))
            owner.km.start_watching_activity(kernel_id)
        owner.log.warning("The server may miss the cells of kernel %s: %s", kernel_id, problem)

    async def _join(self, lc: KernelLifecycle, kernel: Any) -> str | None:
        """Wait until the server's watch has received the kernel's messages; what went
        wrong otherwise.

        A ZMQ subscriber misses what the kernel publishes before its subscription reaches
        the kernel (the "slow joiner"): a first cell run meanwhile would go unseen. As
        jupyter_server's websocket does, ask for kernel info until a message arrives; the
        reply is kept for the kernel's record. The server's own activity watch must have
        seen the kernel idle after it (not "starting", nor "busy" as jupyter_server 2.4
        shows for the kernel-info request): otherwise its state would change under a
        client between two requests, whenever the status came."""
        watched = kernelprocess.ports(kernel)
        begun = time.monotonic()

        def joined() -> bool:
            return lc.joined.is_set() and getattr(kernel, "execution_state", "") == "idle"

        while lc.stream is not None and not joined():
            waited = time.monotonic() - begun
            if waited > JOIN_TIMEOUT:  # slow, and handed out: its first cell may go unseen
                self.owner.log.warning(
                    "Kernel %s said nothing within %.0f s; the server may miss its cells",
                    lc.kernel_id,
                    JOIN_TIMEOUT,
                )
                return None
            if problem := kernelprocess.cannot_answer(kernel, watched, waited > SILENT_AFTER):
                return problem
            # ask until the next look at its ports (each second once it has been silent)
            until_look = min(max(SILENT_AFTER - waited, 1.0), JOIN_TIMEOUT - waited)
            with contextlib.suppress(SuspendFailed):  # no answer yet, or its process exited
                lc.kernel_info = await self.owner.rpc.request(
                    lc.kernel_id, "kernel_info", until_look
                )
            with contextlib.suppress(asyncio.TimeoutError):
                await _until(joined, JOIN_NUDGE_SECONDS)
        return None

    def process_restarted(self, kernel_id: str) -> None:
        """The kernel's process died and was restarted automatically (an OOM kill): its
        state is lost, but its last autosave stays in the store as a saved image the
        user can resume; the fresh kernel's first autosave must not replace it."""
        lc = self.owner.kernels.get(kernel_id)
        if lc is None or lc.autosave_image is None:
            return
        self.owner.log.warning(
            "Kernel %s restarted after its process died; its last autosave %s is kept",
            kernel_id,
            lc.autosave_image,
        )
        lc.autosave_image = None
