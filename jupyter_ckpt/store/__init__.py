"""The image store: content-addressed chunks plus signed manifests.

Layout (DESIGN section 3)::

    <store>/images/<image-id>/manifest.json   written last, atomically; signed
    <store>/chunks/<hh>/<hash>                 immutable, shared between images
    <store>/kernels/<kernel-id>.json           the server's record of a suspended kernel

An image's bytes are a list of *segments* (one packed stream of small pickles and
buffers, then one segment per large buffer). Segments are cut into fixed-size chunks named
by their BLAKE3 hash, so a second save of a slightly changed session writes only the
chunks that changed. BLAKE3 was measured at ~4 GB/s per core here against ~1.7 GB/s for
SHA-256, so hashing stays well ahead of the disk.
"""

from __future__ import annotations

import io
import json
import mmap
import os
import re
import tarfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime
from typing import Any

import blake3
from jupyter_core.paths import jupyter_data_dir
from traitlets import Bool, Dict, Float, Int, Unicode, default
from traitlets.config import LoggingConfigurable

from ..errors import (
    AmbiguousReference,
    ImageInUse,
    ImageNotFound,
    IntegrityError,
    InvalidReference,
)
from .backends import open_backend
from .records import KernelRecords
from .signing import Signer

CHUNK_SIZE = 4 << 20
ID_RE = re.compile(r"^[0-9a-f]{32}$")
REF_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
GC_GRACE_SECONDS = 3600
# Host memory a save may use for copies (ImageStore.buffer_bytes): a few hundred MiB keeps
# the disk and the bus busy without sizing a pod's RAM to its GPU state.
BUFFER_BYTES = 256 << 20

Buffer = memoryview | bytearray | bytes


def chunk_hash(data: Buffer) -> str:
    return blake3.blake3(data).hexdigest()


def chunk_path(digest: str) -> str:
    return f"chunks/{digest[:2]}/{digest}"


def manifest_path(image_id: str) -> str:
    return f"images/{image_id}/manifest.json"


def check_ref(ref: str, what: str = "image name or id") -> str:
    if not isinstance(ref, str) or not REF_RE.match(ref):
        raise InvalidReference(
            f"invalid {what} {ref!r}: use letters, digits, '.', '_' and '-' "
            "(no paths), starting with a letter or digit"
        )
    return ref


def _allocate(nbytes: int) -> memoryview:
    """A writable, page-aligned buffer that is not zero-filled up front.

    Anonymous memory gets its pages on first write, so reading into it costs no extra
    pass; page alignment lets the local backend read chunks into it with direct I/O
    (every chunk starts at a multiple of CHUNK_SIZE).
    """
    if nbytes == 0 or not hasattr(mmap, "MAP_PRIVATE"):
        return memoryview(bytearray(nbytes))
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        buf.madvise(mmap.MADV_HUGEPAGE)  # fewer page faults, as numpy does for big arrays
    return memoryview(buf)


