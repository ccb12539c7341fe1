"""Suspended-kernel records: signed, atomic, refused when altered or misnamed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jupyter_ckpt.errors import ImageNotFound, InvalidReference
from jupyter_ckpt.store import ImageStore
from jupyter_ckpt.store.records import KernelRecords

KID = "0b0c1d2e-0000-4000-8000-000000000001"


@pytest.fixture
def records(tmp_path):
    store = ImageStore(url=str(tmp_path / "store"), secret_file=str(tmp_path / "secret"))
    return KernelRecords(store)


def test_put_get_all_delete(records):
    records.put({"kernel_id": KID, "image_id": "a" * 32})
    assert records.get(KID)["image_id"] == "a" * 32
    assert records.all() == ({KID: {"kernel_id": KID, "image_id": "a" * 32}}, {})
    assert records.pinned_images() == {"a" * 32}
    records.delete(KID)
    with pytest.raises(ImageNotFound):
        records.get(KID)


def test_altered_or_misnamed_records_are_refused(records, tmp_path):
    records.put({"kernel_id": KID, "image_id": "a" * 32})
    kernels = Path(records.store.backend.root, "kernels")  # the user's part of the store
    path = kernels / f"{KID}.json"
    sealed = json.loads(path.read_text())
    sealed["manifest"]["image_id"] = "b" * 32
    path.write_text(json.dumps(sealed))
    other = "0b0c1d2e-0000-4000-8000-000000000002"
    records.put({"kernel_id": KID, "image_id": "c" * 32})
    (kernels / f"{other}.json").write_bytes(path.read_bytes())
    path.write_text(json.dumps(sealed))
    found, errors = records.all()
    assert found == {}
    assert "altered" in errors[KID] and "names another kernel" in errors[other]


def test_kernel_ids_cannot_name_paths(records):
    with pytest.raises(InvalidReference):
        records.get("../images")


def test_image_summary_names_the_gpu_and_the_bytes_held_there() -> None:
    from jupyter_ckpt_server.service import image_summary

    manifest = {
        "id": "f" * 32, "name": "n", "created": "2026-01-01T00:00:00+00:00",
        "devices": ["cpu", "cuda:1"],
        "gpu": {"gpus": [{"index": 0, "name": "A100"}, {"index": 1, "name": "H100"}]},
        "variables": [
            {"name": "w", "status": "saved", "bytes": 4096, "devices": ["cuda:1"]},
            {"name": "x", "status": "saved", "bytes": 10, "devices": ["cpu"]},
        ],
    }  # fmt: skip
    assert image_summary(manifest)["gpu"] == {"model": "H100", "memory_bytes": 4096}
    assert image_summary({**manifest, "devices": ["cpu"]})["gpu"] is None
