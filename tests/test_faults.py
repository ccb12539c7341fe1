"""Fault injection: each test breaks something real in the middle of a save or restore
and checks that no state is lost, on a local store and on an S3 server (moto) where the
fault applies to both.

- a kernel killed with SIGKILL while it saves: the previous image of the name is intact
  and verifies, no half image is listed, gc removes what the killed save left;
- a full disk (a small tmpfs): a clear error naming the full store, the kernel keeps its
  state, and a save after freeing space works;
- the S3 server going away (every connection reset, the port closed) while a kernel saves
  or restores: a clear error, the kernel keeps its state, and once the server is back the
  old image restores;
- two kernels saving the same name at once while gc runs: both images verify and the
  name resolves to the newer one.

The run ends with a summary of the faults injected and survived (shown by pytest's
terminal summary).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import pytest
from harness import (
    S3_TIMEOUTS,
    Kernel,
    KernelError,
    MotoServer,
    Outage,
    Paths,
    S3Paths,
    tmpfs,
    wait_for,
)

from jupyter_ckpt.store import ImageStore

MiB = 1 << 20
# State big enough that a save is still writing when the fault lands.
BIG = {"local": 384 * MiB, "s3": 96 * MiB}

# IPython keeps the last exception (and every frame it holds) here.
NO_EXCEPTION_KEPT = "not hasattr(__import__('sys'), 'last_value')"

FAULTS: list[dict[str, Any]] = []


@pytest.fixture(scope="module", autouse=True)
def fault_summary(request: pytest.FixtureRequest) -> Iterator[None]:
    """Print what was injected and what survived, at the end of the module."""
    yield
    plugins = request.config.pluginmanager
    survived = sum(f["survived"] for f in FAULTS)
    lines = [f"faults injected: {len(FAULTS)}, survived: {survived}"]
    for f in FAULTS:
        lines.append(f"  {'survived' if f['survived'] else 'FAILED'}: {f['fault']} ({f['store']})")
        if f.get("seen"):
            lines.append(f"    user saw: {f['seen']}")
    with plugins.getplugin("capturemanager").global_and_fixture_disabled():
        print("\n" + "\n".join(lines))


class Fault:
    """One injected fault; it counts as survived once the test's checks have passed."""

    def __init__(self, fault: str, store: str) -> None:
        self.entry = {"fault": fault, "store": store, "survived": False}
        FAULTS.append(self.entry)

    def survived(self, seen: str = "") -> None:
        """``seen``: what the user was told, for the summary."""
        self.entry.update(survived=True, seen=seen.strip().splitlines()[-1] if seen else "")


