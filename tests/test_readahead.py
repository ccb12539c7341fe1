"""Reading ahead while a restored kernel starts: the server names the files the restore
reads, and the kernel copies from the page cache what it holds instead of reading it again."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from jupyter_ckpt_server.readahead import image_files, readahead

from jupyter_ckpt import image
from jupyter_ckpt.store import ImageStore, mapping
from jupyter_ckpt.store.backends import LocalBackend
from jupyter_ckpt.store.reading import allocate

MiB = 1 << 20


def evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def test_a_chunk_the_page_cache_holds_is_copied_from_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = LocalBackend(str(tmp_path))
    data = np.random.default_rng(0).bytes(4 * MiB)
    backend.write_atomic("chunk", data)
    direct: list[str] = []
    read_direct = LocalBackend._read_direct
    monkeypatch.setattr(
        LocalBackend,
        "_read_direct",
        staticmethod(lambda f, o: direct.append(f) or read_direct(f, o)),
    )
    out = allocate(len(data))
    os.sync()
    with open(tmp_path / "chunk", "rb") as f:
        f.read()  # cached now
    assert backend.read_into("chunk", out) == len(data) and bytes(out) == data
    assert not direct, "read again from the disk"
    evict(tmp_path / "chunk")
    out = allocate(len(data))
    assert backend.read_into("chunk", out) == len(data) and bytes(out) == data
    if backend.direct_io:  # file systems without O_DIRECT read through the cache anyway
        assert direct


def test_the_server_reads_ahead_the_pickles_and_small_buffers_not_large_ones(
    store: ImageStore,
) -> None:
    big = np.random.default_rng(0).random((mapping.MAP_MIN_BYTES + MiB) // 8)
    ns: dict[str, Any] = {"big": big, "small": np.arange(10)}
    manifest = image.capture(dict(ns), ns, store.writer(), name="ahead")
    root = Path(store.backend.url)
    every = {str(p) for p in root.glob("chunks/*/*")}
    read = set(image_files(store, manifest))
    assert read and read < every  # the pickle stream's and the small buffers', not big's
    big_chunks = len(manifest["segments"][mapping.large_buffers(manifest).pop()]["chunks"])
    assert len(every - read) == big_chunks
    assert readahead(store, manifest) > len(read)  # and numpy's and jupyter_ckpt's files
