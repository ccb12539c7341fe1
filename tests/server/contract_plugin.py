"""A pytest plugin that runs jupyter_server's own tests against jupyter-ckpt: every server
they start uses CkptKernelManager with the extension enabled, whatever ``jp_server_config``
the test module defines. ``--stock-kernel-manager`` leaves the configuration alone, to see
which failures the installed versions have without jupyter-ckpt."""

from __future__ import annotations

from typing import Any

import pytest
from traitlets.config import Config

KERNEL_MANAGER = "jupyter_ckpt_server.kernelmanager.CkptKernelManager"

# Failures that are the installed versions' own, not jupyter-ckpt's (they fail with the stock
# kernel manager too): jupyter_server's tests turn every warning into an error, and its
# test_connection.py builds requests in a way newer tornado versions deprecate.
IGNORED_WARNINGS = [
    "ignore:The method, uri, and version arguments to HTTPServerRequest:DeprecationWarning",
    "ignore:The start_line argument to HTTPServerRequest:DeprecationWarning",
]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--stock-kernel-manager", action="store_true")


def pytest_configure(config: pytest.Config) -> None:
    # jupyter_server's CI has pytest-rerunfailures; the mark only has to be known here
    config.addinivalue_line("markers", "flaky: rerun a test that can fail by chance")
    for line in IGNORED_WARNINGS:
        config.addinivalue_line("filterwarnings", line)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: Any, request: pytest.FixtureRequest) -> Any:
    config = yield
    if fixturedef.argname == "jp_server_config" and not request.config.getoption(
        "--stock-kernel-manager"
    ):
        server = (
            config["ServerApp"]
            if isinstance(config, Config)
            else config.setdefault("ServerApp", {})
        )
        server["kernel_manager_class"] = KERNEL_MANAGER
        server["jpserver_extensions"] = {
            **server.get("jpserver_extensions", {}),
            "jupyter_ckpt_server": True,
        }
    return config
