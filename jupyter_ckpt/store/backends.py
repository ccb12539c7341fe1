"""Where bytes live: a local directory, or anything fsspec can open.

The local backend is the fast path (readinto, no extra copies, fsync, private 0700/0600
permissions). Every other URL goes through fsspec, whose object stores give atomic puts.
Both expose the same small interface so the store above never branches on the kind.
"""

from __future__ import annotations

import errno
import os
import secrets
from collections.abc import Iterator
from typing import Protocol

from ..errors import CkptError


class Backend(Protocol):
    url: str

    def write_atomic(self, path: str, data: memoryview | bytes) -> None: ...
    def read_bytes(self, path: str) -> bytes: ...
    def read_into(self, path: str, out: memoryview) -> int: ...
    def exists(self, path: str) -> bool: ...
    def listdir(self, path: str) -> list[str]: ...
    def walk_files(self, path: str) -> Iterator[tuple[str, float]]: ...
    def remove(self, path: str) -> None: ...
    def sync_dir(self, path: str) -> None: ...


class LocalBackend:
    """A private directory: dirs 0700, files 0600, writes via temp file, fsync, rename."""

    def __init__(self, root: str, fsync: bool = True) -> None:
        self.root = os.path.abspath(os.path.expanduser(root))
        self.url = self.root
        self.fsync = fsync
        self._made: set[str] = set()
        os.makedirs(self.root, mode=0o700, exist_ok=True)
        os.chmod(self.root, 0o700)

    def _abs(self, path: str) -> str:
        return os.path.join(self.root, path)

    def _makedirs(self, directory: str) -> None:
        if directory not in self._made:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            self._made.add(directory)

    def write_atomic(self, path: str, data: memoryview | bytes) -> None:
        target = self._abs(path)
        directory = os.path.dirname(target)
        self._makedirs(directory)
        tmp = os.path.join(directory, f".tmp-{secrets.token_hex(8)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            view = memoryview(data).cast("B")
            while view:
                view = view[os.write(fd, view) :]
            if self.fsync:
                os.fsync(fd)
            os.close(fd)
            fd = -1
            os.replace(tmp, target)
        except BaseException as exc:
            if fd >= 0:
                os.close(fd)
            os.unlink(tmp)
            if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
                raise CkptError(f"the store {self.root} is full (no space left on device)") from exc
            raise

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
        with open(self._abs(path), "rb", buffering=0) as f:
            total = 0
            while total < len(out):
                n = f.readinto(out[total:])
                if not n:
                    break
                total += n
            return total

    def exists(self, path: str) -> bool:
        return os.path.exists(self._abs(path))

    def listdir(self, path: str) -> list[str]:
        try:
            return os.listdir(self._abs(path))
        except FileNotFoundError:
            return []

    def walk_files(self, path: str) -> Iterator[tuple[str, float]]:
        base = self._abs(path)
        for dirpath, _dirs, files in os.walk(base):
            for name in files:
                full = os.path.join(dirpath, name)
                try:
                    mtime = os.stat(full).st_mtime
                except FileNotFoundError:
                    continue
                yield os.path.relpath(full, self.root), mtime

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

    def listdir(self, path: str) -> list[str]:
        try:
            entries = self.fs.ls(self._abs(path), detail=False)
        except FileNotFoundError:
            return []
        return [e.rstrip("/").rsplit("/", 1)[-1] for e in entries]

    def walk_files(self, path: str) -> Iterator[tuple[str, float]]:
        try:
            found = self.fs.find(self._abs(path), detail=True)
        except FileNotFoundError:
            return
        for full, info in found.items():
            modified = info.get("LastModified") or info.get("mtime") or info.get("created") or 0
            mtime = modified.timestamp() if hasattr(modified, "timestamp") else float(modified)
            yield full[len(self.root) + 1 :], mtime

    def remove(self, path: str) -> None:
        full = self._abs(path)
        try:
            self.fs.rm(full, recursive=True)
        except FileNotFoundError:
            pass


def open_backend(url: str, fsync: bool = True) -> LocalBackend | FsspecBackend:
    if "://" not in url or url.startswith("file://"):
        return LocalBackend(url.removeprefix("file://"), fsync=fsync)
    return FsspecBackend(url)
