"""`jupyter ckpt` as users run it: the real entry point in a subprocess, on a private store.

Images are written in-process with the library (fast, no kernel needed); every command
then runs as ``jupyter ckpt ...`` with its own Jupyter dirs, so no config or store of the
machine leaks in. Nothing here unpickles an image.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from harness import BUCKET, CREDENTIALS, S3_TIMEOUTS, node_file, plaintext_in, save_on_node

from jupyter_ckpt import image
from jupyter_ckpt.store import ImageStore, chunk_path, manifest_path

JUPYTER = str(Path(sys.executable).with_name("jupyter"))
USER = "tester"
COMMANDS = ("list", "show", "verify", "rm", "gc", "export", "import", "rekey")

Run = Callable[..., subprocess.CompletedProcess[str]]


class Site:
    """One private Jupyter setup: config dir, store and secret under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.store_dir = root / "store"
        # this user's part of the store, where its images, chunks and records live
        self.data = self.store_dir / "users" / USER
        self.secret = root / "keys" / "secret"
        self.config_dir = root / "config"

    def env(self, **overrides: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "IPYTHON"))}
        env.update(
            HOME=str(self.root / "home"),
            JUPYTER_CONFIG_DIR=str(self.config_dir),
            JUPYTER_DATA_DIR=str(self.root / "data"),
            JUPYTER_RUNTIME_DIR=str(self.root / "runtime"),
            JUPYTER_CKPT_STORE=str(self.store_dir),
            JUPYTER_CKPT_SECRET_FILE=str(self.secret),
            JUPYTER_CKPT_USER=USER,
        )
        env.update(overrides)
        return env

    def store(
        self, store_dir: Path | None = None, secret: Path | None = None, encryption: str = "none"
    ) -> ImageStore:
        return ImageStore(
            url=str(store_dir or self.store_dir),
            secret_file=str(secret or self.secret),
            user=USER,
            encryption=encryption,
        )

    def save(self, name: str, store: ImageStore | None = None, **variables: Any) -> dict[str, Any]:
        """Write an image of ``variables``; return its manifest."""
        writer = (store or self.store()).writer()
        return image.capture(variables, dict(variables), writer, name=name)


@pytest.fixture
def site(tmp_path: Path) -> Site:
    return Site(tmp_path)


@pytest.fixture
def ckpt(site: Site) -> Run:
    """Run ``jupyter ckpt ARGS`` on the site's store; ``env`` entries override."""

    def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [JUPYTER, "ckpt", *args],
            env=site.env(**env),
            cwd=site.root,
            capture_output=True,
            text=True,
            timeout=120,
        )

    return run


