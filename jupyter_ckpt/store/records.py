"""Records of suspended kernels: ``<store>/kernels/<kernel-id>.json``.

The server writes a record once a kernel's image is committed and verified, before it shuts
the kernel down, and removes it once the kernel runs again. A record is what lets a
restarted server list the kernel under its old id and restore it later, and what retention
consults so that an image a suspended kernel needs is never removed. Records are signed
with the store's secret like manifests, so a record planted in a shared store cannot make
the server start a kernel with another spec, directory or environment.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from traitlets import Float, Int

from ..errors import ImageNotFound, IntegrityError, InvalidReference
from . import GC_GRACE_SECONDS, KERNEL_ID_RE, ImageStore


def record_path(kernel_id: str) -> str:
    if not isinstance(kernel_id, str) or not KERNEL_ID_RE.match(kernel_id):
        raise InvalidReference(f"invalid kernel id {kernel_id!r}")
    return f"kernels/{kernel_id}.json"


class KernelRecords:
    """Read and write suspended-kernel records in an :class:`ImageStore`."""

    def __init__(self, store: ImageStore) -> None:
        self.store = store

    def put(self, record: dict[str, Any]) -> None:
        """Write (or replace) the record of ``record["kernel_id"]``, atomically."""
        path = record_path(record["kernel_id"])
        self.store.backend.write_atomic(path, self.store.signer.seal(record))
        self.store.backend.sync_dir("kernels")

    def get(self, kernel_id: str) -> dict[str, Any]:
        try:
            data = self.store.backend.read_bytes(record_path(kernel_id))
        except FileNotFoundError:
            raise ImageNotFound(f"no suspended kernel {kernel_id}") from None
        record = self.store.signer.open(data, f"kernel record {kernel_id}")
        if record.get("kernel_id") != kernel_id:
            raise IntegrityError(f"kernel record {kernel_id} names another kernel, refusing it")
        return record

    def delete(self, kernel_id: str) -> None:
        self.store.backend.remove(record_path(kernel_id))

    def all(self) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
        """(kernel id -> record, kernel id -> why its record was refused)."""
        records: dict[str, dict[str, Any]] = {}
        errors: dict[str, str] = {}
        for name in self.store.backend.listdir("kernels"):
            kernel_id = name.removesuffix(".json")
            if name.startswith(".") or kernel_id == name or not KERNEL_ID_RE.match(kernel_id):
                continue
            try:
                records[kernel_id] = self.get(kernel_id)
            except (IntegrityError, ImageNotFound) as exc:
                errors[kernel_id] = str(exc)
        return records, errors

    def pinned_images(self) -> set[str]:
        """Image ids that suspended kernels need (never removed by retention or delete)."""
        return {r["image_id"] for r in self.all()[0].values()}


class RetainingImageStore(ImageStore):
    """An :class:`ImageStore` that enforces retention. Configured as ``ImageStore.*``
    (traitlets applies a class's config to its subclasses), so one config serves the
    server, the command line and the kernels."""

    retention_days = Float(
        0, help="Remove images older than this many days (0: keep regardless of age)."
    ).tag(config=True)
    max_images = Int(0, help="Keep at most this many images, newest first (0: no limit).").tag(
        config=True
    )
    quota_bytes = Int(
        0, help="Remove the oldest images while the store holds more than this (0: no quota)."
    ).tag(config=True)

    def expired(self, pinned: set[str], now: float | None = None) -> list[str]:
        """Image ids the retention rules remove, oldest first. Images in ``pinned``
        (needed by suspended kernels) and images that fail to load are never chosen."""
        now = time.time() if now is None else now
        images = [(i, m) for i, m, _ in self.iter_manifests() if m is not None]  # newest first
        doomed: set[str] = set()
        if self.retention_days > 0:
            cutoff = now - self.retention_days * 86400
            doomed |= {i for i, m in images if _created(m) < cutoff}
        if self.max_images > 0:
            doomed |= {i for i, _ in images[self.max_images :]}
        if self.quota_bytes > 0:
            kept = [(i, m) for i, m in images if i not in doomed]
            while _stored_bytes(m for _, m in kept) > self.quota_bytes:
                removable = [i for i, _ in kept if i not in pinned]
                if not removable:
                    break
                doomed.add(removable[-1])
                kept = [(i, m) for i, m in kept if i != removable[-1]]
        return [i for i, _ in reversed(images) if i in doomed and i not in pinned]

    def enforce_retention(
        self, now: float | None = None, grace_seconds: float = GC_GRACE_SECONDS
    ) -> tuple[list[str], int]:
        """Delete expired images, then their chunks. Returns (image ids, bytes freed).

        Manifests go first and chunks after, through ``gc``: a crash in between leaves
        only unreferenced chunks, which the next run removes."""
        removed = []
        for image_id in self.expired(KernelRecords(self).pinned_images(), now):
            self.delete(image_id)
            removed.append(image_id)
        _, freed = self.gc(grace_seconds)
        return removed, freed


def _created(manifest: dict[str, Any]) -> float:
    return datetime.fromisoformat(manifest["created"]).timestamp()


def _stored_bytes(manifests: Any) -> int:
    """Bytes of the distinct chunks the images reference (shared chunks count once)."""
    chunks = {(d, n) for m in manifests for s in m["segments"] for d, n in s["chunks"]}
    return sum(n for _, n in chunks)
