"""JupyterLab with jupyter-ckpt on loopback, driven by Debian's Chromium through Playwright.

The server runs as a subprocess with its own root, store, secret and Jupyter directories,
an ``SuspendPolicy.idle_timeout`` no test waits for, and ``gpu_only=False`` so that CPU
kernels are suspended too. A test makes a kernel idle long enough by moving its idle clock
(``idle_clock``, a server extension of the tests), so no step races the wall clock.
Notebooks that must not be suspended even then use the "steady" kernel spec, whose
metadata overrides the idle timeout.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_lab import (
    CHROMIUM,
    CHROMIUM_ARGS,
    IDLE_TIMEOUT,
    OUTPUT,
    REPO,
    STEADY_KERNEL,
    STEADY_TIMEOUT,
    Lab,
)

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Browser tests run last: while its browser is open, Playwright's sync API keeps an
    event loop running in the main thread, which the async server tests cannot share."""
    mine = {id(item) for item in items if Path(str(item.fspath)).is_relative_to(HERE)}
    items.sort(key=lambda item: id(item) in mine)  # stable: each group keeps its order
    if CHROMIUM.exists():
        return
    skip = pytest.mark.skip(reason=f"browser tests need Debian's chromium at {CHROMIUM}")
    for item in items:
        if id(item) in mine:
            item.add_marker(skip)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(lab: Lab, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"jupyter lab exited with {process.returncode}:\n{log.read_text()}")
        try:
            lab.api("GET", "api/ckpt/status")
            return
        except OSError:
            time.sleep(0.25)  # polling the server's port until it answers
    raise RuntimeError(f"jupyter lab did not answer within 90 s:\n{log.read_text()}")


@contextlib.contextmanager
def running_lab(
    base: Path, store: str | None = None, settings: dict[str, Any] | None = None
) -> Iterator[Lab]:
    """A JupyterLab under ``base`` with this checkout's labextension, its own store
    (``store``: a URL, else a folder under ``base``) and ``settings`` in its config file;
    stopped on the way out, its log kept as ``base/server.log``."""
    root = base / "root"
    root.mkdir(parents=True)
    data = base / "data"
    spec = data / "kernels" / STEADY_KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "Python 3 (steady)",
                "language": "python",
                "metadata": {"jupyter_ckpt": {"idle_timeout": STEADY_TIMEOUT}},
            }
        )
    )
    # the labextension built from this checkout, ahead of any installed copy: JUPYTER_PATH
    # comes first (in a virtualenv the environment's directory precedes the user's)
    build = REPO / "server_extension" / "jupyter_ckpt_server" / "labextension"
    checkout = base / "checkout"
    if (build / "package.json").exists():
        (checkout / "labextensions").mkdir(parents=True)
        (checkout / "labextensions" / "jupyter-ckpt").symlink_to(build)
    config = base / "config"
    config.mkdir()
    (config / "jupyter_server_config.json").write_text(
        json.dumps({"ServerApp": {"jpserver_extensions": {"idle_clock": True}}, **(settings or {})})
    )
    # no "get notified about Jupyter news?" toast over the screenshots
    news = base / "settings" / "@jupyterlab" / "apputils-extension"
    news.mkdir(parents=True)
    (news / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    env = {
        **os.environ,
        "JUPYTER_CKPT_STORE": store or str(base / "store"),
        "JUPYTER_CKPT_SECRET_FILE": str(base / "secret"),
        "JUPYTER_CONFIG_DIR": str(config),
        "JUPYTER_DATA_DIR": str(data),
        "JUPYTER_PATH": os.pathsep.join([str(checkout), os.environ.get("JUPYTER_PATH", "")]),
        "JUPYTER_RUNTIME_DIR": str(base / "runtime"),
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        "JUPYTERLAB_SETTINGS_DIR": str(base / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(base / "workspaces"),
    }
    port, token = _free_port(), secrets.token_hex(16)
    log = base / "server.log"
    command = [
        sys.executable, "-m", "jupyterlab",
        "--no-browser",
        "--ServerApp.allow_root=True",  # CI containers run as root
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        f"--SuspendPolicy.idle_timeout={IDLE_TIMEOUT}",
        "--SuspendPolicy.check_interval=3",  # its kernel check gets 3 s on a loaded machine
        "--SuspendPolicy.activity_timeout=3",
        "--SuspendPolicy.gpu_only=False",
        "--SuspendPolicy.suspend_on_shutdown=False",
    ]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(command, cwd=root, env=env, stdout=out, stderr=out)
    lab = Lab(f"http://127.0.0.1:{port}", token, root)
    try:
        _wait_ready(lab, process, log)
        yield lab
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    shutil.rmtree(OUTPUT, ignore_errors=True)  # screenshots and log of this run only
    base = tmp_path_factory.mktemp("lab")
    try:
        with running_lab(base) as lab:
            yield lab
    finally:
        OUTPUT.mkdir(parents=True, exist_ok=True)
        (OUTPUT / "server.log").write_bytes((base / "server.log").read_bytes())


@pytest.fixture
def start_lab(
    tmp_path: Path,
) -> Callable[..., contextlib.AbstractContextManager[Lab]]:
    """Another JupyterLab, the test's own: one it stops, or whose store fails."""
    count = itertools.count()

    def start(
        store: str | None = None, settings: dict[str, Any] | None = None
    ) -> contextlib.AbstractContextManager[Lab]:
        return running_lab(tmp_path / f"lab{next(count)}", store, settings)

    return start


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    from playwright.sync_api import expect, sync_playwright

    # an assertion waits as long as an action may: a save or a suspend behind a check, on
    # two loaded cores, takes longer than Playwright's default 5 s
    expect.set_options(timeout=30_000)

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Any, lab: Lab, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A fresh browser context per test; a screenshot of the page when the test failed."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.set_default_timeout(60_000)
    page = context.new_page()
    yield page
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:  # what the page looked like, for the reviewer
        OUTPUT.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=OUTPUT / f"failed-{request.node.name}.png")
    context.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report