def files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes, to show that a command changed nothing."""
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def chunk_files(site: Site, manifest: dict[str, Any]) -> set[Path]:
    return {
        site.data / chunk_path(digest) for s in manifest["segments"] for digest, _ in s["chunks"]
    }


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr}"
    return result.stdout


def failed(result: subprocess.CompletedProcess[str], code: int, *words: str) -> str:
    """Assert a clean failure: the exit code, nothing on stdout, one stderr line naming
    the cause, no traceback."""
    assert result.returncode == code, f"exit {result.returncode}: {result.stdout}{result.stderr}"
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for word in words:
        assert word in lines[0]
    return lines[0]


# -- usage ---------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_help_exits_0_and_shows_usage(ckpt: Run, command: str) -> None:
    out = ok(ckpt(*filter(None, [command, "--help"])))
    assert out.startswith(f"Usage: jupyter ckpt {command or 'COMMAND'}")
    assert "--store=" in out


def test_app_help_lists_every_command(ckpt: Run) -> None:
    out = ok(ckpt("--help"))
    assert all(f"\n{command}\n" in out for command in COMMANDS)


@pytest.mark.parametrize(
    ("args", "cause"),
    [
        ((), "no command given"),
        (("bogus",), "unknown command 'bogus'"),
        (("show",), "expected ID, got nothing"),
        (("export", "abc123"), "expected ID FILE, got abc123"),
        (("list", "extra"), "expected no arguments, got extra"),
        (("list", "--jsn"), "--jsn"),
        (("gc", "--grase=0"), "unrecognized option --grase"),
        (("gc", "--grace=-1"), "should not be less than 0"),
        (("gc", "--grace=soon"), "expected a float"),
        (("show", "../../etc/passwd"), "invalid image name or id '../../etc/passwd'"),
        (("rm", "/tmp"), "invalid image name or id '/tmp'"),
    ],
)
def test_bad_usage_exits_2(ckpt: Run, args: tuple[str, ...], cause: str) -> None:
    failed(ckpt(*args), 2, cause, "--help")


# -- reading -------------------------------------------------------------------------------


def test_list_empty_store(ckpt: Run, site: Site) -> None:
    assert ok(ckpt("list")).strip() == f"No images in {site.data}"
    assert json.loads(ok(ckpt("list", "--json"))) == []


def test_a_store_named_with_a_typo_is_refused(ckpt: Run, site: Site) -> None:
    """``--store`` naming a directory that does not exist: exit 1, nothing created."""
    typo = site.root / "stroe"
    failed(ckpt("list", f"--store={typo}"), 1, f"no store at {typo}")
    assert not typo.exists()


def test_list_newest_first(ckpt: Run, site: Site) -> None:
    older = site.save("older", x=1)
    newer = site.save("newer", x=2, y="two")
    lines = ok(ckpt("list")).splitlines()
    assert [line.split()[0] for line in lines] == [newer["id"][:12], older["id"][:12]]
    assert lines[0].endswith("2 vars  newer")
    entries = json.loads(ok(ckpt("list", "--json")))
    assert [(e["id"], e["name"], e["saved_variables"]) for e in entries] == [
        (newer["id"], "newer", 2),
        (older["id"], "older", 1),
    ]


@pytest.mark.parametrize("ref", ["name", "prefix", "id"])
def test_show_by_name_prefix_or_id(ckpt: Run, site: Site, ref: str) -> None:
    manifest = site.save("session", weights=[1.5] * 10, label="run 7")
    given = {"name": "session", "prefix": manifest["id"][:8], "id": manifest["id"]}[ref]
    out = ok(ckpt("show", given))
    assert out.startswith(f"Image {manifest['id']}  'session'")
    assert "weights" in out
    assert "label" in out


def test_show_json_has_variables_without_layout(ckpt: Run, site: Site) -> None:
    manifest = site.save("session", n=3)
    shown = json.loads(ok(ckpt("show", manifest["id"], "--json")))
    assert shown["id"] == manifest["id"]
    assert [(v["name"], v["status"]) for v in shown["variables"]] == [("n", "saved")]
    assert "segments" not in shown
    assert "groups" not in shown


def test_show_says_whether_a_node_can_restore_the_image(
    ckpt: Run, site: Site, tmp_path: Path
) -> None:
    save_on_node(site.store(), node_file(tmp_path, "h100"), 1 << 20, name="big")
    out = ok(ckpt("show", "big", f"--node-facts={node_file(tmp_path, 'a10')}"))
    assert out.endswith(
        "  compatibility with this node: incompatible\n"
        "    saved on a GPU of compute capability 9.0; this node's GPUs have at most 8.6\n"
        "    saved on NVIDIA H100 80GB HBM3, this node has NVIDIA A10\n"
    )
    on_h100 = {"JUPYTER_CKPT_NODE_FACTS": str(node_file(tmp_path, "h100"))}
    shown = json.loads(ok(ckpt("show", "big", "--json", **on_h100)))
    assert shown["compatibility"] == {"verdict": "compatible", "reasons": []}
    no_torch = node_file(tmp_path, "h100", packages={"torch": None})
    out = ok(ckpt("show", "big", f"--node-facts={no_torch}"))
    assert "    torch " in out and " is not installed\n" in out
    out = ok(ckpt("show", "big", f"--node-facts={node_file(tmp_path, 'cpu')}"))
    assert "    needs a GPU (cuda:0) and this node has none\n" in out


def test_unknown_id_exits_1(ckpt: Run, site: Site) -> None:
    site.save("session", n=3)
    failed(ckpt("show", "deadbeef"), 1, "no image", "'deadbeef'", str(site.store_dir))


def test_ambiguous_prefix_exits_1(ckpt: Run, site: Site) -> None:
    image_id = site.save("session", n=3)["id"]
    twin = image_id[:4] + ("0" if image_id[4] != "0" else "1") * 28
    shutil.copytree(site.data / "images" / image_id, site.data / "images" / twin)
    failed(ckpt("show", image_id[:4]), 1, f"'{image_id[:4]}' matches 2 images")


# -- verify --------------------------------------------------------------------------------


def test_verify_ok_with_counts(ckpt: Run, site: Site) -> None:
    manifest = site.save("session", a=b"x" * 100_000, b=list(range(10)))
    chunks = chunk_files(site, manifest)
    line = ok(ckpt("verify", "session")).strip()
    assert line.startswith(f"OK {manifest['id']} 'session': signature valid, {len(chunks)} chunks")
    assert f"in {len(manifest['segments'])} segments match their hashes, 2 variables" in line


def test_verify_tampered_chunk_exits_1(ckpt: Run, site: Site) -> None:
    manifest = site.save("session", a=b"x" * 100_000)
    victim = sorted(chunk_files(site, manifest))[0]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    failed(ckpt("verify", manifest["id"]), 1, f"chunk {victim.name} was altered")


def test_verify_missing_chunk_exits_1(ckpt: Run, site: Site) -> None:
    manifest = site.save("session", a=b"x" * 100_000)
    victim = sorted(chunk_files(site, manifest))[0]
    victim.unlink()
    failed(ckpt("verify", manifest["id"]), 1, f"chunk {victim.name} is missing")


def test_verify_tampered_manifest_exits_1(ckpt: Run, site: Site) -> None:
    manifest = site.save("session", a=1)
    path = site.data / manifest_path(manifest["id"])
    sealed = json.loads(path.read_bytes())
    sealed["manifest"]["variables"][0]["name"] = "evil"
    path.write_text(json.dumps(sealed))
    failed(ckpt("verify", manifest["id"]), 1, "manifest was altered (signature mismatch)")
    assert "INVALID: " in ok(ckpt("list"))
    [entry] = json.loads(ok(ckpt("list", "--json")))
    assert entry["id"] == manifest["id"]
    assert "signature mismatch" in entry["error"]


def test_wrong_secret_exits_1(ckpt: Run, site: Site) -> None:
    manifest = site.save("session", a=1)
    other = site.root / "other-keys" / "secret"
    site.store(secret=other)  # creates a second secret
    failed(
        ckpt("verify", manifest["id"], JUPYTER_CKPT_SECRET_FILE=str(other)),
        1,
        "signed with a different secret",
    )


# -- removing ------------------------------------------------------------------------------


def test_rm_then_list(ckpt: Run, site: Site) -> None:
    kept = site.save("kept", a=1)
    gone = site.save("gone", a=2)
    assert ok(ckpt("rm", gone["id"][:8])).strip() == f"Deleted image {gone['id']}"
    listed = ok(ckpt("list"))
    assert kept["id"][:12] in listed
    assert gone["id"][:12] not in listed
    failed(ckpt("show", gone["id"]), 1, "no image")


def test_rm_refuses_an_image_that_fails_verification(ckpt: Run, site: Site) -> None:
    """Only images we can vouch for are deleted through jupyter-ckpt: an altered or
    foreign one is refused, naming why, and stays listed as invalid."""
    manifest = site.save("session", a=1)
    path = site.data / manifest_path(manifest["id"])
    path.write_text(path.read_text().replace('"session"', '"altered"'))
    failed(ckpt("rm", manifest["id"]), 1, "refusing to delete", "altered")
    assert path.exists()
    assert "INVALID" in ok(ckpt("list"))


def test_gc_removes_only_orphaned_chunks(ckpt: Run, site: Site) -> None:
    kept = site.save("kept", a=b"k" * 200_000)
    gone = site.save("gone", a=b"g" * 200_000)
    orphans = chunk_files(site, gone) - chunk_files(site, kept)
    assert orphans
    ok(ckpt("rm", "gone"))

    # The default grace keeps chunks this young: a writer elsewhere may still need them.
    assert ok(ckpt("gc")).startswith("Removed 0 unreferenced chunk files")
    assert all(p.exists() for p in orphans)

    freed = sum(p.stat().st_size for p in orphans)
    out = ok(ckpt("gc", "--grace=0"))
    assert out.startswith(f"Removed {len(orphans)} unreferenced chunk files")
    assert f"freed {freed / 1024:.1f} KiB" in out
    assert not any(p.exists() for p in orphans)
    assert all(p.exists() for p in chunk_files(site, kept))
    ok(ckpt("verify", "kept"))


def test_gc_applies_retention_but_keeps_images_suspended_kernels_need(
    ckpt: Run, site: Site
) -> None:
    oldest = site.save("oldest", a=b"1" * 100_000)
    pinned = site.save("pinned", a=b"2" * 100_000)
    newest = site.save("newest", a=b"3" * 100_000)
    site.store().records.put({"kernel_id": "k-1", "image_id": pinned["id"]})

    failed(ckpt("rm", "pinned"), 1, pinned["id"], "suspended kernel k-1")
    out = ok(ckpt("gc", "--grace=0", "--ImageStore.max_images=1"))
    assert f"Removed image {oldest['id']} (retention)" in out
    listing = ok(ckpt("list"))
    assert pinned["id"][:12] in listing and newest["id"][:12] in listing
    assert oldest["id"][:12] not in listing


# -- moving between stores -----------------------------------------------------------------


def test_export_then_import_into_a_second_store(ckpt: Run, site: Site) -> None:
    manifest = site.save("session", a=b"e" * 300_000, b={"k": [1, 2]})
    tar = site.root / "session.tar"
    tar.write_bytes(b"an older export, readable by all")
    tar.chmod(0o644)
    line = failed(ckpt("export", "session", str(tar)), 1)
    assert line == f"jupyter ckpt export: {tar} exists; give --force to replace it"
    assert tar.read_bytes() == b"an older export, readable by all"
    out = ok(ckpt("export", "session", str(tar), "--force"))
    assert out.strip() == f"Exported image {manifest['id']} to {tar}"
    assert stat.S_IMODE(tar.stat().st_mode) == 0o600, "an image is private to its user"
    assert [p.name for p in site.root.iterdir() if p.name.startswith(".")] == []

    second = str(site.root / "second")
    out = ok(ckpt("import", str(tar), JUPYTER_CKPT_STORE=second))
    assert out.strip() == f"Imported image {manifest['id']} from {tar}"
    ok(ckpt("verify", manifest["id"], JUPYTER_CKPT_STORE=second))
    shown = json.loads(ok(ckpt("show", "session", "--json", JUPYTER_CKPT_STORE=second)))
    assert shown == json.loads(ok(ckpt("show", "session", "--json")))


def test_import_with_another_secret_is_refused_and_writes_nothing(ckpt: Run, site: Site) -> None:
    site.save("session", a=b"e" * 300_000)
    tar = site.root / "session.tar"
    ok(ckpt("export", "session", str(tar)))
    second, other = site.root / "second", site.root / "other-keys" / "secret"
    site.store(second, other).writer().commit({"name": "theirs", "variables": []})
    before = files(second)

    env = {"JUPYTER_CKPT_STORE": str(second), "JUPYTER_CKPT_SECRET_FILE": str(other)}
    failed(ckpt("import", str(tar), **env), 1, "signed with a different secret")
    assert files(second) == before


def test_export_of_a_corrupt_image_writes_no_file(ckpt: Run, site: Site) -> None:
    manifest = site.save("session", a=b"x" * 100_000)
    sorted(chunk_files(site, manifest))[0].write_bytes(b"not the chunk")
    tar = site.root / "session.tar"
    failed(ckpt("export", "session", str(tar)), 1, "was altered")
    assert not tar.exists()


def test_import_of_a_file_that_is_no_export_exits_1(ckpt: Run, site: Site) -> None:
    bogus = site.root / "notes.txt"
    bogus.write_text("hello")
    line = failed(ckpt("import", str(bogus)), 1)
    assert line == (
        f"jupyter ckpt import: {bogus}: not a jupyter-ckpt export (not a tar file); give a "
        "file written by `jupyter ckpt export`"
    )
    missing = site.root / "missing.tar"
    line = failed(ckpt("import", str(missing)), 1)
    assert line == f"jupyter ckpt import: cannot read {missing}: No such file or directory"


def test_export_errors_name_the_file_asked_for(ckpt: Run, site: Site) -> None:
    site.save("session", a=1)
    target = site.root / "missing-dir" / "session.tar"
    line = failed(ckpt("export", "session", str(target)), 1)
    assert line == f"jupyter ckpt export: cannot write {target}: No such file or directory"


# -- the store fails -----------------------------------------------------------------------


def closed_port() -> str:
    """An endpoint on loopback where nothing listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize(
    "args", [("list",), ("show", "work"), ("verify", "abc123"), ("rm", "work"), ("gc",)]
)
def test_s3_down_is_one_line_naming_the_store(ckpt: Run, args: tuple[str, ...]) -> None:
    options = {"endpoint_url": closed_port(), **CREDENTIALS, **S3_TIMEOUTS}
    env = {"JUPYTER_CKPT_STORE": f"s3://{BUCKET}/down", "FSSPEC_S3": json.dumps(options)}
    line = failed(ckpt(*args, **env), 1)
    url = f"s3://{BUCKET}/down/users/{USER}"
    assert re.fullmatch(
        rf"jupyter ckpt {args[0]}: cannot reach the store {re.escape(url)} \(.+"
        rf"{re.escape(options['endpoint_url'])}.+\); check that it is up and reachable "
        r"from here \(endpoint, network, credentials\), then try again",
        line,
    ), line


