"""JupyterHub's side of jupyter-ckpt (DESIGN section 7): per-user stores and secrets, and
spawner hooks that place a returning user's server where their images can be restored.

Imported by the hub, which has neither the server extension nor the kernels' libraries:
nothing heavy is imported here (the store, kubespawner's models) until a hook runs.
"""

from .placement import (
    IMAGE_OPTION,
    Placement,
    SpawnHooks,
    SpawnRefused,
    make_spawn_hooks,
    modify_pod_hook,
    pre_spawn_hook,
    required_expressions,
)
from .stores import UserStores, read_master_secret, user_secret

__all__ = [
    "IMAGE_OPTION",
    "Placement",
    "SpawnHooks",
    "SpawnRefused",
    "UserStores",
    "make_spawn_hooks",
    "modify_pod_hook",
    "pre_spawn_hook",
    "read_master_secret",
    "required_expressions",
    "user_secret",
]
