"""The store while it fails: S3 down or flapping (moto's server behind a forwarder that
stops and starts), a read-only mount, a rekey stopped halfway. Every failure is one line
that names the store and what to do, and nothing a user saved is lost."""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from harness import (
    BUCKET,
    CREDENTIALS,
    S3_TIMEOUTS,
    CountingBackend,
    Kernel,
    Outage,
    Paths,
    S3Paths,
    load_namespace,
    save_namespace,
)

from jupyter_ckpt.errors import ImageInUse, IntegrityError, StoreReadOnly, StoreUnavailable
from jupyter_ckpt.store import ImageStore

KID = "0b1c2d3e-aaaa-bbbb-cccc-000000000001"


def unreachable(url: str) -> re.Pattern[str]:
    """The one line every operation on a store that does not answer fails with."""
    return re.compile(
        rf"cannot reach the store {re.escape(url)} \([^\n]+\); check that it is up and "
        r"reachable from here \(endpoint, network, credentials\), then try again"
    )


def refused_read_only(url: str) -> re.Pattern[str]:
    return re.compile(
        rf"the store {re.escape(url)} is read-only \([^\n]+\): images can be listed, shown, "
        r"verified and restored, but not saved or removed; mount it writable, or save to "
        r"another store \(ImageStore\.url\)"
    )


def s3(endpoint: str, directory: Path, **traits: Any) -> ImageStore:
    """A store on the S3 server at ``endpoint`` with short timeouts: a server that is down
    shows as an error within a second."""
    return ImageStore(
        url=f"s3://{BUCKET}/{directory.name}",
        secret_file=str(directory / "secret"),
        storage_options={
            "endpoint_url": endpoint,
            **CREDENTIALS,
            **S3_TIMEOUTS,
            "use_listings_cache": False,
        },
        **traits,
    )


def pin(store: ImageStore, image_id: str, kernel_id: str = KID) -> None:
    """Write the record of a suspended kernel that needs ``image_id``."""
    store.records.put(
        {"kernel_id": kernel_id, "kernel_name": "python3", "image_id": image_id, "env": {}}
    )


def store_operations(store: ImageStore, ref: str) -> dict[str, Callable[[], object]]:
    """Everything a user or the server does with a store, by name."""
    return {
        "list": lambda: list(store.iter_manifests()),
        "show": lambda: store.open(ref),
        "verify": lambda: store.verify(ref),
        "restore": lambda: load_namespace(store, ref),
        "save": lambda: save_namespace(store, {"y": np.arange(10)}, name="during"),
        "delete": lambda: store.delete(ref),
        "retention": lambda: store.enforce_retention(grace_seconds=0),
        "records": lambda: store.records.all(),
        "rekey": lambda: list(store.rekey()),
    }


def test_every_operation_on_a_stopped_s3_server_fails_with_one_line(
    outage: Outage, tmp_path: Path
) -> None:
    store = s3(outage.url, tmp_path)
    before = save_namespace(store, {"x": np.arange(100_000)}, name="before")
    pin(store, before["id"])

    outage.stop()
    for what, operation in store_operations(store, "before").items():
        with pytest.raises(StoreUnavailable) as failed:
            operation()
        assert unreachable(store.backend.url).fullmatch(str(failed.value)), (what, failed.value)
    outage.start()

    assert store.verify("before")["id"] == before["id"]
    assert store.records.pinned_images() == {before["id"]}
    assert [m["name"] for _, m, _ in store.iter_manifests()] == ["before"]


