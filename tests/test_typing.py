"""The code type-checks: mypy, run with the project's configuration ([tool.mypy] in
pyproject.toml), finds no error in jupyter_ckpt, jupyter_ckpt_server or the benchmarks
(which call the server's internals and would otherwise break unseen).

mypy keeps its incremental cache in ``.mypy_cache`` at the repository root, as when it is
run by hand, so only the first run (about 40 s of CPU) checks everything.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_finds_no_errors() -> None:
    # [tool.mypy] names the files; its paths are relative to the working directory
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    output = f"{result.stdout}{result.stderr}"
    assert result.returncode == 0, f"mypy reports errors:\n{output}"
    assert "Success: no issues found" in result.stdout, output