class ImageStore(LoggingConfigurable):
    """Where images live. Configure with ``ImageStore.url`` or ``JUPYTER_CKPT_STORE``."""

    url = Unicode(help="Store location: a local path or an fsspec URL (s3://bucket/prefix).").tag(
        config=True
    )

    @default("url")
    def _default_url(self) -> str:
        return os.environ.get("JUPYTER_CKPT_STORE") or os.path.join(jupyter_data_dir(), "ckpt")

    secret_file = Unicode(
        help="Per-user signing secret, kept outside the store (created 0600 on first use)."
    ).tag(config=True)

    @default("secret_file")
    def _default_secret_file(self) -> str:
        return os.environ.get("JUPYTER_CKPT_SECRET_FILE") or os.path.join(
            jupyter_data_dir(), "ckpt-secret"
        )

    fsync = Bool(True, help="fsync chunks and manifests before an image counts as committed.").tag(
        config=True
    )

    io_threads = Int(
        8,
        help="Threads that hash, write and read chunks in parallel; more than cores, since "
        "they mostly wait for the disk (8 beat 4 on a 2-core machine, benchmarks/README.md).",
    ).tag(config=True)

    direct_io = Bool(
        True,
        help="Read chunks of a local store with O_DIRECT where the file system supports it "
        "(faster and lighter on the CPU for cold reads; falls back by itself).",
    ).tag(config=True)

    buffer_bytes = Int(
        BUFFER_BYTES,
        help="Host memory a save may use for the copies it writes (GPU data on its way to "
        "the store, packed small buffers), whatever the size of the state. Kernels read "
        "JUPYTER_CKPT_BUFFER_BYTES.",
    ).tag(config=True)

    @default("buffer_bytes")
    def _default_buffer_bytes(self) -> int:
        return int(os.environ.get("JUPYTER_CKPT_BUFFER_BYTES") or BUFFER_BYTES)

    storage_options = Dict(
        help="fsspec options for a remote store (e.g. {'endpoint_url': ...} for an "
        "S3-compatible server). Kernels read fsspec's own config instead (FSSPEC_S3=<json>), "
        "so the server and its kernels can share one setting through the environment.",
    ).tag(config=True)

    retention_days = Float(
        0, help="Remove images older than this many days (0: keep regardless of age)."
    ).tag(config=True)
    max_images = Int(0, help="Keep at most this many images, newest first (0: no limit).").tag(
        config=True
    )
    quota_bytes = Int(
        0, help="Remove the oldest images while the store holds more than this (0: no quota)."
    ).tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.backend = open_backend(
            self.url, fsync=self.fsync, direct_io=self.direct_io, **self.storage_options
        )
        self.signer = Signer(self.secret_file)
        self._pool = ThreadPoolExecutor(max(1, self.io_threads), thread_name_prefix="ckpt-io")

    # -- writing -------------------------------------------------------------------------

    def writer(self) -> ImageWriter:
        return ImageWriter(self)

    def _put_chunk(
        self, data: memoryview, claim: Callable[[str], bool]
    ) -> tuple[str, int, str | None]:
        """(digest, bytes written, staged file or None); the commit publishes the staged."""
        digest = chunk_hash(data)
        path = chunk_path(digest)
        # An existing chunk is touched, not skipped: an unreferenced one (of a deleted image)
        # would otherwise look old to a concurrent gc and go before our manifest lands.
        if not claim(digest) or self.backend.touch(path):
            return digest, 0, None
        return digest, len(data), self.backend.stage(path, data)

    def _publish(self, staged: list[tuple[str, str]]) -> None:
        """Make staged chunks durable and visible, then their directory entries durable:
        all on the pool, so the fsyncs overlap and the file system batches them."""
        pool = self._pool
        list(pool.map(lambda s: self.backend.publish(*s), staged))
        dirs = {p.rpartition("/")[0] for _, p in staged}
        list(pool.map(self.backend.sync_dir, sorted(dirs | {"chunks"} if dirs else dirs)))

    # -- reading -------------------------------------------------------------------------

    def image_ids(self) -> list[str]:
        return [i for i in self.backend.listdir("images") if ID_RE.match(i)]

    def load_manifest(self, image_id: str) -> dict[str, Any]:
        """The verified manifest of one image id."""
        if not isinstance(image_id, str) or not ID_RE.match(image_id):
            raise InvalidReference(f"invalid image id {image_id!r}: 32 hex digits expected")
        path = manifest_path(image_id)
        try:
            data = self.backend.read_bytes(path)
        except FileNotFoundError:
            raise ImageNotFound(f"no image with id {image_id} in {self.backend.url}") from None
        manifest = self.signer.open(data, f"image {image_id}")
        if manifest.get("id") != image_id:
            raise IntegrityError(f"image {image_id}: manifest names another id, refusing it")
        return manifest

    def iter_manifests(self) -> Iterator[tuple[str, dict[str, Any] | None, str | None]]:
        """(id, manifest or None, error) for every image, newest first; bad ones are named."""
        entries = []
        for image_id in self.image_ids():
            try:
                entries.append((image_id, self.load_manifest(image_id), None))
            except (IntegrityError, ImageNotFound) as exc:
                entries.append((image_id, None, str(exc)))
        entries.sort(key=lambda e: (e[1] or {}).get("created", ""), reverse=True)
        yield from entries

    def resolve(self, ref: str) -> str:
        """An image id from an id, a unique id prefix, or a name (the newest image of it)."""
        check_ref(ref)
        if ID_RE.match(ref) and self.backend.exists(manifest_path(ref)):
            return ref
        named = [(m["created"], i) for i, m, _ in self.iter_manifests() if m and m["name"] == ref]
        if named:
            return max(named)[1]
        prefixed = [i for i in self.image_ids() if i.startswith(ref)] if len(ref) >= 4 else []
        if len(prefixed) == 1:
            return prefixed[0]
        if len(prefixed) > 1:
            raise AmbiguousReference(f"{ref!r} matches {len(prefixed)} images; give more of the id")
        raise ImageNotFound(f"no image named or with id {ref!r} in {self.backend.url}")

    def open(self, ref: str) -> dict[str, Any]:
        return self.load_manifest(self.resolve(ref))

    def read_segments(self, manifest: dict[str, Any]) -> list[memoryview]:
        """Every segment of an image, each chunk verified against its hash before use."""
        jobs: list[Future[None]] = []
        segments = []
        for segment in manifest["segments"]:
            buf = _allocate(segment["size"])
            segments.append(buf)
            offset = 0
            for digest, size in segment["chunks"]:
                jobs.append(
                    self._pool.submit(self._read_chunk, digest, buf[offset : offset + size])
                )
                offset += size
        for job in jobs:
            job.result()
        return segments

    def _read_chunk(self, digest: str, out: memoryview) -> None:
        try:
            n = self.backend.read_into(chunk_path(digest), out)
        except FileNotFoundError:
            raise IntegrityError(f"chunk {digest} is missing from the store") from None
        if n != len(out) or chunk_hash(out) != digest:
            raise IntegrityError(f"chunk {digest} was altered (content does not match its hash)")

    def verify(self, ref: str) -> dict[str, Any]:
        """Check signature and every chunk; return the manifest. Unpickles nothing, and
        holds only one chunk per I/O thread in memory, whatever the image's size."""
        manifest = self.open(ref)
        chunks = [chunk for segment in manifest["segments"] for chunk in segment["chunks"]]
        for _ in self._pool.map(lambda c: self._read_chunk(c[0], _allocate(c[1])), chunks):
            pass
        return manifest

    # -- removing ------------------------------------------------------------------------

    @property
    def records(self) -> KernelRecords:
        """The records of suspended kernels kept in this store."""
        return KernelRecords(self)

    def delete(self, ref: str) -> str:
        image_id = self.resolve(ref)
        for kernel_id, record in self.records.all()[0].items():
            if record.get("image_id") == image_id:
                raise ImageInUse(
                    f"image {image_id} is needed by suspended kernel {kernel_id}; "
                    "resume or shut down that kernel first"
                )
        # Removing the manifest first makes the image vanish at once; chunks go in gc().
        self.backend.remove(manifest_path(image_id))
        self.backend.remove(f"images/{image_id}")
        return image_id

    def gc(self, grace_seconds: float = GC_GRACE_SECONDS) -> tuple[int, int]:
        """Remove chunks no image references. Returns (files removed, bytes freed).

        Chunks younger than ``grace_seconds`` are kept: a writer in another process writes
        its chunks before its manifest, and they must survive until the manifest lands.
        """
        referenced: set[str] = set()
        for image_id in self.image_ids():
            try:
                data = json.loads(self.backend.read_bytes(manifest_path(image_id)))
                segments = data["manifest"]["segments"]
            except (FileNotFoundError, ValueError, KeyError, TypeError):
                continue
            referenced.update(digest for s in segments for digest, _ in s["chunks"])
        cutoff = time.time() - grace_seconds
        removed = freed = 0
        for path, mtime, size in list(self.backend.walk_files("chunks")):
            name = path.rsplit("/", 1)[-1]
            if name in referenced or mtime > cutoff:
                continue
            # Look again: a writer may have reused (touched) it since the listing.
            mtime_now = self.backend.mtime(path)
            if mtime_now is None or mtime_now > cutoff:
                continue
            self.backend.remove(path)
            removed += 1
            freed += size
        return removed, freed

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
    ) -> tuple[list[str], int, int]:
        """Delete expired images, then unreferenced chunks.
        Returns (image ids removed, chunk files removed, bytes freed).

        Manifests go first and chunks after, through ``gc``: a crash in between leaves
        only unreferenced chunks, which the next run removes."""
        removed = []
        for image_id in self.expired(self.records.pinned_images(), now):
            self.delete(image_id)
            removed.append(image_id)
        files, freed = self.gc(grace_seconds)
        return removed, files, freed

    # -- moving images between stores -----------------------------------------------------

    def export(self, ref: str, file: str) -> str:
        """Write one image (manifest and chunks) to a tar file."""
        manifest = self.verify(ref)
        image_id = manifest["id"]
        with tarfile.open(file, "w") as tar:
            self._tar_add(tar, "manifest.json", self.backend.read_bytes(manifest_path(image_id)))
            for digest in sorted({d for s in manifest["segments"] for d, _ in s["chunks"]}):
                self._tar_add(tar, chunk_path(digest), self.backend.read_bytes(chunk_path(digest)))
        return image_id

    @staticmethod
    def _tar_add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mode = 0o600
        tar.addfile(info, io.BytesIO(data))

    def import_(self, file: str) -> str:
        """Add an exported image. It must be signed with our secret; nothing is written
        unless the manifest and every chunk check out."""
        with tarfile.open(file, "r") as tar:
            members = {m.name: m for m in tar.getmembers() if m.isfile()}
            if "manifest.json" not in members:
                raise IntegrityError(f"{file}: not a jupyter-ckpt export (no manifest.json)")
            sealed = self._tar_read(tar, members["manifest.json"])
            manifest = self.signer.open(sealed, file)
            image_id = check_ref(manifest.get("id", ""), "image id")
            if not ID_RE.match(image_id):
                raise IntegrityError(f"{file}: bad image id {image_id!r}")
            chunks = {}
            for digest in {d for s in manifest["segments"] for d, _ in s["chunks"]}:
                member = members.get(chunk_path(digest))
                if member is None:
                    raise IntegrityError(f"{file}: chunk {digest} is missing")
                data = self._tar_read(tar, member)
                if chunk_hash(data) != digest:
                    raise IntegrityError(f"{file}: chunk {digest} was altered")
                chunks[digest] = data
        for digest, data in chunks.items():
            if not self.backend.exists(chunk_path(digest)):
                self.backend.write_atomic(chunk_path(digest), data)
        self.backend.write_atomic(manifest_path(image_id), sealed)
        return image_id

    @staticmethod
    def _tar_read(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
        f = tar.extractfile(member)
        assert f is not None
        return f.read()


def _created(manifest: dict[str, Any]) -> float:
    return datetime.fromisoformat(manifest["created"]).timestamp()


def _stored_bytes(manifests: Any) -> int:
    """Bytes of the distinct chunks the images reference (shared chunks count once)."""
    chunks = {(d, n) for m in manifests for s in m["segments"] for d, n in s["chunks"]}
    return sum(n for _, n in chunks)


class ImageWriter:
    """Streams segments into chunks on the I/O pool; the manifest lands last, atomically.

    Until :meth:`commit` returns, no reader can see the image: a killed writer leaves
    only unreferenced chunks, which ``gc`` removes.
    """

    def __init__(self, store: ImageStore) -> None:
        self.store = store
        self.image_id = uuid.uuid4().hex
        self._segments: list[tuple[int, list[Future[tuple[str, int, str | None]]]]] = []
        # Digests this image already writes: equal chunks (zeros, repeated data) are written
        # and counted once, not raced by several I/O threads.
        self._claimed: set[str] = set()
        self._claim_lock = threading.Lock()

    def _claim(self, digest: str) -> bool:
        with self._claim_lock:
            if digest in self._claimed:
                return False
            self._claimed.add(digest)
            return True

    def add_segment(self, data: Buffer) -> int:
        """Queue a buffer for writing; it must stay unchanged until commit."""
        view = memoryview(data).cast("B")
        submit: Callable[..., Future[tuple[str, int, str | None]]] = self.store._pool.submit
        futures = [
            submit(self.store._put_chunk, view[i : i + CHUNK_SIZE], self._claim)
            for i in range(0, len(view), CHUNK_SIZE)
        ]
        self._segments.append((len(view), futures))
        return len(self._segments) - 1

    def add_segment_parts(self, parts: Iterable[Buffer]) -> int:
        """Write one segment from consecutive parts (whole chunks each, but the last) as
        they come: the next part is asked for only once the one before the current part is
        written, and all are written on return, so at most two parts are held at a time."""
        submit: Callable[..., Future[tuple[str, int, str | None]]] = self.store._pool.submit
        futures: list[Future[tuple[str, int, str | None]]] = []
        self._segments.append((0, futures))
        index = len(self._segments) - 1
        size = done = 0
        for part in parts:
            if size % CHUNK_SIZE:
                raise ValueError("only the last part of a segment may end inside a chunk")
            earlier = len(futures)
            view = memoryview(part).cast("B")
            futures += [
                submit(self.store._put_chunk, view[i : i + CHUNK_SIZE], self._claim)
                for i in range(0, len(view), CHUNK_SIZE)
            ]
            size += len(view)
            del part, view
            for future in futures[done:earlier]:
                future.result()  # the part before is written: its memory can go
            done = earlier
        for future in futures[done:]:
            future.result()
        self._segments[index] = (size, futures)
        return index

    def commit(self, manifest: dict[str, Any]) -> dict[str, Any]:
        segments = []
        written = 0
        staged: list[tuple[str, str]] = []
        try:
            for size, futures in self._segments:
                chunks = []
                offset = 0
                for future in futures:
                    digest, new, stage = future.result()
                    length = min(CHUNK_SIZE, size - offset)
                    chunks.append([digest, length])
                    offset += length
                    written += new
                    if stage is not None:
                        staged.append((stage, chunk_path(digest)))
                segments.append({"size": size, "chunks": chunks})
        except BaseException:
            self.abandon()
            raise
        # Chunks are durable and in place before the manifest that names them is written.
        self.store._publish(staged)
        logical = sum(s["size"] for s in segments)
        manifest = {
            **manifest,
            "id": self.image_id,
            "segments": segments,
            "sizes": {**manifest.get("sizes", {}), "logical": logical, "written": written},
        }
        backend = self.store.backend
        backend.write_atomic(manifest_path(self.image_id), self.store.signer.seal(manifest))
        backend.sync_dir(f"images/{self.image_id}")
        backend.sync_dir("images")  # the new image directory's own entry
        return manifest

    def abandon(self) -> None:
        """Stop queued chunks and remove the staged files of those already written (a
        failed save leaves nothing behind but what gc would remove anyway)."""
        for _, futures in self._segments:
            for future in futures:
                future.cancel()
        for _, futures in self._segments:
            for future in futures:
                if future.cancelled() or future.exception() is not None:
                    continue
                stage = future.result()[2]
                if stage:
                    self.store.backend.discard(stage)
