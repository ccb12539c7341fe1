"""Manifest signatures: loading an image runs pickle, so only images we signed are loaded.

The secret is per user and lives outside the store (a shared store must not hold the key
that vouches for its contents). It is created on first use with mode 0600 and refused if
anyone else can read it, as ssh does with private keys. Under JupyterHub the hub can give
it instead (``JUPYTER_CKPT_SECRET``, derived per user: :mod:`jupyter_ckpt.hub.stores`), so
that it follows the user to whichever node their server lands on. The same secret keys
encryption at rest (:mod:`.encryption`), through keys derived from it (:meth:`Signer.derive`).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import stat
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ..errors import IntegrityError, SecretError

FORMAT = "jupyter-ckpt/1"


def canonical_json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


class Signer:
    def __init__(self, secret_file: str, secret: str | None = None, create: bool = True) -> None:
        """``secret``, when given, is used instead of the file (which is then not read).
        ``create=False``: a missing file is an error (a path the user named, where a
        typo must not quietly become a new secret that opens nothing)."""
        self.secret_file = os.path.abspath(os.path.expanduser(secret_file))
        self._create = create
        self._secret = _checked(secret, "JUPYTER_CKPT_SECRET") if secret else self._load_or_create()
        self.key_id = hashlib.sha256(b"jupyter-ckpt key id" + self._secret).hexdigest()[:16]

    def _load_or_create(self) -> bytes:
        path = self.secret_file
        if not self._create and not os.path.exists(path):
            raise SecretError(
                f"no secret file {path}: give the path of an existing secret "
                "(nothing was created there)"
            )
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        if not os.path.exists(path):
            _create_secret(path)
        try:
            mode = os.stat(path).st_mode
            if mode & (stat.S_IRWXG | stat.S_IRWXO):
                raise SecretError(
                    f"the signing secret {path} is accessible by other users "
                    f"(mode {stat.S_IMODE(mode):o}); run: chmod 600 {path}"
                )
            with open(path) as f:
                secret = f.read()
        except OSError as exc:
            raise SecretError(f"cannot read the signing secret {path}: {exc}") from exc
        # Never replaced silently: images signed with a lost secret could not be loaded
        # again, so the user decides.
        return _checked(
            secret,
            path,
            "; if it is empty it was left by an interrupted first use: remove it and a new "
            "one is created",
        )

    def derive(self, label: bytes) -> bytes:
        """A 256-bit key for one purpose (``label``), derived from the secret with HKDF:
        keys for different purposes are independent, and none reveals the secret."""
        return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=label).derive(
            self._secret
        )

    def _mac(self, payload: bytes) -> str:
        return hmac.new(self._secret, payload, hashlib.sha256).hexdigest()

    def seal(self, manifest: dict[str, Any]) -> bytes:
        """The bytes of a signed manifest file."""
        envelope = {
            "format": FORMAT,
            "key_id": self.key_id,
            "signature": self._mac(canonical_json(manifest)),
            "manifest": manifest,
        }
        return json.dumps(envelope, indent=1, sort_keys=True).encode()

    def open(self, data: bytes, where: str) -> dict[str, Any]:
        """Verify a signed manifest file and return the manifest; raise if it is not ours."""
        try:
            envelope = json.loads(data)
            manifest = envelope["manifest"]
            signature = envelope["signature"]
            key_id = envelope.get("key_id")
        except (ValueError, KeyError, TypeError) as exc:
            raise IntegrityError(f"{where}: not a jupyter-ckpt manifest ({exc})") from exc
        if envelope.get("format") != FORMAT:
            raise IntegrityError(f"{where}: unknown image format {envelope.get('format')!r}")
        if not hmac.compare_digest(self._mac(canonical_json(manifest)), str(signature)):
            if key_id != self.key_id:
                raise IntegrityError(
                    f"{where}: signed with a different secret (key {key_id}, ours is "
                    f"{self.key_id}); refusing to load an image we cannot vouch for"
                )
            raise IntegrityError(f"{where}: the manifest was altered (signature mismatch)")
        return manifest


def _checked(secret: str, where: str, hint: str = "") -> bytes:
    secret = secret.strip()
    if len(secret) < 32:
        raise SecretError(
            f"the signing secret {where} is too short ({len(secret)} characters, need 32+){hint}"
        )
    return secret.encode()


def _create_secret(path: str) -> None:
    """Write a new secret aside (0600, fsynced) and link it into place: the file appears
    complete or not at all, and of processes racing to create it, all read the winner's."""
    tmp = f"{path}.tmp-{secrets.token_hex(8)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(FileExistsError):  # another process won: use theirs
            os.link(tmp, path)
        dir_fd = os.open(os.path.dirname(path), os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    finally:
        os.unlink(tmp)
