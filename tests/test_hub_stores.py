"""Two users of one S3 store, each with the secret the hub derives for them: neither can
list, load or delete the other's images, even pointed at the other's prefix."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from pathlib import Path
from typing import Any

import pytest
from harness import BUCKET, CREDENTIALS, save_namespace

from jupyter_ckpt.errors import ImageNotFound, IntegrityError, SecretError
from jupyter_ckpt.hub import UserStores, read_master_secret
from jupyter_ckpt.store import ImageStore


@pytest.fixture
def hub(endpoint: str, tmp_path: Path) -> UserStores:
    master = tmp_path / "master"
    master.write_text(secrets.token_hex(32))
    return UserStores(
        f"s3://{BUCKET}/{tmp_path.name}",
        read_master_secret(str(master)),
        {"endpoint_url": endpoint, **CREDENTIALS, "use_listings_cache": False},
    )


def server_store(
    hub: UserStores, env: dict[str, str], monkeypatch: pytest.MonkeyPatch, **changes: Any
) -> ImageStore:
    """The store a user's server opens from the environment the hub gave it."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return ImageStore(storage_options=hub.storage_options, secret_file="/nonexistent", **changes)


def test_each_user_gets_their_own_secret(hub: UserStores):
    alice, bob = hub.environment("alice"), hub.environment("bob")
    assert alice["JUPYTER_CKPT_SECRET"] != bob["JUPYTER_CKPT_SECRET"]
    expected = hmac.new(hub._master, b"alice", hashlib.sha256).hexdigest()
    assert alice == {
        "JUPYTER_CKPT_STORE": hub.url,
        "JUPYTER_CKPT_USER": "alice",
        "JUPYTER_CKPT_SECRET": expected,
    }


def test_users_cannot_read_load_or_delete_each_others_images(hub, monkeypatch):
    alice = server_store(hub, hub.environment("alice"), monkeypatch)
    assert alice.backend.url.endswith("/users/alice")
    manifest = save_namespace(alice, {"weights": list(range(100))}, "alice-work")
    image_id = manifest["id"]

    bob = server_store(hub, hub.environment("bob"), monkeypatch)
    assert [i for i, _, _ in bob.iter_manifests()] == []
    with pytest.raises(ImageNotFound):
        bob.open(image_id)
    with pytest.raises(ImageNotFound):
        bob.delete(image_id)

    # bob's server pointed at alice's prefix still has only bob's secret
    intruder = server_store(hub, hub.environment("bob"), monkeypatch, user="alice")
    entries = list(intruder.iter_manifests())
    assert [(i, m) for i, m, _ in entries] == [(image_id, None)]
    assert "signed with a different secret" in entries[0][2]
    with pytest.raises(IntegrityError, match="signed with a different secret"):
        intruder.load_manifest(image_id)
    with pytest.raises(IntegrityError, match="refusing to delete"):
        intruder.delete(image_id)

    assert alice.open("alice-work")["id"] == image_id, "alice's image is intact"
    as_hub = hub.open("alice")
    assert as_hub is not None
    assert as_hub.verify(image_id)["id"] == image_id, "the hub reads it as alice"
    as_hub.close()


def test_a_short_secret_from_the_hub_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("JUPYTER_CKPT_SECRET", "short")
    with pytest.raises(SecretError, match="JUPYTER_CKPT_SECRET is too short"):
        ImageStore(url=str(tmp_path / "store"), secret_file="/nonexistent")
    (tmp_path / "master").write_text("short")
    with pytest.raises(SecretError, match=r"master secret .* is too short"):
        read_master_secret(str(tmp_path / "master"))
