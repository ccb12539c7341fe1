"""Large array buffers mapped from their chunk files, read on first touch.

A large buffer is a segment of its own, cut into chunk files of ``CHUNK_SIZE`` bytes
(:mod:`.capture`). Reading it before the first cell runs costs time in proportion to the
state, whether the cell needs the data or not. On a local, unencrypted store the chunk
files hold the buffer's bytes as they are, so instead a range of address space is
reserved for the buffer and each chunk file is mapped over its part of it, private and
copy-on-write: a page is read from the file when first touched, and a write changes the
kernel's copy of the page, never the chunk (nor the image, nor other images sharing it).

A chunk file that goes away while mapped (the image deleted, retention, gc) is safe on
the local file systems listed in :data:`MAPPABLE_FILESYSTEMS`: the store only unlinks or
renames over chunk files, never truncates or rewrites them in place, and an unlinked file
keeps its data until its last mapping goes (its disk space is freed then). Network file
systems do not promise that (another node's gc makes the file stale under the mapping and
the next touch would kill the kernel), so they are read as before.

The chunks' hashes are checked in the background after the restore (:class:`Checker`),
reading each file once through the page cache, so that touching the data later finds it
in memory; a chunk that does not match is reported, with the variables it belongs to.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import psutil

from .layout import chunk_hash

# Local file systems on which an unlinked file stays readable through its mappings and
# the store's writers never change a chunk file in place.
MAPPABLE_FILESYSTEMS = frozenset(
    {"ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "tmpfs", "overlay", "bcachefs"}
)
# Segments smaller than this are read: a mapping per chunk costs more than reading them.
MAP_MIN_BYTES = 16 << 20

_MAP_FIXED = 0x10  # Linux, every architecture
_PAGE = mmap.PAGESIZE


def _libc_mmap() -> Callable[..., int] | None:
    if sys.platform != "linux":
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    fn = libc.mmap
    fn.restype = ctypes.c_void_p
    fn.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    return fn


_mmap_at = _libc_mmap()
_MAP_FAILED = ctypes.c_void_p(-1).value


def filesystem_of(path: str) -> str | None:
    """The type of the file system ``path`` is on (the mount table), or None."""
    try:
        mounts = psutil.disk_partitions(all=True)
    except OSError:
        return None
    path = os.path.realpath(path)
    best, kind = "", None
    for mount in mounts:
        point = mount.mountpoint
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, mount.fstype
    return kind


def can_map(root: str) -> bool:
    """Whether chunk files under ``root`` may be mapped (see the module's docstring)."""
    return _mmap_at is not None and filesystem_of(root) in MAPPABLE_FILESYSTEMS


def map_files(paths: Sequence[str], sizes: Sequence[int]) -> memoryview:
    """One writable buffer made of the files in order, each mapped private (copy-on-write)
    at its place. Every file but the last must be a whole number of pages long and each
    must have exactly its size (else OSError: the caller reads them instead).

    The buffer owns the address range: when the last reference to it goes, Python unmaps
    the whole range, and with it every file's mapping."""
    assert _mmap_at is not None
    total = sum(sizes)
    region = mmap.mmap(-1, total, flags=mmap.MAP_PRIVATE)
    anchor = ctypes.c_char.from_buffer(region)
    base = ctypes.addressof(anchor)
    del anchor  # an exported buffer would keep the region from ever closing
    offset = 0
    for i, (path, size) in enumerate(zip(paths, sizes, strict=True)):
        if i < len(sizes) - 1 and size % _PAGE:
            raise OSError(f"{path}: {size} bytes is not a whole number of pages")
        fd = os.open(path, os.O_RDONLY)
        try:
            if os.fstat(fd).st_size != size:
                raise OSError(f"{path}: not {size} bytes long")
            prot = mmap.PROT_READ | mmap.PROT_WRITE
            flags = mmap.MAP_PRIVATE | _MAP_FIXED
            if _mmap_at(base + offset, size, prot, flags, fd, 0) in (None, _MAP_FAILED):
                err = ctypes.get_errno()
                raise OSError(err, f"mmap {path}: {os.strerror(err)}")
        finally:
            os.close(fd)
        offset += size
    return memoryview(region)


def large_buffers(manifest: dict[str, Any]) -> set[int]:
    """The indexes of the image's segments that hold one large buffer each (the ones to
    map): large, and no pickle is in them (those are read and checked before unpickling)."""
    pickled = {g["pickle"][0] for g in manifest.get("groups", ())}
    return {
        index
        for index, segment in enumerate(manifest["segments"])
        if index not in pickled and segment["size"] >= MAP_MIN_BYTES
    }


class Mapper:
    """Maps the large buffer segments of one image; its :class:`Checker` checks them
    after the restore."""

    def __init__(self, manifest: dict[str, Any], path_of: Callable[[str], str]) -> None:
        self._large = large_buffers(manifest)
        self._path_of = path_of
        self.checker = Checker()
        self.bytes = 0  # mapped, so far

    def __call__(self, index: int, segment: dict[str, Any]) -> memoryview | None:
        """The segment, mapped; None where it is to be read (small, holds a pickle, or a
        chunk file is not as the manifest says: reading it then says what is wrong)."""
        if index not in self._large:
            return None
        digests = [digest for digest, _ in segment["chunks"]]
        sizes = [size for _, size in segment["chunks"]]
        paths = [self._path_of(digest) for digest in digests]
        try:
            view = map_files(paths, sizes)
        except OSError:
            return None
        for digest, path, size in zip(digests, paths, sizes, strict=True):
            self.checker.chunks[digest] = (path, size)
        self.bytes += segment["size"]
        return view


def read_ahead(path: str) -> None:
    """Ask the page cache for the file without waiting for it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    except OSError:
        pass
    finally:
        os.close(fd)


class Checker:
    """Checks mapped chunks against their hashes on a background thread, after the
    restore: all files are read ahead at once, then each is hashed, which leaves them in
    the page cache for the first touch of their pages. ``failed``: digest -> why, for each
    chunk that did not match."""

    def __init__(self) -> None:
        self.chunks: dict[str, tuple[str, int]] = {}  # digest -> path, size
        self.failed: dict[str, str] = {}
        self.done = threading.Event()

    def start(self, report: Callable[[Checker], None]) -> None:
        """Check every chunk, then call ``report`` (on the checking thread)."""

        def run() -> None:
            chunks = list(self.chunks.items())
            try:
                for _, (path, _) in chunks:  # the disk reads them all at its pace meanwhile
                    read_ahead(path)
                for digest, (path, size) in chunks:
                    self._check(digest, path, size)
            finally:
                self.done.set()
            report(self)

        threading.Thread(target=run, name="ckpt-check-mapped", daemon=True).start()

    def _check(self, digest: str, path: str, size: int) -> None:
        try:
            with open(path, "rb") as f:
                data = f.read(size + 1)
        except FileNotFoundError:
            return  # deleted since: nothing to compare with (its mapping keeps the data)
        except OSError as exc:
            self.failed[digest] = f"unreadable: {exc}"
            return
        if len(data) != size or chunk_hash(data) != digest:
            self.failed[digest] = "its content does not match its hash"
