"""What a kernel's debugger says of itself, kept in its record at suspend: JupyterLab asks
for it on every connect, and a suspended kernel answers from it (see
:mod:`jupyter_ckpt_server.websocket`) rather than leave the question waiting for a restore."""

from __future__ import annotations

from typing import Any

from ..rpc import SuspendFailed
from .kernels import Kernels

# how long a suspend waits for the kernel's debugger to describe itself (it is optional)
DEBUG_INFO_TIMEOUT = 5.0


async def debug_info(
    owner: Kernels, kernel_id: str, info: dict[str, Any], deadline: float | None
) -> dict[str, Any] | None:
    """The kernel's ``debugInfo``, when it has a debugger (its kernel ``info`` says so);
    none if it does not answer before ``deadline``."""
    if not (info.get("debugger") or "debugger" in info.get("supported_features", [])):
        return None  # (protocol 5.5 lists it among the supported features)
    try:
        reply = await owner.rpc.request(
            kernel_id,
            "debug",
            min(DEBUG_INFO_TIMEOUT, owner.timeout(deadline)),
            channel="control",
            type="request",
            seq=0,
            command="debugInfo",
            arguments={},
        )
    except SuspendFailed as exc:
        owner.log.info("No debugger facts from kernel %s: %s", kernel_id, exc)
        return None
    return reply.get("body") if reply.get("success") else None
