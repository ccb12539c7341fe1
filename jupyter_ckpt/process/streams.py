"""The global random streams: a seeded experiment draws the same numbers after a restore.

A generator held in a variable (``numpy.random.Generator``, ``random.Random``) travels
with the namespace; these are the module-level ones a notebook seeds with
``random.seed``, ``np.random.seed`` or ``torch.manual_seed`` and draws from without naming.
"""

from __future__ import annotations

import functools
import random
import sys
from typing import Any

from .registry import Provider


def _numpy_capture() -> Any:
    return sys.modules["numpy"].random.get_state()


def _numpy_apply(state: Any) -> None:
    import numpy

    numpy.random.set_state(state)


def _torch_capture() -> dict[str, Any]:
    """The generators' states as bytes: tensors would count as the image's CPU tensors."""
    torch = sys.modules["torch"]
    state: dict[str, Any] = {"cpu": bytes(torch.get_rng_state().numpy())}
    # Reading a CUDA generator initializes CUDA: only where the kernel did already.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [bytes(s.numpy()) for s in torch.cuda.get_rng_state_all()]
    return state


def _torch_apply(state: dict[str, Any]) -> None:
    import torch

    def tensor(data: bytes) -> Any:
        return torch.frombuffer(bytearray(data), dtype=torch.uint8)

    torch.set_rng_state(tensor(state["cpu"]))
    cuda = state.get("cuda")
    if cuda is not None:
        if len(cuda) > torch.cuda.device_count():
            raise RuntimeError(
                f"the image holds {len(cuda)} CUDA generators, this node has "
                f"{torch.cuda.device_count()} GPUs: only the CPU stream was restored"
            )
        torch.cuda.set_rng_state_all([tensor(s) for s in cuda])


def keep_ipython_off_the_stream() -> None:
    """IPython picks the tip in its banner from the global ``random`` stream, on every
    ``kernel_info`` request: each frontend that connects would move a seeded notebook's
    stream on, and a kernel that was only reconnected to would hold another state than
    its last image. The tip is picked with the stream put back afterwards."""
    shell = sys.modules.get("IPython.core.interactiveshell")
    pick = getattr(shell, "pick_tip", None)
    if pick is None or getattr(pick, "keeps_the_stream", False):
        return

    @functools.wraps(pick)
    def pick_tip() -> str:
        state = random.getstate()
        try:
            return pick()
        finally:
            random.setstate(state)

    pick_tip.keeps_the_stream = True  # type: ignore[attr-defined]
    shell.pick_tip = pick_tip  # type: ignore[union-attr]


PROVIDERS = [
    Provider("random", ("random",), random.getstate, random.setstate),
    Provider("numpy.random", ("numpy",), _numpy_capture, _numpy_apply),
    Provider("torch.random", ("torch",), _torch_capture, _torch_apply),
]