def test_a_named_secret_file_is_never_created(ckpt: Run, site: Site) -> None:
    site.save("session", a=1)
    typo = site.root / "keys" / "secrte"
    for args in (("list", f"--secret-file={typo}"), ("rekey", f"--old-secret-file={typo}")):
        line = failed(ckpt(*args), 1)
        assert line == (
            f"jupyter ckpt {args[0]}: no secret file {typo}: give the path of an existing "
            "secret (nothing was created there)"
        )
        assert not typo.exists()


@pytest.mark.parametrize(
    ("option", "trait", "minimum", "value"),
    [
        ("--ImageStore.io_threads=0", "io_threads", 1, 0),
        ("--ImageStore.max_images=-5", "max_images", 0, -5),
    ],
)
def test_store_settings_out_of_range_are_refused(
    ckpt: Run, option: str, trait: str, minimum: int, value: int
) -> None:
    line = failed(ckpt("list", option), 1)
    assert line == (
        f"jupyter ckpt list: bad store configuration: The value of the '{trait}' trait of "
        f"an ImageStore instance should not be less than {minimum}, but a value of {value} "
        "was specified"
    )


def test_an_image_that_fails_verification_is_named_so(ckpt: Run, site: Site) -> None:
    manifest = site.save("session", a=1)
    path = site.data / manifest_path(manifest["id"])
    path.write_bytes(path.read_bytes().replace(b'"a"', b'"b"'))
    for command in ("show", "rm", "verify"):
        line = failed(ckpt(command, "session"), 1)
        assert line == (
            f"jupyter ckpt {command}: image 'session' ({manifest['id']}) cannot be used: "
            f"image {manifest['id']}: the manifest was altered (signature mismatch)"
        )


