"""The files installed into etc/jupyter enable the extension and its kernel manager."""

from __future__ import annotations

import json
from pathlib import Path

from jupyter_ckpt_server import _jupyter_server_extension_points
from jupyter_ckpt_server.app import CkptExtensionApp
from jupyter_ckpt_server.kernelmanager import CkptKernelManager

CONFIG = Path(__file__).parents[2] / "server_extension" / "jupyter-config"


def test_the_extension_is_enabled_on_install():
    enabled = json.loads((CONFIG / "jupyter_server_config.d" / "jupyter_ckpt.json").read_text())
    assert enabled == {"ServerApp": {"jpserver_extensions": {"jupyter_ckpt_server": True}}}
    assert _jupyter_server_extension_points() == [
        {"module": "jupyter_ckpt_server", "app": CkptExtensionApp}
    ]


def test_the_extension_config_file_sets_the_kernel_manager():
    name = CkptExtensionApp().config_file_name
    config = json.loads((CONFIG / f"{name}.json").read_text())
    dotted = config["ServerApp"]["kernel_manager_class"]
    module, _, cls = dotted.rpartition(".")
    assert getattr(__import__(module, fromlist=[cls]), cls) is CkptKernelManager
