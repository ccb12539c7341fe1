"""Where bytes live: a local directory, or anything fsspec can open.

The local backend is the fast path (direct I/O reads, no extra copies, fsync, private
0700/0600 permissions). Every other URL goes through fsspec, whose object stores give
atomic puts. Both expose the same small interface so the store above never branches on the
kind.

Chunks of an image are *staged* (written to a temp file whose writeback starts at once)
and *published* at commit (fsync, then rename). A thread that fsyncs each chunk as soon as
it is written waits for the disk once per chunk; staging lets the I/O threads keep hashing
and writing while the disk drains, and the fsyncs at commit find the data mostly on disk
(measurements in benchmarks/README.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import functools
import inspect
import os
import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

from ..errors import (
    CkptError,
    StoreError,
    StoreFull,
    StorePermission,
    StoreReadOnly,
    StoreUnavailable,
)


class Backend(Protocol):
    url: str

    def write_atomic(self, path: str, data: memoryview | bytes) -> None: ...
    def stage(self, path: str, data: memoryview | bytes) -> str: ...
    def publish(self, staged: str, path: str) -> None: ...
    def discard(self, staged: str) -> None: ...
    def read_bytes(self, path: str) -> bytes: ...
    def read_into(self, path: str, out: memoryview) -> int: ...
    def exists(self, path: str) -> bool: ...
    def reusable(self, path: str, max_age: float) -> bool: ...
    def mtime(self, path: str) -> float | None: ...
    def listdir(self, path: str) -> list[str]: ...
    def walk_files(self, path: str) -> Iterator[tuple[str, float, int]]: ...
    def fingerprints(self, path: str, name: str) -> Iterator[tuple[str, str]]: ...
    def remove(self, path: str) -> None: ...
    def sync_dir(self, path: str) -> None: ...


# Direct I/O needs buffer address, file offset and length aligned; every Linux block device
# accepts 4096 (the page size), most 512.
DIRECT_ALIGN = 4096


def _address(view: memoryview) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


def _read_fully(fd: int, out: memoryview) -> int:
    """Read until ``out`` is full or the file ends; returns the bytes read."""
    total = 0
    while total < len(out):
        n = os.readv(fd, [out[total:]])
        if not n:
            break
        total += n
    return total


# -- errors ------------------------------------------------------------------------------
# Every failure of the store becomes a StoreError here, once, with a message that names the
# store and what to do: everything above (the image store, the server, the command line,
# %ckpt) then shows one line instead of a traceback from fsspec, botocore or aiohttp.

# Raised for a missing object: the store above reads them as "no such image", not failures.
_ABSENT = (FileNotFoundError, NotADirectoryError, IsADirectoryError, FileExistsError)
# Libraries whose own exception types (not OSErrors) mean "the store did not answer".
_NETWORK_LIBRARIES = frozenset({"botocore", "aiobotocore", "aiohttp", "urllib3", "requests"})
# What a store method does, for the message when it is refused.
_WRITES = frozenset({"write_atomic", "stage", "publish", "discard", "remove", "sync_dir"})
_READS = frozenset(
    {
        "read_bytes",
        "read_into",
        "exists",
        "reusable",
        "mtime",
        "listdir",
        "walk_files",
        "fingerprints",
    }
)
_F = TypeVar("_F", bound=Callable[..., Any])


def _cause(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _from_network(exc: BaseException) -> bool:
    return isinstance(exc, asyncio.TimeoutError) or any(
        c.__module__.partition(".")[0] in _NETWORK_LIBRARIES for c in type(exc).__mro__
    )


def store_error(exc: BaseException, url: str, write: bool) -> StoreError | None:
    """The StoreError that ``exc``, raised by the store at ``url``, means for a user; None
    for what is not a failure of the store (a missing object, our own errors)."""
    if isinstance(exc, (CkptError, *_ABSENT)) or not isinstance(exc, Exception):
        return None
    cause = _cause(exc)
    code = exc.errno if isinstance(exc, OSError) else None
    if code == errno.ENOSPC or code == errno.EDQUOT:
        return StoreFull(
            f"the store {url} is full (no space left on device); free space with "
            "`jupyter ckpt rm` and `jupyter ckpt gc`, or set ImageStore.quota_bytes"
        )
    if code == errno.EROFS:
        return StoreReadOnly(
            f"the store {url} is read-only ({cause}): images can be listed, shown, "
            "verified and restored, but not saved or removed; mount it writable, or save "
            "to another store (ImageStore.url)"
        )
    if isinstance(exc, PermissionError):
        if write:
            return StorePermission(
                f"no permission to write to the store {url} ({cause}): images can be read "
                "but not saved or removed; ask the store's owner for write access, or save "
                "to another store (ImageStore.url)"
            )
        return StorePermission(
            f"no permission to read the store {url} ({cause}); ask the store's owner to "
            "give you read access"
        )
    if isinstance(exc, OSError) or _from_network(exc):
        return StoreUnavailable(
            f"cannot reach the store {url} ({cause}); check that it is up and reachable "
            "from here (endpoint, network, credentials), then try again"
        )
    return None


def _mapped(method: _F, write: bool) -> _F:
    """``method`` raising StoreErrors (see :func:`store_error`) instead of its own."""

    def translate(backend: Any, exc: Exception) -> None:
        error = store_error(exc, backend.url, write)
        if error is None and isinstance(exc, NotADirectoryError):
            error = backend.gone(exc) if isinstance(backend, LocalBackend) else None
        if error is not None:
            raise error from exc

    if inspect.isgeneratorfunction(method):

        @functools.wraps(method)
        def generator(self: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
            try:
                yield from method(self, *args, **kwargs)
            except Exception as exc:
                translate(self, exc)
                raise

        return generator  # type: ignore[return-value]

    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:
            translate(self, exc)
            raise

    return call  # type: ignore[return-value]


_B = TypeVar("_B", bound=type)


def _store_errors(cls: _B) -> _B:
    """Every Backend method of ``cls`` raises StoreErrors for the store's failures."""
    for name in _WRITES | _READS:
        setattr(cls, name, _mapped(getattr(cls, name), name in _WRITES))
    return cls


