"""Capped exponential back-off: the waits between the attempts of what the server retries
until the store answers (the store health's background retry, a restore's reads)."""

from __future__ import annotations

from collections.abc import Iterator


def backoff(first: float, most: float) -> Iterator[float]:
    """``first``, doubled after each attempt, up to ``most`` (after a long outage the
    store's return is seen within ``most``); endless, as the retries stop themselves."""
    delay = first
    while True:
        yield delay
        delay = min(delay * 2, most)
