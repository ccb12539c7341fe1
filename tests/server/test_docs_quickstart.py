"""The quickstart without a browser, run as written: its second terminal goes to bash as
is, against a real server started with the first terminal's settings."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from docs_snippets import blocks_of
from server_helpers import ServerProcess


@pytest.mark.skipif(shutil.which("curl") is None, reason="the quickstart uses curl")
async def test_a_kernel_is_suspended_and_a_cell_restores_it(tmp_path: Path) -> None:
    _, start, terminal = blocks_of("bash", "quickstart.md")
    (script,) = blocks_of("python", "quickstart.md")
    policy = {}
    for flag in shlex.split(start.text):
        if flag.startswith("--SuspendPolicy."):
            name, _, value = flag.removeprefix("--SuspendPolicy.").partition("=")
            policy[name] = json.loads(value.lower())
    server = ServerProcess(tmp_path, policy=policy)
    await server.start()
    try:
        (tmp_path / "cell.py").write_text(script.text)
        text = terminal.text.replace("http://localhost:8888", f"http://127.0.0.1:{server.port}")
        text = text.replace("TOKEN=quickstart", f"TOKEN={server.token}")
        # python3 is the one with this project (and tornado) installed
        env = {**server.env, "PATH": f"{Path(sys.executable).parent}:{server.env['PATH']}"}
        result = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", text], cwd=tmp_path, env=env,
            capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr
        assert '"suspended"' in result.stdout, result.stdout
        assert "499999500000" in result.stdout, result.stdout
    finally:
        server.kill()