def test_flapping_s3_loses_nothing_and_every_failure_is_one_line(
    outage: Outage, tmp_path: Path
) -> None:
    """Saves, listings, restores and retention (keep 2 images) while the server is up,
    down, or stops in the middle of them (in turn, so each operation meets each case):
    each succeeds or says the store is unreachable. Afterwards the pinned image and the
    newest images are there and whole: no half-written image, nothing lost but what
    retention removes."""
    store = s3(outage.url, tmp_path, max_images=2)
    pinned = save_namespace(store, {"kept": np.arange(50_000)}, name="pinned")
    pin(store, pinned["id"])
    saved: list[int] = []  # the saves reported done, in order
    outcomes = {"ok": 0, "failed": 0}
    cases = itertools.cycle(("up", "down", "cut"))  # cut: the server stops mid-operation
    try:
        for i in range(4):
            operations: dict[str, Callable[[], object]] = {
                "save": lambda i=i: saved.append(
                    save_namespace(store, {"v": np.full(20_000, i)}, name=f"s{i}") and i
                ),
                "list": lambda: list(store.iter_manifests()),
                "restore": lambda: load_namespace(store, "pinned"),
                "retention": lambda: store.enforce_retention(grace_seconds=0),
            }
            for what, operation in operations.items():
                case = next(cases)
                outage.stop() if case == "down" else outage.start()
                cut = threading.Timer(0.02, outage.stop)
                if case == "cut":
                    cut.start()
                try:
                    operation()
                    outcomes["ok"] += 1
                except StoreUnavailable as exc:
                    assert unreachable(store.backend.url).fullmatch(str(exc)), (what, exc)
                    outcomes["failed"] += 1
                finally:
                    cut.cancel()
                    if case == "cut":
                        cut.join()
    finally:
        outage.start()

    assert outcomes["ok"] and outcomes["failed"], outcomes
    store.enforce_retention(grace_seconds=0)
    entries = list(store.iter_manifests())
    assert all(m is not None for _, m, _ in entries), entries
    assert load_namespace(store, "pinned")["kept"].sum() == np.arange(50_000).sum()
    present = {int(m["name"][1:]): i for i, m, _ in entries if i != pinned["id"]}
    assert 0 < len(present) <= 2, entries
    # the last save reported done is there, unless retention made room for newer ones
    # (saves that wrote their image but lost the answer)
    assert saved[-1] in present or (len(present) == 2 and min(present) > saved[-1]), (
        saved,
        present,
    )
    for value, image_id in present.items():
        assert (load_namespace(store, image_id)["v"] == value).all()


# -- a read-only store ---------------------------------------------------------------------


def test_percent_ckpt_says_in_one_line_that_s3_is_down(
    outage: Outage, tmp_path: Path, kernels: Callable[[Paths], Kernel]
) -> None:
    paths = S3Paths(tmp_path, outage.url, S3_TIMEOUTS)
    kernel = kernels(paths)
    kernel.run("x = 1")
    assert kernel.ckpt("save work").startswith("Saved ")
    url = paths.open_store().backend.url
    outage.stop()
    for command in ("list", "show work", "restore work", "rm work"):
        out = kernel.ckpt(command).strip()
        prefix = f"%ckpt {command.split()[0]}: "
        assert out.startswith(prefix) and unreachable(url).fullmatch(out[len(prefix) :]), out
    out = kernel.ckpt("save again").strip()
    assert out.startswith("%ckpt save: cannot reach the store ") and "nothing was saved" in out
    assert len(out.splitlines()) == 1, out
    outage.start()
    assert "work" in kernel.ckpt("list")


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[tuple[ImageStore, Paths]]:
    """A store with one image (written through the first store returned), and kernel
    paths whose store is that directory mounted read-only: even root gets EROFS there."""
    paths = Paths(tmp_path / "ro")
    writable = ImageStore(url=str(tmp_path / "store"), secret_file=str(paths.secret))
    save_namespace(writable, {"x": np.arange(100_000), "name": "kept"}, name="work")
    paths.store.mkdir(parents=True)
    subprocess.run(["mount", "--bind", "-o", "ro", writable.root_url, paths.store], check=True)
    try:
        yield writable, paths
    finally:
        subprocess.run(["umount", paths.store], check=True)


