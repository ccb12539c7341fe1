"""Writing one image: chunks on the I/O pool, the signed manifest last."""

from __future__ import annotations

import threading
import uuid
import weakref
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from ..errors import IntegrityError
from .layout import CHUNK_SIZE, Buffer, chunk_path, manifest_path
from .progress import Progress

if TYPE_CHECKING:
    from .space import ChunkSpace


class ImageWriter:
    """Streams segments into chunks on the I/O pool; the manifest lands last, atomically.

    Until :meth:`commit` returns, no reader can see the image: a killed writer leaves
    only unreferenced chunks, which ``gc`` removes. From its first chunk until its image is
    committed and checked (or abandoned, or the writer is dropped) it holds a lease that
    keeps gc from removing chunks it may be reusing.
    """

    def __init__(self, store: ChunkSpace, progress: Progress | None = None) -> None:
        self.store = store
        # bytes written of those queued (or announced with progress.expect)
        self.progress = progress or Progress()
        self._queued = 0
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
        self._segments.append((len(view), self._submit(view)))
        return len(self._segments) - 1

    def add_segment_parts(self, parts: Iterable[Buffer]) -> int:
        """Write one segment from consecutive parts (whole chunks each, but the last) as
        they come: the next part is asked for only once the one before the current part is
        written, and all are written on return, so at most two parts are held at a time."""
        futures: list[Future[tuple[str, int, str | None]]] = []
        self._segments.append((0, futures))  # abandon() finds what was submitted so far
        index = len(self._segments) - 1
        size = done = 0
        for part in parts:
            if size % CHUNK_SIZE:
                raise ValueError("only the last part of a segment may end inside a chunk")
            earlier = len(futures)
            view = memoryview(part).cast("B")
            futures += self._submit(view)
            size += len(view)
            del part, view
            for future in futures[done:earlier]:
                future.result()  # the part before is written: its memory can go
            done = earlier
        for future in futures[done:]:
            future.result()
        self._segments[index] = (size, futures)
        return index

    def _submit(self, view: memoryview) -> list[Future[tuple[str, int, str | None]]]:
        """Hash and write ``view``'s chunks on the I/O pool."""
        if self._lease is None:
            # Released by commit or abandon, or when a failed save drops the writer.
            self._lease = weakref.finalize(self, self.store.lease().release)
        submit: Callable[..., Future[tuple[str, int, str | None]]] = self.store.pool.submit
        self._queued += len(view)
        self.progress.expect(self._queued)
        return [
            submit(self._put_chunk, view[i : i + CHUNK_SIZE])
            for i in range(0, len(view), CHUNK_SIZE)
        ]

    def _put_chunk(self, data: memoryview) -> tuple[str, int, str | None]:
        result = self.store.put_chunk(data, self._claim)
        self.progress.add(len(data))
        return result

    def commit(
        self,
        manifest: dict[str, Any],
        keep: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None,
    ) -> dict[str, Any]:
        """Write the manifest and return it. ``keep``: given the manifest this image would
        have, an existing image's manifest to return instead, committing nothing (a save
        identical to the image before it). Also asked when a chunk was new: the same
        state may pickle to other bytes (see ``image.identity.canonical_digest``); the
        chunks staged for it are then discarded."""
        segments: list[dict[str, Any]] = []
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
        logical = sum(s["size"] for s in segments)
        manifest = {
            **manifest,
            "id": self.image_id,
            "segments": segments,
            "sizes": {**manifest.get("sizes", {}), "logical": logical, "written": written},
            "encryption": self.store.chunks.encryption,
        }
        kept = keep(manifest) if keep is not None else None
        if kept is not None:
            for stage, _ in staged:
                self.store.backend.discard(stage)
            self._release()
            self.progress.finish()
            return kept
        backend = self.store.backend
        try:
            # Chunks are durable and in place before the manifest that names them.
            self.store.publish(staged)
            sealed = self.store.sealer.seal(manifest, "manifest")
            backend.write_atomic(manifest_path(self.image_id), sealed)
            backend.sync_dir(f"images/{self.image_id}")
            backend.sync_dir("images")  # the new image directory's own entry
            self._check_chunks(manifest)
        finally:
            self._release()
        self.progress.finish()
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
        self._release()
