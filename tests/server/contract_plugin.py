"""A pytest plugin that runs jupyter_server's own tests against jupyter-ckpt: every server
they start uses CkptKernelManager with the extension enabled, whatever ``jp_server_config``
the test module defines (so a test's variants that differ only in the kernel manager class
run once). ``--stock-kernel-manager`` leaves the configuration alone, to see
which failures the installed versions have without jupyter-ckpt."""

from __future__ import annotations

import copy
import json
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


def _use_ckpt(server: Any) -> None:
    """Point a ``ServerApp`` config section at jupyter-ckpt's kernel manager and extension."""
    server["kernel_manager_class"] = KERNEL_MANAGER
    server["jpserver_extensions"] = {
        **server.get("jpserver_extensions", {}),
        "jupyter_ckpt_server": True,
    }


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run each test once per distinct configuration: the modules' variants that differ
    only in their kernel manager class (one per stock class) are the same run here."""
    if config.getoption("--stock-kernel-manager"):
        return
    seen: set[tuple[str, str]] = set()
    keep, dropped = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        server_config = params.get("jp_server_config")
        if not isinstance(server_config, dict):
            keep.append(item)
            continue
        others = {k: repr(v) for k, v in params.items() if k != "jp_server_config"}
        effective = copy.deepcopy(server_config)
        _use_ckpt(effective.setdefault("ServerApp", {}))
        key = (
            f"{item.path}::{getattr(item, 'originalname', item.name)}",
            json.dumps([effective, others], sort_keys=True, default=repr),
        )
        (dropped if key in seen else keep).append(item)
        seen.add(key)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: Any, request: pytest.FixtureRequest) -> Any:
    config = yield
    if fixturedef.argname == "jp_server_config" and not request.config.getoption(
        "--stock-kernel-manager"
    ):
        # in place: the fixture's value is cached already
        _use_ckpt(
            config["ServerApp"]
            if isinstance(config, Config)
            else config.setdefault("ServerApp", {})
        )
    return config
