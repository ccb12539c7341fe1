"""Large array buffers mapped from the chunk files of a local store (ImageStore.map_buffers):
the same values as a read, the kernel's own copy on write, safe when the image goes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from jupyter_ckpt import image
from jupyter_ckpt.store import ImageStore, mapping
from jupyter_ckpt.store.layout import chunk_path

MiB = 1 << 20
# large enough to be mapped (a segment of its own above MAP_MIN_BYTES), not a multiple of
# the chunk size, so the last chunk file ends inside a page
N = (mapping.MAP_MIN_BYTES + 3 * MiB + 40) // 8


def namespace() -> dict[str, Any]:
    big = np.random.default_rng(0).random(N)
    return {"big": big, "view": big[5:9], "small": np.arange(100), "text": "kept"}


def save(store: ImageStore, ns: dict[str, Any]) -> dict[str, Any]:
    return image.capture(dict(ns), ns, store.writer(), name="mapped")


def restore(store: ImageStore, manifest: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    out: dict[str, Any] = {}
    segments = store.read_segments(manifest)
    report = image.restore(manifest, segments, out)
    assert not report.missing, report.missing
    return out, segments


def chunk_files(store: ImageStore, manifest: dict[str, Any]) -> list[Path]:
    root = Path(store.backend.url)
    return [root / chunk_path(d) for s in manifest["segments"] for d, _ in s["chunks"]]


@pytest.fixture
def mappable(store: ImageStore) -> ImageStore:
    if not mapping.can_map(store.backend.url):
        pytest.skip(f"{mapping.filesystem_of(store.backend.url)}: chunk files are read here")
    return store


def test_mapped_arrays_hold_the_saved_values_and_share_as_saved(mappable: ImageStore) -> None:
    ns = namespace()
    manifest = save(mappable, ns)
    out, segments = restore(mappable, manifest)
    assert segments.mapper.bytes == ns["big"].nbytes  # the large one, and only it
    np.testing.assert_array_equal(out["big"], ns["big"])
    np.testing.assert_array_equal(out["small"], ns["small"])
    assert out["text"] == "kept"
    assert np.shares_memory(out["view"], out["big"])
    assert out["big"].flags.writeable


def test_writing_to_a_mapped_array_changes_the_kernels_copy_not_the_image(
    mappable: ImageStore,
) -> None:
    ns = namespace()
    manifest = save(mappable, ns)
    out, _ = restore(mappable, manifest)
    out["big"][:] = -1.0
    out["view"][0] = 7.0
    assert out["big"][5] == 7.0
    mappable.verify(manifest["id"])  # every chunk still matches its hash
    again, _ = restore(mappable, manifest)
    np.testing.assert_array_equal(again["big"], ns["big"])


def test_deleting_the_image_and_its_chunks_leaves_mapped_arrays_whole(
    mappable: ImageStore,
) -> None:
    ns = namespace()
    manifest = save(mappable, ns)
    out, _ = restore(mappable, manifest)  # nothing of the array touched yet
    mappable.delete(manifest["id"])
    assert mappable.gc(grace_seconds=0).files
    assert not any(p.exists() for p in chunk_files(mappable, manifest))
    np.testing.assert_array_equal(out["big"], ns["big"])  # read on this first touch


def test_mapping_is_off_where_configured_encrypted_or_on_a_network_file_system(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def store(**kw: Any) -> ImageStore:
        return ImageStore(url=str(tmp_path / "store"), secret_file=str(tmp_path / "secret"), **kw)

    ns = namespace()
    plain, encrypted = save(store(), ns), save(store(encryption="aes-256-gcm"), ns)
    assert store(map_buffers=False).mapper(plain) is None
    assert store().mapper(encrypted) is None
    monkeypatch.setattr(mapping, "filesystem_of", lambda path: "nfs4")
    assert store().mapper(plain) is None
    out, segments = restore(store(), plain)  # read, as before
    assert segments.mapper is None
    np.testing.assert_array_equal(out["big"], ns["big"])
    monkeypatch.setenv("JUPYTER_CKPT_MAP_BUFFERS", "0")
    assert not store().map_buffers


def test_a_chunk_file_not_as_the_manifest_says_is_read_and_refused(
    mappable: ImageStore,
) -> None:
    manifest = save(mappable, namespace())
    victim = chunk_files(mappable, manifest)[0]
    os.chmod(victim, 0o600)
    os.truncate(victim, 4096)  # shorter than the manifest says: not mapped, read, refused
    with pytest.raises(Exception, match="altered"):
        restore(mappable, manifest)


def test_the_check_after_a_mapped_restore_names_a_damaged_chunk(mappable: ImageStore) -> None:
    manifest = save(mappable, namespace())
    _, segments = restore(mappable, manifest)
    checker = segments.mapper.checker
    digest, (path, _) = next(iter(checker.chunks.items()))
    os.chmod(path, 0o600)
    with open(path, "r+b") as f:
        f.write(b"\xff" * 8)  # same size: mapped as it was, then found by the check
    reports: list[mapping.Checker] = []
    checker.start(reports.append)
    assert checker.done.wait(30)
    assert reports == [checker]
    assert list(checker.failed) == [digest]
