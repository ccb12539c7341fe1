"""Encryption at rest (``ImageStore.encryption = "aes-256-gcm"``): real kernels save and
restore through an encrypted store; its raw files, read without the key, show none of
what the images, records and index hold; tampering is refused before anything is
unpickled; and two users on one S3 store cannot read each other's data.

Every crafted image carries a live payload where one can be planted (unpickling it creates
a marker file): the kernel must refuse the image, the marker must never appear, and a
control loads the same bytes without the checks to prove the payload would have fired.
"""

from __future__ import annotations

import io
import json
import pickle
import socket
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from harness import (
    BUCKET,
    CREDENTIALS,
    Kernel,
    Paths,
    counting,
    group_of,
    load_namespace,
    payload,
    plaintext_in,
    s3_store,
    save_namespace,
    write_foreign_image,
)
from traitlets import TraitError

from jupyter_ckpt import image
from jupyter_ckpt.errors import IntegrityError
from jupyter_ckpt.store import CHUNK_SIZE, ImageStore, chunk_hash, chunk_path, manifest_path
from jupyter_ckpt.store.encryption import HEADER, KEY_ID, MAGIC, is_encrypted
from jupyter_ckpt.store.index import INDEX

AES = "aes-256-gcm"
NOTEBOOK = "research/confidential-forecast.ipynb"
PATTERN = bytes(range(7, 71))  # 64 bytes that random ciphertext will not contain
# What the kernel's image holds, as it would show in a file that is not encrypted.
KNOWN = {
    "variable name": b"forecast_weights_matrix",
    "another variable": b"quarterly_numbers_note",
    "string value": b"the-launch-is-on-the-ninth",
    "array bytes": PATTERN,
    "notebook path": NOTEBOOK.encode(),
}
SETUP = f"""
import os
import numpy as np
os.environ["JPY_SESSION_NAME"] = {NOTEBOOK!r}
forecast_weights_matrix = np.frombuffer({PATTERN!r} * (9 << 14), dtype=np.uint8).copy()
quarterly_numbers_note = {{"plan": "the-launch-is-on-the-ninth", "n": [1, 2, 3]}}
noise_floor = np.random.default_rng(5).random(1 << 20)
value = "v" * 300
"""


@pytest.fixture(scope="module")
def ckpt_paths(tmp_path_factory: pytest.TempPathFactory) -> Paths:
    """This module's kernels write to an encrypted store."""
    return Paths(tmp_path_factory.mktemp("ckpt"), encryption=AES)


@pytest.fixture(scope="module")
def kernel(start_kernel: Callable[..., Kernel]) -> Kernel:
    """A kernel that saved image ``good``: 9 MiB of a repeated pattern (chunks that
    dedupe to one) and 8 MiB of random values (two distinct full chunks)."""
    k = start_kernel()
    k.run(SETUP)
    assert k.ckpt("save good").startswith("Saved")
    return k


def raw_files(root: Path) -> dict[str, bytes]:
    """Every file of the store as someone without the key sees it."""
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_round_trip_through_an_encrypted_store(
    kernel: Kernel, start_kernel: Callable[..., Kernel], kernel_store: ImageStore
) -> None:
    manifest = kernel_store.verify("good")
    assert manifest["encryption"] == AES and manifest["kernel"]["notebook_path"] == NOTEBOOK
    fresh = start_kernel()
    out = fresh.ckpt("restore good")
    assert out.startswith("Restored"), out
    fresh.check(
        f"forecast_weights_matrix.tobytes() == {PATTERN!r} * (9 << 14)",
        "quarterly_numbers_note == {'plan': 'the-launch-is-on-the-ninth', 'n': [1, 2, 3]}",
        "value == 'v' * 300",
        "noise_floor.sum() == np.random.default_rng(5).random(1 << 20).sum()",
    )


