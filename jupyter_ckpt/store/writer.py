"""Writing one image: chunks on the I/O pool, the signed manifest last."""

from __future__ import annotations

import threading
import uuid
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from ..errors import IntegrityError
from .layout import CHUNK_SIZE, Buffer, chunk_path, manifest_path

if TYPE_CHECKING:
    from .imagestore import ImageStore


class ImageWriter:
    """Streams segments into chunks on the I/O pool; the manifest lands last, atomically.

    Until :meth:`commit` returns, no reader can see the image: a killed writer leaves
    only unreferenced chunks, which ``gc`` removes. From its first chunk until its image is
    committed and checked (or abandoned, or the writer is dropped) it holds a lease that
    keeps gc from removing chunks it may be reusing.
    """

    def __init__(self, store: ImageStore) -> None:
        self.store = store
        self.image_id = uuid.uuid4().hex
        self._segments: list[tuple[int, list[Future[tuple[str, int, str | None]]]]] = []
        # Digests this image already writes: equal chunks (zeros, repeated data) are written
        # and counted once, not raced by several I/O threads.
        self._claimed: set[str] = set()
        self._claim_lock = threading.Lock()
        self._lease: weakref.finalize | None = None

    def _claim(self, digest: str) -> bool:
        with self._claim_lock:
            if digest in self._claimed:
                return False
            self._claimed.add(digest)
            return True

    def add_segment(self, data: Buffer) -> int:
        """Queue a buffer for writing; it must stay unchanged until commit."""
        view = memoryview(data).cast("B")
        if self._lease is None:
            # Released by commit or abandon, or when a failed save drops the writer.
            self._lease = weakref.finalize(self, self.store.lease().release)
        submit: Callable[..., Future[tuple[str, int, str | None]]] = self.store._pool.submit
        futures = [
            submit(self.store._put_chunk, view[i : i + CHUNK_SIZE], self._claim)
            for i in range(0, len(view), CHUNK_SIZE)
        ]
        self._segments.append((len(view), futures))
        return len(self._segments) - 1

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
            self._abandon()
            raise
        logical = sum(s["size"] for s in segments)
        manifest = {
            **manifest,
            "id": self.image_id,
            "segments": segments,
            "sizes": {**manifest.get("sizes", {}), "logical": logical, "written": written},
        }
        backend = self.store.backend
        try:
            # Chunks are durable and in place before the manifest that names them.
            self.store._publish(staged)
            backend.write_atomic(manifest_path(self.image_id), self.store.signer.seal(manifest))
            backend.sync_dir(f"images/{self.image_id}")
            backend.sync_dir("images")  # the new image directory's own entry
            self._check_chunks(manifest)
        finally:
            self._release()
        return manifest

    def _check_chunks(self, manifest: dict[str, Any]) -> None:
        """A committed image whose chunks are not all in the store is withdrawn (its
        manifest removed) and the save fails: never report a broken image as saved."""
        missing = self.store.missing_chunks(manifest)
        if missing:
            self.store.backend.remove(f"images/{self.image_id}")
            raise IntegrityError(
                f"save failed: {len(missing)} chunk(s) of image {self.image_id} vanished from "
                f"the store {self.store.backend.url} while it was written (first: "
                f"{missing[0]}); was the store cleaned up meanwhile? The image was not kept"
            )

    def _release(self) -> None:
        if self._lease is not None:
            self._lease()

    def _abandon(self) -> None:
        """Stop queued chunks and remove the staged files of those already written."""
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
        self._release()
