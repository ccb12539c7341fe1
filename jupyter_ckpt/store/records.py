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

import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import ImageNotFound, IntegrityError, InvalidReference
from .encryption import is_encrypted

if TYPE_CHECKING:
    from .space import ChunkSpace

KERNEL_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,127}$")


def record_path(kernel_id: str) -> str:
    if not isinstance(kernel_id, str) or not KERNEL_ID_RE.match(kernel_id):
        raise InvalidReference(f"invalid kernel id {kernel_id!r}")
    return f"kernels/{kernel_id}.json"


class KernelRecords:
    """Read and write suspended-kernel records in a store (an :class:`.imagestore.ImageStore`)."""

    def __init__(self, store: ChunkSpace) -> None:
        self.store = store

    def put(self, record: dict[str, Any]) -> None:
        """Write (or replace) the record of ``record["kernel_id"]``, atomically."""
        path = record_path(record["kernel_id"])
        self.store.follow_store_encryption()
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
        return set(self.pins().images)

    def pins(self) -> Pins:
        """What the records keep from retention and delete. A record we cannot verify
        still pins the image it names (one written under the previous secret, before a
        rekey got to it, is still a suspended kernel's); one we cannot even read, being
        encrypted under another secret, may name any image, so it pins them all."""
        records, errors = self.all()
        pins = Pins()
        for kernel_id, record in records.items():
            holder = "running" if record.get("state") == "running" else "suspended"
            pins.images[record["image_id"]] = f"{holder} kernel {kernel_id}"
            for kept in record.get("keeps", []):  # what a kernel did after a failed restore
                pins.images[kept] = f"kernel {kernel_id}, whose restore failed"
        for kernel_id, why in errors.items():
            named = self._named_image(kernel_id)
            if named is None:
                pins.unknown[kernel_id] = why
            else:
                pins.images[named] = f"kernel {kernel_id}, whose record cannot be verified ({why})"
        return pins

    def _named_image(self, kernel_id: str) -> str | None:
        """The image id a plaintext record names, unverified; None if it names none we
        can see."""
        try:
            data = self.store.backend.read_bytes(record_path(kernel_id))
            if is_encrypted(data):
                return None
            image_id = json.loads(data)["manifest"]["image_id"]
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return None
        return image_id if isinstance(image_id, str) else None


@dataclass
class Pins:
    """Images that kernel records keep: by id, with who needs each, and the records that
    may name any image (all images are pinned while there is one)."""

    images: dict[str, str] = field(default_factory=dict)
    unknown: dict[str, str] = field(default_factory=dict)

    def holder(self, image_id: str) -> str | None:
        """Who keeps ``image_id``, said for a user; None if nobody does."""
        if image_id in self.images:
            return self.images[image_id]
        for kernel_id, why in self.unknown.items():
            return f"kernel {kernel_id}, whose record cannot be read ({why}) and may name it"
        return None

    def note(self) -> str | None:
        """Why retention removes no image now, if a record may name any."""
        if not self.unknown:
            return None
        kernels = ", ".join(sorted(self.unknown))
        return (
            f"no image is removed by retention while kernel records cannot be read "
            f"({kernels}: {next(iter(self.unknown.values()))}); run `jupyter ckpt rekey "
            "--old-secret-file=<previous secret>` to make them readable, or remove them"
        )
