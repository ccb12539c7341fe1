"""Fixtures: real ipykernel processes on a private store.

Kernels are expensive on a small machine, so test modules share them (module scope): one
kernel writes the images of a module, a second, fresh one restores them. Each module gets
its own store and a signing secret that lives outside the store, as in production.

A skipped test fails the run: the browser and TypeScript tests skip when Chromium or the
labextension's node modules are missing, and a green run must mean they ran. Developers
without them set ``JUPYTER_CKPT_ALLOW_SKIPS=1``; under ``CI`` skips always fail.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from deadlines import scaled
from harness import BUCKET, CREDENTIALS, Kernel, MotoServer, Outage, Paths

from jupyter_ckpt.store import ImageStore

ALLOW_SKIPS = "JUPYTER_CKPT_ALLOW_SKIPS"
# Read by kubernetes_asyncio when it is imported: set before any test imports kubespawner.
os.environ.setdefault("KUBECONFIG", str(Path(__file__).parent / "kubeconfig-unreachable.yaml"))
_skipped: list[str] = []
_tables: list[str] = []  # the corpus test's table (test_corpus.py), shown in the summary


def skips_allowed() -> bool:
    return os.environ.get(ALLOW_SKIPS) == "1" and not os.environ.get("CI")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _skipped.append(report.nodeid)
    if report.when == "call":
        _tables.extend(str(v) for k, v in report.user_properties if k == "corpus_table")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _skipped and not skips_allowed() and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for table in _tables:
        terminalreporter.write_sep("=", "notebook corpus: saved, restored, compared")
        terminalreporter.write_line(table)
    if _skipped and not skips_allowed():
        terminalreporter.write_line(
            f"FAILED: {len(_skipped)} test(s) skipped (see the reasons above); every test "
            f"must run. Without Chromium or npm, {ALLOW_SKIPS}=1 allows skips (not under CI).",
            red=True,
        )


# Under pytest-xdist (``-n``), test files go to the workers whole (``--dist loadfile``: their
# module-scoped kernels and servers are shared), the longest first, so that no worker is
# left with a long file at the end. Seconds, roughly, on 2 cores. The browser files come
# last whatever their length: Playwright's sync API leaves its event loop behind in the
# worker, where no async test may run after it. (Not ``loadgroup``: pytest 9.2 builds node
# ids from ``Node._id``, and xdist 3.8 still marks a group by rewriting ``_nodeid``.)
_LAST = "tests/browser/"
_LONG_FILES = {
    "tests/server/test_kernels_api_contract.py": 300,
    "tests/test_corpus.py": 250,
    "tests/test_roundtrip.py": 180,
    "tests/test_faults.py": 130,
    "tests/test_packaging.py": 120,
    "tests/server/test_server_idle_work.py": 115,
    "tests/server/test_server_stop_paths.py": 110,
    "tests/server/test_server_lifecycle_seams.py": 90,
    "tests/server/test_server_autosave.py": 80,
    "tests/server/test_server_crash.py": 80,
    "tests/hub/test_hub_e2e.py": 75,
    "tests/server/test_server_soak.py": 55,
    "tests/test_typing.py": 55,
    "tests/test_cli.py": 55,
    "tests/server/test_server_idle_libraries.py": 50,
    # the browser files among themselves
    "tests/browser/test_saved_sessions.py": 270,
    "tests/browser/test_reopen_and_resume.py": 160,
}


def _file(item: pytest.Item) -> str:
    return Path(str(item.fspath)).relative_to(Path(__file__).parent.parent).as_posix()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test's time limit (its own, or the run's) scaled to the machine (see
    :mod:`deadlines`); under xdist, the long files first."""
    given = config.getoption("timeout", None)  # --timeout=0: none
    limit = float(given if given is not None else config.getini("timeout") or 0)
    for item in items:
        marker = item.get_closest_marker("timeout")
        seconds = float(marker.args[0]) if marker is not None and marker.args else limit
        if seconds:
            item.add_marker(pytest.mark.timeout(scaled(seconds)))
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return  # one process: the browser tests' own hook puts them last
    items.sort(key=lambda item: (_file(item).startswith(_LAST), -_LONG_FILES.get(_file(item), 0)))


@pytest.fixture(scope="module")
def ckpt_paths(tmp_path_factory: pytest.TempPathFactory) -> Paths:
    """One store and secret per test module; the secret is outside the store directory."""
    return Paths(tmp_path_factory.mktemp("ckpt"))


@pytest.fixture(scope="module")
def start_kernel(ckpt_paths: Paths) -> Iterator[Callable[..., Kernel]]:
    """Start kernels on the module's store (with jupyter_ckpt loaded); all stop at the end."""
    started: list[Kernel] = []

    def start(cwd: Path | None = None) -> Kernel:
        kernel = Kernel(ckpt_paths, cwd)
        started.append(kernel)
        kernel.run("%load_ext jupyter_ckpt")
        return kernel

    yield start
    for kernel in started:
        if kernel.manager.has_kernel:
            kernel.shutdown()


@pytest.fixture(scope="module")
def kernel_store(ckpt_paths: Paths) -> ImageStore:
    """The store of the module's kernels, opened in the test process."""
    return ckpt_paths.open_store()


@pytest.fixture
def store(tmp_path: Path) -> ImageStore:
    """A private store for one in-process test."""
    return ImageStore(url=str(tmp_path / "store"), secret_file=str(tmp_path / "keys" / "secret"))


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoServer]:
    """moto's S3 server on loopback (bucket ``BUCKET``), one per test module."""
    server = MotoServer()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def endpoint(moto: MotoServer) -> str:
    return moto.url


@pytest.fixture
def outage(moto: MotoServer) -> Iterator[Outage]:
    """The S3 server as its clients see it: it can stop and start again."""
    server = Outage(moto.url)
    yield server
    server.close()


@pytest.fixture
def kernels() -> Iterator[Callable[[Paths], Kernel]]:
    """Starts kernels with %ckpt loaded, on the store of the Paths given; shuts them down
    after the test."""
    started: list[Kernel] = []

    def start(paths: Paths) -> Kernel:
        kernel = Kernel(paths)
        started.append(kernel)
        kernel.run("%load_ext jupyter_ckpt")
        return kernel

    yield start
    for kernel in started:
        kernel.shutdown()


@pytest.fixture
def s3_store(endpoint: str, tmp_path: Path) -> ImageStore:
    """A private store on the S3 server for one in-process test."""
    return ImageStore(
        url=f"s3://{BUCKET}/{tmp_path.name}",
        secret_file=str(tmp_path / "secret"),
        storage_options={"endpoint_url": endpoint, **CREDENTIALS},
    )
