"""Image compatibility with this node, from the manifest alone (DESIGN section 6)."""

from __future__ import annotations

import platform
from importlib import metadata

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
