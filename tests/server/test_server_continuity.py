"""A suspend the computation cannot notice, through the server: the idle monitor
suspends a kernel that set seeds, options and sys.path, and the first cell sent to it
restores it, into a process that stood by or a fresh one; the cell goes on as it would
have without the suspend."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from harness import SHARED_COUNTER
from server_helpers import poll, start_session, text_of

SETUP = (
    """
import random, sys, decimal, warnings
import numpy as np
sys.path.append({src!r})
from tallies import Tally
tally = Tally(3)
random.seed(7); np.random.seed(8)
np.set_printoptions(precision=2); decimal.getcontext().prec = 41
warnings.filterwarnings('ignore', message='quiet please')
words = ['alpha', 'beta', 'gamma', 'delta', 'epsilon', 'zeta']
order = list(set(words))  # in the process's string-hash order
"""
    + SHARED_COUNTER.replace("{", "{{").replace("}", "}}")
    + """
inc()
"""
)
NEXT = (
    "import json; print(json.dumps([random.random(), np.random.rand(), "
    "np.get_printoptions()['precision'], decimal.getcontext().prec, tally.total(), "
    "inc(), get(), any(f[1] and f[1].pattern == 'quiet please' for f in warnings.filters), "
    "list(set(words)) == order]))"
)


@pytest.mark.parametrize("standby", [True, False], ids=["standby", "fresh-process"])
async def test_an_idle_suspend_and_the_first_cell_go_on_as_without_them(
    jp_fetch, connect, manager, monitor, tmp_path: Path, standby: bool
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "tallies.py").write_text(
        "class Tally:\n    def __init__(self, n):\n        self.n = n\n"
        "    def total(self):\n        return self.n * 10\n"
    )
    manager.standby_kernel = standby
    _, kernel_id = await start_session(jp_fetch, "continuity.ipynb")
    client = await connect(kernel_id)
    reply, outputs = await client.execute(SETUP.format(src=str(src)))
    assert reply["status"] == "ok", text_of(outputs)
    # what the next cell gives without a suspend: the same state, copied in the kernel
    reply, outputs = await client.execute("_state = (random.getstate(), np.random.get_state())")
    assert reply["status"] == "ok", text_of(outputs)

    km = manager.kernel_manager
    await poll(lambda: km.get_kernel(kernel_id).execution_state == "idle", what="idle")
    manager.policy.idle_timeout = 0.1

    async def suspended_when_idle() -> bool:
        return kernel_id in await monitor.tick()

    await poll(suspended_when_idle, timeout=120, what="the idle monitor's suspend")
    manager.policy.idle_timeout = 3600

    client = await connect(kernel_id)
    reply, outputs = await client.execute(NEXT)
    assert reply["status"] == "ok", text_of(outputs)
    after_restore = json.loads(text_of(outputs))
    # the same cell, from the state the kernel had before the suspend
    reply, outputs = await client.execute(
        "random.setstate(_state[0]); np.random.set_state(_state[1]); inc.__closure__"
        "[0].cell_contents = 1\n" + NEXT
    )
    assert reply["status"] == "ok", text_of(outputs)
    uninterrupted = json.loads(text_of(outputs))
    assert after_restore == uninterrupted
    assert after_restore[2:] == [2, 41, 30, 2, 2, True, True]
    standby_pids = manager.lifecycles.standby.pids()
    assert standby or not standby_pids
