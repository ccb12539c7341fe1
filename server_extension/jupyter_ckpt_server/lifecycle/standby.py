"""Which kernel specs have a process standing by (the server's
:mod:`jupyter_ckpt_server.standby` starts them): those of the kernels suspended or being
suspended, whose restore then starts at once."""

from __future__ import annotations

import os

from .kernels import Kernels
from .states import State


def keep_standby(owner: Kernels) -> None:
    """A process standing by for each spec of the kernels suspended or being suspended,
    and none for others."""
    if owner.stopping:
        return
    names = {lc.record["kernel_name"] for lc in owner.in_state(State.SUSPENDED) if lc.record}
    for lc in owner.in_state(State.SUSPENDING):
        if owner.km.has_process(lc.kernel_id):
            names.add(owner.km.get_kernel(lc.kernel_id).kernel_name)
    owner.standby.want(names, {**os.environ, **owner.km.ckpt_env})
