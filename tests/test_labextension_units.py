"""The JupyterLab extension's TypeScript unit tests (vitest) and its linters (eslint,
stylelint, prettier, configured as in the JupyterLab extension template), run as part of the
one test command: `pip install -e .` builds the extension and leaves its node_modules in
place."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


needs_node_modules = pytest.mark.skipif(
    not (ROOT / "node_modules" / ".bin" / "vitest").exists() or shutil.which("npm") is None,
    reason="the labextension's npm dependencies are not installed (pip install -e . does it)",
)


def npm(*args: str) -> None:
    result = subprocess.run(
        ["npm", *args, "--silent"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr


@needs_node_modules
def test_typescript_models() -> None:
    npm("test")


@needs_node_modules
def test_lint() -> None:
    """`npm run lint` fixes what the linters can; this checks without changing files."""
    npm("run", "lint:check")
