"""The image store: content-addressed chunks plus signed manifests (DESIGN section 3)."""

from .imagestore import ImageStore
from .layout import (
    BUFFER_BYTES,
    CHUNK_SIZE,
    GC_GRACE_SECONDS,
    ID_RE,
    REF_RE,
    Buffer,
    check_ref,
    chunk_hash,
    chunk_path,
    manifest_path,
)
from .records import KernelRecords
from .signing import Signer
from .writer import ImageWriter

__all__ = [
    "BUFFER_BYTES",
    "CHUNK_SIZE",
    "GC_GRACE_SECONDS",
    "ID_RE",
    "REF_RE",
    "Buffer",
    "ImageStore",
    "ImageWriter",
    "KernelRecords",
    "Signer",
    "check_ref",
    "chunk_hash",
    "chunk_path",
    "manifest_path",
]
