"""Loading an image runs pickle, so an image that is not exactly what we signed is refused
before anything is unpickled.

Each attack carries a live payload: unpickling it creates a marker file. The kernel must
refuse the image and the marker must never appear; then the same bytes are loaded once
without the checks, in the test process, to prove the payload would have fired.
"""

from __future__ import annotations

import json
import os
import pickle
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from harness import Kernel, Paths, group_of, payload, write_foreign_image

from jupyter_ckpt import image
from jupyter_ckpt.errors import IntegrityError, InvalidReference, SecretError
from jupyter_ckpt.store import ImageStore, check_ref, chunk_hash, chunk_path, manifest_path
from jupyter_ckpt.store.signing import Signer


def load_unchecked(store: ImageStore, image_id: str) -> None:
    """What a loader without signature and hash checks would do with an image."""
    envelope = json.loads(store.backend.read_bytes(manifest_path(image_id)))
    manifest = envelope["manifest"]
    segments = [
        memoryview(b"".join(store.backend.read_bytes(chunk_path(d)) for d, _ in s["chunks"]))
        for s in manifest["segments"]
    ]
    image.restore(manifest, segments, {})


def tamper_chunk(store: ImageStore, marker: Path) -> str:
    """Overwrite the pickle of `value` inside its chunk; manifest and signature untouched."""
    manifest = store.open("good")
    segment, offset, length = group_of(manifest, "value")["pickle"]
    digest, size = manifest["segments"][segment]["chunks"][0]
    assert offset + length <= size, "the pickle of `value` should sit in the first chunk"
    evil = payload(marker)
    assert len(evil) <= length
    path = Path(store.backend.root, chunk_path(digest))
    data = bytearray(path.read_bytes())
    data[offset : offset + length] = evil.ljust(length, b"\0")
    path.write_bytes(bytes(data))
    return manifest["id"]


def tamper_manifest(store: ImageStore, marker: Path) -> str:
    """A copy of the image whose manifest points `value` at a payload chunk; not re-signed."""
    sealed = json.loads(store.backend.read_bytes(manifest_path(store.resolve("good"))))
    manifest = sealed["manifest"]
    evil = payload(marker)
    store.backend.write_atomic(chunk_path(chunk_hash(evil)), evil)
    manifest["segments"].append({"size": len(evil), "chunks": [[chunk_hash(evil), len(evil)]]})
    group_of(manifest, "value")["pickle"] = [len(manifest["segments"]) - 1, 0, len(evil)]
    manifest["id"] = "f" * 32
    manifest["name"] = "tampered"
    store.backend.write_atomic(manifest_path(manifest["id"]), json.dumps(sealed).encode())
    return manifest["id"]


def foreign_image(store: ImageStore, marker: Path) -> str:
    """A well-formed image with valid chunk hashes, signed with someone else's secret."""
    return write_foreign_image(store, marker, "other-secret")[1]


@pytest.fixture(scope="module")
def kernel(start_kernel) -> Kernel:
    k = start_kernel()
    k.run("value = 'v' * 300\nimport numpy as np\narr = np.arange(200_000)")
    k.ckpt("save good")
    return k


@pytest.mark.parametrize(
    ("craft", "refusal"),
    [
        (tamper_chunk, "was altered (content does not match its hash)"),
        (tamper_manifest, "the manifest was altered (signature mismatch)"),
        (foreign_image, "signed with a different secret"),
    ],
)
def test_crafted_image_refused_before_unpickling(
    kernel: Kernel,
    kernel_store: ImageStore,
    tmp_path: Path,
    craft: Callable[[ImageStore, Path], str],
    refusal: str,
) -> None:
    marker = tmp_path / "pwned"
    image_id = craft(kernel_store, marker)
    kernel.run("value = 'before'")
    out = kernel.ckpt(f"restore {image_id}")
    assert out.startswith("%ckpt restore: ") and refusal in out
    assert not marker.exists(), "the payload ran: something was unpickled"
    assert kernel.eval("value") == "before"
    load_unchecked(kernel_store, image_id)
    assert marker.exists(), "control: without the checks the crafted image does run code"


