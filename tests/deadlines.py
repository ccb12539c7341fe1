"""Deadlines that scale with the machine: a slow or loaded machine makes the suite slower,
not red.

A deadline in a test is the time something takes on an idle machine, with a margin; on a
loaded one (two cores shared by several test runs) everything takes longer.
:func:`scaled` stretches a deadline by the slowdown: ``$JUPYTER_CKPT_TEST_SLOWDOWN`` when
set, else the machine's load per core when the run started, never less than 1.
"""

from __future__ import annotations

import functools
import os

SLOWDOWN_ENV = "JUPYTER_CKPT_TEST_SLOWDOWN"


@functools.cache
def slowdown() -> float:
    if os.environ.get(SLOWDOWN_ENV):
        return max(1.0, float(os.environ[SLOWDOWN_ENV]))
    try:
        load = os.getloadavg()[0]
    except OSError:  # not on this platform
        return 1.0
    return max(1.0, load / (os.cpu_count() or 1))


def scaled(seconds: float) -> float:
    """``seconds`` on an idle machine, as a deadline on this one."""
    return seconds * slowdown()
