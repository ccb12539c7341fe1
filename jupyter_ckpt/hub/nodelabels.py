"""The node label the hub's placement prefers: GPU memory free on this node now.

No standard label says how much GPU memory a node has free (NVIDIA GPU Feature Discovery
labels the total), so the node publishes it itself, e.g. from a DaemonSet that runs, every
minute, ``kubectl label node "$NODE_NAME" --overwrite $(python -m
jupyter_ckpt.hub.nodelabels)``. The hub then prefers, for a returning user whose images
hold GPU state, a node with that much free now (:func:`.placement.preferred_terms`).
"""

from __future__ import annotations

from ..gpu import GpuProbe
from .placement import FREE_MEMORY

_MIB = 1 << 20


def labels(probe: GpuProbe) -> dict[str, str]:
    """``{FREE_MEMORY: MiB}`` free now on the node's GPU with the most free memory (as
    NVML counts it: every process's memory is used); empty on a node without a GPU."""
    free = probe.free_memory()
    if not free:
        return {}
    return {FREE_MEMORY: str(max(free.values()) // _MIB)}


def main() -> None:
    print(" ".join(f"{key}={value}" for key, value in labels(GpuProbe()).items()))


if __name__ == "__main__":
    main()
