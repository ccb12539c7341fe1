"""Image compatibility with this node, from the manifest alone (DESIGN section 6)."""

from __future__ import annotations

import platform
from importlib import metadata

from harness import NODES

from jupyter_ckpt import compat

HERE = platform.python_version()
PYTEST = metadata.version("pytest")


def manifest(python: str = HERE, packages: dict[str, str] | None = None, devices=()) -> dict:
    return {
        "environment": {"python": python, "packages": packages or {}},
        "devices": list(devices),
    }


def test_same_environment_is_compatible():
    assert compat.check(manifest(packages={"pytest": PYTEST})) == {
        "verdict": "compatible",
        "reasons": [],
    }


def test_other_minor_version_is_a_warning():
    major = PYTEST.split(".")[0]
    result = compat.check(manifest(packages={"pytest": f"{major}.0.0rc9"}))
    assert result["verdict"] == "warnings"
    assert result["reasons"] == [f"pytest {major}.0.0rc9 saved, {PYTEST} installed"]


def test_python_packages_and_gpus_can_make_it_incompatible():
    result = compat.check(
        manifest(
            python="2.7.18",
            packages={"no_such_module_here": "1.0", "pytest": "0.1"},
            devices=["cpu", "cuda:1"],
        ),
        node={"available": False, "gpus": []},
    )
    assert result["verdict"] == "incompatible"
    assert result["reasons"] == [
        f"saved with Python 2.7.18, this is Python {HERE}",
        "no_such_module_here 1.0 is not installed",
        f"pytest 0.1 saved, {PYTEST} installed (major differs)",
        "needs a GPU (cuda:1) and this node has none",
    ]


def test_many_images_get_the_verdict_of_their_own_environment():
    images = [
        manifest(packages={"pytest": PYTEST}),
        manifest(python="2.7.18"),
        manifest(packages={"pytest": PYTEST}, devices=["cuda:0"]),
        manifest(packages={"pytest": PYTEST}),
    ]
    node = {"gpus": []}
    assert compat.check_all(images, node) == [compat.check(m, node) for m in images]
    assert [v["verdict"] for v in compat.check_all(images, node)] == [
        "compatible",
        "incompatible",
        "incompatible",
        "compatible",
    ]


GIB = 1 << 30


def gpu_image(gpu: dict, device_bytes: dict | None = None, variables: list | None = None) -> dict:
    """An image with tensors on cuda:0, saved on the GPU node ``gpu`` describes."""
    facts = {**gpu, "torch_cuda": "12.1"}
    if device_bytes is not None:
        facts["device_bytes"] = device_bytes
    return {**manifest(devices=["cpu", "cuda:0"]), "gpu": facts, "variables": variables or []}


def with_gpu(node: dict, **changes) -> dict:
    return {**node, "gpus": [{**node["gpus"][0], **changes}]}


def test_gpu_memory_compute_capability_and_driver_are_checked():
    h100 = gpu_image(NODES["h100"], {"cuda:0": 30 * GIB})
    assert compat.check(h100, NODES["h100"]) == {"verdict": "compatible", "reasons": []}
    old_driver = {**NODES["h100"], "driver": "470.82.01"}
    assert compat.check(h100, old_driver)["reasons"] == [
        "saved by a framework built for CUDA 12.1, which needs NVIDIA driver 525 or newer; "
        "this node has 470.82.01"
    ]
    assert compat.check(h100, NODES["a10"])["reasons"] == [
        "needs 30.0 GiB of GPU memory on one GPU (cuda:0); the largest GPU here (NVIDIA A10) "
        "has 22.0 GiB",
        "saved on a GPU of compute capability 9.0; this node's GPUs have at most 8.6",
        "saved on NVIDIA H100 80GB HBM3, this node has NVIDIA A10",
    ]
    h200 = with_gpu(NODES["h100"], name="NVIDIA H200", memory_total=140 * GIB)
    assert compat.check(h100, h200) == {
        "verdict": "warnings",
        "reasons": ["saved on NVIDIA H100 80GB HBM3, this node has NVIDIA H200"],
    }
    a100 = with_gpu(NODES["a10"], name="NVIDIA A10", compute_capability="8.0")
    assert compat.check(gpu_image(NODES["a10"], {"cuda:0": GIB}), a100)["reasons"] == [
        "saved on a GPU of compute capability 8.6, this node's is 8.0"
    ]


