"""The release artifacts: one version for Python and npm, and a wheel that carries what a
user needs (the license, type information, the production build of the JupyterLab
extension, the server extension's config) and nothing from a development build."""

from __future__ import annotations

import email
import inspect
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from jupyter_ckpt import __version__

ROOT = Path(__file__).resolve().parent.parent
LABEXTENSION = "jupyter_ckpt-{v}.data/data/share/jupyter/labextensions/jupyter-ckpt/"


def npm_version() -> str:
    return json.loads((ROOT / "package.json").read_text())["version"]


def test_python_takes_its_version_from_package_json() -> None:
    assert __version__ == npm_version()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """A wheel built from this checkout as a release builds it (npm runs unless the
    production bundle is already there). It is built from a copy: the production build
    replaces the labextension in place, which the browser tests load meanwhile."""
    out = tmp_path_factory.mktemp("dist")
    source = tmp_path_factory.mktemp("source") / ROOT.name
    unwanted = (".git", ".venv", "node_modules", "__pycache__", ".mypy_cache", "test-output")
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*unwanted), symlinks=True)
    (source / "node_modules").symlink_to(ROOT / "node_modules")
    result = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(source)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (path,) = out.glob("jupyter_ckpt-*.whl")
    return zipfile.ZipFile(path)


# building the wheel (the fixture) may take its own 900 s: beyond the run's time limit
WHEEL_TIMEOUT = pytest.mark.timeout(1200)


@WHEEL_TIMEOUT
@pytest.mark.skipif(shutil.which("npm") is None, reason="building the wheel runs npm")
def test_the_wheel_carries_the_production_extension(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    version = npm_version()
    lab = LABEXTENSION.format(v=version)
    assert f"{lab}package.json" in names
    assert f"{lab}install.json" in names
    assert f"{lab}static/third-party-licenses.json" in names, "not a production build"
    assert any(n.startswith(f"{lab}static/remoteEntry.") for n in names)
    dev = [n for n in names if n.endswith((".map", "build_log.json"))]
    assert dev == [], "files of a development build"
    config = f"jupyter_ckpt-{version}.data/data/etc/jupyter/jupyter_server_config.d/"
    assert any(n.startswith(config) for n in names)


@WHEEL_TIMEOUT
@pytest.mark.skipif(shutil.which("npm") is None, reason="building the wheel runs npm")
def test_the_wheel_carries_license_types_and_metadata(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    version = npm_version()
    info = f"jupyter_ckpt-{version}.dist-info/"
    assert any(n.startswith(info) and n.endswith("LICENSE") for n in names)
    assert {"jupyter_ckpt/py.typed", "jupyter_ckpt_server/py.typed"} <= names
    assert wheel.read("jupyter_ckpt/_version.py").decode().endswith(f'"{version}"\n')
    metadata = email.message_from_bytes(wheel.read(f"{info}METADATA"))
    assert metadata["Version"] == version
    classifiers = metadata.get_all("Classifier")
    for classifier in (
        "Framework :: Jupyter :: JupyterLab :: 4",
        "Framework :: Jupyter :: JupyterLab :: Extensions :: Prebuilt",
        "License :: OSI Approved :: BSD License",
    ):
        assert classifier in classifiers
    assert metadata.get_all("Project-URL")


def test_labextension_develop_links_the_checkouts_build(tmp_path: Path) -> None:
    """What `jupyter labextension develop .` does, into a directory of the test's own."""
    from jupyter_builder.federated_extensions import develop_labextension_py

    build = ROOT / "server_extension" / "jupyter_ckpt_server" / "labextension"
    if not (build / "package.json").exists():
        pytest.skip("no built labextension in this checkout (pip install -e . builds it)")
    (linked,) = develop_labextension_py(str(ROOT), labextensions_dir=str(tmp_path))
    assert Path(linked) == tmp_path / "jupyter-ckpt"
    assert Path(linked).resolve() == build.resolve()


def test_the_wheel_tests_may_wait_for_its_build() -> None:
    """The wheel's build may take 900 s, in whichever test needs the wheel first: each
    such test's own time limit leaves it that (the run's limit is shorter)."""
    users = [
        test
        for name, test in globals().items()
        if name.startswith("test_") and "wheel" in inspect.signature(test).parameters
    ]
    assert users
    for test in users:
        limits = [m.args[0] for m in getattr(test, "pytestmark", []) if m.name == "timeout"]
        assert limits and limits[0] > 900, test.__name__