def test_a_read_only_store_reads_and_refuses_writes_with_one_line(
    read_only: tuple[ImageStore, Paths],
) -> None:
    writable, paths = read_only
    store = paths.open_store()
    assert [m["name"] for _, m, _ in store.iter_manifests()] == ["work"]
    assert store.open("work")["name"] == "work"
    assert store.verify("work")["name"] == "work"
    assert load_namespace(store, "work")["name"] == "kept"
    for write in (
        lambda: save_namespace(store, {"y": 1}, name="new"),
        lambda: store.delete("work"),
        lambda: pin(store, store.resolve("work")),
    ):
        with pytest.raises(StoreReadOnly) as failed:
            write()
        assert refused_read_only(store.backend.url).fullmatch(str(failed.value)), failed.value
    assert writable.verify("work")["name"] == "work", "nothing was changed"


def test_kernels_read_a_read_only_store_and_say_why_a_write_fails(
    read_only: tuple[ImageStore, Paths], kernels: Callable[[Paths], Kernel]
) -> None:
    _, paths = read_only
    url = paths.open_store().backend.url
    kernel = kernels(paths)
    assert "work" in kernel.ckpt("list")
    assert kernel.ckpt("status").startswith(f"Store: {url}\n")
    assert kernel.ckpt("restore work").startswith("Restored ")
    kernel.check("name == 'kept'")
    out = kernel.ckpt("save again").strip()
    assert out.startswith("%ckpt save: the store ") and len(out.splitlines()) == 1, out
    assert "is read-only" in out and "nothing was saved" in out, out
    out = kernel.ckpt("rm work").strip()
    assert refused_read_only(url).fullmatch(out.removeprefix("%ckpt rm: ")), out


# -- a rekey stopped halfway ---------------------------------------------------------------


class Interrupted(CountingBackend):
    """A store stopped, as by Ctrl-C, just before its ``at``-th write."""

    WRITES = frozenset({"write_atomic", "stage", "publish", "remove", "sync_dir"})

    def __init__(self, inner: Any, at: int) -> None:
        super().__init__(inner)
        self.at = at

    def __getattr__(self, name: str) -> Any:
        call = super().__getattr__(name)
        if name not in self.WRITES:
            return call

        def write(*args: Any, **kwargs: Any) -> Any:
            if sum(m in self.WRITES for m, _ in self.calls) + 1 == self.at:
                raise KeyboardInterrupt
            return call(*args, **kwargs)

        return write


@pytest.mark.parametrize("encryption", ["none", "aes-256-gcm"])
def test_a_rekey_stopped_at_any_write_loses_nothing_and_finishes_when_run_again(
    tmp_path: Path, encryption: str
) -> None:
    """Two suspended kernels need two of three images. The secret changed; rekey is
    stopped before each of its writes in turn. Retention (keep 1 image) and deletes in
    between must not remove what the kernels need, and rekey run again finishes."""
    old, new = tmp_path / "old-secret", tmp_path / "new-secret"
    template = tmp_path / "template"
    before = ImageStore(url=str(template), secret_file=str(old), encryption=encryption)
    images = [save_namespace(before, {"v": np.full(1000, i)}, name=f"s{i}")["id"] for i in range(3)]
    pin(before, images[0], "k-0")
    pin(before, images[1], "k-1")
    at = 0
    while True:
        at += 1
        root = tmp_path / f"stopped-at-{at}"
        shutil.copytree(template, root)
        store = ImageStore(url=str(root), secret_file=str(new), encryption=encryption)
        backend = store.backend = store._index.backend = Interrupted(store.backend, at)
        try:
            outcomes = list(store.rekey(str(old)))
            finished = True
        except KeyboardInterrupt:
            finished = False
        store.backend = store._index.backend = backend.inner
        store.max_images = 1
        store.enforce_retention(grace_seconds=0)
        for image_id in images[:2]:
            with pytest.raises((ImageInUse, IntegrityError)):
                store.delete(image_id)

        outcomes = list(store.rekey(str(old)))
        assert [o for o in outcomes if o.result == "failed"] == [], (at, outcomes)
        for i, image_id in enumerate(images):
            assert (load_namespace(store, image_id)["v"] == i).all(), (at, i)
        records, errors = store.records.all()
        assert ({k: r["image_id"] for k, r in records.items()}, errors) == (
            {"k-0": images[0], "k-1": images[1]},
            {},
        ), at
        if finished:
            break
    assert at > 6, "every record, chunk, manifest and lease write was a stopping point"