def test_an_image_without_per_device_bytes_counts_its_gpu_variables():
    variables = [
        {"name": "w", "status": "saved", "bytes": 20 * GIB, "devices": ["cuda:0"]},
        {"name": "b", "status": "saved", "bytes": 4 * GIB, "devices": ["cpu", "cuda:0"]},
        {"name": "x", "status": "saved", "bytes": 50 * GIB, "devices": ["cpu"]},
    ]
    needs = compat.gpu_needs(gpu_image(NODES["h100"], variables=variables))
    assert needs is not None and needs.device_bytes == {"cuda:0": 24 * GIB}
    assert needs.compute == (9, 0) and needs.min_driver == 525
    assert compat.gpu_needs(manifest(devices=["cpu"])) is None


def two_gpu_image(per_device: int) -> dict:
    """An image with ``per_device`` bytes on each of cuda:0 and cuda:1 of two A10s."""
    a10 = NODES["a10"]
    saved_on = {**a10, "gpus": [a10["gpus"][0], {**a10["gpus"][0], "index": 1}]}
    image = gpu_image(saved_on, {"cuda:0": per_device, "cuda:1": per_device})
    return {**image, "devices": ["cpu", "cuda:0", "cuda:1"]}


def test_devices_that_share_one_gpu_after_the_restore_need_their_memory_together():
    """A restore maps saved devices modulo the node's GPU count: on one GPU the tensors of
    cuda:0 and cuda:1 all land on cuda:0."""
    one_a10 = NODES["a10"]
    assert compat.check(two_gpu_image(15 * GIB), one_a10)["reasons"] == [
        "needs 30.0 GiB of GPU memory on one GPU: a restore puts cuda:0 and cuda:1 on cuda:0 "
        "(this node has 1 GPU(s)); the largest GPU here (NVIDIA A10) has 22.0 GiB",
        "tensors saved on cuda:0, cuda:1; this node has 1 GPU(s), so a restore maps "
        "cuda:1 -> cuda:0",
    ]
    assert compat.check(two_gpu_image(10 * GIB), one_a10) == {
        "verdict": "warnings",
        "reasons": [
            "tensors saved on cuda:0, cuda:1; this node has 1 GPU(s), so a restore maps "
            "cuda:1 -> cuda:0"
        ],
    }
    two_a10s = {**one_a10, "gpus": [one_a10["gpus"][0], {**one_a10["gpus"][0], "index": 1}]}
    assert compat.check(two_gpu_image(15 * GIB), two_a10s)["verdict"] == "compatible"
    needs = compat.gpu_needs(two_gpu_image(GIB))
    assert needs is not None and needs.spread == 2
    assert (needs.per_gpu, needs.per_gpu_on(1), needs.per_gpu_on(2)) == (GIB, 2 * GIB, GIB)


def test_each_saved_device_is_checked_against_the_gpu_it_lands_on():
    """Where every saved index exists, cuda:1 goes to this node's cuda:1, however large
    its cuda:0 is."""
    big, small = NODES["h100"]["gpus"][0], {**NODES["a10"]["gpus"][0], "index": 1}
    image = two_gpu_image(GIB)
    image["gpu"]["device_bytes"] = {"cuda:0": GIB, "cuda:1": 30 * GIB}
    mixed = {**NODES["h100"], "gpus": [big, small]}
    assert compat.check(image, mixed)["reasons"][0] == (
        "needs 30.0 GiB of GPU memory on one GPU (cuda:1); cuda:1 here (NVIDIA A10) has 22.0 GiB"
    )


def test_the_check_maps_devices_as_the_restore_does():
    """compat.device_map is DeviceMapper's rule, which the restore applies."""
    from fake_devices import FakeDeviceOps

    from jupyter_ckpt.image.devices import DeviceMapper

    for saved in (["cuda:0"], ["cuda:0", "cuda:1"], ["cuda:0", "cuda:3"], ["cuda:2", "cuda:5"]):
        for count in (1, 2, 3, 8):
            mapper = DeviceMapper(FakeDeviceOps(count), ["cpu", *saved], None)
            restored = {d: int(mapper.resolve(d).partition(":")[2]) for d in saved}
            assert compat.device_map(saved, count) == restored, (saved, count)
    images = compat.gpu_needs(two_gpu_image(GIB)).merge(
        compat.gpu_needs({**gpu_image(NODES["a10"], {"cuda:3": GIB}), "devices": ["cuda:3"]})
    )
    # each image is mapped on its own: the second one's cuda:3 goes to cuda:0
    assert images.load(2) == {0: (2 * GIB, ["cuda:0", "cuda:3"]), 1: (GIB, ["cuda:1"])}
