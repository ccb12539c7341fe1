"""Time limits and deadlines grow with the machine's slowdown (see :mod:`deadlines`)."""

from __future__ import annotations

import pytest
from deadlines import SLOWDOWN_ENV, scaled, slowdown


def test_the_run_time_limit_is_scaled(request: pytest.FixtureRequest) -> None:
    given = request.config.getoption("timeout", None)
    limit = float(given if given is not None else request.config.getini("timeout") or 0)
    marker = request.node.get_closest_marker("timeout")
    assert limit == 0 or float(marker.args[0]) == scaled(limit) >= limit


def test_a_slowdown_given_stretches_deadlines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SLOWDOWN_ENV, "3")
    slowdown.cache_clear()
    try:
        assert scaled(10) == 30
    finally:
        monkeypatch.undo()
        slowdown.cache_clear()
