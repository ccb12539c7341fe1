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