def test_payload_is_live(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    pickle.loads(payload(marker))
    assert marker.exists()


def test_list_marks_bad_images_invalid(
    kernel: Kernel, kernel_store: ImageStore, tmp_path: Path
) -> None:
    bad = foreign_image(kernel_store, tmp_path / "unused")
    listing = kernel.ckpt("list").splitlines()
    line = next(line for line in listing if line.startswith(bad[:12]))
    assert "INVALID: " in line and "different secret" in line


BAD_REFS = ["../x", "/etc/passwd", "a/b", "..", ".hidden", "a b", ""]


@pytest.mark.parametrize(
    ("command", "ref"),
    # an empty name for save means the default name, so that pair is not an error
    [(c, r) for c in ("save", "restore", "show", "rm") for r in BAD_REFS if r or c != "save"],
)
def test_path_like_references_rejected(kernel: Kernel, command: str, ref: str) -> None:
    out = kernel.ckpt(f"{command} '{ref}'")
    assert f"%ckpt {command}: invalid image name" in out


@pytest.mark.parametrize("ref", ["../x", "/etc/passwd", "a/b", "x\\y", "a" * 129, "é"])
def test_store_refuses_path_like_references(ref: str, store: ImageStore) -> None:
    """Every entry point that turns a reference into a path checks it first."""
    with pytest.raises(InvalidReference):
        check_ref(ref)
    for entry in (store.resolve, store.open, store.delete, store.verify, store.load_manifest):
        with pytest.raises(InvalidReference):
            entry(ref)


def test_kernel_secret_is_private_and_outside_store(kernel: Kernel, ckpt_paths: Paths) -> None:
    secret = ckpt_paths.secret
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert not secret.resolve().is_relative_to(ckpt_paths.store.resolve())


def test_secret_created_0600(tmp_path: Path) -> None:
    path = tmp_path / "new" / "secret"
    signer = Signer(str(path))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert Signer(str(path)).key_id == signer.key_id  # reused, not regenerated


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644])
def test_shared_secret_refused(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "secret"
    Signer(str(path))
    os.chmod(path, mode)
    with pytest.raises(SecretError, match="accessible by other users"):
        Signer(str(path))


def test_short_secret_refused(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("too short")
    path.chmod(0o600)
    with pytest.raises(SecretError, match="too short"):
        Signer(str(path))


def test_empty_secret_left_by_a_crash_is_a_clear_error_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.touch(mode=0o600)
    with pytest.raises(SecretError, match="interrupted first use: remove it") as refused:
        Signer(str(path))
    assert str(path) in str(refused.value)
    assert path.read_text() == "", "never replaced behind the user's back"


FIRST_USE = """
import os, sys, time
from jupyter_ckpt.store.signing import Signer
print("ready", flush=True)
while not os.path.exists(sys.argv[2]):
    time.sleep(0.001)
for i in range(int(sys.argv[3])):  # racing on one secret after another keeps them in step
    print(Signer(os.path.join(sys.argv[1], str(i), "secret")).key_id)
"""


def test_concurrent_first_uses_share_one_complete_secret(tmp_path: Path) -> None:
    """50 processes first-use 20 secrets at once: all succeed and agree on each one."""
    go, secrets = tmp_path / "go", 20
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", FIRST_USE, str(tmp_path), str(go), str(secrets)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(50)
    ]
    assert all(p.stdout is not None and p.stdout.readline() == "ready\n" for p in procs)
    go.touch()
    results = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * 50, [err for _, err in results if err][:1]
    for i in range(secrets):
        key_ids = {out.split()[i] for out, _ in results}
        assert key_ids == {Signer(str(tmp_path / str(i) / "secret")).key_id}
        assert [p.name for p in (tmp_path / str(i)).iterdir()] == ["secret"], "temp left"


def test_image_signed_with_another_secret_is_not_deleted(store: ImageStore, tmp_path: Path) -> None:
    foreign = foreign_image(store, tmp_path / "unused")
    with pytest.raises(IntegrityError, match=r"refusing to delete .* different secret"):
        store.delete(foreign)
    assert store.backend.exists(manifest_path(foreign))
