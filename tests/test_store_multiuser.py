"""One store shared by several users: each works in their own prefix, nobody's save can
reference chunks they cannot read, and nobody's listing, gc or delete trips over (or
removes) another's data. Two real OS users (uids without passwd entries, started through
``store_user.py``) on one group-writable local directory, and the same model on S3."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from harness import BUCKET, CREDENTIALS, s3_store, save_namespace

from jupyter_ckpt.errors import ImageNotFound, IntegrityError
from jupyter_ckpt.store import ImageStore, chunk_path, manifest_path

TESTS = Path(__file__).parent
GROUP = 23456
USERS = {"alice": 23001, "bob": 23002}


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[Path]:
    """A group-writable, setgid store root with one home per user (outside pytest's
    private tmp tree, which other users cannot enter)."""
    base = Path(tempfile.mkdtemp(prefix="ckpt-shared-"))
    base.chmod(0o755)
    root = base / "store"
    root.mkdir()
    os.chown(root, 0, GROUP)
    root.chmod(0o2770)
    for name, uid in USERS.items():
        home = base / name
        home.mkdir(mode=0o700)
        os.chown(home, uid, GROUP)
    yield root
    shutil.rmtree(base)


def as_user(root: Path, name: str, *actions: list[Any]) -> list[dict[str, Any]]:
    spec = {
        "uid": USERS[name],
        "gid": GROUP,
        "home": str(root.parent / name),
        "store": {
            "url": str(root),
            "user": name,
            "secret_file": str(root.parent / name / "secret"),
        },
        "actions": actions,
    }
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path])}
    done = subprocess.run(
        [sys.executable, str(TESTS / "store_user.py"), json.dumps(spec)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(results) == len(actions), done.stderr
    return results


def test_two_users_share_a_group_writable_store(shared: Path) -> None:
    (alice_save,) = as_user(shared, "alice", ["save", "run", 7, 8])
    alice_id = alice_save["ok"]["id"]

    # The same bytes: bob writes his own chunks (no dedupe onto alice's private ones).
    bob = as_user(
        shared,
        "bob",
        ["save", "run", 7, 8],
        ["verify", "run"],
        ["list"],
        ["delete", alice_id],
        ["gc"],
        ["rmtree", str(shared / "users" / "alice")],
    )
    saved, verified, listed, deleted, gc, removed = bob
    assert saved["ok"]["written"] >= 8 << 20, "bob's chunks are his own"
    assert verified == {"ok": saved["ok"]["id"]}
    assert listed == {"ok": [[saved["ok"]["id"], None]]}, "alice's image is not bob's"
    assert "ImageNotFound" in deleted["error"]
    assert gc["ok"]["files"] == 0
    assert "PermissionError" in removed["error"], "the sticky users/ keeps alice's prefix"

    users = shared / "users"
    mode = users.stat().st_mode
    assert mode & stat.S_ISVTX and mode & stat.S_ISGID and stat.S_IMODE(mode) & 0o070 == 0o070
    for name, uid in USERS.items():
        prefix = (users / name).stat()
        assert (prefix.st_uid, prefix.st_mode & 0o777) == (uid, 0o700)
    assert as_user(shared, "alice", ["verify", alice_id]) == [{"ok": alice_id}]


def test_a_store_its_users_cannot_write_is_a_clear_error(shared: Path) -> None:
    shared.chmod(0o2750)  # group may read, not create
    (opened,) = as_user(shared, "bob", ["list"])
    assert "cannot create your part of the store" in opened["error"]
    assert "Traceback" not in opened["error"]


def test_unreadable_manifest_is_skipped_with_a_note(shared: Path) -> None:
    (saved,) = as_user(shared, "bob", ["save", "mine", 1, 1])
    # A manifest bob cannot read inside his prefix (put there by someone with the rights).
    stray = shared / "users" / "bob" / manifest_path("e" * 32)
    stray.parent.mkdir(mode=0o755)
    stray.write_text("{}")
    os.chown(stray, USERS["alice"], GROUP)
    stray.chmod(0o600)

    listed, resolved, gc = as_user(shared, "bob", ["list"], ["resolve", "mine"], ["gc"])
    notes = dict(listed["ok"])
    assert notes[saved["ok"]["id"]] is None
    assert "cannot read" in notes["e" * 32]
    assert resolved == {"ok": saved["ok"]["id"]}
    assert gc["ok"]["files"] == 0 and "cannot read" in gc["ok"]["notes"][0]


def test_a_chunk_the_writer_cannot_read_back_is_written_again(shared: Path) -> None:
    """Dedupe onto a chunk is only safe if the writer can read it: one it may touch but
    not read (here writable by the group, readable by nobody but its owner) is replaced."""
    as_user(shared, "bob", ["save", "data", 1, 1])
    prefix = shared / "users" / "bob"
    (chunk,) = [p for p in (prefix / "chunks").rglob("*") if p.is_file() and p.stat().st_size]
    os.chown(chunk, USERS["alice"], GROUP)
    chunk.chmod(0o620)
    again, verified = as_user(shared, "bob", ["save", "data", 1, 1], ["verify", "data"])
    assert again["ok"]["written"] >= 1 << 20, again
    assert verified == {"ok": again["ok"]["id"]}
    assert chunk.stat().st_uid == USERS["bob"]


def test_store_of_the_single_user_layout_moves_into_the_user_prefix(tmp_path: Path) -> None:
    before = ImageStore(url=str(tmp_path / "src"), user="carol", secret_file=str(tmp_path / "s"))
    manifest = save_namespace(before, {"x": np.arange(10)}, name="old")
    legacy = tmp_path / "legacy"
    legacy.mkdir(mode=0o700)
    for name in ("images", "chunks", "kernels"):
        if Path(before.backend.root, name).exists():
            os.rename(Path(before.backend.root, name), legacy / name)

    after = ImageStore(url=str(legacy), user="carol", secret_file=str(tmp_path / "s"))
    assert after.verify("old")["id"] == manifest["id"]
    assert not (legacy / "images").exists() and (legacy / "users" / "carol" / "images").is_dir()
    assert (
        ImageStore(url=str(legacy), user="dave", secret_file=str(tmp_path / "s")).image_ids() == []
    )


@pytest.mark.parametrize("user", ["../x", "a/b", "..", "", ".hidden", "x\\y"])
def test_user_names_that_are_paths_are_refused(user: str, tmp_path: Path) -> None:
    with pytest.raises(Exception, match="invalid store user name"):
        ImageStore(url=str(tmp_path / "s"), user=user, secret_file=str(tmp_path / "k"))


def test_users_get_their_own_prefix_on_s3(endpoint: str, tmp_path: Path) -> None:
    import s3fs

    alice = s3_store(endpoint, tmp_path, "alice", "a")
    bob = s3_store(endpoint, tmp_path, "bob", "b")
    data = {"x": np.random.default_rng(3).random(1 << 20)}
    mine = save_namespace(alice, data, name="run")
    theirs = save_namespace(bob, data, name="run")
    assert theirs["sizes"]["written"] == theirs["sizes"]["logical"], "no dedupe across users"
    fs = s3fs.S3FileSystem(endpoint_url=endpoint, **CREDENTIALS)
    top = {p.rsplit("/", 1)[-1] for p in fs.ls(f"{BUCKET}/{tmp_path.name}")}
    assert top == {"users"}
    assert fs.exists(f"{BUCKET}/{tmp_path.name}/users/bob/{manifest_path(theirs['id'])}")
    assert [i for i, _, _ in bob.iter_manifests()] == [theirs["id"]]
    with pytest.raises(ImageNotFound):
        bob.delete(mine["id"])

    # alice's manifest copied into bob's prefix: listed as invalid, never deleted by bob
    bob.backend.write_atomic(
        manifest_path(mine["id"]), alice.backend.read_bytes(manifest_path(mine["id"]))
    )
    errors = {i: e for i, _, e in bob.iter_manifests()}
    assert "different secret" in errors[mine["id"]]
    with pytest.raises(IntegrityError, match="refusing to delete"):
        bob.delete(mine["id"])
    digest = mine["segments"][0]["chunks"][0][0]
    assert bob.gc(grace_seconds=0).files == 0
    assert alice.backend.exists(chunk_path(digest)) and alice.verify("run")


# -- a careless or hostile neighbour -------------------------------------------------------


def squat_refused(prefix: Path, problem: str, fix: str) -> str:
    return f"StorePermission: refusing the store directory {prefix}: {problem}; {fix}"


def test_a_prefix_made_by_another_user_is_refused(shared: Path) -> None:
    """bob makes users/alice before alice's first save: she would save into a directory
    he can read, rename and empty."""
    as_user(shared, "bob", ["list"])
    prefix = shared / "users" / "alice"
    assert as_user(shared, "bob", ["mkdir", str(prefix), 0o777]) == [{"ok": "made"}]
    (result,) = as_user(shared, "alice", ["save", "run", 7, 1])
    assert result["error"] == squat_refused(
        prefix,
        f"it belongs to uid {USERS['bob']}, not to you (uid {USERS['alice']})",
        "another user may have made it to read or remove your images; have it removed "
        "(by its owner or an administrator) and try again",
    )
    assert list(prefix.iterdir()) == [], "nothing was written into it"


def test_a_symlinked_prefix_is_refused(shared: Path) -> None:
    as_user(shared, "bob", ["list"])
    prefix, target = shared / "users" / "alice", shared.parent / "bob"
    assert as_user(shared, "bob", ["symlink", str(target), str(prefix)]) == [{"ok": "linked"}]
    (result,) = as_user(shared, "alice", ["save", "run", 7, 1])
    assert result["error"] == squat_refused(
        prefix, f"it is a symbolic link (to {target})", f"remove the link ({prefix}) and try again"
    )


def test_a_directory_of_the_prefix_that_others_may_write_is_refused(shared: Path) -> None:
    (saved,) = as_user(shared, "alice", ["save", "run", 7, 1])
    assert "ok" in saved, saved
    prefix = shared / "users" / "alice"
    modes = {
        str(d.relative_to(prefix)): stat.S_IMODE(d.stat().st_mode) & 0o777
        for d in [prefix, *prefix.rglob("*")]
        if d.is_dir()
    }
    assert set(modes.values()) == {0o700}, f"every directory private: {modes}"
    (prefix / "chunks").chmod(0o777)
    (result,) = as_user(shared, "alice", ["list"])
    assert result["error"] == squat_refused(
        prefix / "chunks",
        "other users may write to it (mode 777)",
        f"run: chmod -R go-w {prefix / 'chunks'}",
    )
