"""Jupyter server extension of jupyter-ckpt: suspend idle GPU kernels, restore on return."""

from __future__ import annotations

from typing import Any

from .app import CkptExtensionApp


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    return [{"module": "jupyter_ckpt_server", "app": CkptExtensionApp}]
