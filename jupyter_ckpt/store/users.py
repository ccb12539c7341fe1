"""One store root, many users: each user's images live under ``<root>/users/<user>/``.

Everything a user writes (images, chunks, kernel records, leases) stays inside their
prefix, so chunks are deduplicated per user only and no user ever references, lists or
deletes another's data. On a local directory the prefix is private (0700); the shared
``users/`` directory copies the root's group and other permission bits and gets the
sticky bit when the root is writable by others, so a user can create their own prefix but
not remove anyone else's. Object stores are shared through the bucket's access policy
(one prefix per user).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import stat

from ..errors import InvalidReference, StorePermission
from .backends import store_error

USER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._@+-]{0,127}$")
# What the store held at its root before it had one prefix per user.
LEGACY_NAMES = ("images", "chunks", "kernels")
# The directories of a prefix whose owner and permissions are checked at each open.
CHECKED_DIRS = ("images", "chunks", "kernels", "leases")


def check_user(user: str) -> str:
    """A user name that is safe as one path component."""
    if not isinstance(user, str) or not USER_RE.match(user) or ".." in user:
        raise InvalidReference(
            f"invalid store user name {user!r}: use letters, digits, '.', '_', '@', '+' "
            "and '-' (no path separators, no '..')"
        )
    return user


def user_prefix(user: str) -> str:
    return f"users/{check_user(user)}"


def prepare_local(root: str, user: str) -> str:
    """Create the user's private prefix of a local store (and the root and ``users/`` if
    missing); move a store of the single-user layout into the prefix once. Returns the
    prefix's absolute path. An existing prefix must be the user's own (:func:`check_owned`)."""
    users = os.path.join(root, "users")
    prefix = os.path.join(root, user_prefix(user))
    if os.path.lexists(prefix):
        check_owned(prefix)
        return prefix
    try:
        if not os.path.isdir(root):
            os.makedirs(root, mode=0o700)
        if not os.path.isdir(users):
            _make_shared(users, os.stat(root).st_mode)
        fd = os.open(users, os.O_RDONLY)
        try:
            with contextlib.suppress(OSError):  # no lock on some network file systems
                fcntl.flock(fd, fcntl.LOCK_EX)
            if not os.path.isdir(prefix):  # another process of this user may have won
                _create_prefix(root, prefix)
        finally:
            os.close(fd)
    except PermissionError as exc:
        raise StorePermission(
            f"cannot create your part of the store, {prefix}: {exc.strerror} ({exc.filename}); "
            "a store shared by several users needs a root they can all write to "
            "(e.g. group-writable and setgid)"
        ) from exc
    except OSError as exc:
        error = store_error(exc, root, write=True)
        if error is None:
            raise
        raise error from exc
    check_owned(prefix)
    return prefix


def check_owned(prefix: str) -> None:
    """Refuse a prefix that another user could read or change under us: one (or a
    directory in it) that is a symbolic link, is owned by someone else than the user or
    root (an administrator may provide it, e.g. read-only), or that others may write to.
    On a shared root anyone may create ``users/<name>`` before ``<name>`` does,
    then rename away or read what ``<name>`` saves into it."""
    for path in [prefix, *(os.path.join(prefix, name) for name in CHECKED_DIRS)]:
        _check_dir(path)  # the prefix first: a link must not be followed, even to list it
    chunks = os.path.join(prefix, "chunks")
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for name in os.listdir(chunks):
            _check_dir(os.path.join(chunks, name))


def _check_dir(path: str) -> None:
    uid = os.geteuid()
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        problem = f"it is a symbolic link (to {os.readlink(path)})"
        fix = f"remove the link ({path}) and try again"
    elif not stat.S_ISDIR(st.st_mode):
        problem, fix = "it is not a directory", f"move it away ({path}) and try again"
    elif uid != 0 and st.st_uid not in (uid, 0):  # root (a hub reading it) may use any
        problem = f"it belongs to uid {st.st_uid}, not to you (uid {uid})"
        fix = (
            "another user may have made it to read or remove your images; have it "
            "removed (by its owner or an administrator) and try again"
        )
    elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        problem = f"other users may write to it (mode {stat.S_IMODE(st.st_mode):o})"
        fix = f"run: chmod -R go-w {path}"
    else:
        return
    raise StorePermission(f"refusing the store directory {path}: {problem}; {fix}")


def _make_shared(users: str, root_mode: int) -> None:
    mode = 0o700 | (root_mode & (0o077 | stat.S_ISGID))
    if root_mode & (stat.S_IWGRP | stat.S_IWOTH):
        mode |= stat.S_ISVTX
    with contextlib.suppress(FileExistsError):
        os.mkdir(users, 0o700)
        os.chmod(users, mode)  # our own new directory: the umask must not narrow it


def _create_prefix(root: str, prefix: str) -> None:
    """Build the prefix aside and rename it into place, so it appears complete: with
    the legacy directories the current user owns moved in (renames, nothing copied)."""
    staging = os.path.join(os.path.dirname(prefix), f".new-{secrets.token_hex(8)}")
    os.mkdir(staging, 0o700)
    uid = os.geteuid()
    moved = []
    for name in LEGACY_NAMES:
        old = os.path.join(root, name)
        with contextlib.suppress(FileNotFoundError):
            if os.lstat(old).st_uid == uid and os.path.isdir(old):
                os.rename(old, os.path.join(staging, name))
                moved.append(name)
    try:
        os.rename(staging, prefix)
    except OSError:
        for name in moved:  # put everything back as it was
            os.rename(os.path.join(staging, name), os.path.join(root, name))
        os.rmdir(staging)
        raise