# -- configuration -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["json", "py"])
def test_store_from_the_server_config_file(ckpt: Run, site: Site, kind: str) -> None:
    """`ImageStore.url` set for the server is the CLI's store too, ahead of the env var."""
    manifest = site.save("session", a=1)
    site.config_dir.mkdir()
    config = {
        "json": json.dumps({"ImageStore": {"url": str(site.store_dir)}}),
        "py": f"c.ImageStore.url = {str(site.store_dir)!r}\nc.ServerApp.port = 9999\n",
    }[kind]
    (site.config_dir / f"jupyter_server_config.{kind}").write_text(config)
    elsewhere = str(site.root / "elsewhere")
    assert manifest["id"][:12] in ok(ckpt("list", JUPYTER_CKPT_STORE=elsewhere))


@pytest.mark.parametrize("option", ["--store", "--ImageStore.url"])
def test_store_option_beats_config_and_env(ckpt: Run, site: Site, option: str) -> None:
    manifest = site.save("session", a=1)
    site.config_dir.mkdir()
    elsewhere = str(site.root / "elsewhere")
    (site.config_dir / "jupyter_server_config.json").write_text(
        json.dumps({"ImageStore": {"url": elsewhere}})
    )
    out = ok(ckpt("show", "session", f"{option}={site.store_dir}", JUPYTER_CKPT_STORE=elsewhere))
    assert manifest["id"] in out


