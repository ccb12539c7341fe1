"""Whether a process runs, and whether a kernel's process, just started, can still answer.

A started kernel that says nothing is slow (a cold file cache, startup files that import a
large library, a kernelspec's launcher that prepares an environment before it starts
ipykernel): it is waited for. Only evidence that the process cannot answer makes the
server start another: it exited (jupyter_client's restarter then replaces it on new
ports, which the server's iopub watch does not follow), it was replaced on other ports,
or another process holds one of its ports (taken between the server's choice and the
kernel's bind, ipykernel was seen to hang for good, "Address already in use").
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


def cannot_answer(kernel: Any, watched: dict[str, int], look_at_ports: bool) -> str | None:
    """Why the kernel's process cannot answer on the ports the server watches (None
    while it may): it exited, it was replaced on other ports, or (``look_at_ports``)
    another process listens on one of them. A process the server cannot see (a remote
    provisioner's) may answer."""
    if ports(kernel) != watched:
        return "its process was replaced on other ports"
    pid = getattr(kernel.provisioner, "pid", None)
    if pid is None:
        return None
    if not alive(pid):
        return "its process exited"
    if not look_at_ports or kernel.transport != "tcp":
        return None
    try:
        process = psutil.Process(pid)
        # a kernelspec may start the kernel through a wrapper (a shell, conda run)
        tree = {process.pid, *(child.pid for child in process.children(recursive=True))}
        holders = {
            conn.laddr.port: conn.pid
            for conn in psutil.net_connections("tcp")
            if conn.status == psutil.CONN_LISTEN and conn.laddr.port in watched.values()
        }
    except psutil.NoSuchProcess:
        return "its process exited"
    except psutil.AccessDenied:
        return None
    for name, port in watched.items():
        if port in holders and holders[port] not in tree:
            holder = holders[port]
            by = "another process" if holder is None else f"process {holder}"
            return f"its {name.removesuffix('_port')} port {port} is held by {by}"
    return None