def test_raw_files_show_no_names_values_or_paths(
    kernel: Kernel, kernel_store: ImageStore, ckpt_paths: Paths
) -> None:
    manifest = kernel_store.open("good")
    kernel_store.records.put(
        {"kernel_id": "k-1", "image_id": manifest["id"], "path": NOTEBOOK, "env": {"A": "1"}}
    )
    listing = ImageStore(
        url=str(ckpt_paths.store), secret_file=str(ckpt_paths.secret), encryption=AES, index_slack=0
    )
    assert [i for i, _, _ in listing.iter_manifests()] == [manifest["id"]]
    lease = kernel_store.lease()  # a save in progress names its host and process
    try:
        raw = raw_files(ckpt_paths.store)
    finally:
        lease.release()
    prefix = f"users/{kernel_store.user}"
    assert {f"{prefix}/{INDEX}", f"{prefix}/kernels/k-1.json", f"{prefix}/{lease.path}"} <= set(raw)
    known = {**KNOWN, "kernel cwd": str(ckpt_paths.root / "cwd").encode()}
    host = socket.gethostname().encode()
    if len(host) >= 6:  # long enough not to turn up in random bytes by chance
        known["host name"] = host
    assert plaintext_in(raw, known) == {}

    # control: the same plaintexts are in what the key opens
    opened = json.dumps([manifest, kernel_store.records.get("k-1")]).encode()
    opened += b"".join(bytes(s) for s in kernel_store.read_segments(manifest))
    assert set(plaintext_in({"opened": opened}, KNOWN)["opened"]) == set(KNOWN)


def test_raw_files_of_a_plain_store_do_show_them(tmp_path: Path) -> None:
    """Control for the test above: without encryption the same search finds everything."""
    store = ImageStore(url=str(tmp_path / "s"), secret_file=str(tmp_path / "k"))
    variables = {
        "forecast_weights_matrix": np.frombuffer(PATTERN * 1000, dtype=np.uint8).copy(),
        "quarterly_numbers_note": "the-launch-is-on-the-ninth",
    }
    manifest = save_namespace(store, variables)
    store.records.put({"kernel_id": "k-1", "image_id": manifest["id"], "path": NOTEBOOK})
    found = plaintext_in(raw_files(tmp_path / "s"), KNOWN)
    assert {k for hits in found.values() for k in hits} == set(KNOWN)


# -- tampering -----------------------------------------------------------------------------

# A craft changes the store as someone with write access to it but without the key could,
# and returns (the image to restore, a control that loads the planted bytes unchecked).
Craft = Callable[[ImageStore, Path], tuple[str, Callable[[], Any] | None]]


def _value_chunk(store: ImageStore) -> tuple[dict[str, Any], str, int, int, int]:
    """(manifest, digest, chunk size, offset, length) of the pickle of ``value``."""
    manifest = store.open("good")
    segment, offset, length = group_of(manifest, "value")["pickle"]
    digest, size = manifest["segments"][segment]["chunks"][0]
    assert offset + length <= size, "the pickle of `value` should sit in the first chunk"
    return manifest, digest, size, offset, length


def _chunk_file(store: ImageStore, digest: str) -> Path:
    return Path(store.backend.root, chunk_path(digest))


def plaintext_chunk(store: ImageStore, marker: Path) -> tuple[str, Callable[[], Any]]:
    """The chunk holding `value` replaced by plaintext whose `value` is the payload."""
    manifest, digest, size, offset, length = _value_chunk(store)
    plain = bytearray(size)
    store.chunk_reader(manifest)(digest, memoryview(plain))
    evil = payload(marker)
    plain[offset : offset + length] = evil.ljust(length, b"\0")
    _chunk_file(store, digest).write_bytes(plain)
    return manifest["id"], lambda: pickle.loads(plain[offset : offset + length])


def plaintext_manifest(store: ImageStore, marker: Path) -> tuple[str, Callable[[], Any]]:
    """A plaintext, unsigned manifest pointing `value` at a plaintext payload chunk."""
    manifest = store.open("good")
    evil = payload(marker)
    Path(store.backend.root, chunk_path(chunk_hash(evil))).parent.mkdir(exist_ok=True)
    Path(store.backend.root, chunk_path(chunk_hash(evil))).write_bytes(evil)
    manifest["segments"].append({"size": len(evil), "chunks": [[chunk_hash(evil), len(evil)]]})
    group_of(manifest, "value")["pickle"] = [len(manifest["segments"]) - 1, 0, len(evil)]
    manifest.update(id="f" * 32, name="planted", encryption="none")
    envelope = {
        "format": "jupyter-ckpt/1",
        "key_id": store.signer.key_id,
        "signature": "0" * 64,
        "manifest": manifest,
    }
    path = Path(store.backend.root, manifest_path(manifest["id"]))
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(envelope))
    return manifest["id"], lambda: pickle.loads(evil)