@_store_errors
class LocalBackend:
    """A private directory: dirs 0700, files 0600, writes via temp file, fsync, rename.

    Reads of page-aligned buffers use ``O_DIRECT`` where the file system allows it: the
    disk writes straight into the caller's memory, which skips the copy out of the page
    cache and the cost of filling and evicting it. An image is mostly read once, in a
    fresh kernel, so the cache would only duplicate memory the kernel then holds. A file
    the page cache holds whole already is copied from it instead.
    """

    def __init__(self, root: str, fsync: bool = True, direct_io: bool = True) -> None:
        self.root = os.path.abspath(os.path.expanduser(root))
        self.url = self.root
        self.fsync = fsync
        # Switched off for good at the first EINVAL (tmpfs, some FUSE file systems).
        self.direct_io = direct_io and hasattr(os, "O_DIRECT")
        # whether reads can ask the page cache alone (off for good at the first refusal)
        self.nowait = hasattr(os, "RWF_NOWAIT")
        self._made: set[str] = set()
        if not os.path.isdir(self.root):
            # Private from the start; an existing directory (a shared file system) keeps
            # the permissions its owner chose.
            os.makedirs(self.root, mode=0o700)

    def _abs(self, path: str) -> str:
        return os.path.join(self.root, path)

    def gone(self, exc: NotADirectoryError) -> StoreError | None:
        """A path under a root that is no longer a directory is no missing object but a
        store that is gone (None while the root is a directory)."""
        if os.path.isdir(self.root):
            return None
        return StoreUnavailable(
            f"the store {self.url} is not a directory any more ({_cause(exc)}); put the "
            "store's directory back, or point ImageStore.url at it"
        )

    def _makedirs(self, directory: str) -> None:
        """Create ``directory`` and every missing one above it up to the root, each 0700
        (``os.makedirs`` gives the mode to the last one only)."""
        if directory in self._made:
            return
        missing = []
        path = directory
        while path != self.root and not os.path.isdir(path):
            missing.append(path)
            path = os.path.dirname(path)
        for path in reversed(missing):
            with contextlib.suppress(FileExistsError):
                os.mkdir(path, 0o700)
        self._made.add(directory)

    def write_atomic(self, path: str, data: memoryview | bytes) -> None:
        self.publish(self._write_temp(path, data, sync=True), path, synced=True)

    def stage(self, path: str, data: memoryview | bytes) -> str:
        """Write ``data`` for ``path`` to a temp file and start its writeback without
        waiting for it; :meth:`publish` makes it durable and visible. Returns the temp."""
        return self._write_temp(path, data, sync=False)

    def publish(self, staged: str, path: str, synced: bool = False) -> None:
        """fsync a staged file (unless ``synced``), then rename it into place."""
        try:
            if self.fsync and not synced:
                fd = os.open(staged, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            os.replace(staged, self._abs(path))
        except BaseException:
            self.discard(staged)
            raise

    def discard(self, staged: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staged)

    def _write_temp(self, path: str, data: memoryview | bytes, sync: bool) -> str:
        directory = os.path.dirname(self._abs(path))
        self._makedirs(directory)
        tmp = os.path.join(directory, f".tmp-{secrets.token_hex(8)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            view = memoryview(data).cast("B")
            while view:
                view = view[os.write(fd, view) :]
            if self.fsync and sync:
                os.fsync(fd)
            elif self.fsync and hasattr(os, "posix_fadvise"):
                # Starts writeback of the dirty pages now, without waiting (Linux); the
                # pages stay cached while under writeback.
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)
        return tmp

    def sync_dir(self, path: str) -> None:
        """Make renames in a directory durable (the manifest commit)."""
        if self.fsync:
            fd = os.open(self._abs(path), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def read_bytes(self, path: str) -> bytes:
        with open(self._abs(path), "rb") as f:
            return f.read()

    def read_into(self, path: str, out: memoryview) -> int:
        full = self._abs(path)
        if self.direct_io and len(out) >= DIRECT_ALIGN and _address(out) % DIRECT_ALIGN == 0:
            # a chunk the page cache holds whole (read ahead by the server while the kernel
            # started, or just written) is copied from there; direct I/O would read it again
            if self._read_cached(full, out) == len(out):
                return len(out)
            try:
                return self._read_direct(full, out)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self.direct_io = False
        fd = os.open(full, os.O_RDONLY)
        try:
            return _read_fully(fd, out)
        finally:
            os.close(fd)

    def _read_cached(self, full: str, out: memoryview) -> int:
        """Bytes of the file the page cache holds from its start, read without waiting
        for the disk (``RWF_NOWAIT``); 0 where the platform or file system cannot say."""
        if not self.nowait:
            return 0
        fd = os.open(full, os.O_RDONLY)
        total = 0
        try:
            while total < len(out):
                n = os.preadv(fd, [out[total:]], total, os.RWF_NOWAIT)
                if not n:
                    break
                total += n
        except BlockingIOError:
            pass
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            self.nowait = False
        finally:
            os.close(fd)
        return total

    @staticmethod
    def _read_direct(full: str, out: memoryview) -> int:
        """The aligned body with O_DIRECT, the short tail (if any) through the cache."""
        body = len(out) - len(out) % DIRECT_ALIGN
        fd = os.open(full, os.O_RDONLY | os.O_DIRECT)
        try:
            total = _read_fully(fd, out[:body])
        finally:
            os.close(fd)
        if total == body < len(out):
            fd = os.open(full, os.O_RDONLY)
            try:
                os.lseek(fd, body, os.SEEK_SET)
                total += _read_fully(fd, out[body:])
            finally:
                os.close(fd)
        return total

    def exists(self, path: str) -> bool:
        return os.path.exists(self._abs(path))

    def reusable(self, path: str, max_age: float) -> bool:
        """True if the file exists, we can read it back, and its age is now refreshed (so
        gc's grace covers it). A file we cannot read or refresh is written again."""
        full = self._abs(path)
        try:
            os.utime(full)
            os.close(os.open(full, os.O_RDONLY))
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            return False
        return True

    def mtime(self, path: str) -> float | None:
        try:
            return os.stat(self._abs(path)).st_mtime
        except FileNotFoundError:
            return None

    def listdir(self, path: str) -> list[str]:
        try:
            return os.listdir(self._abs(path))
        except FileNotFoundError:
            return []

    def walk_files(self, path: str) -> Iterator[tuple[str, float, int]]:
        """(path, mtime, size) of every file below ``path``."""
        base = self._abs(path)
        for dirpath, _dirs, files in os.walk(base):
            for name in files:
                full = os.path.join(dirpath, name)
                try:
                    st = os.stat(full)
                except FileNotFoundError:
                    continue
                yield os.path.relpath(full, self.root), st.st_mtime, st.st_size

    def fingerprints(self, path: str, name: str) -> Iterator[tuple[str, str]]:
        """(path, fingerprint) of every file ``name`` one directory below ``path``. A
        file replaced or rewritten gets a new one: a rename brings a new inode, and the
        change time cannot be set back by hand (unlike the modification time)."""
        try:
            entries = os.listdir(self._abs(path))
        except FileNotFoundError:
            return
        for entry in entries:
            rel = f"{path}/{entry}/{name}"
            try:
                st = os.stat(self._abs(rel))
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OSError as exc:  # listed, so that reading it names the problem
                yield rel, f"unreadable:{exc.errno}"
                continue
            yield rel, f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"

    def remove(self, path: str) -> None:
        target = self._abs(path)
        try:
            if os.path.isdir(target):
                for name in os.listdir(target):
                    os.unlink(os.path.join(target, name))
                os.rmdir(target)
            else:
                os.unlink(target)
        except FileNotFoundError:
            pass


@_store_errors
class FsspecBackend:
    """Any fsspec URL (s3://, gs://, memory://). Object-store puts are atomic by nature."""

    def __init__(self, url: str, **storage_options: object) -> None:
        import fsspec

        self.url = url.rstrip("/")
        self.fs, self.root = fsspec.core.url_to_fs(self.url, **storage_options)
        self.root = self.root.rstrip("/")

    def _abs(self, path: str) -> str:
        return f"{self.root}/{path}" if path else self.root

    def write_atomic(self, path: str, data: memoryview | bytes) -> None:
        self.fs.pipe_file(self._abs(path), bytes(data))

    def stage(self, path: str, data: memoryview | bytes) -> str:
        """A put is atomic and durable here: the object lands at once, nothing to publish."""
        self.write_atomic(path, data)
        return ""

    def publish(self, staged: str, path: str) -> None:
        """Nothing left to do: :meth:`stage` already put the object."""

    def discard(self, staged: str) -> None:
        """An object put by :meth:`stage` is unreferenced until a manifest names it; gc
        removes it."""

    def sync_dir(self, path: str) -> None:
        """Object stores are durable once a put returns."""

    def read_bytes(self, path: str) -> bytes:
        return self.fs.cat_file(self._abs(path))

    def read_into(self, path: str, out: memoryview) -> int:
        data = self.read_bytes(path)
        n = min(len(data), len(out))
        out[:n] = data[:n]
        return len(data)

    def exists(self, path: str) -> bool:
        return self.fs.exists(self._abs(path))

    def reusable(self, path: str, max_age: float) -> bool:
        """True if the object exists, we may read it (the HEAD request needs read access)
        and it is younger than ``max_age``. Object stores cannot refresh an object's age
        without rewriting it, so an older one is put again rather than reused."""
        try:
            info = self.fs.info(self._abs(path))
        except (FileNotFoundError, PermissionError):
            return False
        return _modified(info) > time.time() - max_age

    def mtime(self, path: str) -> float | None:
        try:
            return _modified(self.fs.info(self._abs(path)))
        except FileNotFoundError:
            return None

    def listdir(self, path: str) -> list[str]:
        try:
            entries = self.fs.ls(self._abs(path), detail=False)
        except FileNotFoundError:
            return []
        return [e.rstrip("/").rsplit("/", 1)[-1] for e in entries]

    def walk_files(self, path: str) -> Iterator[tuple[str, float, int]]:
        try:
            found = self.fs.find(self._abs(path), detail=True)
        except FileNotFoundError:
            return
        for full, info in found.items():
            yield full[len(self.root) + 1 :], _modified(info), int(info.get("size") or 0)

    def fingerprints(self, path: str, name: str) -> Iterator[tuple[str, str]]:
        """(path, fingerprint) of every object ``name`` one level below ``path``, from
        one listing (a request per 1,000 keys): ETag (a hash of the content on S3), size
        and modification time."""
        try:
            found = self.fs.find(self._abs(path), detail=True)
        except FileNotFoundError:
            return
        for full, info in found.items():
            rel = full[len(self.root) + 1 :]
            inner = rel[len(path) + 1 :].split("/")
            if len(inner) != 2 or inner[1] != name:
                continue
            etag = str(info.get("ETag") or info.get("etag") or "").strip('"')
            yield rel, f"{etag}:{info.get('size')}:{_modified(info)}"

    def remove(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(self._abs(path), recursive=True)


def _modified(info: dict[str, Any]) -> float:
    """An fsspec entry's modification time; each file system names it its own way."""
    modified = info.get("LastModified") or info.get("mtime") or info.get("created") or 0
    return modified.timestamp() if hasattr(modified, "timestamp") else float(modified)


def local_path(url: str) -> str | None:
    """The directory a store URL names on this machine, or None for a remote store."""
    if "://" not in url or url.startswith("file://"):
        return os.path.abspath(os.path.expanduser(url.removeprefix("file://")))
    return None


def open_backend(
    url: str, fsync: bool = True, direct_io: bool = True, **storage_options: object
) -> LocalBackend | FsspecBackend:
    path = local_path(url)
    if path is not None:
        return LocalBackend(path, fsync=fsync, direct_io=direct_io)
    return FsspecBackend(url, **storage_options)