def test_bad_store_setting_exits_1(ckpt: Run) -> None:
    failed(ckpt("list", "--ImageStore.io_threads=many"), 1, "bad store configuration", "many")
    failed(ckpt("list", "--store=nosuchproto://bucket"), 1, "cannot open the store")
    failed(ckpt("list", "--store="), 1, "ImageStore.url is empty")


# -- rekey ---------------------------------------------------------------------------------

# What the images and records below hold, as it would show in a file that is not encrypted.
KNOWN = {
    "variable name": b"weights_of_the_model",
    "notebook path": b"projects/secret-plan.ipynb",
    "array bytes": b"\x8a\x13fixed-array-pattern\x8a\x13" * 4,
}


def save_known(site: Site, store: ImageStore) -> dict[str, Any]:
    manifest = site.save("session", store, weights_of_the_model=KNOWN["array bytes"] * 5000)
    store.records.put(
        {"kernel_id": "k-1", "image_id": manifest["id"], "path": KNOWN["notebook path"].decode()}
    )
    return manifest


def test_rekey_encrypts_the_plaintext_images_and_records(ckpt: Run, site: Site) -> None:
    manifest = save_known(site, site.store())
    assert set(plaintext_in(files(site.data), KNOWN)), "control: a plain store shows them"

    out = ok(ckpt("rekey", "--encryption=aes-256-gcm"))
    assert f"Rekeyed image {manifest['id']} (aes-256-gcm, " in out
    assert "Rekeyed kernel record k-1" in out
    assert out.strip().endswith(
        "2 rewritten, 0 already current (encryption for new images: aes-256-gcm)"
    )
    ok(ckpt("gc", "--grace=0"))  # the plaintext chunks, now unreferenced
    assert plaintext_in(files(site.data), KNOWN) == {}
    assert ok(ckpt("verify", "session")).startswith(f"OK {manifest['id']}")
    assert site.store().records.get("k-1")["image_id"] == manifest["id"], "the id stays"

    again = ok(ckpt("rekey", "--encryption=aes-256-gcm")).strip()
    assert again == "0 rewritten, 2 already current (encryption for new images: aes-256-gcm)"
    # a store that rekey encrypted stays so for writers configured without encryption
    later = site.save("later", site.store(), weights_of_the_model=KNOWN["array bytes"] * 5000)
    assert later["encryption"] == "aes-256-gcm"
    assert plaintext_in(files(site.data), KNOWN) == {}
    again = ok(ckpt("rekey")).strip()  # configured without encryption, as the server may be
    assert again == "0 rewritten, 3 already current (encryption for new images: aes-256-gcm)"


