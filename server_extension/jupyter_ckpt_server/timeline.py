"""The steps of one restore and when each ended: where the user's wait for the first
result after a suspend goes, kept in the restore event so an admin can see it."""

from __future__ import annotations

import time
from typing import Any


class Timeline:
    """Steps in the order they ended, each with its end (seconds since the restore
    began) and its length."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self._steps: list[tuple[str, float, float]] = []

    def _last_end(self) -> float:
        return self._steps[-1][1] if self._steps else 0.0

    def mark(self, step: str) -> None:
        """``step`` ended now; it began when the step before it ended."""
        at = time.perf_counter() - self.started
        self._steps.append((step, at, at - self._last_end()))

    def kernel_steps(self, steps: dict[str, float]) -> None:
        """The kernel's own steps (seconds each) of the call that ended now: what they
        leave of the call's time went to the request, the reply and the kernel's imports."""
        at = time.perf_counter() - self.started
        overhead = max(0.0, at - self._last_end() - sum(steps.values()))
        end = self._last_end()
        for step, seconds in {"imports and messages": overhead, **steps}.items():
            end += seconds
            self._steps.append((step, end, seconds))

    def to_json(self) -> list[dict[str, Any]]:
        return [
            {"step": step, "at": round(at, 4), "seconds": round(seconds, 4)}
            for step, at, seconds in self._steps
        ]

    def describe(self) -> str:
        """One line per step, for the log."""
        return "\n".join(
            f"  {at:8.3f} s  {seconds:7.3f} s  {step}" for step, at, seconds in self._steps
        )
