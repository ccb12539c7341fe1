"""Listing a store with history: the signed index is used, and never trusted blindly.

Reads are counted through a backend that records every call (on S3 each is a request),
so these check how much a listing reads, not how long it takes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from harness import counting, save_namespace

from jupyter_ckpt.errors import ImageNotFound, IntegrityError
from jupyter_ckpt.kernel.state import compact_history, expand_history
from jupyter_ckpt.store import ImageStore, manifest_path
from jupyter_ckpt.store.index import INDEX
from jupyter_ckpt.store.signing import Signer


def save(store: ImageStore, name: str, value: int) -> dict[str, Any]:
    return save_namespace(store, {"x": [value]}, name)


def twin(store: ImageStore) -> ImageStore:
    """The same user's store as another process sees it: nothing cached in memory."""
    return ImageStore(
        url=store.url,
        user=store.user,
        secret_file=store.secret_file,
        storage_options=store.storage_options,
        index_slack=store.index_slack,
    )


def listed(store: ImageStore) -> dict[str, str | None]:
    """name (or the error, for an image that fails to load) by image id."""
    return {i: m["name"] if m else e for i, m, e in store.iter_manifests()}


@pytest.fixture(autouse=True)
def strict(request: pytest.FixtureRequest) -> None:
    """Every new manifest goes into the index at once, unless a test says otherwise."""
    for name in ("store", "s3_store"):
        if name in request.fixturenames:
            request.getfixturevalue(name).index_slack = 0


def test_a_fresh_listing_reads_the_index_not_every_manifest(store: ImageStore) -> None:
    ids = [save(store, f"n{i}", i)["id"] for i in range(4)]
    listed(store)  # the first listing writes the index

    other = twin(store)
    calls = counting(other)
    assert listed(other) == {i: f"n{n}" for n, i in enumerate(ids)}
    assert calls.count("read_bytes", "manifest.json") == 0
    assert calls.count("read_bytes", INDEX) == 1
    assert other.resolve("n2") == ids[2]
    other.max_images = 2
    assert other.expired(set()) == ids[:2], "retention decides from the index"
    assert calls.count("read_bytes") == 1, "later listings are answered from memory"
    assert other.open("n3")["id"] == ids[3], "loading an image still reads its manifest"


def test_images_another_process_adds_or_deletes_show_up(store: ImageStore) -> None:
    first = save(store, "first", 1)
    listed(store)
    other = twin(store)
    second = save(other, "second", 2)

    calls = counting(store)
    assert listed(store) == {first["id"]: "first", second["id"]: "second"}
    assert calls.count("read_bytes", "manifest.json") == 1, "only the new manifest is read"
    other.delete("first")
    assert listed(store) == {second["id"]: "second"}
    with pytest.raises(ImageNotFound):
        store.resolve("first")


def test_a_tampered_index_is_ignored(store: ImageStore) -> None:
    real = {save(store, name, n)["id"]: name for n, name in enumerate(["a", "b"])}
    listed(store)
    path = Path(store.backend.root, INDEX)
    envelope = json.loads(path.read_bytes())
    entries = envelope["manifest"]["entries"]
    a_id = next(i for i, name in real.items() if name == "a")
    entries[a_id][1]["name"] = "renamed"
    fingerprint, forged = entries[a_id]
    entries["f" * 32] = [fingerprint, {**forged, "id": "f" * 32, "name": "ghost"}]
    path.write_text(json.dumps(envelope))

    other = twin(store)
    calls = counting(other)
    assert listed(other) == real, "no forged image, no forged name, none hidden"
    assert calls.count("read_bytes", "manifest.json") == 2, "the manifests were read instead"
    for ref in ("ghost", "renamed"):
        with pytest.raises(ImageNotFound):
            other.resolve(ref)
    calls = counting(twin(store))
    assert listed(store) == real
    assert calls.count("read_bytes", "manifest.json") == 0, "the index was written anew"


