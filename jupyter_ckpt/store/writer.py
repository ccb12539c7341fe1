"""Writing one image: chunks on the I/O pool, the signed manifest last."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from .layout import CHUNK_SIZE, Buffer, chunk_path, manifest_path

if TYPE_CHECKING:
    from .imagestore import ImageStore


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
