"""Counting the bytes of an image as the I/O threads write or read its chunks, for the
server's progress events."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from jupyter_ckpt import image
from jupyter_ckpt.store import CHUNK_SIZE, ImageStore
from jupyter_ckpt.store.progress import Progress, read_progress

ARRAYS = 5 * CHUNK_SIZE + 123  # several chunks, the last one partial


class Recorded(Progress):
    """A progress file that also remembers every value it published."""

    def __init__(self, path: Path, interval: float = 0) -> None:
        super().__init__(str(path), interval)
        self.published: list[tuple[int, int]] = []

    def _publish(self) -> None:
        super()._publish()
        self.published.append((self.done, self.total))


def namespace() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    return {
        "a": rng.integers(0, 255, ARRAYS - 4000, dtype=np.uint8),
        "b": np.arange(500, dtype=np.float64),
        "label": "text",
    }


def assert_counts_up_to(published: list[tuple[int, int]], logical: int) -> None:
    done = [d for d, _ in published]
    assert done == sorted(done), "bytes done never go back"
    assert len(set(done)) > 2, "progress is published while chunks are moved, not only at the end"
    assert all(d <= t for d, t in published)
    assert published[-1] == (logical, logical)


def test_a_save_counts_written_bytes_against_the_estimate(
    store: ImageStore, tmp_path: Path
) -> None:
    progress = Recorded(tmp_path / "save.json")
    ns = namespace()
    manifest = image.capture(ns, ns, store.writer(progress), name="p")
    logical = manifest["sizes"]["logical"]
    assert_counts_up_to(progress.published, logical)
    # the estimate covers the arrays before their chunks are done
    assert progress.published[0][1] >= ns["a"].nbytes + ns["b"].nbytes
    assert read_progress(str(tmp_path / "save.json")) == (logical, logical)
    assert not (tmp_path / "save.json.part").exists()


def test_a_restore_counts_read_bytes_of_the_stored_size(store: ImageStore, tmp_path: Path) -> None:
    store.map_buffers = False  # read chunk by chunk (a mapped buffer counts at once)
    ns = namespace()
    manifest = image.capture(ns, ns, store.writer(), name="p")
    logical = manifest["sizes"]["logical"]
    progress = Recorded(tmp_path / "restore.json")
    segments = store.read_segments(manifest, progress)
    assert progress.total == logical, "the total is known before anything is read"
    restored: dict[str, Any] = {}
    image.restore(manifest, segments, restored)
    progress.finish()
    assert np.array_equal(restored["a"], ns["a"])
    assert_counts_up_to(progress.published, logical)
    assert json.loads((tmp_path / "restore.json").read_text()) == {
        "done": logical,
        "total": logical,
    }


def test_writes_are_throttled(store: ImageStore, tmp_path: Path) -> None:
    """Only the first chunk and the end are published within one interval."""
    progress = Recorded(tmp_path / "save.json", interval=3600)
    ns = namespace()
    manifest = image.capture(ns, ns, store.writer(progress), name="p")
    assert len(progress.published) == 2
    assert progress.published[-1] == (manifest["sizes"]["logical"],) * 2


def test_a_file_that_cannot_be_written_does_not_stop_the_save(
    store: ImageStore, tmp_path: Path
) -> None:
    """A kernel that does not share the server's file system saves without progress."""
    path = tmp_path / "absent" / "save.json"
    ns = namespace()
    manifest = image.capture(ns, ns, store.writer(Progress(str(path))), name="p")
    assert store.open(manifest["id"])["id"] == manifest["id"]
    assert not path.exists() and read_progress(str(path)) is None