def _mallory(store: ImageStore, marker: Path, size: int | None = None) -> tuple[ImageStore, str]:
    """An encrypted image whose `value` is the payload, written with another secret; its
    one chunk is ``size`` bytes if given (to stand in for one of ours)."""
    return write_foreign_image(store, marker, "mallory-secret", pad_to=size, encryption=AES)


def foreign_image(store: ImageStore, marker: Path) -> tuple[str, Callable[[], Any]]:
    """A whole encrypted image, well formed, under someone else's secret."""
    other, image_id = _mallory(store, marker)

    def control() -> None:
        manifest = other.open(image_id)
        image.restore(manifest, other.read_segments(manifest), {})

    return image_id, control


def foreign_chunk(store: ImageStore, marker: Path) -> tuple[str, Callable[[], Any]]:
    """Someone else's encrypted payload chunk, of the very same size, in place of ours."""
    manifest, digest, size, *_ = _value_chunk(store)
    other, image_id = _mallory(store, marker, size)
    theirs = other.open(image_id)
    (their_digest, _), *_ = theirs["segments"][0]["chunks"]
    _chunk_file(store, digest).write_bytes(_chunk_file(other, their_digest).read_bytes())
    return manifest["id"], lambda: image.restore(theirs, other.read_segments(theirs), {})


