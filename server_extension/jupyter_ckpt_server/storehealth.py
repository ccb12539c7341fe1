"""Whether the store answers, for the status API, the status bar and the log.

An object store that is down when the server starts must not leave the extension half
started: every part starts regardless, and what needs the store (loading the records of
suspended kernels) is retried here in the background, with capped exponential backoff,
until it succeeds. The log gets one line per change of health, not one per attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from datetime import datetime, timezone
from typing import Any

from jupyter_ckpt.errors import CkptError

from .backoff import backoff


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


class StoreHealth:
    """The store's health as last seen ``{ok, error, since}``, and retries until it is
    back. ``first_delay`` doubles after each failed attempt, up to ``max_delay``."""

    def __init__(
        self,
        url: str,
        log: logging.Logger,
        first_delay: float = 1.0,
        max_delay: float = 60.0,
        on_change: Callable[[StoreHealth], None] | None = None,
    ) -> None:
        self.url = url
        self.on_change = on_change  # told of each change of health (a store event)
        self.log = log
        self.first_delay = first_delay
        self.max_delay = max_delay
        self.ok = True
        self.error: str | None = None
        self.since = _now()
        self._task: asyncio.Task[None] | None = None
        self._back = asyncio.Event()  # another operation saw the store answer

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "ok": self.ok, "error": self.error, "since": self.since}

    def record(self, error: BaseException | None, what: str) -> None:
        """Note the outcome of a store operation; log only when the health changes."""
        message = None if error is None else " ".join(str(error).split()) or type(error).__name__
        if (error is None) == self.ok:
            # same health: the latest reason, no new log line (an event: clients show it)
            said, self.error = self.error, message
            if message != said:
                self._changed()
            return
        self.ok, self.error, self.since = error is None, message, _now()
        self._changed()
        if error is None:
            self.log.info("The store %s answers again (%s succeeded)", self.url, what)
        else:
            self.log.error(
                "The store is unavailable, %s failed: %s. Retrying in the background; "
                "kernels are not suspended or autosaved until it answers",
                what,
                message,
            )

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change(self)

    def saw(self, error: BaseException | None, what: str) -> None:
        """The outcome of an operation the server did on the store anyway (a save): a
        failure makes the store not ok (a store that refuses writes while it reads is
        not); a success, while an operation is being retried, has that one tried at once
        (its success says the store is back), else says the store answers."""
        if error is None and self._task is not None and not self._task.done():
            self._back.set()
            return
        self.record(error, what)

    async def attempt(self, operation: Callable[[], Awaitable[None]], what: str) -> bool:
        """Run ``operation`` once; True if it succeeded."""
        try:
            await operation()
        except (CkptError, OSError) as exc:
            self.record(exc, what)
            return False
        self.record(None, what)
        return True

    def retry(self, operation: Callable[[], Awaitable[None]], what: str) -> None:
        """Run ``operation`` again in the background, after a delay, until it succeeds
        (unless it is being retried already)."""
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._retry(operation, what))

    def delays(self) -> Iterator[float]:
        """The waits before each retry: ``first_delay``, doubled after each failure, up to
        ``max_delay`` (after a long outage the store's return is seen within it)."""
        return backoff(self.first_delay, self.max_delay)

    async def _retry(self, operation: Callable[[], Awaitable[None]], what: str) -> None:
        for delay in self.delays():
            self._back.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._back.wait(), delay)
            if await self.attempt(operation, what):
                return

    async def stop(self) -> None:
        """Stop retrying (the server is stopping)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