@pytest.fixture(params=["local", "s3"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Paths:
    """Where the kernels of one test keep their store."""
    if request.param == "local":
        return Paths(tmp_path)
    moto: MotoServer = request.getfixturevalue("moto")
    return S3Paths(tmp_path, moto.url, S3_TIMEOUTS)


def kind(paths: Paths) -> str:
    return "s3" if isinstance(paths, S3Paths) else "local"


def stored_bytes(store: ImageStore) -> int:
    """Bytes of every file or object in the store, finished or not."""
    return sum(size for _, _, size in store.backend.walk_files(""))


def rss(kernel: Kernel) -> int:
    return psutil.Process(kernel.pid).memory_info().rss


def make_big(kernel: Kernel, nbytes: int, name: str = "big", offset: int = 0) -> None:
    """An int64 array of ``nbytes``, every chunk distinct (nothing dedupes)."""
    kernel.run(f"import numpy as np\n{name} = np.arange({offset}, {offset + nbytes // 8})")


def big_intact(nbytes: int, name: str = "big", offset: int = 0) -> str:
    last = offset + nbytes // 8 - 1
    return f"{name}.shape == ({nbytes // 8},) and int({name}[-1]) == {last}"


def in_background(call: Callable[[], Any]) -> Future[Any]:
    pool = ThreadPoolExecutor(1)
    future = pool.submit(call)
    pool.shutdown(wait=False)
    return future


def only_image(store: ImageStore, name: str, image_id: str) -> None:
    """``image_id`` is the one image in the store, ``name`` resolves to it, it verifies."""
    assert store.image_ids() == [image_id], "no half image is listed"
    assert store.resolve(name) == image_id
    assert store.verify(name)["id"] == image_id


# -- kill -9 during a save -----------------------------------------------------------------


def test_kill_9_during_save_keeps_the_previous_image(where: Paths, kernels) -> None:
    store = where.open_store()
    kernel = kernels(where)
    kernel.run("x = 'kept'")
    assert kernel.ckpt("save work").startswith("Saved ")
    old = store.resolve("work")
    make_big(kernel, BIG[kind(where)])

    stored = stored_bytes(store)
    kernel.client.execute("%ckpt save work")
    wait_for(lambda: stored_bytes(store) - stored > 16 * MiB, 60, "the save to write")
    fault = Fault("kill -9 of the kernel during a save", kind(where))
    os.kill(kernel.pid, signal.SIGKILL)
    wait_for(lambda: not kernel.manager.is_alive(), 30, "the kernel to die")

    only_image(store, "work", old)
    removed, _ = store.gc(grace_seconds=0)
    assert removed > 0, "the killed save had written chunks; gc removes them"
    assert tuple(store.gc(grace_seconds=0)) == (0, 0)
    only_image(store, "work", old)
    fresh = kernels(where)
    assert fresh.ckpt("restore work").startswith("Restored ")
    fresh.check("x == 'kept'")
    fault.survived()


GPU_BIG = f"""
import fake_devices, torch
gpu = torch.arange({64 * MiB // 8})
fake_devices.install(gpus=1).pretend(gpu, "cuda:0")
"""
GPU_BIG_INTACT = f"int(gpu[-1]) == {64 * MiB // 8 - 1}"


# -- a full disk ---------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Paths]:
    """A store on a 24 MiB tmpfs."""
    paths = Paths(tmp_path)
    paths.store.mkdir()
    with tmpfs(paths.store, "24m"):
        yield paths


def test_full_disk_is_named_and_the_kernel_keeps_its_state(small_disk: Paths, kernels) -> None:
    store = small_disk.open_store()
    kernel = kernels(small_disk)
    # GPU data (the stand-in) goes in 4 MiB parts: the disk fills up between two of them
    kernel.run(f"import os\nos.environ['JUPYTER_CKPT_BUFFER_BYTES'] = '{8 * MiB}'")
    kernel.run("x = 'kept'")
    assert kernel.ckpt("save work").startswith("Saved ")
    old = store.resolve("work")
    kernel.run(GPU_BIG)
    stored = stored_bytes(store)

    fault = Fault("ENOSPC: store on a full 24 MiB tmpfs", "local")
    out = kernel.ckpt("save work")
    assert out.startswith("%ckpt save: "), out
    assert f"{small_disk.store}" in out and "is full (no space left on device)" in out, out
    assert "nothing was saved" in out
    kernel.check(NO_EXCEPTION_KEPT, "x == 'kept'", GPU_BIG_INTACT)
    only_image(store, "work", old)
    assert stored_bytes(store) - stored < 64 << 10, "the failed save's chunks are removed"

    kernel.run("del gpu")  # free space: a smaller state
    assert kernel.ckpt("save work").startswith("Saved ")
    assert store.resolve("work") != old
    assert store.verify("work")["name"] == "work"
    fault.survived(out)


# -- the S3 server stops -------------------------------------------------------------------


@pytest.fixture
def s3(outage: Outage, tmp_path: Path) -> S3Paths:
    return S3Paths(tmp_path, outage.url, S3_TIMEOUTS)


def _endpoint_named(out: str, outage: Outage) -> bool:
    return outage.url in out


def test_s3_server_stopped_during_save(s3: S3Paths, outage: Outage, kernels) -> None:
    store = s3.open_store()
    kernel = kernels(s3)
    kernel.run("x = 'kept'")
    assert kernel.ckpt("save work").startswith("Saved ")
    old = store.resolve("work")
    make_big(kernel, BIG["s3"])

    stored = stored_bytes(store)
    saving = in_background(lambda: kernel.ckpt("save work"))
    wait_for(lambda: stored_bytes(store) - stored > 8 * MiB, 60, "the save to write")
    fault = Fault("S3 server stopped during a save", "s3")
    outage.stop()
    out = saving.result(timeout=300)
    outage.start()

    assert out.startswith("%ckpt save: ") and "nothing was saved" in out, out
    assert _endpoint_named(out, outage), out
    kernel.check("x == 'kept'", big_intact(BIG["s3"]))
    only_image(store, "work", old)
    kernel.run("del big, x")
    assert kernel.ckpt("restore work").startswith("Restored ")
    kernel.check("x == 'kept'")
    fault.survived(out)


def test_s3_server_stopped_during_restore(s3: S3Paths, outage: Outage, kernels) -> None:
    writer = kernels(s3)
    make_big(writer, BIG["s3"])
    assert writer.ckpt("save work").startswith("Saved ")
    kernel = kernels(s3)
    kernel.run("mine = 'untouched'\nimport numpy")
    assert "work" in kernel.ckpt("list")  # the store's client is loaded: memory grows
    before = rss(kernel)  # from here on as the image's chunks arrive
    restoring = in_background(lambda: kernel.ckpt("restore work"))
    wait_for(lambda: rss(kernel) - before > 16 * MiB, 60, "the restore to read chunks")
    fault = Fault("S3 server stopped during a restore", "s3")
    outage.stop()
    try:
        out = restoring.result(timeout=300)
    except KernelError as exc:  # the restore raised in the cell
        out = str(exc)
    outage.start()

    assert not out.startswith("Restored "), out
    assert _endpoint_named(out, outage), out
    assert kernel.falsy("'big' in globals()", "mine == 'untouched'") == ["'big' in globals()"]
    assert kernel.ckpt("restore work").startswith("Restored ")
    kernel.check(big_intact(BIG["s3"]), "mine == 'untouched'")
    fault.survived(out)


# -- two writers and gc --------------------------------------------------------------------


def test_two_kernels_save_one_name_while_gc_runs(where: Paths, kernels) -> None:
    """Both kernels reuse the chunks of a deleted image. On the local store those chunks
    are made two hours old first, so gc takes them for garbage while the saves run."""
    store = where.open_store()
    shared = 16 * MiB
    first, second = kernels(where), kernels(where)
    for i, kernel in enumerate((first, second)):
        make_big(kernel, shared, "common")
        make_big(kernel, 48 * MiB, "own", offset=(i + 1) << 40)
    assert first.ckpt("save seed").startswith("Saved ")
    store.delete("seed")
    if kind(where) == "local":  # an object store cannot age its objects
        old = time.time() - 2 * 3600
        for path, _, _ in store.backend.walk_files("chunks"):
            os.utime(Path(store.backend.url) / path, (old, old))

    stop = threading.Event()
    runs = [0]

    def collect() -> None:
        while not stop.is_set():
            store.gc()
            runs[0] += 1

    fault = Fault("two kernels save one name, gc running", kind(where))
    gc_thread = threading.Thread(target=collect)
    gc_thread.start()
    try:
        saves = [in_background(lambda k=k: k.ckpt("save same")) for k in (first, second)]
        outs = [s.result(timeout=300) for s in saves]
    finally:
        stop.set()
        gc_thread.join()

    assert runs[0] > 0, "gc ran while the kernels saved"
    assert all(o.startswith(("Saved ", "%ckpt save: ")) for o in outs), outs
    saved = [o for o in outs if o.startswith("Saved ")]
    assert saved, outs
    manifests = [m for _, m, _ in store.iter_manifests() if m and m["name"] == "same"]
    assert len(manifests) == len(saved)
    for manifest in manifests:
        assert store.verify(manifest["id"])["id"] == manifest["id"]
    newest = max(manifests, key=lambda m: m["created"])
    assert store.resolve("same") == newest["id"]
    store.gc(grace_seconds=0)  # no writer now: whatever is unreferenced goes
    for manifest in manifests:
        assert store.verify(manifest["id"])["id"] == manifest["id"]
    fault.survived(f"{len(saved)} of 2 saves committed, both verify")
