"""Can an image be restored here? (DESIGN section 6), answered from its manifest alone.

The answer is ``compatible``, ``warnings`` or ``incompatible`` with the reasons. Packages
are looked up in the environment that asks (the server's, or a kernel's), without
importing them.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Iterable
from importlib import metadata
from typing import Any

_dists: dict[str, list[str]] | None = None


def _installed_version(module: str) -> str | None:
    global _dists
    if _dists is None:
        _dists = metadata.packages_distributions()
    for dist in _dists.get(module, []):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def _major(version: str) -> str:
    return version.split(".", 1)[0]


def check(manifest: dict[str, Any], node: dict[str, Any] | None = None) -> dict[str, Any]:
    """Compatibility of ``manifest`` with this environment and the GPU facts in ``node``
    (``GpuProbe.node()``; None skips the GPU check)."""
    problems: list[str] = []
    warnings: list[str] = []
    env = manifest.get("environment", {})
    saved_python = env.get("python", "")
    here = platform.python_version()
    if saved_python.split(".")[:2] != here.split(".")[:2]:
        problems.append(f"saved with Python {saved_python}, this is Python {here}")
    for module, saved in sorted(env.get("packages", {}).items()):
        installed = _installed_version(module)
        if installed is None:
            problems.append(f"{module} {saved} is not installed")
        elif _major(installed) != _major(saved):
            problems.append(f"{module} {saved} saved, {installed} installed (major differs)")
        elif installed != saved:
            warnings.append(f"{module} {saved} saved, {installed} installed")
    cuda = [d for d in manifest.get("devices", []) if d.startswith("cuda")]
    if cuda and node is not None and not node.get("gpus"):
        problems.append(f"needs a GPU ({', '.join(cuda)}) and this node has none")
    verdict = "incompatible" if problems else "warnings" if warnings else "compatible"
    return {"verdict": verdict, "reasons": problems + warnings}


def check_all(
    manifests: Iterable[dict[str, Any]], node: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """:func:`check` of many images: each distinct environment is checked once (a
    store's history is mostly a few notebooks saved many times, and looking up installed
    versions is the slow part)."""
    checked: dict[str, dict[str, Any]] = {}
    results = []
    for manifest in manifests:
        key = json.dumps([manifest.get("environment"), manifest.get("devices")], sort_keys=True)
        if key not in checked:
            checked[key] = check(manifest, node)
        results.append(checked[key])
    return results
