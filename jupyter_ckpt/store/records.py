"""Records of suspended kernels: ``kernels/<kernel-id>.json`` in the user's part of the store.

The server writes a record once a kernel's image is committed and verified, before it shuts
the kernel down, and removes it once the kernel runs again. A record is what lets a
restarted server list the kernel under its old id and restore it later, and what retention
consults so that an image a suspended kernel needs is never removed. Records are signed
with the store's secret like manifests, so a record planted in a shared store cannot make
the server start a kernel with another spec, directory or environment; with encryption on
they are encrypted too, since they hold notebook paths and environments.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from ..errors import ImageNotFound, IntegrityError, InvalidReference

if TYPE_CHECKING:
    from .imagestore import ImageStore

KERNEL_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,127}$")


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
        self.store.backend.write_atomic(path, self.store.sealer.seal(record, "record"))
        self.store.backend.sync_dir("kernels")

    def get(self, kernel_id: str) -> dict[str, Any]:
        try:
            data = self.store.backend.read_bytes(record_path(kernel_id))
        except FileNotFoundError:
            raise ImageNotFound(f"no suspended kernel {kernel_id}") from None
        record = self.store.sealer.open(data, f"kernel record {kernel_id}", "record")
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
