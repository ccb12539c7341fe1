"""Reading an image's segments on demand, so a restore never holds them all at once."""

from __future__ import annotations

import mmap
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, overload

from .mapping import Mapper
from .progress import Progress


def allocate(nbytes: int) -> memoryview:
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


def _uses(manifest: dict[str, Any]) -> Counter[int]:
    """How many references of the image's groups point into each segment."""
    refs = [r for g in manifest.get("groups", ()) for r in (g["pickle"], *g["buffers"])]
    return Counter(r[0] for r in refs)


class Segments(Sequence[memoryview]):
    """An image's segments, each read and verified when first asked for.

    A segment is kept only until its last reference (counted from the manifest's groups)
    has been handed out; after that, whatever the unpickled objects still share of it is
    all that stays in memory. Asking for it again reads it again. Every chunk is checked
    against its hash before its segment is handed out, so nothing unverified reaches the
    unpickler.
    """

    def __init__(
        self,
        manifest: dict[str, Any],
        read_chunk: Callable[[str, memoryview], None],
        pool: ThreadPoolExecutor,
        progress: Progress | None = None,
        mapper: Mapper | None = None,
    ) -> None:
        self._segments = manifest["segments"]
        self._read_chunk = read_chunk
        # bytes read of the image's (a segment asked for again is read, and counted, again)
        self.progress = progress or Progress()
        self.progress.expect(sum(s["size"] for s in self._segments))
        self._pool = pool
        self._left = _uses(manifest)
        self._held: dict[int, memoryview] = {}
        # maps a large buffer's segment instead of reading it (see :mod:`.mapping`)
        self.mapper = mapper
        self.read_seconds = 0.0  # spent reading (and checking, and mapping) segments

    def __len__(self) -> int:
        return len(self._segments)

    @overload
    def __getitem__(self, index: int) -> memoryview: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[memoryview]: ...
    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(len(self))[index]]
        index = range(len(self))[index]
        buf = self._held.get(index)
        if buf is None:
            started = time.perf_counter()
            segment = self._segments[index]
            buf = self.mapper(index, segment) if self.mapper is not None else None
            if buf is None:
                buf = self._read(segment)
            else:
                self.progress.add(len(buf))
            self.read_seconds += time.perf_counter() - started
        self._left[index] -= 1
        if self._left[index] > 0:
            self._held[index] = buf
        else:
            self._held.pop(index, None)
        return buf

    def __iter__(self) -> Iterator[memoryview]:
        return (self[i] for i in range(len(self)))

    def _read(self, segment: dict[str, Any]) -> memoryview:
        buf = allocate(segment["size"])
        jobs = []
        offset = 0
        for digest, size in segment["chunks"]:
            jobs.append(self._pool.submit(self._read_counted, digest, buf[offset : offset + size]))
            offset += size
        for job in jobs:
            job.result()
        return buf

    def _read_counted(self, digest: str, out: memoryview) -> None:
        self._read_chunk(digest, out)
        self.progress.add(len(out))