def flipped_byte(store: ImageStore, marker: Path) -> tuple[str, None]:
    """One bit of the ciphertext holding `value` flipped."""
    return _flip(store, lambda data, size: 64 + size // 2)


def flipped_padding(store: ImageStore, marker: Path) -> tuple[str, None]:
    """One bit of the zero padding after the chunk flipped (nothing may change unseen)."""
    return _flip(store, lambda data, size: len(data) - 1)


def _flip(store: ImageStore, where: Callable[[bytes, int], int]) -> tuple[str, None]:
    manifest, digest, size, *_ = _value_chunk(store)
    path = _chunk_file(store, digest)
    data = bytearray(path.read_bytes())
    data[where(bytes(data), size)] ^= 1
    path.write_bytes(data)
    return manifest["id"], None


def swapped_chunks(store: ImageStore, marker: Path) -> tuple[str, None]:
    """Two full chunks of the same image (same size, same key) trade places."""
    manifest = store.open("good")
    full = sorted({d for s in manifest["segments"] for d, n in s["chunks"] if n == CHUNK_SIZE})
    a, b = _chunk_file(store, full[0]), _chunk_file(store, full[1])
    first, second = a.read_bytes(), b.read_bytes()
    a.write_bytes(second)
    b.write_bytes(first)
    return manifest["id"], None


def truncated_chunk(store: ImageStore, marker: Path) -> tuple[str, None]:
    manifest, digest, *_ = _value_chunk(store)
    path = _chunk_file(store, digest)
    path.write_bytes(path.read_bytes()[:-1])
    return manifest["id"], None


def moved_manifest(store: ImageStore, marker: Path) -> tuple[str, None]:
    """Our own encrypted manifest copied to another image id."""
    manifest = store.open("good")
    source = Path(store.backend.root, manifest_path(manifest["id"]))
    target = Path(store.backend.root, manifest_path("e" * 32))
    target.parent.mkdir(exist_ok=True)
    target.write_bytes(source.read_bytes())
    return "e" * 32, None


@pytest.fixture
def pristine(kernel: Kernel, kernel_store: ImageStore) -> Iterator[None]:
    """Put back the chunks a craft altered, so every craft starts from the good image."""
    chunks = Path(kernel_store.backend.root, "chunks")
    before = {p: p.read_bytes() for p in chunks.rglob("*") if p.is_file()}
    yield
    for path, data in before.items():
        path.write_bytes(data)


@pytest.mark.parametrize(
    ("craft", "refusal"),
    [
        (plaintext_chunk, "was altered"),
        (plaintext_manifest, "the manifest was altered (signature mismatch)"),
        (foreign_image, "encrypted with a different secret"),
        (foreign_chunk, "encrypted with a different secret"),
        (flipped_byte, "was altered or moved (it does not decrypt under your key)"),
        (flipped_padding, "was altered (its size or padding is wrong)"),
        (swapped_chunks, "was altered or moved (it does not decrypt under your key)"),
        (truncated_chunk, "was altered"),
        (moved_manifest, "manifest names another id"),
    ],
)
def test_tampering_is_refused_before_unpickling(
    kernel: Kernel,
    kernel_store: ImageStore,
    pristine: None,
    tmp_path: Path,
    craft: Craft,
    refusal: str,
) -> None:
    marker = tmp_path / "pwned"
    image_id, control = craft(kernel_store, marker)
    kernel.run("value = 'before'")
    out = kernel.ckpt(f"restore {image_id}")
    assert out.startswith("%ckpt restore: ") and refusal in out, out
    assert not marker.exists(), "the payload ran: something was unpickled"
    assert kernel.eval("value") == "before"
    if control is not None:
        control()
        assert marker.exists(), "control: without the checks the planted bytes do run code"


# -- keys ----------------------------------------------------------------------------------


def encrypted_store(root: Path, secret: str = "secret", **options: Any) -> ImageStore:
    return ImageStore(
        url=str(root / "store"), secret_file=str(root / secret), encryption=AES, **options
    )


def test_another_secret_opens_nothing(tmp_path: Path) -> None:
    mine = encrypted_store(tmp_path)
    manifest = save_namespace(mine, {"x": np.arange(1000)})
    mine.records.put({"kernel_id": "k-1", "image_id": manifest["id"], "path": NOTEBOOK})
    theirs = encrypted_store(tmp_path, "other-secret")
    [(image_id, summary, error)] = list(theirs.iter_manifests())
    assert (image_id, summary) == (manifest["id"], None)
    assert "encrypted with a different secret" in str(error)
    with pytest.raises(IntegrityError, match="encrypted with a different secret"):
        theirs.verify(manifest["id"])
    records, errors = theirs.records.all()
    assert records == {} and "encrypted with a different secret" in errors["k-1"]
    with pytest.raises(IntegrityError, match="refusing to delete"):
        theirs.delete(manifest["id"])
    # gc under the other secret cannot see what the image references, so it keeps it all
    result = theirs.gc(grace_seconds=0)
    assert result.files == 0 and "cannot read its manifest" in result.notes[0]
    assert mine.verify(manifest["id"])


def test_the_same_secret_from_the_environment_opens_what_a_file_secret_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node where the hub injects the secret (no file) reads what a node with the secret
    in a file wrote: the keys come from the secret, not from where it was kept."""
    (tmp_path / "file").write_text("cd" * 32)
    (tmp_path / "file").chmod(0o600)
    saved = save_namespace(encrypted_store(tmp_path, "file"), {"x": np.arange(10)}, name="env")
    monkeypatch.setenv("JUPYTER_CKPT_SECRET", "cd" * 32)
    elsewhere = encrypted_store(tmp_path, "unused")
    assert load_namespace(elsewhere, "env")["x"].tolist() == list(range(10))
    assert not (tmp_path / "unused").exists(), "no file is created or read"
    monkeypatch.setenv("JUPYTER_CKPT_SECRET", "ef" * 32)
    with pytest.raises(IntegrityError, match="encrypted with a different secret"):
        encrypted_store(tmp_path, "unused").open(saved["id"])


def test_encryption_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTER_CKPT_ENCRYPTION", AES)
    store = ImageStore(url=str(tmp_path / "s"), secret_file=str(tmp_path / "k"))
    assert store.encryption == AES and save_namespace(store, {"x": 1})["encryption"] == AES
    monkeypatch.setenv("JUPYTER_CKPT_ENCRYPTION", "rot13")
    with pytest.raises(TraitError, match="rot13"):
        ImageStore(url=str(tmp_path / "s"), secret_file=str(tmp_path / "k"))


# -- how the store works with encryption on --------------------------------------------------


def test_mixed_store_reads_both_kinds(tmp_path: Path) -> None:
    data = {"x": np.random.default_rng(1).random(1 << 19)}
    plain = ImageStore(url=str(tmp_path / "store"), secret_file=str(tmp_path / "secret"))
    old = save_namespace(plain, data, name="old")
    store = encrypted_store(tmp_path)
    new = save_namespace(store, data, name="new")
    assert (old.get("encryption", "none"), new["encryption"]) == ("none", AES)
    for reader in (plain, store):  # switched on, and off again
        for name in ("old", "new"):
            assert np.array_equal(load_namespace(reader, name)["x"], data["x"])
    assert {i for i, _, e in plain.iter_manifests() if e is None} == {old["id"], new["id"]}


def test_dedupe_within_a_user_and_lazy_reads(tmp_path: Path) -> None:
    store = encrypted_store(tmp_path)
    data = {"a": np.random.default_rng(2).random(3 << 19), "b": np.arange(10)}
    first = save_namespace(store, data, name="one")
    second = save_namespace(store, data, name="two")
    assert first["sizes"]["written"] >= first["sizes"]["logical"] * 0.99
    assert second["sizes"]["written"] < CHUNK_SIZE, "equal chunks are stored once"
    # a segment is read (and decrypted) on its own: only its chunks are fetched
    backend = counting(store)
    segments = store.read_segments(second)
    largest = max(range(len(segments)), key=lambda i: second["segments"][i]["size"])
    assert len(segments[largest]) == 3 << 22
    assert backend.count("read_into") == len(second["segments"][largest]["chunks"]) == 3


def nonces(root: Path) -> dict[str, bytes]:
    """The nonce of every encrypted file under ``root``, by its path."""
    start = len(MAGIC) + KEY_ID
    return {
        name: data[start:HEADER] for name, data in raw_files(root).items() if is_encrypted(data)
    }


def test_every_stored_object_has_a_nonce_of_its_own(tmp_path: Path) -> None:
    """Under AES-GCM one nonce used twice with one key gives away the XOR of the two
    plaintexts and lets anyone forge tags: each chunk, manifest and record gets a fresh
    nonce, and saving the very same bytes again draws new ones."""
    store = encrypted_store(tmp_path)
    data = {"x": np.random.default_rng(3).random(3 << 19)}  # three distinct full chunks
    first = save_namespace(store, data, name="one")
    store.records.put({"kernel_id": "k-1", "image_id": first["id"], "path": NOTEBOOK})
    save_namespace(store, data, name="two")  # dedupes: a new manifest, no new chunk
    elsewhere = ImageStore(
        url=str(tmp_path / "elsewhere"), secret_file=str(tmp_path / "secret"), encryption=AES
    )
    save_namespace(elsewhere, data, name="one")  # the same chunks, written again
    ours, theirs = nonces(Path(store.backend.root)), nonces(Path(elsewhere.backend.root))
    chunks = {p for p in ours.keys() & theirs.keys() if p.startswith("chunks/")}
    assert len(chunks) >= 4 and sum(p.startswith("kernels/") for p in ours) == 1
    assert sum(p.startswith("images/") for p in ours) >= 2
    every = list(ours.values()) + list(theirs.values())
    assert len(set(every)) == len(every), "a nonce was used for more than one object"


def test_export_and_import_stay_encrypted(tmp_path: Path) -> None:
    store = encrypted_store(tmp_path)
    variables = {"forecast_weights_matrix": np.frombuffer(PATTERN * 1000, np.uint8).copy()}
    manifest = save_namespace(store, variables)
    tar = tmp_path / "image.tar"
    store.export(manifest["id"], str(tar))
    assert plaintext_in({"tar": tar.read_bytes()}, KNOWN) == {}
    second = ImageStore(url=str(tmp_path / "second"), secret_file=str(tmp_path / "secret"))
    assert second.import_(str(tar)) == manifest["id"]
    assert second.verify(manifest["id"])["encryption"] == AES

    # an altered chunk in the export is refused and nothing is imported
    with tarfile.open(tar) as t:
        members = [(m, t.extractfile(m).read()) for m in t.getmembers()]  # type: ignore[union-attr]
    altered = tmp_path / "altered.tar"
    with tarfile.open(altered, "w") as t:
        for member, data in members:
            if member.name.startswith("chunks/"):
                data = data[:100] + bytes([data[100] ^ 1]) + data[101:]
            t.addfile(member, io.BytesIO(data))
    third = ImageStore(url=str(tmp_path / "third"), secret_file=str(tmp_path / "secret"))
    with pytest.raises(IntegrityError, match="was altered or moved"):
        third.import_(str(altered))
    assert third.image_ids() == []


# -- two users, one S3 store ----------------------------------------------------------------


def test_two_users_on_one_s3_store_cannot_read_each_other(endpoint: str, tmp_path: Path) -> None:
    import s3fs

    def store(user: str, secret: str) -> ImageStore:
        return s3_store(endpoint, tmp_path, user, secret, encryption=AES)

    alice, bob = store("alice", "a"), store("bob", "b")
    data = {"forecast_weights_matrix": np.frombuffer(PATTERN * (1 << 15), np.uint8).copy()}
    mine = save_namespace(alice, data, name="run")
    alice.records.put({"kernel_id": "k-1", "image_id": mine["id"], "path": NOTEBOOK})
    theirs = save_namespace(bob, data, name="run")
    assert theirs["sizes"]["written"] == theirs["sizes"]["logical"], "no dedupe across users"

    def names(manifest: dict[str, Any]) -> set[str]:
        return {d for s in manifest["segments"] for d, _ in s["chunks"]}

    assert not names(mine) & names(theirs), "equal data gets different names per user"

    # what bob can fetch from alice's prefix (the bucket policy is the only wall here)
    fs = s3fs.S3FileSystem(endpoint_url=endpoint, **CREDENTIALS)
    prefix = f"{BUCKET}/{tmp_path.name}/users/alice"
    raw = {path: fs.cat_file(path) for path in fs.find(prefix)}
    assert len(raw) >= len(names(mine)) + 2  # chunks, the manifest, the record
    assert plaintext_in(raw, KNOWN) == {}

    # bob's key on alice's prefix opens nothing; alice's objects in his prefix neither
    snooper = store("alice", "b")
    assert [e is not None and "different secret" in e for _, _, e in snooper.iter_manifests()] == [
        True
    ]
    with pytest.raises(IntegrityError, match="different secret"):
        snooper.verify(mine["id"])
    assert "different secret" in snooper.records.all()[1]["k-1"]
    for path in [manifest_path(mine["id"]), *(chunk_path(d) for d in names(mine))]:
        bob.backend.write_atomic(path, alice.backend.read_bytes(path))
    with pytest.raises(IntegrityError, match="different secret"):
        bob.verify(mine["id"])
    assert alice.verify("run")["id"] == mine["id"]


def test_leases_are_encrypted_and_still_hold_off_gc(tmp_path: Path) -> None:
    store = encrypted_store(tmp_path)
    manifest = save_namespace(store, {"x": np.arange(1 << 16)})
    store.delete(manifest["id"])
    lease = store.lease()
    try:
        raw = Path(store.backend.root, lease.path).read_bytes()
        assert b'"pid"' not in raw and b'"host"' not in raw
        result = store.gc(grace_seconds=0)
        assert result.files == 0 and "1 save(s) in progress" in result.notes[0]
    finally:
        lease.release()
    assert store.gc(grace_seconds=0).files > 0


def test_rekey_of_plain_images_to_a_new_secret_rewrites_no_chunk(tmp_path: Path) -> None:
    """Plain chunks are named by an unkeyed hash: a new secret only re-signs manifests."""
    old = ImageStore(url=str(tmp_path / "store"), secret_file=str(tmp_path / "old"))
    manifest = save_namespace(old, {"x": np.arange(1 << 18)}, name="plain")
    new = ImageStore(url=str(tmp_path / "store"), secret_file=str(tmp_path / "new"))
    outcomes = [(o.kind, o.result, o.detail) for o in new.rekey(str(tmp_path / "old"))]
    assert outcomes == [("image", "rekeyed", "none, 0 chunks rewritten")]
    assert new.verify("plain")["segments"] == manifest["segments"]
    with pytest.raises(IntegrityError, match="signed with a different secret"):
        old.verify(manifest["id"])
