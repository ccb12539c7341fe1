"""How far an image is written or read, published for the server to poll.

The kernel writes (or reads) its image inside one silent execute that the server awaits;
the only way to tell the server how far it got meanwhile is a side channel. A small JSON
file, ``{"done": bytes, "total": bytes}``, replaced atomically and at most every
``interval`` seconds, costs next to nothing on the I/O threads that count the bytes.
"""

from __future__ import annotations

import json
import os
import threading
import time

# seconds between two writes of the progress file
INTERVAL = 0.2


class Progress:
    """Bytes done of a total that may grow (a save's total is an estimate until its last
    chunk is queued). ``path`` None, or a file that cannot be written (a kernel that does
    not share the server's file system), only counts."""

    def __init__(self, path: str | None = None, interval: float = INTERVAL) -> None:
        self.path = path
        self.interval = interval
        self.done = 0
        self.total = 0
        self._lock = threading.Lock()
        self._written_at = -float("inf")

    def expect(self, total: int) -> None:
        """At least ``total`` bytes will be done."""
        with self._lock:
            self.total = max(self.total, total)

    def add(self, nbytes: int) -> None:
        """``nbytes`` more are done (called from the I/O threads)."""
        with self._lock:
            self.done += nbytes
            self.total = max(self.total, self.done)
            if time.monotonic() - self._written_at >= self.interval:
                self._publish()

    def finish(self) -> None:
        """The work is complete: all of the total is done, published now."""
        with self._lock:
            self.total = self.done = max(self.total, self.done)
            self._publish()

    def _publish(self) -> None:
        self._written_at = time.monotonic()
        if self.path is None:
            return
        partial = f"{self.path}.part"
        try:
            with open(partial, "w") as out:
                json.dump({"done": self.done, "total": self.total}, out)
            os.replace(partial, self.path)
        except OSError:
            self.path = None  # no progress to tell: the work itself goes on


def read_progress(path: str) -> tuple[int, int] | None:
    """(done, total) from a progress file, or None while there is none (yet)."""
    try:
        with open(path) as f:
            data = json.load(f)
        return int(data["done"]), int(data["total"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
