"""Write leases: how gc knows that a writer may still be reusing unreferenced chunks.

A writer reuses a chunk that is already in the store instead of writing it again. Until
its manifest lands, that chunk may be referenced by no image, and gc would remove it. A
local store can refresh the chunk's age (``utime``), but an object store cannot without
rewriting the object. So every writer also holds a lease, ``leases/<uuid>``: put when
the writer starts, put again every ``LEASE_REFRESH_SECONDS`` while it writes, removed
after its manifest is committed and checked. gc removes no unreferenced chunk while a
lease younger than ``LEASE_STALE_SECONDS`` exists. A writer killed mid-save leaves a
lease behind: gc removes it once it is stale, or at once when the lease names a process of
this host that no longer runs. With encryption on, a lease is encrypted like the rest
(it names a host and a process). Writers also re-put a reused chunk that
is older than half of ``GC_GRACE_SECONDS`` (see ``Backend.reusable``), which closes the
window between gc's lease check and its removals.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from typing import TYPE_CHECKING

import psutil

from ..errors import IntegrityError

if TYPE_CHECKING:
    from .backends import Backend
    from .encryption import Sealer

LEASE_REFRESH_SECONDS = 60.0
LEASE_STALE_SECONDS = 10 * LEASE_REFRESH_SECONDS
LEASES = "leases"


class Lease:
    """Held by one writer from its first chunk until its image is committed."""

    def __init__(
        self, backend: Backend, sealer: Sealer, refresh: float = LEASE_REFRESH_SECONDS
    ) -> None:
        self.backend = backend
        self.sealer = sealer
        self.path = f"{LEASES}/{uuid.uuid4().hex}"
        self._put()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._keep, args=(refresh,), name="ckpt-lease", daemon=True
        )
        self._thread.start()

    def _put(self) -> None:
        holder = {"host": socket.gethostname(), "pid": os.getpid(), "time": time.time()}
        self.backend.write_atomic(self.path, self.sealer.wrap(json.dumps(holder).encode(), "lease"))

    def _keep(self, refresh: float) -> None:
        while not self._stop.wait(refresh):
            with contextlib.suppress(OSError):  # the next refresh tries again
                self._put()

    def release(self) -> None:
        self._stop.set()
        self._thread.join()
        self.backend.remove(self.path)


def live_leases(backend: Backend, sealer: Sealer, now: float) -> list[str]:
    """Leases of writers that may still run; stale ones (killed writers) are removed."""
    live = []
    for path, mtime, _ in list(backend.walk_files(LEASES)):
        if mtime > now - LEASE_STALE_SECONDS and _holder_may_run(backend, sealer, path):
            live.append(path)
        else:
            backend.remove(path)
    return live


def _holder_may_run(backend: Backend, sealer: Sealer, path: str) -> bool:
    try:
        holder = json.loads(sealer.reveal(backend.read_bytes(path), path, "lease"))
        local = holder["host"] == socket.gethostname()
        pid = int(holder["pid"])
    except FileNotFoundError:
        return False  # released meanwhile
    except (OSError, ValueError, KeyError, TypeError, IntegrityError):
        return True  # unreadable or from elsewhere: only its age can tell
    return not local or psutil.pid_exists(pid)
