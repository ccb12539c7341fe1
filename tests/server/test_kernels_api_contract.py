"""The kernels API contract: jupyter_server's own kernels and sessions tests, from the sdist
of the installed jupyter_server, pass with CkptKernelManager and the extension enabled
(``contract_plugin.py``), as they do with the stock kernel manager.

The sdist is downloaded from PyPI (which must be reachable); only its ``tests/`` are used,
against the installed jupyter_server.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from importlib.metadata import version
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
VERSION = version("jupyter_server")


def download_sdist(name: str, version: str, directory: Path) -> Path:
    """The sdist of ``name==version`` from PyPI's simple index (PEP 691 JSON), checked
    against the index's sha256: a plain download, where ``pip download`` of an sdist would
    also build its metadata (a minute on a small machine)."""
    filename = f"{name}-{version}.tar.gz"
    index = urllib.request.Request(
        f"https://pypi.org/simple/{name.replace('_', '-')}/",
        headers={"Accept": "application/vnd.pypi.simple.v1+json"},
    )
    with urllib.request.urlopen(index, timeout=60) as response:
        files = json.load(response)["files"]
    [entry] = [f for f in files if f["filename"] == filename]
    target = directory / filename
    with urllib.request.urlopen(entry["url"], timeout=120) as response:
        target.write_bytes(response.read())
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    assert digest == entry["hashes"]["sha256"], f"{filename}: sha256 mismatch"
    return target


@pytest.fixture(scope="module")
def server_tests(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The root of jupyter_server's sdist (its ``tests/`` and ``pyproject.toml``), in a
    directory of each test process's own (the two runs may go to different workers)."""
    cache = tmp_path_factory.mktemp("jupyter_server-sdist")
    with tempfile.TemporaryDirectory() as download:
        sdist = download_sdist("jupyter_server", VERSION, Path(download))
        root = cache / f"jupyter_server-{VERSION}"
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
def test_jupyter_server_tests_pass_with_ckpt_kernel_manager(
    area: str, server_tests: Path, tmp_path: Path
) -> None:
    """The failed tests run once more, alone: a few upstream tests time the server to the
    second (a kernel culled within 5 s of idleness) and can miss on a loaded machine, as
    upstream marks others flaky. A failure that repeats is jupyter-ckpt's."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p),
    }

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-p",
                "contract_plugin",
                "-o",
                f"cache_dir={tmp_path / 'cache'}",
                "-q",
                "-o",
                "addopts=-ra",
                "-o",
                "timeout_method=signal",
                "--show-capture=no",
                "--tb=short",
                *args,
                f"tests/services/{area}",
            ],
            cwd=server_tests,
            env=env,
            capture_output=True,
            text=True,
        )

    done = run()
    if done.returncode != 0:
        again = run("--last-failed", "--last-failed-no-failures", "none")
        assert again.returncode == 0, (
            done.stdout[-10000:] + "\n--- the failed tests again ---\n" + again.stdout[-10000:]
        )
