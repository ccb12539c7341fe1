"""A store on an S3-compatible object store (moto's server on loopback), through fsspec:
the same image semantics as a local directory (round trip, dedupe, verification, gc),
and kernels that find the store and its endpoint through the environment alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from harness import (
    Kernel,
    S3Paths,
    chunk_files,
    load_namespace,
    restore_and_list,
    save_namespace,
)

from jupyter_ckpt.errors import IntegrityError
from jupyter_ckpt.store import CHUNK_SIZE, ImageStore, chunk_hash, chunk_path


def test_round_trip_dedupe_and_gc(s3_store: ImageStore) -> None:
    big = np.random.default_rng(1).random(3_000_000)  # 24 MB: six 4 MiB chunks
    namespace: dict[str, Any] = {"big": big, "view": big[10:20], "meta": {"run": 7}}
    first = save_namespace(s3_store, namespace, name="on-s3")

    back = load_namespace(s3_store, "on-s3")
    np.testing.assert_array_equal(back["big"], big)
    assert np.shares_memory(back["view"], back["big"])
    assert back["meta"] == {"run": 7}

    big[:1000] += 1  # one chunk changes
    second = save_namespace(s3_store, namespace, name="on-s3")
    assert second["sizes"]["written"] < first["sizes"]["written"] / 4
    assert s3_store.resolve("on-s3") == second["id"]

    only_first = chunk_files(first) - chunk_files(second)
    sizes = {p: len(s3_store.backend.read_bytes(p)) for p in only_first}
    assert only_first, "the changed chunk and the first pickle are the first image's alone"
    s3_store.delete(first["id"])
    removed, freed = s3_store.gc(grace_seconds=0)
    assert (removed, freed) == (len(only_first), sum(sizes.values()))
    assert not any(s3_store.backend.exists(p) for p in only_first)
    assert all(s3_store.backend.exists(p) for p in chunk_files(second))
    assert s3_store.verify("on-s3")["id"] == second["id"]


def test_altered_chunk_is_refused(s3_store: ImageStore) -> None:
    manifest = save_namespace(s3_store, {"x": np.arange(1_000_000)}, name="tamper")
    digest = manifest["segments"][0]["chunks"][0][0]
    data = bytearray(s3_store.backend.read_bytes(chunk_path(digest)))
    data[100] ^= 0xFF
    s3_store.backend.write_atomic(chunk_path(digest), bytes(data))
    with pytest.raises(IntegrityError, match="altered"):
        s3_store.verify("tamper")


def test_kernels_save_and_restore_through_s3(endpoint: str, tmp_path: Path) -> None:
    paths = S3Paths(tmp_path, endpoint)
    writer, reader = Kernel(paths), None
    try:
        writer.run("%load_ext jupyter_ckpt")
        writer.run("import numpy as np\nw = np.linspace(0, 1, 500_000)\nlabel = 'remote'")
        assert "Saved" in writer.ckpt("save remote-run")
        writer.shutdown()

        reader = Kernel(paths)
        reader.run("%load_ext jupyter_ckpt")
        out, names = restore_and_list(reader, "remote-run")
        assert out.startswith("Restored 3 variables") and names == {"np", "w", "label"}
        assert reader.eval("[label, float(w[-1]), len(w)]") == ["remote", 1.0, 500_000]
    finally:
        for kernel in (writer, reader):
            if kernel is not None and kernel.manager.has_kernel:
                kernel.shutdown()


def test_gc_does_not_take_chunks_a_writer_is_reusing(s3_store: ImageStore) -> None:
    """An object store cannot refresh a reused chunk's age: the writer's lease keeps a
    concurrent gc (another process's, with no grace at all) from removing it."""
    data = np.random.default_rng(5).random(1 << 20)
    save_namespace(s3_store, {"data": data}, name="first")
    s3_store.delete("first")  # its chunks are now unreferenced, and reused below
    raw = memoryview(data).cast("B")
    writer = s3_store.writer()
    writer.add_segment(raw)
    for future in writer._segments[0][1]:  # every chunk has been found and reused
        future.result()
    digest = chunk_hash(raw[:CHUNK_SIZE])
    other = ImageStore(  # another process's view of the same store, same user
        url=s3_store.url,
        secret_file=s3_store.signer.secret_file,
        storage_options=s3_store.storage_options,
    )
    result = other.gc(grace_seconds=0)
    manifest = writer.commit({"name": "second", "variables": [], "imports": [], "groups": []})
    assert s3_store.backend.exists(chunk_path(digest))
    assert s3_store.verify(manifest["id"])["id"] == manifest["id"]
    assert result.files == 0 and "in progress" in result.notes[0]
    assert other.gc(grace_seconds=0).files >= 1, "the pickle chunk of 'first' goes after"
