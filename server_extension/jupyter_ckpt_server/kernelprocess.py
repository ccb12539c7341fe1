"""Whether a process runs, and whether a kernel's process, just started, can still answer.

A started kernel that says nothing is usually slow (a cold file cache, startup files that
import a large library). Two failures look the same from the server's side and never end:
ipykernel hangs for good when one of its ports was taken by another process between the
server's choice and its bind ("Address already in use"), and a process that exits as it
starts is replaced by jupyter_client's restarter on new ports, which the server's iopub
watch does not follow. They are told apart from slowness by the process itself: ipykernel
binds its ports before it runs anything slow of the user's, so a live process that listens
on all of them is only slow.
"""

from __future__ import annotations

from typing import Any

import psutil

PORTS = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")


def alive(pid: int) -> bool:
    """Whether a process runs (an exited child not yet reaped by its parent does not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def ports(kernel: Any) -> dict[str, int]:
    return {name: getattr(kernel, name) for name in PORTS}


def cannot_answer(kernel: Any, watched: dict[str, int], bound_by_now: bool) -> str | None:
    """Why the kernel's process cannot answer on the ports the server watches (None
    while it may): it exited, it was replaced on other ports, or (once it has had the
    time to bind them) it runs without listening on them. A process the server cannot
    see (a remote provisioner's) may."""
    if ports(kernel) != watched:
        return "its process was replaced on other ports"
    pid = getattr(kernel.provisioner, "pid", None)
    if pid is None:
        return None
    if not alive(pid):
        return "its process exited"
    if not bound_by_now or kernel.transport != "tcp":
        return None
    try:
        process = psutil.Process(pid)
        # a kernelspec may start the kernel through a wrapper (a shell, conda run)
        tree = [process, *process.children(recursive=True)]
        listening = {
            conn.laddr.port
            for member in tree
            for conn in member.net_connections("tcp")
            if conn.status == psutil.CONN_LISTEN
        }
    except psutil.NoSuchProcess:
        return "its process exited"
    except psutil.AccessDenied:
        return None
    if not set(watched.values()) <= listening:
        return "its process does not listen on its ports (one may have been taken)"
    return None
