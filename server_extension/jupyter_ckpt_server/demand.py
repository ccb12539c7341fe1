"""GPU demand: more notebook users than GPUs. A kernel that needs GPU memory the node does
not have free gets it by the suspension of idle GPU kernels, or waits its turn.

A demand comes from a kernel spec that asks for GPU memory (the kernel's start waits),
from the restore of an image that held GPU memory (the restore waits), or from the kernel
itself (``%ckpt gpu``, :func:`jupyter_ckpt.kernel.request_gpu`; the cell waits, see
:mod:`jupyter_ckpt.gpurequest`). Its bytes are memory the kernel is about to allocate.

Free memory is NVML's, per device (``demand_accounting = "device"``: one queue per GPU)
or summed over the node (``"node"``: one queue), so memory held by processes that are not
this server's kernels counts as used. Memory granted to a demand stays set aside until
the kernel holds it (or ``HOLD_SECONDS`` passed): two demands at once are not both given
the same free memory.

**The invariant.** A demand suspends only kernels the idle monitor judges suspendable now
(its :class:`~.monitor.Assessment` blocks nothing: not busy, no background work, not
excluded) that have been idle at least ``min_idle_on_demand``, the longest idle first,
and only as many as the demand lacks; a kernel that waits for a demand itself is never
one of them. Each queue is served first come first served, one place per user (a user's
next demand goes behind the other users' ones), and no demand is granted while an
earlier one of its queue waits.

States of one demand:

===========  =========================================  ==========
state        event                                      next
===========  =========================================  ==========
(none)       asked                                      queued
queued       free memory (after suspends) covers it,    granted
             and it is first in its queue
queued       its deadline (demand_timeout) passed       refused
queued       withdrawn (a cancelled wait, a removed     gone
             request file, the kernel shut down)
granted      the kernel holds the memory, it went       (none)
             away, or HOLD_SECONDS passed
===========  =========================================  ==========
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from jupyter_core.utils import ensure_async

from jupyter_ckpt import gpurequest
from jupyter_ckpt.errors import GpuUnavailable
from jupyter_ckpt.gpu import GpuSnapshot

from . import metrics
from .manager import CkptManager, SuspendFailed
from .monitor import Assessment, IdleMonitor

# How long memory granted to a demand stays set aside for its kernel to allocate it.
HOLD_SECONDS = 120.0
# How often the queue is looked at again while demands wait (and request files read).
POLL_SECONDS = 0.5
NODE = "node"


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.0f} MiB"


@dataclass
class Demand:
    kernel_id: str
    nbytes: int
    source: str  # "spec", "restore" or "kernel"
    user: str
    key: str  # its queue: a device index, or NODE
    since: float
    deadline: float
    future: asyncio.Future[int | None]  # the device granted (None: node accounting)

    @property
    def device(self) -> int | None:
        return None if self.key == NODE else int(self.key)


@dataclass
class _Place:
    user: str
    demands: deque[Demand] = field(default_factory=deque)


@dataclass
class _Hold:
    key: str
    nbytes: int
    until: float
    started: bool = False  # its kernel has been seen running (a start's demand is not yet)


class GpuDemand:
    """The demand queues of one server, and the suspensions that make room."""

    def __init__(self, manager: CkptManager, monitor: IdleMonitor, directory: str) -> None:
        self.manager = manager
        self.monitor = monitor
        self.directory = directory
        # queue key -> the places in it, first served first
        self.queues: dict[str, list[_Place]] = {}
        # kernel id -> memory granted to it that it does not hold yet
        self._holds: dict[str, _Hold] = {}
        # kernel id -> the number of demands served before its own
        self._ahead: dict[str, int] = {}
        # kernel id -> the task that answers its request file
        self._files: dict[str, asyncio.Task[None]] = {}
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._serving: asyncio.Future[None] | None = None
        os.makedirs(directory, mode=0o700, exist_ok=True)

    @property
    def policy(self) -> Any:
        return self.manager.policy

    # -- asking ------------------------------------------------------------------------

    async def request(
        self,
        kernel_id: str,
        nbytes: int,
        source: str,
        user: str | None = None,
        device: int | None = None,
    ) -> int | None:
        """Wait until ``nbytes`` of GPU memory are free for the kernel; the device (None
        under node accounting or when nothing needs to be waited for). Raises
        :class:`GpuUnavailable` when no suspension made room within ``demand_timeout``."""
        demand = self.enqueue(kernel_id, nbytes, source, user, device)
        if demand is None:
            return device
        return await self.wait(demand)

    def enqueue(
        self,
        kernel_id: str,
        nbytes: int,
        source: str,
        user: str | None = None,
        device: int | None = None,
    ) -> Demand | None:
        """Queue a demand (None: demand is off, nothing asked, or no GPU to count)."""
        if not self.policy.gpu_demand or nbytes <= 0:
            return None
        free = self.manager.probe.free_memory()
        if not free:
            return None
        if self.policy.demand_accounting == NODE:
            key = NODE
        elif device is not None and device in free:
            key = str(device)
        else:  # the device with the most memory free now
            key = str(max(free, key=lambda d: (free[d], -d)))
        now = time.monotonic()
        loop = asyncio.get_running_loop()
        demand = Demand(
            kernel_id,
            nbytes,
            source,
            user or self.manager.store.user,
            key,
            now,
            now + self.policy.demand_timeout,
            loop.create_future(),
        )
        places = self.queues.setdefault(key, [])
        place = next((p for p in places if p.user == demand.user), None)
        if place is None:
            place = _Place(demand.user)
            places.append(place)
        place.demands.append(demand)
        self._positions()
        self.kick()
        return demand

    async def wait(self, demand: Demand) -> int | None:
        """Until the demand is granted (its device) or refused (GpuUnavailable). Each
        waiter has the queues served again every ``POLL_SECONDS``: memory freed by any
        means (a kernel shut down, another process ending) is seen that soon."""
        try:
            while not demand.future.done():
                self.kick()
                await asyncio.wait([demand.future], timeout=POLL_SECONDS)
            return demand.future.result()
        except asyncio.CancelledError:
            self.withdraw(demand.kernel_id)
            raise

    def withdraw(self, kernel_id: str) -> None:
        """Drop the kernel's waiting demands (its wait was cancelled, it shut down)."""
        for places in self.queues.values():
            for place in places:
                for demand in [d for d in place.demands if d.kernel_id == kernel_id]:
                    place.demands.remove(demand)
                    if not demand.future.done():
                        demand.future.cancel()
            places[:] = [p for p in places if p.demands]
        self.queues = {key: places for key, places in self.queues.items() if places}
        self._holds.pop(kernel_id, None)
        self._positions()

    async def before_start(self, kernel_id: str, kernel_name: str) -> None:
        """A kernel spec that needs GPU memory: its start waits for it."""
        specs = self.manager.kernel_manager.kernel_spec_manager
        if specs is None:
            return
        try:
            spec = await ensure_async(specs.get_kernel_spec(kernel_name))
        except Exception:  # no such spec: the start itself says so
            return
        nbytes = self.policy.gpu_demand_of(kernel_name, spec.metadata)
        await self.request(kernel_id, nbytes, "spec")

    async def before_restore(self, kernel_id: str, by_device: dict[str, int]) -> bool:
        """The restore or resume of an image that held GPU memory waits for that memory, on
        each device it held (its tensors go back where they were); whether it asked for
        any."""
        held = {int(d): int(n) for d, n in by_device.items() if n}
        if not (held and self.policy.gpu_demand):
            return False
        if self.policy.demand_accounting == NODE:
            await self.request(kernel_id, sum(held.values()), "restore")
            return True
        for device, nbytes in sorted(held.items()):
            await self.request(kernel_id, nbytes, "restore", device=device)
        return True

    # -- what the status shows -------------------------------------------------------------

    def status_of(self, kernel_id: str) -> dict[str, Any] | None:
        """The kernel's place in the queue, or None if it does not wait."""
        for places in self.queues.values():
            for place in places:
                for demand in place.demands:
                    if demand.kernel_id == kernel_id:
                        ahead = self._ahead.get(kernel_id, 0)
                        return {
                            "ahead": ahead,
                            "bytes": demand.nbytes,
                            "device": demand.device,
                            "source": demand.source,
                            "waiting_seconds": time.monotonic() - demand.since,
                            "message": f"Waiting for a GPU: {ahead} ahead of you",
                        }
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "queues": {
                key: [d.kernel_id for d in self._order(places)]
                for key, places in self.queues.items()
            }
        }

    @staticmethod
    def _order(places: list[_Place]) -> list[Demand]:
        """The order the demands of one queue are served in: a round over the places,
        each place's first demand, then the next round."""
        order: list[Demand] = []
        rounds = [list(p.demands) for p in places]
        while any(rounds):
            order += [r.pop(0) for r in rounds if r]
        return order

    def _positions(self) -> None:
        ahead: dict[str, int] = {}
        waiting = 0
        for places in self.queues.values():
            order = self._order(places)
            waiting += len(order)
            for index, demand in enumerate(order):  # several demands: the nearest
                ahead[demand.kernel_id] = min(index, ahead.get(demand.kernel_id, index))
        self._ahead = ahead
        metrics.DEMAND_QUEUE.set(waiting)

    # -- serving -------------------------------------------------------------------------

    def kick(self) -> None:
        """Serve the queues soon (a demand arrived); a serve under way leaves it to the
        next poll."""
        if not self._lock.locked() and (self._serving is None or self._serving.done()):
            self._serving = asyncio.ensure_future(self.serve())

    async def serve(self) -> None:
        """Grant, in each queue's order, every demand that there is (or suspensions make)
        room for; refuse those past their deadline."""
        async with self._lock:
            for key in list(self.queues):
                while self.queues.get(key):
                    demand = self.queues[key][0].demands[0]
                    if demand.future.done():
                        self._pop(key)
                        continue
                    room, why = await self._make_room(demand)
                    if room:
                        self._grant(demand)
                    elif time.monotonic() >= demand.deadline:
                        self._refuse(demand, why)
                    else:
                        break
                    self._pop(key)
            self._positions()

    def _pop(self, key: str) -> None:
        """The first place's first demand is done: that place goes to the back."""
        places = self.queues[key]
        place = places.pop(0)
        place.demands.popleft()
        if place.demands:
            places.append(place)
        if not places:
            del self.queues[key]

    def _grant(self, demand: Demand) -> None:
        self._holds[demand.kernel_id] = _Hold(
            demand.key,
            demand.nbytes,
            time.monotonic() + HOLD_SECONDS,
            self.manager.kernel_manager.is_running(demand.kernel_id),
        )
        demand.future.set_result(demand.device)
        waited = time.monotonic() - demand.since
        metrics.DEMAND_WAIT.labels(outcome="granted").observe(waited)
        self.manager.log.info(
            "GPU demand of kernel %s (%s, %s) granted after %.1f s",
            demand.kernel_id,
            demand.source,
            _mib(demand.nbytes),
            waited,
        )

    def _refuse(self, demand: Demand, why: str) -> None:
        waited = time.monotonic() - demand.since
        line = f"No GPU for kernel {demand.kernel_id} after waiting {waited:.0f} s: {why}"
        demand.future.set_exception(GpuUnavailable(line))
        demand.future.exception()  # retrieved by whoever awaits it, or by no one
        metrics.DEMAND_WAIT.labels(outcome="refused").observe(waited)
        self.manager.log.warning(line)

    def _free(self, snapshot: GpuSnapshot) -> dict[str, int]:
        """Queue key -> bytes free, less what granted demands have yet to allocate."""
        by_device = self.manager.probe.free_memory()
        free = {str(d): n for d, n in by_device.items()}
        free[NODE] = sum(by_device.values())
        now = time.monotonic()
        km = self.manager.kernel_manager
        for kernel_id, hold in list(self._holds.items()):
            running = km.is_running(kernel_id)
            hold.started = hold.started or running
            # expired, or its kernel went (shut down) before it allocated
            gone = kernel_id in self.manager.lifecycles.gone
            if now > hold.until or gone or (hold.started and not running):
                del self._holds[kernel_id]
                continue
            held = 0
            if running:
                held = self._held(self.manager.gpu_usage(kernel_id, snapshot).to_json(), hold.key)
            if held >= hold.nbytes:
                del self._holds[kernel_id]
                continue
            for key in (hold.key, NODE) if hold.key != NODE else (NODE,):
                free[key] = free.get(key, 0) - (hold.nbytes - held)
        return free

    @staticmethod
    def _held(gpu: dict[str, Any], key: str) -> int:
        return int(gpu["bytes"] if key == NODE else gpu["by_device"].get(key, 0))

    def _waiting(self, kernel_id: str) -> bool:
        return any(
            d.kernel_id == kernel_id
            for places in self.queues.values()
            for p in places
            for d in p.demands
        )

    async def _make_room(self, demand: Demand) -> tuple[bool, str]:
        """Whether ``demand`` fits now, after suspending the longest-idle kernels it
        lacks room for; if not, why (one line)."""
        snapshot = await asyncio.to_thread(self.monitor.snapshot)
        free = self._free(snapshot).get(demand.key, 0)
        if free >= demand.nbytes:
            return True, ""
        lacking = demand.nbytes - free
        floor = self.policy.min_idle_on_demand
        holders = [
            (a, self._held(a.gpu, demand.key))
            for a in self.monitor.assess_all(snapshot)
            if a.kernel_id != demand.kernel_id and self._held(a.gpu, demand.key) > 0
        ]
        eligible = sorted(
            (
                (a, held)
                for a, held in holders
                if not a.blocked_by and a.idle_seconds >= floor and not self._waiting(a.kernel_id)
            ),
            key=lambda pair: -pair[0].idle_seconds,
        )
        chosen: list[Assessment] = []
        freed = 0
        for a, held in eligible:
            if freed >= lacking:
                break
            chosen.append(a)
            freed += held
        if freed < lacking:
            return False, self._why_not(demand, free, holders, {a.kernel_id for a, _ in eligible})
        for a in chosen:
            # the suspends before this one took a while: the monitor judges it again, now
            fresh = await self.monitor.assess([a.kernel_id])
            if not fresh or fresh[0].blocked_by or fresh[0].idle_seconds < floor:
                return False, f"kernel {a.kernel_id} became busy"
            try:
                await self.manager.suspend(a.kernel_id, trigger="demand")
            except SuspendFailed as exc:
                return False, f"suspending kernel {a.kernel_id} failed: {exc}"
        snapshot = await asyncio.to_thread(self.monitor.snapshot)
        free = self._free(snapshot).get(demand.key, 0)
        return free >= demand.nbytes, f"{_mib(free)} free after suspending {len(chosen)} kernel(s)"

    def _why_not(
        self,
        demand: Demand,
        free: int,
        holders: list[tuple[Assessment, int]],
        eligible: set[str],
    ) -> str:
        where = "the node's GPUs" if demand.key == NODE else f"GPU {demand.key}"
        floor = self.policy.min_idle_on_demand
        kept = []
        for a, held in holders:
            if a.kernel_id in eligible:
                continue
            if a.blocked_by:
                reason = a.blocked_by[0]
            elif self._waiting(a.kernel_id):
                reason = "it waits for a GPU itself"
            else:
                reason = f"idle {a.idle_seconds:.0f} s, under min_idle_on_demand={floor:.0f}"
            kept.append(f"kernel {a.kernel_id[:8]} holds {_mib(held)} ({reason})")
        held_by_kernels = ", ".join(kept) or "the rest is held by other processes"
        return (
            f"needs {_mib(demand.nbytes)} on {where}, {_mib(max(free, 0))} free; {held_by_kernels}"
        )

    # -- request files -------------------------------------------------------------------

    async def read_requests(self) -> None:
        """Queue the demands of new request files, withdraw those whose file went."""
        pending = await asyncio.to_thread(gpurequest.pending, self.directory)
        km = self.manager.kernel_manager
        for kernel_id, request in pending.items():
            if not km.is_running(kernel_id):  # its kernel is gone: withdrawn at the next poll
                gpurequest.remove(gpurequest.request_path(self.directory, kernel_id))
                continue
            answering = self._files.get(kernel_id)
            if answering is not None and not answering.done():
                continue
            self._files[kernel_id] = asyncio.ensure_future(self._answer(kernel_id, request))
        for kernel_id in [k for k in self._files if k not in pending]:
            self._files.pop(kernel_id).cancel()  # withdrawn (a done one: answered)

    async def _answer(self, kernel_id: str, request: dict[str, Any]) -> None:
        answer = gpurequest.answer_path(self.directory, kernel_id)
        try:
            nbytes, device = int(request.get("bytes", 0)), request.get("device")
            demand = self.enqueue(
                kernel_id,
                nbytes,
                "kernel",
                request.get("user"),
                device if isinstance(device, int) else None,
            )
            waiting = None if demand is None else asyncio.ensure_future(self.wait(demand))
            while waiting is not None and not waiting.done():
                gpurequest.write(answer, {"state": "waiting", **(self.status_of(kernel_id) or {})})
                await asyncio.wait([waiting], timeout=POLL_SECONDS)
            granted = None if waiting is None else waiting.result()
            gpurequest.write(answer, {"state": "granted", "device": granted})
        except GpuUnavailable as exc:
            gpurequest.write(answer, {"state": "refused", "message": str(exc)})
        except (TypeError, ValueError) as exc:
            gpurequest.write(answer, {"state": "refused", "message": f"bad request: {exc}"})
        except asyncio.CancelledError:
            self.withdraw(kernel_id)
            raise
        finally:
            gpurequest.remove(gpurequest.request_path(self.directory, kernel_id))

    # -- the loop ------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(POLL_SECONDS)
            try:
                await self.read_requests()
            except Exception:  # never let one bad poll stop the requests
                self.manager.log.exception("jupyter_ckpt GPU demand poll failed")

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        for task in [self._task, *self._files.values()]:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = None
        self._files.clear()
