"""Each user's part of a shared store, and each user's signing secret, from the hub.

The hub holds one master secret; a user's secret is HMAC-SHA256(master, user name) in hex,
handed to that user's server only (``JUPYTER_CKPT_SECRET``). A server therefore signs and
verifies with a key no other user has: pointed at another user's prefix it finds images
it cannot vouch for, and refuses to load or delete them. The hub derives the same secret
when it reads a user's images to place their server (:mod:`.placement`).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import TYPE_CHECKING, Any

from ..errors import SecretError

if TYPE_CHECKING:
    from ..store import ImageStore

STORE_ENV = "JUPYTER_CKPT_HUB_STORE"
SECRET_FILE_ENV = "JUPYTER_CKPT_HUB_SECRET_FILE"


def user_secret(master: bytes, user: str) -> str:
    """The signing secret of ``user``: hex HMAC-SHA256 of the user name."""
    return hmac.new(master, user.encode(), hashlib.sha256).hexdigest()


def read_master_secret(path: str) -> bytes:
    """The hub's master secret (32+ characters; e.g. a Kubernetes secret mounted 0400)."""
    try:
        with open(path) as f:
            secret = f.read().strip()
    except OSError as exc:
        raise SecretError(f"cannot read the hub's master secret {path}: {exc}") from exc
    if len(secret) < 32:
        raise SecretError(
            f"the hub's master secret {path} is too short ({len(secret)} characters, "
            "need 32+); make one with: openssl rand -hex 32"
        )
    return secret.encode()


class UserStores:
    """Opens users' parts of one shared store with their own secrets."""

    def __init__(
        self, url: str, master_secret: bytes, storage_options: dict[str, Any] | None = None
    ) -> None:
        self.url = url
        self._master = master_secret
        self.storage_options = storage_options or {}

    @classmethod
    def from_env(cls) -> UserStores:
        """From ``JUPYTER_CKPT_HUB_STORE`` and ``JUPYTER_CKPT_HUB_SECRET_FILE``."""
        missing = [name for name in (STORE_ENV, SECRET_FILE_ENV) if not os.environ.get(name)]
        if missing:
            raise SecretError(
                f"the jupyter_ckpt hub hooks need {' and '.join(missing)} in the hub's "
                "environment (the shared store's URL and the file of the hub's master secret)"
            )
        return cls(os.environ[STORE_ENV], read_master_secret(os.environ[SECRET_FILE_ENV]))

    def secret(self, user: str) -> str:
        return user_secret(self._master, user)

    def environment(self, user: str) -> dict[str, str]:
        """What the user's server needs to use its part of the store (the store adds
        ``users/<user>/`` itself)."""
        return {
            "JUPYTER_CKPT_STORE": self.url,
            "JUPYTER_CKPT_USER": user,
            "JUPYTER_CKPT_SECRET": self.secret(user),
        }

    def open(self, user: str) -> ImageStore | None:
        """The user's part of the store, or None when a local store has none yet (the
        hub must not create it: the directory belongs to the user's server). Close it
        after use."""
        from ..store import ImageStore
        from ..store.backends import local_path
        from ..store.users import user_prefix

        root = local_path(self.url)
        if root is not None and not os.path.isdir(os.path.join(root, user_prefix(user))):
            return None
        return ImageStore(
            url=self.url,
            user=user,
            secret=self.secret(user),
            storage_options=self.storage_options,
            # a hub never writes images; the file is not read when a secret is given
            secret_file=os.devnull,
        )