def test_rekey_moves_images_to_a_new_secret_given_in_the_environment(ckpt: Run, site: Site) -> None:
    """The hub case: the secret rotated, the new one comes from $JUPYTER_CKPT_SECRET and
    the old one is kept in a file that rekey only reads."""
    manifest = save_known(site, site.store(encryption="aes-256-gcm"))
    old = files(site.root / "keys")
    new_secret = {"JUPYTER_CKPT_SECRET": "ab" * 32}
    failed(ckpt("verify", manifest["id"], **new_secret), 1, "encrypted with a different secret")

    out = ok(ckpt("rekey", f"--old-secret-file={site.secret}", **new_secret))
    assert f"Rekeyed image {manifest['id']} (aes-256-gcm, " in out
    assert "Rekeyed kernel record k-1" in out
    assert files(site.root / "keys") == old, "the old secret is only read"
    ok(ckpt("verify", "session", **new_secret))
    failed(ckpt("verify", manifest["id"]), 1, "encrypted with a different secret")
    assert plaintext_in(files(site.data), KNOWN) == {}


def test_rekey_names_what_it_cannot_open_and_rekeys_the_rest(ckpt: Run, site: Site) -> None:
    mine = site.save("mine", a=1)
    other = site.root / "other-keys" / "secret"
    theirs = site.save("theirs", site.store(secret=other, encryption="aes-256-gcm"), a=2)

    result = ckpt("rekey", "--encryption=aes-256-gcm")
    assert result.returncode == 1
    assert f"Rekeyed image {mine['id']}" in result.stdout
    assert f"Could not rekey image {theirs['id']}: image {theirs['id']}: encrypted with a " in (
        result.stdout
    )
    assert "1 could not be rekeyed (see above); 1 rewritten" in result.stderr
    ok(ckpt("verify", "mine", "--encryption=aes-256-gcm"))