def test_a_stale_or_replayed_index_neither_hides_nor_revives(
    store: ImageStore, tmp_path: Path
) -> None:
    old = save(store, "old", 1)
    listed(store)
    replay = Path(store.backend.root, INDEX).read_bytes()  # genuine, signed, out of date
    new = save(store, "new", 2)
    store.delete("old")
    listed(store)
    Path(store.backend.root, INDEX).write_bytes(replay)

    other = twin(store)
    assert listed(other) == {new["id"]: "new"}
    with pytest.raises(ImageNotFound):
        other.resolve(old["id"][:8])

    # A manifest replaced under a current index is read again, not vouched for by it.
    foreign = Signer(str(tmp_path / "someone-else")).seal(store.open("new"))
    store.backend.write_atomic(manifest_path(new["id"]), foreign)
    assert "different secret" in str(listed(twin(store))[new["id"]])
    with pytest.raises(IntegrityError, match="refusing to delete"):
        twin(store).delete(new["id"])


def test_listing_on_s3_makes_a_bounded_number_of_requests(s3_store: ImageStore) -> None:
    ids = {save(s3_store, f"s{i}", i)["id"] for i in range(3)}
    listed(s3_store)

    warm = twin(s3_store)
    listed(warm)
    calls = counting(warm)
    assert set(listed(warm)) == ids
    assert calls.calls == [("fingerprints", "images")], "a second listing: one LIST only"
    fresh = twin(s3_store)
    calls = counting(fresh)
    assert set(listed(fresh)) == ids
    assert sorted(m for m, _ in calls.calls) == ["fingerprints", "read_bytes"]

    ids |= {save(s3_store, f"t{i}", i)["id"] for i in range(3)}
    calls = counting(fresh)
    assert set(listed(fresh)) == ids
    assert calls.count("read_bytes", "manifest.json") == 3, "only the new manifests"
    assert calls.count("write_atomic", INDEX) == 1


def test_the_index_is_rewritten_once_it_misses_more_than_the_slack(store: ImageStore) -> None:
    store.index_slack = 2
    for n in range(3):
        save(store, f"a{n}", n)
    listed(store)  # three unseen manifests: more than the slack, so the index is written
    for n in range(2):
        save(store, f"b{n}", n)

    fresh = twin(store)
    calls = counting(fresh)
    assert len(listed(fresh)) == 5
    assert calls.count("read_bytes", INDEX) == 1
    assert calls.count("read_bytes", "manifest.json") == 2
    assert calls.count("write_atomic", INDEX) == 0, "two missing entries are within the slack"

    c = save(store, "c", 0)
    calls = counting(fresh)
    assert len(listed(fresh)) == 6
    assert calls.calls[1:] == [("read_bytes", manifest_path(c["id"]))], "only the new one"
    calls = counting(newer := twin(store))
    assert len(listed(newer)) == 6
    assert calls.count("read_bytes", "manifest.json") == 3
    assert calls.count("write_atomic", INDEX) == 1, "three missing entries: rewritten"


def test_retention_after_a_save_does_not_walk_the_chunks(store: ImageStore) -> None:
    save(store, "a", 1)
    store.enforce_retention(collect=None)  # the first one collects
    save(store, "b", 2)
    calls = counting(store)
    store.enforce_retention(collect=None)
    assert calls.count("walk_files", "chunks") == 0
    store.enforce_retention()
    assert calls.count("walk_files", "chunks") == 1, "an explicit gc always collects"
    store.gc_interval = 0
    store.enforce_retention(collect=None)
    assert calls.count("walk_files", "chunks") == 2, "and retention does once it is due"


@pytest.mark.parametrize(
    "raw, parsed",
    [
        (
            ["", "x = 1", "%time y = 2", "!ls"],
            [
                "",
                "x = 1",
                "get_ipython().run_line_magic('time', 'y = 2')",
                "get_ipython().system('ls')",
            ],
        ),
        ([], []),
        (["", "a"], ["", "a", "b"]),
    ],
)
def test_input_history_is_stored_once(raw: list[str], parsed: list[str]) -> None:
    stored = compact_history(raw, parsed)
    assert expand_history(stored) == (raw, parsed)
    assert "x = 1" not in json.dumps(stored["parsed_changes"]), "a plain cell is kept once"
    assert expand_history({"raw": raw, "parsed": parsed}) == (raw, parsed), "older images"
