"""The kernels API contract: jupyter_server's own kernels and sessions tests, from the sdist
of the installed jupyter_server, pass with CkptKernelManager and the extension enabled
(``contract_plugin.py``), as they do with the stock kernel manager.

The sdist is downloaded once (PyPI must be reachable) and kept in pytest's cache directory;
only its ``tests/`` are used, against the installed jupyter_server.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from importlib.metadata import version
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
VERSION = version("jupyter_server")


@pytest.fixture(scope="module")
def server_tests(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The root of jupyter_server's sdist (its ``tests/`` and ``pyproject.toml``), kept in
    pytest's cache when the cache is on (``-p no:cacheprovider`` turns it off)."""
    name = f"jupyter_server-{VERSION}-sdist"
    pytest_cache = getattr(request.config, "cache", None)
    cache = Path(pytest_cache.mkdir(name) if pytest_cache else tmp_path_factory.mktemp(name))
    root = cache / f"jupyter_server-{VERSION}"
    if (root / "tests" / "services").is_dir():
        return root
    with tempfile.TemporaryDirectory() as download:
        pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary"]
        done = subprocess.run(
            [*pip, ":all:", f"jupyter_server=={VERSION}", "-d", download],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, f"cannot download the jupyter_server sdist: {done.stderr}"
        [sdist] = Path(download).glob("*.tar.gz")
        with tarfile.open(sdist) as tar:
            wanted = [
                m
                for m in tar.getmembers()
                if m.name.startswith(f"{root.name}/tests/")
                or m.name == f"{root.name}/pyproject.toml"
            ]
            tar.extractall(cache, members=wanted, filter="data")
    return root


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("area", ["kernels", "sessions"])
def test_jupyter_server_tests_pass_with_ckpt_kernel_manager(area: str, server_tests: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p),
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "contract_plugin",
            "-p",
            "no:cacheprovider",
            "-q",
            "-o",
            "addopts=-ra",
            "-o",
            "timeout_method=signal",
            "--show-capture=no",
            "--tb=short",
            f"tests/services/{area}",
        ],
        cwd=server_tests,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-20000:] + done.stderr[-5000:]
