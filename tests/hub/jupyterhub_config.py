"""The e2e hub: configurable-http-proxy in front, servers from a spawner that starts each
server "on a node" named by the start request, jupyterhub-idle-culler with the jupyter-ckpt
arbiter as a managed service, and every server's store on the S3 server.

Everything a run varies comes from the environment (see hub_helpers.Hub)."""

import os
import sys
from pathlib import Path

from jupyterhub.spawner import SimpleLocalProcessSpawner

from jupyter_ckpt.hub import pre_spawn_hook

c = get_config()  # noqa: F821 (defined by JupyterHub when it loads this file)
work = Path(os.environ["E2E_DIR"])
public_url = os.environ["E2E_PUBLIC_URL"]


class NodeSpawner(SimpleLocalProcessSpawner):
    """Starts each server on the node the start request names ({"node": "b"}): that node
    has its own home directory (the server's root) and its own node facts, as another
    machine of a cluster would; the store is the same everywhere."""

    async def start(self):
        self.node = work / "nodes" / self.user_options.get("node", "a")
        self.home_dir = self.notebook_dir = str(self.node / "home" / self.user.name)
        return await super().start()

    def get_env(self):
        return {**super().get_env(), "JUPYTER_CKPT_NODE_FACTS": str(self.node / "facts.json")}


c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = int(os.environ["E2E_PORT"])
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = int(os.environ["E2E_HUB_PORT"])
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{os.environ['E2E_PROXY_API_PORT']}"
c.ConfigurableHTTPProxy.command = [os.environ["E2E_PROXY"]]
c.JupyterHub.db_url = f"sqlite:///{work / 'hub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(work / "cookie_secret")
c.JupyterHub.pid_file = str(work / "hub.pid")
# activity reaches the hub within seconds, so the culler's short timeout sees real idleness
c.JupyterHub.last_activity_interval = 2

c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allow_all = True

c.JupyterHub.spawner_class = NodeSpawner
c.Spawner.cmd = [sys.executable, "-m", "jupyterhub.singleuser"]
c.Spawner.args = ["--ServerApp.allow_root=True"]
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120
# the store, user and per-user secret, from $JUPYTER_CKPT_HUB_STORE and the master secret
c.Spawner.pre_spawn_hook = pre_spawn_hook
c.Spawner.environment = {
    "JUPYTERHUB_ACTIVITY_INTERVAL": "2",
    "FSSPEC_S3": os.environ["FSSPEC_S3"],
}

culler = [
    sys.executable, "-m", "jupyterhub_idle_culler",
    f"--timeout={os.environ['E2E_CULL_TIMEOUT']}",
    f"--cull-every={os.environ['E2E_CULL_EVERY']}",
    f"--config={Path(__file__).with_name('idle_culler_config.py')}",
]  # fmt: skip
c.JupyterHub.services = [
    {
        "name": "idle-culler",
        "command": culler,
        "environment": {"JUPYTER_CKPT_CULL_URL": public_url},
    },
    {"name": "e2e", "api_token": os.environ["E2E_TOKEN"]},
]
c.JupyterHub.load_roles = [
    {
        "name": "idle-culler",
        "scopes": [
            "list:users",
            "read:users:activity",
            "read:servers",
            "delete:servers",
            # what the arbiter needs to ask a server to suspend its kernels
            "access:servers",
        ],
        "services": ["idle-culler"],
    },
    {
        "name": "e2e",
        "scopes": ["admin:users", "admin:servers", "access:servers", "list:users"],
        "services": ["e2e"],
    },
]
