"""Retention: age, count and quota limits; shared chunks; pinned images are never removed."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from server_helpers import start_session

from jupyter_ckpt.store import ImageStore
from jupyter_ckpt.store.records import KernelRecords

DAY = 86400
NOW = datetime(2026, 11, 29, tzinfo=timezone.utc)


@pytest.fixture
def store(tmp_path: Any) -> ImageStore:
    return ImageStore(url=str(tmp_path / "store"), secret_file=str(tmp_path / "secret"))


def write_image(store: ImageStore, days_old: float, data: bytes) -> str:
    writer = store.writer()
    writer.add_segment(data)
    created = (NOW - timedelta(days=days_old)).isoformat()
    manifest = {"name": f"img-{days_old}", "created": created, "variables": []}
    return writer.commit(manifest)["id"]


def chunk_count(store: ImageStore) -> int:
    return sum(1 for _ in store.backend.walk_files("chunks"))


def test_age_and_count_limits_keep_the_newest(store):
    old, mid, new = (write_image(store, d, bytes([d]) * 1000) for d in (40, 10, 1))
    store.retention_days = 30
    assert store.expired(set(), NOW.timestamp()) == [old]
    store.max_images = 1
    assert store.expired(set(), NOW.timestamp()) == [old, mid]
    removed, _, freed = store.enforce_retention(NOW.timestamp(), grace_seconds=0)
    assert (removed, freed) == ([old, mid], 2000)
    assert store.image_ids() == [new] and chunk_count(store) == 1


def test_quota_counts_shared_chunks_once_and_spares_pinned_images(store):
    shared = b"s" * 3000
    pinned = write_image(store, 9, shared)
    second = write_image(store, 8, shared)  # same bytes: no new chunk
    third = write_image(store, 7, b"t" * 3000)
    store.quota_bytes = 6000
    assert store.expired(set(), NOW.timestamp()) == []
    store.quota_bytes = 3500
    assert store.expired(set(), NOW.timestamp()) == [pinned, second]
    KernelRecords(store).put({"kernel_id": "k-1", "image_id": pinned})
    removed, _, _ = store.enforce_retention(NOW.timestamp(), grace_seconds=0)
    assert removed == [second, third]
    assert store.image_ids() == [pinned] and chunk_count(store) == 1


def test_recent_chunks_without_a_manifest_survive_gc(store):
    write_image(store, 1, b"x" * 100)
    store.max_images = 1
    store.backend.write_atomic("chunks/ab/" + "ab" * 32, b"being written")
    store.enforce_retention(NOW.timestamp())
    assert chunk_count(store) == 2, "a writer in flight keeps its chunks"


@pytest.fixture
def jp_server_config(jp_server_config: dict[str, Any]) -> dict[str, Any]:
    return {**jp_server_config, "ImageStore": {"max_images": 1}}


async def test_the_server_enforces_max_images_after_each_write(jp_fetch, connect, manager):
    _, kernel_id = await start_session(jp_fetch)
    await (await connect(kernel_id)).execute("v = 1")
    for name in ("first", "second"):
        body = json.dumps({"name": name})
        await jp_fetch("api", "ckpt", "kernels", kernel_id, "checkpoint", method="POST", body=body)
    images = json.loads((await jp_fetch("api", "ckpt", "images")).body)
    assert [i["name"] for i in images] == ["second"]
