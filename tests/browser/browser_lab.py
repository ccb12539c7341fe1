"""The JupyterLab server the browser tests run against, and where their output goes."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
REPO = Path(__file__).resolve().parents[2]
OUTPUT = REPO / "test-output" / "browser"
IDLE_TIMEOUT = 600  # never reached by waiting: tests move the idle clock (Lab.idle_for)
STEADY_KERNEL = "steady"
# "suspends in 2 h" for the first 30 minutes, however slow the page is to show it
STEADY_TIMEOUT = 7200
# ms for a step that starts a kernel and restores an image into it: seconds when the
# machine is idle, far more on a loaded one
RESTORE_WAIT = 90_000


@dataclass
class Lab:
    url: str
    token: str
    root: Path

    def api(self, method: str, path: str, body: Any = None) -> Any:
        request = urllib.request.Request(
            f"{self.url}/{path}",
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"token {self.token}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                text = response.read()
        except urllib.error.HTTPError as exc:
            # the server's answer (its message, and a traceback for a 500) in the failure
            raise AssertionError(f"{method} {path}: {exc.code} {exc.read().decode()}") from exc
        return json.loads(text) if text else None

    def idle_for(self, kernel_id: str, seconds: float = IDLE_TIMEOUT) -> bool:
        """Move the kernel's idle clock ``seconds`` on, as if it had been idle that long
        (tests/browser/idle_clock.py); False if the kernel was not running."""
        return self.api("POST", f"api/idle-clock/{kernel_id}", {"seconds": seconds})["running"]

    def kernel_of(self, notebook: str) -> str:
        sessions = self.api("GET", "api/sessions")
        return next(s["kernel"]["id"] for s in sessions if s["path"] == notebook)

    def notebook(self, name: str, kernel: str = "python3") -> str:
        """Write an empty notebook on ``kernel``; returns its API path."""
        content = {
            "cells": [
                {
                    "cell_type": "code",
                    "execution_count": None,
                    "id": "c0",
                    "metadata": {},
                    "outputs": [],
                    "source": "",
                }
            ],
            "metadata": {
                "kernelspec": {"name": kernel, "display_name": kernel, "language": "python"}
            },
            "nbformat": 4,
            "nbformat_minor": 5,
        }
        (self.root / name).write_text(json.dumps(content))
        return name
