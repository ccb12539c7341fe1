"""Prometheus metrics, on jupyter_server's own ``/metrics`` endpoint (names ``jupyter_ckpt_*``).

The metrics live in prometheus_client's default registry, which that endpoint serves;
they are defined once per process (a registry refuses a name twice). Most are counted from
the server's own jupyter_ckpt events (:class:`MetricsListener`), so that every suspend and
restore is counted whoever started it; the demand queue sets its own.

A kernel suspended while it held GPU memory counts that memory as freed, and each second
it stays suspended as a GPU-second released: that counter is read at each scrape, so a
dashboard sees the seconds of kernels still suspended, not only of those restored.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Iterator
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from jupyter_ckpt.store import ImageStore

from .events import STORE_CHANGES
from .lifecycle import Lifecycles

# Seconds: a suspend or restore of a small kernel takes a second, a large GPU one minutes.
DURATION_BUCKETS = (0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800)

SUSPENDS = Counter(
    "jupyter_ckpt_suspends",
    "Kernels suspended (or not), by what asked for it: idle, demand, api, shutdown (stop).",
    ["reason", "status"],
)
RESTORES = Counter(
    "jupyter_ckpt_restores",
    "Suspended kernels restored (or not), by trigger.",
    ["reason", "status"],
)
SUSPEND_SECONDS = Histogram(
    "jupyter_ckpt_suspend_duration_seconds",
    "Seconds from a suspend's start until the kernel's memory was released.",
    ["reason"],
    buckets=DURATION_BUCKETS,
)
RESTORE_SECONDS = Histogram(
    "jupyter_ckpt_restore_duration_seconds",
    "Seconds from a restore's start until the kernel held its state again.",
    buckets=DURATION_BUCKETS,
)
GPU_FREED = Counter(
    "jupyter_ckpt_gpu_memory_freed_bytes",
    "GPU memory held by kernels when they were suspended, by reason.",
    ["reason"],
)


class _GpuSecondsReleased(Collector):
    """The seconds kernels that held GPU memory have spent suspended, over every server
    of the process, up to the scrape."""

    def __init__(self) -> None:
        self.listeners: weakref.WeakSet[MetricsListener] = weakref.WeakSet()

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(
            "jupyter_ckpt_gpu_seconds_released",
            "Seconds kernels that held GPU memory spent suspended, up to now.",
            value=sum(listener.released_seconds() for listener in list(self.listeners)),
        )


GPU_SECONDS = _GpuSecondsReleased()
REGISTRY.register(GPU_SECONDS)
DEMAND_QUEUE = Gauge("jupyter_ckpt_demand_queue_length", "GPU demands waiting now.")
DEMAND_WAIT = Histogram(
    "jupyter_ckpt_demand_wait_seconds",
    "Seconds a GPU demand waited, by outcome (granted, refused).",
    ["outcome"],
    buckets=(0, 1, 5, 10, 30, 60, 120, 300, 600, 1800),
)
STORE_BYTES = Gauge("jupyter_ckpt_store_bytes", "Bytes of the images in the store.")
STORE_IMAGES = Gauge("jupyter_ckpt_store_images", "Images in the store.")

# the actions after which the store holds other images


def count_store(store: ImageStore) -> None:
    """Set the store's gauges from its index (reads only manifests new since)."""
    images = total = 0
    for _image_id, summary, _error in store.iter_manifests():
        images += 1
        total += int((summary or {}).get("bytes") or 0)
    STORE_IMAGES.set(images)
    STORE_BYTES.set(total)


class MetricsListener:
    """A jupyter_events listener that counts the server's suspends and restores."""

    def __init__(self, lifecycles: Lifecycles, store: ImageStore, log: Any) -> None:
        self.lifecycles = lifecycles
        self.store = store
        self.log = log
        # kernel id -> when it was suspended holding GPU memory (time.monotonic())
        self._released_at: dict[str, float] = {}
        self._released_before = 0.0  # the seconds of kernels no longer suspended
        self._counting: asyncio.Future[None] | None = None
        GPU_SECONDS.listeners.add(self)

    async def on_event(self, logger: Any, schema_id: str, data: dict[str, Any]) -> None:
        action, status = data.get("action"), data.get("status")
        reason = str(data.get("trigger", ""))
        kernel_id = data.get("kernel_id") or ""
        if action == "suspend":
            SUSPENDS.labels(reason=reason, status=status).inc()
            if status == "success":
                SUSPEND_SECONDS.labels(reason=reason).observe(data.get("seconds", 0.0))
                self._freed(kernel_id, reason)
        elif action == "restore":
            RESTORES.labels(reason=reason, status=status).inc()
            if status == "success":
                RESTORE_SECONDS.observe(data.get("seconds", 0.0))
            self.released_until_now(kernel_id)
        if action in STORE_CHANGES and status == "success":
            self._count_store()

    def _freed(self, kernel_id: str, reason: str) -> None:
        lc = self.lifecycles.get(kernel_id)
        gpu = ((lc.record if lc else None) or {}).get("gpu") or {}
        if gpu.get("holds_gpu"):
            GPU_FREED.labels(reason=reason).inc(int(gpu.get("bytes") or 0))
            self._released_at[kernel_id] = time.monotonic()

    def released_until_now(self, kernel_id: str) -> None:
        """The kernel asked for its GPU back (its restore) or went: its seconds without it
        stop growing."""
        since = self._released_at.pop(kernel_id, None)
        if since is not None:
            self._released_before += time.monotonic() - since

    def released_seconds(self) -> float:
        """GPU-seconds released up to now: those of kernels still suspended included."""
        for kernel_id in [k for k in self._released_at if not self.lifecycles.is_suspended(k)]:
            self.released_until_now(kernel_id)  # shut down while suspended
        now = time.monotonic()
        return self._released_before + sum(now - t for t in self._released_at.values())

    def _count_store(self) -> None:
        if self._counting is None or self._counting.done():
            self._counting = asyncio.ensure_future(asyncio.to_thread(count_store, self.store))
            self._counting.add_done_callback(self._counted)

    def _counted(self, future: asyncio.Future[None]) -> None:
        if not future.cancelled() and future.exception() is not None:
            self.log.warning("Counting the store's images failed: %s", future.exception())
