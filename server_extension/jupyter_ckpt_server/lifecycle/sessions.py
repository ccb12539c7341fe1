"""A kernel's sessions (notebooks, consoles), as its record keeps them so that a restored
kernel, and its later images, still name its notebook."""

from __future__ import annotations

from typing import Any

from .kernels import Kernels


class Sessions:
    """What the session manager knows of a kernel, for its record."""

    def __init__(self, owner: Kernels) -> None:
        self.owner = owner

    async def of(self, kernel_id: str) -> list[dict[str, Any]]:
        """The sessions (notebooks, consoles) attached to a kernel, as a record keeps them."""
        manager = self.owner.session_manager
        if manager is None:
            return []
        return [
            {key: session[key] for key in ("id", "path", "name", "type")}
            for session in await manager.list_sessions()
            if (session.get("kernel") or {}).get("id") == kernel_id
        ]

    async def reattach(self, kernel_id: str, sessions: list[dict[str, Any]]) -> None:
        """Give a recorded kernel its sessions back, under their ids, unless the session
        database (a persistent one) still has them."""
        manager = self.owner.session_manager
        if manager is None:
            return
        known = {session["id"] for session in await manager.list_sessions()}
        for session in sessions:
            if session["id"] not in known:
                await manager.save_session(
                    session["id"],
                    path=session["path"],
                    name=session["name"],
                    type=session["type"],
                    kernel_id=kernel_id,
                )

    def notebook_env(self, record: dict[str, Any]) -> dict[str, str]:
        """JPY_SESSION_NAME of the kernel's notebook under this server's root: after a
        respawn on a node that mounts the home elsewhere, the recorded one names a file of
        the old node (the restored kernel maps its working directory from the two)."""
        manager = self.owner.session_manager
        notebooks = [s for s in record.get("sessions", []) if s["type"] == "notebook"]
        if manager is None or not notebooks:
            return {}
        env = manager.get_kernel_env(notebooks[0]["path"], notebooks[0]["name"])
        return {"JPY_SESSION_NAME": env["JPY_SESSION_NAME"]}
