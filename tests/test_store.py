"""The store on its own: crash safety, dedupe, name resolution, signatures and gc.

These run the library in the test process (and one writer subprocess); nothing here needs
a kernel.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from harness import chunk_files, load_namespace, save_namespace, wait_for

from jupyter_ckpt import image
from jupyter_ckpt.errors import AmbiguousReference, ImageNotFound, IntegrityError
from jupyter_ckpt.store import CHUNK_SIZE, ImageStore, chunk_hash, chunk_path, manifest_path
from jupyter_ckpt.store.signing import Signer

WRITER = """
import sys
import numpy as np
from jupyter_ckpt import image
from jupyter_ckpt.store import ImageStore
store = ImageStore(url=sys.argv[1], secret_file=sys.argv[2], io_threads=1)
ns = {f"a{i}": np.arange(i << 20, (i + 1) << 20, dtype=np.float64) for i in range(64)}
image.capture(ns, ns, store.writer(), name="killed")
print("committed")
"""


def save(store: ImageStore, name: str, **variables: Any) -> dict[str, Any]:
    return save_namespace(store, variables, name)


def stored_chunks(store: ImageStore) -> set[str]:
    return {path for path, *_ in store.backend.walk_files("chunks")}


def test_killed_writer_leaves_no_image(store: ImageStore, tmp_path: Path) -> None:
    """SIGKILL mid-write: no image appears, the store stays usable, gc takes the orphans."""
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, store.root_url, store.signer.secret_file],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(
            lambda: (
                any(not p.rsplit("/", 1)[-1].startswith(".tmp") for p in stored_chunks(store))
                or writer.poll() is not None
            ),
            timeout=120,
            what="the writer's first chunk",
        )
        writer.send_signal(signal.SIGKILL)
        out, _ = writer.communicate(timeout=30)
    finally:
        if writer.poll() is None:
            writer.kill()
    assert writer.returncode == -signal.SIGKILL and "committed" not in out
    orphans = stored_chunks(store)
    assert orphans, "the writer had started writing chunks"
    assert store.image_ids() == [] and list(store.iter_manifests()) == []
    assert not os.path.exists(os.path.join(store.backend.root, "images"))

    fresh = np.arange(3 << 20, dtype=np.float64) + 0.5  # shares no chunk with the orphans
    manifest = save(store, "after", x=fresh, y=[1, 2])
    assert [(i, e) for i, _, e in store.iter_manifests()] == [(manifest["id"], None)]
    assert tuple(store.gc()) == (0, 0), "young chunks may belong to a writer still running"
    removed, freed = store.gc(grace_seconds=0)
    assert removed > 0 and freed > 0
    assert stored_chunks(store) == chunk_files(manifest)
    restored = load_namespace(store, "after")
    assert np.array_equal(restored["x"], fresh)
    assert restored["y"] == [1, 2]


def test_second_save_writes_only_changed_chunks(store: ImageStore) -> None:
    big = np.arange(8 * CHUNK_SIZE // 8, dtype=np.float64)  # 8 chunks
    first = save(store, "d", big=big, note="v1")
    assert first["sizes"]["written"] == first["sizes"]["logical"] >= big.nbytes
    big[CHUNK_SIZE // 8 * 3 + 5] = -1.0  # inside the fourth chunk only
    second = save(store, "d", big=big, note="v1")
    new = chunk_files(second) - chunk_files(first)
    assert len(new) == 1, "only the chunk holding the changed element is new"
    assert second["sizes"]["written"] == CHUNK_SIZE
    assert second["sizes"]["logical"] == first["sizes"]["logical"]
    assert load_namespace(store, second["id"])["big"][CHUNK_SIZE // 8 * 3 + 5] == -1.0


def test_identical_save_writes_nothing(store: ImageStore) -> None:
    state = {"a": np.ones(3 << 20), "b": "text"}
    save(store, "same", **state)
    again = save(store, "same", **state)
    assert again["sizes"]["written"] == 0 < again["sizes"]["logical"]


def test_a_save_of_the_newest_images_state_commits_no_image(store: ImageStore) -> None:
    """Given the newest image, a save of the same state returns it and commits nothing.
    A state whose variables keep their facts (type, shape, preview) is still a new state
    when their bytes changed: one element in the middle of an array (a new chunk), or
    two arrays swapped (every chunk is in the store already): the comparison goes by
    where each variable's bytes are, not by the variables' facts."""
    namespace: dict[str, Any] = {"a": np.ones(3 << 20), "b": np.zeros(3 << 20), "w": 3}

    def capture(newest: dict[str, Any] | None) -> dict[str, Any]:
        return image.capture(
            dict(namespace), namespace, store.writer(), name="n", newest=newest, trigger="idle"
        )

    first = capture(None)
    assert first["trigger"] == "idle" and "unchanged" not in first
    again = capture(store.open(first["id"]))
    assert again["id"] == first["id"] and again["unchanged"]
    assert store.image_ids() == [first["id"]]
    namespace["a"][1 << 20] = 2.0
    changed = capture(store.open(first["id"]))
    assert changed["id"] != first["id"] and "unchanged" not in changed
    assert sorted(store.image_ids()) == sorted([first["id"], changed["id"]])
    assert load_namespace(store, changed["id"])["a"][1 << 20] == 2.0
    namespace["a"], namespace["b"] = namespace["b"], namespace["a"]
    swapped = capture(store.open(changed["id"]))
    assert swapped["id"] not in (first["id"], changed["id"]) and "unchanged" not in swapped
    assert swapped["sizes"]["written"] == 0, "the swap's chunks were all in the store"
    assert load_namespace(store, swapped["id"])["b"][1 << 20] == 2.0


def test_repeated_chunks_in_one_image_written_once(store: ImageStore) -> None:
    """16 equal chunks (zeros) are one file and count once in 'written'."""
    manifest = save(store, "zeros", z=np.zeros(16 * CHUNK_SIZE, dtype=np.uint8))
    assert len(chunk_files(manifest)) == 2  # the zero chunk and the packed pickles
    pack = sum(s["size"] for s in manifest["segments"]) - 16 * CHUNK_SIZE
    assert manifest["sizes"]["written"] == CHUNK_SIZE + pack
    assert stored_chunks(store) == chunk_files(manifest)
    assert not load_namespace(store, "zeros")["z"].any()


def test_gc_spares_old_chunks_a_writer_reuses(store: ImageStore) -> None:
    """A writer deduping onto chunks of a deleted image must not lose them to a gc that runs
    before its manifest lands."""
    data = np.arange(2 * CHUNK_SIZE // 8, dtype=np.float64)
    save(store, "old", data=data)
    store.delete("old")
    orphans = stored_chunks(store)
    hours_ago = time.time() - 7200
    for path in orphans:
        os.utime(Path(store.backend.root, path), (hours_ago, hours_ago))

    raw = memoryview(data).cast("B")
    reused = {
        chunk_path(chunk_hash(raw[i : i + CHUNK_SIZE])) for i in range(0, len(raw), CHUNK_SIZE)
    }
    assert reused < orphans
    writer = store.writer()
    writer.add_segment(raw)  # the same bytes again: its chunks exist and are reused
    wait_for(
        lambda: all(store.backend.mtime(p) > hours_ago + 1 for p in reused),
        timeout=30,
        what="the writer to mark the chunks it reuses",
    )
    # default grace, as retention runs it at any time: the writer's lease keeps them all
    during = store.gc()
    assert tuple(during) == (0, 0) and "in progress" in during.notes[0]
    manifest = writer.commit({"name": "new", "variables": [], "imports": [], "groups": []})
    assert store.verify(manifest["id"])["id"] == manifest["id"]
    assert store.gc()[0] == len(orphans - reused) == 1, "only the old pickle chunk goes"


def test_gc_keeps_unreferenced_chunks_younger_than_its_grace(store: ImageStore) -> None:
    """With no lease to go by (a writer on another node whose lease is lost), the grace
    period alone must keep chunks a manifest may still come to name."""
    save(store, "old", data=np.arange(2 * CHUNK_SIZE // 8, dtype=np.float64))
    store.delete("old")
    orphans = stored_chunks(store)
    assert orphans and not store.backend.listdir("leases")
    assert tuple(store.gc(grace_seconds=3600)) == (0, 0)
    assert stored_chunks(store) == orphans
    hours_ago = time.time() - 7200
    for path in orphans:
        os.utime(Path(store.backend.root, path), (hours_ago, hours_ago))
    assert store.gc(grace_seconds=3600)[0] == len(orphans)
    assert stored_chunks(store) == set()


# -- resolve ------------------------------------------------------------------------------


def save_as(store: ImageStore, name: str, image_id: str | None = None) -> str:
    writer = store.writer()
    if image_id:
        writer.image_id = image_id
    return image.capture({"v": name}, {}, writer, name=name)["id"]


def test_resolve_name_id_and_prefix(store: ImageStore) -> None:
    old = save_as(store, "alpha")
    new = save_as(store, "alpha")
    beta = save_as(store, "beta")
    assert store.resolve("alpha") == new != old, "a name means its newest image"
    assert store.resolve(old) == old
    assert store.resolve(beta[:8]) == beta
    assert load_namespace(store, "alpha")["v"] == "alpha"
    with pytest.raises(ImageNotFound):
        store.resolve("gamma")
    with pytest.raises(ImageNotFound):
        store.resolve(beta[:3])  # too short to count as a prefix


def test_resolve_ambiguous_prefix(store: ImageStore) -> None:
    one = save_as(store, "one", "abcd1" + "0" * 27)
    save_as(store, "two", "abcd2" + "0" * 27)
    with pytest.raises(AmbiguousReference, match="matches 2 images"):
        store.resolve("abcd")
    assert store.resolve("abcd1") == one
    named = save_as(store, "abcd")
    assert store.resolve("abcd") == named, "a name wins over an id prefix"


def test_delete_then_resolve(store: ImageStore) -> None:
    image_id = save_as(store, "gone")
    assert store.delete("gone") == image_id
    with pytest.raises(ImageNotFound):
        store.resolve(image_id)
    assert list(store.iter_manifests()) == []


# -- signatures ---------------------------------------------------------------------------


def test_signer_round_trip_and_refusals(tmp_path: Path) -> None:
    signer = Signer(str(tmp_path / "a"))
    manifest = {"id": "x", "groups": [{"names": ["é"]}]}
    sealed = signer.seal(manifest)
    assert signer.open(sealed, "here") == manifest
    envelope = json.loads(sealed)
    envelope["manifest"]["groups"][0]["names"] = ["other"]
    with pytest.raises(IntegrityError, match="here: the manifest was altered"):
        signer.open(json.dumps(envelope).encode(), "here")
    with pytest.raises(IntegrityError, match="signed with a different secret"):
        Signer(str(tmp_path / "b")).open(sealed, "here")
    with pytest.raises(IntegrityError, match="not a jupyter-ckpt manifest"):
        signer.open(b"{not json", "here")
    with pytest.raises(IntegrityError, match="unknown image format"):
        signer.open(json.dumps({**json.loads(sealed), "format": "other/9"}).encode(), "here")


def test_manifest_moved_to_another_id_refused(store: ImageStore) -> None:
    """A validly signed manifest replayed under another id is not that image."""
    image_id = save_as(store, "orig")
    other = "e" * 32
    store.backend.write_atomic(
        manifest_path(other), store.backend.read_bytes(manifest_path(image_id))
    )
    with pytest.raises(IntegrityError, match="manifest names another id"):
        store.load_manifest(other)


@pytest.mark.parametrize("where", [0, -1], ids=["the stream", "a large array's data"])
def test_verify_detects_altered_chunk(store: ImageStore, where: int) -> None:
    """Every segment's chunks are checked: the pickle stream's, and those of each large
    buffer (its own segment), down to the last chunk."""
    manifest = save(store, "v", a=np.arange(1 << 20))
    assert store.verify("v")["id"] == manifest["id"]
    assert len(manifest["segments"]) > 1
    digest = manifest["segments"][where]["chunks"][where][0]
    path = Path(store.backend.root, chunk_path(digest))
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=f"chunk {digest} was altered"):
        store.verify("v")


# -- concurrent writers, mutators and gc --------------------------------------------------


def test_array_changed_during_save_never_poisons_a_chunk(store: ImageStore) -> None:
    """A thread writes into the array while it is saved: whatever mix of values the image
    holds, every chunk's bytes match its name, so the image verifies."""
    big = np.zeros(8 * CHUNK_SIZE // 8)
    stop = threading.Event()

    def mutate() -> None:
        step = 0
        while not stop.is_set():
            step += 1
            big[:] = step

    thread = threading.Thread(target=mutate)
    thread.start()
    try:
        manifests = [save(store, f"moving-{i}", big=big) for i in range(2)]
    finally:
        stop.set()
        thread.join()
    for manifest in manifests:
        assert store.verify(manifest["id"])["id"] == manifest["id"]


def test_save_whose_chunks_vanish_fails_and_leaves_no_image(store: ImageStore) -> None:
    """A chunk removed between write and commit (a gc that did not see the writer) makes
    the save fail naming the cause, instead of committing a broken image."""
    data = np.arange(2 * CHUNK_SIZE // 8, dtype=np.float64) + 0.25
    save(store, "gone", data=data)
    store.delete("gone")
    path = chunk_path(chunk_hash(memoryview(data).cast("B")[:CHUNK_SIZE]))
    os.utime(Path(store.backend.root, path), (1, 1))
    writer = store.writer()
    writer.add_segment(memoryview(data).cast("B"))  # reuses the old chunks
    wait_for(lambda: store.backend.mtime(path) > 1, timeout=30, what="the chunk's reuse")
    store.backend.remove(path)
    with pytest.raises(IntegrityError, match="vanished"):
        writer.commit({"name": "broken", "variables": [], "imports": [], "groups": []})
    assert store.image_ids() == []


def test_a_record_unreadable_under_this_secret_keeps_every_image(tmp_path: Path) -> None:
    """A kernel record encrypted under another secret (a rekey that has not reached it
    yet) may name any image: retention removes none while it is there, and says why."""
    url = str(tmp_path / "store")
    new = ImageStore(url=url, secret_file=str(tmp_path / "new"), max_images=1)
    kept = save(new, "suspended-on", x=1)
    old = ImageStore(url=url, secret_file=str(tmp_path / "old"), encryption="aes-256-gcm")
    old.records.put({"kernel_id": "k-1", "kernel_name": "python3", "image_id": kept["id"]})
    newer = save(new, "newer", y=2)
    pins = new.records.pins()
    assert set(pins.unknown) == {"k-1"} and pins.note(), pins
    removed, _, _ = new.enforce_retention(collect=None)
    assert removed == []
    assert {kept["id"], newer["id"]} <= set(new.image_ids())
