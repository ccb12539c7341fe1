"""SuspendPolicy: DESIGN section 5 names and defaults, validation, kernelspec override."""

from __future__ import annotations

import json

import pytest
from jupyter_ckpt_server.policy import SuspendPolicy
from server_helpers import ServerProcess
from traitlets import TraitError
from traitlets.config import Config
from traitlets.config.application import Application


def test_defaults_are_the_designed_ones():
    policy = SuspendPolicy()
    assert policy.to_json() == {
        "idle_timeout": 1800,
        "check_interval": 30,
        "gpu_only": True,
        "min_gpu_memory_mb": 0,
        "suspend_connected": True,
        "on_unsaveable": "keep",
        "restore_on": "first-message",
        "suspend_on_shutdown": True,
        "shutdown_timeout": 120,
        "stop_grace_period": 0,
        "checkpoint_timeout": 600,
        "exclude_kernel_names": [],
        "background_work": ["threads", "tasks", "children", "gpu"],
        "busy_cpu_percent": 2,
        "busy_io_bytes_per_second": 65536,
        "background_thread_ignore": [],
        "gpu_busy_percent": 5,
        "activity_timeout": 2,
        "autosave_interval": 600,
        "autosave_idle": 30,
        "autosave_concurrency": 1,
        "gpu_demand": True,
        "min_idle_on_demand": 120,
        "demand_timeout": 300,
        "demand_kernel_specs": {},
        "demand_accounting": "device",
    }


def test_config_file_and_command_line():
    config = Config({"SuspendPolicy": {"idle_timeout": 600, "exclude_kernel_names": ["ir"]}})
    assert SuspendPolicy(config=config).idle_timeout == 600

    app = Application()
    app.classes = [SuspendPolicy]
    app.parse_command_line(
        ["--SuspendPolicy.check_interval=5", "--SuspendPolicy.restore_on=connect"]
    )
    policy = SuspendPolicy(config=app.config)
    assert (policy.check_interval, policy.restore_on) == (5, "connect")


@pytest.mark.parametrize(
    ("trait", "value", "message"),
    [
        ("idle_timeout", -1, "idle_timeout must be at least 0"),
        ("check_interval", 0, "check_interval must be greater than 0"),
        ("shutdown_timeout", -5, "shutdown_timeout must be greater than 0"),
        ("min_gpu_memory_mb", -1, "min_gpu_memory_mb must be at least 0"),
        ("stop_grace_period", -1, "stop_grace_period must be at least 0"),
        ("on_unsaveable", "drop", "on_unsaveable"),
        ("restore_on", "later", "restore_on"),
        ("background_work", ["threads", "disk"], "background_work"),
        ("gpu_busy_percent", 150, "gpu_busy_percent"),
        ("busy_cpu_percent", -1, "busy_cpu_percent must be at least 0"),
        ("busy_io_bytes_per_second", -1, "busy_io_bytes_per_second must be at least 0"),
        ("activity_timeout", 0, "activity_timeout must be greater than 0"),
        ("autosave_interval", -1, "autosave_interval must be at least 0"),
        ("autosave_idle", -1, "autosave_idle must be at least 0"),
        ("autosave_concurrency", 0, "autosave_concurrency must be greater than 0"),
        ("min_idle_on_demand", -1, "min_idle_on_demand must be at least 0"),
        ("demand_timeout", 0, "demand_timeout must be greater than 0"),
        ("demand_kernel_specs", {"gpu": -1}, "demand_kernel_specs"),
        ("demand_accounting", "pod", "demand_accounting"),
    ],
)
def test_bad_values_are_refused_with_the_trait_name(trait, value, message):
    with pytest.raises(TraitError, match=message):
        SuspendPolicy(config=Config({"SuspendPolicy": {trait: value}}))


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        (None, 1800),
        ({}, 1800),
        ({"jupyter_ckpt": {"idle_timeout": 60}}, 60),
        ({"jupyter_ckpt": {"idle_timeout": 0}}, 0),
        ({"jupyter_ckpt": {"idle_timeout": "soon"}}, 1800),
        ({"jupyter_ckpt": {"idle_timeout": -3}}, 1800),
        ({"jupyter_ckpt": "60"}, 1800),
    ],
)
def test_kernelspec_metadata_overrides_idle_timeout(metadata, expected):
    assert SuspendPolicy().idle_timeout_for(metadata) == expected


@pytest.mark.parametrize("trait", ["autosave_interval", "autosave_idle"])
def test_kernelspec_metadata_overrides_autosave_like_idle_timeout(trait):
    policy = SuspendPolicy()
    default = getattr(policy, trait)
    assert policy.for_spec(trait, None) == default
    assert policy.for_spec(trait, {"jupyter_ckpt": {trait: 5}}) == 5
    assert policy.for_spec(trait, {"jupyter_ckpt": {trait: 0}}) == 0
    assert policy.for_spec(trait, {"jupyter_ckpt": {trait: "often"}}) == default
    assert policy.for_spec(trait, {"jupyter_ckpt": {"idle_timeout": 5}}) == default


@pytest.mark.parametrize(
    ("metadata", "expected_mib"),
    [
        (None, 2048),  # demand_kernel_specs
        ({"jupyter_ckpt": {"gpu_memory_mb": 512}}, 512),
        ({"jupyter_ckpt": {"gpu_memory_mb": 0}}, 0),
        ({"jupyter_ckpt": {"gpu_memory_mb": "lots"}}, 0),
        ({"jupyter_ckpt": {"gpu_memory_mb": -1}}, 0),
        ({"jupyter_ckpt": {"gpu_memory_mb": True}}, 0),
    ],
)
def test_a_kernel_spec_demands_gpu_memory_by_metadata_or_config(metadata, expected_mib):
    policy = SuspendPolicy(demand_kernel_specs={"gpu": 2048})
    assert policy.gpu_demand_of("gpu", metadata) == expected_mib * 2**20
    assert policy.gpu_demand_of("python3", None) == 0


async def test_a_bad_value_stops_the_server_with_the_trait_name(tmp_path):
    """Not a warning and a server that runs on without the extension."""
    server = ServerProcess(tmp_path, {"idle_timeout": -5})
    with pytest.raises(AssertionError, match="the server exited"):
        await server.start()
    assert server.process.returncode == 1
    assert (
        "jupyter_ckpt_server: SuspendPolicy.idle_timeout must be at least 0, got -5.0; "
        "fix it and start the server again"
    ) in server.log()


@pytest.mark.parametrize(
    ("section", "settings", "message"),
    [
        (
            "SuspendPolicy",
            {"idle_timout": 60},
            "c.SuspendPolicy.idle_timout is no setting of jupyter-ckpt "
            "(did you mean c.SuspendPolicy.idle_timeout?)",
        ),
        (
            "SuspendPolicyy",
            {"idle_timeout": 60},
            "c.SuspendPolicyy is no setting of jupyter-ckpt (did you mean c.SuspendPolicy?)",
        ),
    ],
    ids=["setting", "class"],
)
async def test_a_mistyped_name_stops_the_server(tmp_path, section, settings, message):
    """A mistyped setting or class name would leave the default in force unnoticed."""
    server = ServerProcess(tmp_path)
    config_file = tmp_path / "config.json"
    config = json.loads(config_file.read_text())
    config.setdefault(section, {}).update(settings)
    config_file.write_text(json.dumps(config))
    with pytest.raises(AssertionError, match="the server exited"):
        await server.start()
    assert server.process.returncode == 1
    assert message in server.log(), server.log()[-2000:]
