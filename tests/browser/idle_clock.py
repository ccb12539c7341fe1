"""A server extension the browser tests load: it moves a kernel's idle clock forward.

A test says when a kernel has been idle long enough (``POST /api/idle-clock/<kernel id>``
with ``{"seconds": N}``) instead of racing a short idle timeout on a loaded machine: the
idle monitor, unchanged, suspends the kernel at its next check. ``GET`` on the same route
gives the kernel's process id (null when it has none), for a test to look at the process.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from jupyter_server.base.handlers import APIHandler
from jupyter_server.services.kernels.handlers import _kernel_id_regex
from jupyter_server.utils import url_path_join
from tornado import web


class IdleClockHandler(APIHandler):
    @web.authenticated
    def get(self, kernel_id: str) -> None:
        km = self.kernel_manager
        kernel = km.get_kernel(kernel_id) if km.is_running(kernel_id) else None
        self.finish({"pid": getattr(getattr(kernel, "provisioner", None), "pid", None)})

    @web.authenticated
    def post(self, kernel_id: str) -> None:
        seconds = float(json.loads(self.request.body)["seconds"])
        km = self.kernel_manager
        if not km.is_running(kernel_id):  # suspended meanwhile: it has no clock to move
            self.finish({"running": False})
            return
        # both halves of the idle monitor's clock: the last message, and the last moment it
        # saw background work (a slow answer to its check, on a loaded machine, is some)
        kernel = km.get_kernel(kernel_id)
        kernel.last_activity -= timedelta(seconds=seconds)
        work_seen = self.settings["jupyter_ckpt_monitor"]._work_seen
        if kernel_id in work_seen:
            work_seen[kernel_id] -= timedelta(seconds=seconds)
        self.finish({"running": True})


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    return [{"module": "idle_clock"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    route = url_path_join(serverapp.base_url, rf"/api/idle-clock/{_kernel_id_regex}")
    serverapp.web_app.add_handlers(".*$", [(route, IdleClockHandler)])
