"""Can an image be restored on a node? (DESIGN section 6), answered from its manifest alone.

The answer is ``compatible``, ``warnings`` or ``incompatible`` with the reasons. One
function, :func:`check`, gives it to the server (the panel's badge, and the refusal of a
resume before any kernel starts), to ``jupyter ckpt show`` and to the hub, which checks a
user's images against the nodes of each profile before it places their server.

A node is described by its *facts*: :meth:`jupyter_ckpt.gpu.GpuProbe.node`'s answer
(driver, CUDA version, and per GPU its model, compute capability and memory), optionally
with ``python`` and ``packages`` (module -> version, or null for "not installed") where
they differ from the environment that asks. :func:`node_facts` reads them from a JSON file
instead of probing when ``JUPYTER_CKPT_NODE_FACTS`` names one, so an admin can describe
the nodes of a profile, and a test can play an H100, an A10 or a CPU-only node. Packages
are otherwise looked up in the environment that asks, without importing them.
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from packaging.version import InvalidVersion, Version

from .errors import CkptError

NODE_FACTS_ENV = "JUPYTER_CKPT_NODE_FACTS"
# The GPU part of node facts, as a manifest records the node it was saved on.
GPU_KEYS = ("available", "reason", "driver", "cuda", "gpus")
# The oldest NVIDIA driver (major) that runs any release of a CUDA major version, by
# CUDA's minor-version compatibility (CUDA toolkit release notes, "CUDA Driver" table).
MIN_DRIVER = {11: 450, 12: 525, 13: 580}
_GIB = 1 << 30

_dists: Mapping[str, list[str]] | None = None


def node_facts(path: str | None = None, probe: Any = None) -> dict[str, Any]:
    """This node's facts: from the JSON file ``path`` (default ``$JUPYTER_CKPT_NODE_FACTS``)
    when there is one, else probed with ``probe`` (a :class:`~jupyter_ckpt.gpu.GpuProbe`)."""
    path = path or os.environ.get(NODE_FACTS_ENV)
    if not path:
        if probe is None:
            from .gpu import GpuProbe

            probe = GpuProbe()
        return probe.node()
    try:
        with open(path) as f:
            facts = json.load(f)
    except (OSError, ValueError) as exc:
        raise CkptError(f"cannot read the node facts {path}: {exc}") from exc
    if not isinstance(facts, dict) or not isinstance(facts.get("gpus", []), list):
        raise CkptError(f"node facts {path}: expected an object with a list of 'gpus'")
    return facts


def prepare() -> None:
    """Scan the installed distributions now (about a second, more with a cold page
    cache), as a server does when it starts, so its first restore does not wait for it."""
    global _dists
    if _dists is None:
        _dists = metadata.packages_distributions()


def _installed_version(module: str) -> str | None:
    prepare()
    assert _dists is not None
    for dist in _dists.get(module, []):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def _release(version: str, parts: int) -> tuple[int, ...] | None:
    """The first ``parts`` numbers of a version (PEP 440; NVIDIA's driver versions are
    ones too), or None where it is not a version."""
    try:
        return Version(version).release[:parts]
    except InvalidVersion:
        return None


def _majors_differ(a: str, b: str) -> bool:
    """Whether two versions' major releases differ; where one is no version, the two
    cannot be told apart by major, and their difference is only a warning."""
    majors = _release(a, 1), _release(b, 1)
    return None not in majors and majors[0] != majors[1]


def _capability(text: str | None) -> tuple[int, int] | None:
    try:
        major, minor = str(text).split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return None


def _size(n: int) -> str:
    return f"{n / _GIB:.1f} GiB" if n >= _GIB else f"{n / (1 << 20):.1f} MiB"


def device_map(saved: Iterable[str], count: int) -> dict[str, int]:
    """Where a restore puts each saved CUDA device on a node with ``count`` GPUs, by
    :class:`jupyter_ckpt.image.devices.DeviceMapper`'s rule: the same index when every
    saved index exists there, else the saved devices in order onto the local ones,
    modulo ``count`` (so two saved devices may share one GPU)."""
    ordered = sorted(set(saved), key=_device_index)
    if all(_device_index(d) < count for d in ordered):
        return {d: _device_index(d) for d in ordered}
    return {d: i % count for i, d in enumerate(ordered)}


def _device_index(device: str) -> int:
    return int(device.partition(":")[2] or 0)


@dataclass
class GpuNeeds:
    """What restoring images needs of a node's GPUs."""

    #: saved device ("cuda:N") -> bytes of the tensors on it, summed over the images
    device_bytes: dict[str, int] = field(default_factory=dict)
    #: compute capability of the GPU the tensors were on (the highest, over devices)
    compute: tuple[int, int] | None = None
    #: CUDA runtime the saving framework was built for ("12.1"; None when unknown)
    cuda: str | None = None
    #: GPU models the images were saved on
    products: list[str] = field(default_factory=list)
    #: each image's device_bytes: a restore maps each image's devices on its own
    images: list[dict[str, int]] = field(default_factory=list)

    @property
    def per_gpu(self) -> int:
        """Bytes one GPU must hold where every saved device keeps its index (a node with
        :attr:`spread` GPUs or more): the largest device's."""
        return max(self.device_bytes.values(), default=0)

    @property
    def spread(self) -> int:
        """GPUs a node needs for every saved device to keep its index."""
        return max(map(_device_index, self.device_bytes), default=-1) + 1

    def mapping(self, count: int) -> list[dict[str, int]]:
        """Each image's :func:`device_map` onto ``count`` GPUs."""
        return [device_map(devices, count) for devices in self.images]

    def load(self, count: int) -> dict[int, tuple[int, list[str]]]:
        """Per GPU of a node with ``count``, once restored: the bytes it must hold and the
        saved devices that land on it."""
        load: dict[int, tuple[int, list[str]]] = {}
        for devices, mapped in zip(self.images, self.mapping(count), strict=True):
            for saved, local in mapped.items():
                n, names = load.get(local, (0, []))
                load[local] = (n + devices[saved], sorted({*names, saved}, key=_device_index))
        return load

    def per_gpu_on(self, count: int) -> int:
        """Bytes each GPU must hold on a node (or a pod) with ``count`` GPUs."""
        return max((n for n, _ in self.load(count).values()), default=0)

    @property
    def min_driver(self) -> int | None:
        """The oldest driver major that runs :attr:`cuda` (None when unknown)."""
        cuda = _capability(self.cuda)
        return MIN_DRIVER.get(cuda[0]) if cuda else None

    def merge(self, other: GpuNeeds) -> GpuNeeds:
        """Both restored on one node: device by device their bytes add up."""
        devices = dict(self.device_bytes)
        for device, n in other.device_bytes.items():
            devices[device] = devices.get(device, 0) + n
        cudas = [c for c in (self.cuda, other.cuda) if _capability(c)]
        return GpuNeeds(
            devices,
            max((c for c in (self.compute, other.compute) if c), default=None),
            max(cudas, key=lambda c: _capability(c) or (0, 0), default=None),
            sorted(set(self.products) | set(other.products)),
            [*self.images, *other.images],
        )


def gpu_needs(manifest: dict[str, Any]) -> GpuNeeds | None:
    """What the image's GPU tensors need of a node, or None when it has none."""
    cuda = sorted(d for d in manifest.get("devices", []) if d.startswith("cuda"))
    if not cuda:
        return None
    gpu = manifest.get("gpu", {})
    # every saved device, with or without bytes, takes its place in the restore's mapping
    device_bytes = dict.fromkeys(cuda, 0)
    if "device_bytes" in gpu:
        device_bytes.update({d: int(n) for d, n in gpu["device_bytes"].items() if d in cuda})
    else:  # an image from before they were recorded: count per variable
        for var in manifest.get("variables", []):
            for device in var.get("devices", []):
                if device.startswith("cuda"):
                    device_bytes[device] = device_bytes.get(device, 0) + var.get("bytes", 0)
    saved = {f"cuda:{g.get('index', 0)}": g for g in gpu.get("gpus", [])}
    used = [saved[d] for d in cuda if d in saved]
    capabilities = [c for c in (_capability(g.get("compute_capability")) for g in used) if c]
    return GpuNeeds(
        device_bytes,
        max(capabilities, default=None),
        gpu.get("torch_cuda"),
        sorted({g["name"] for g in used if g.get("name")}),
        [device_bytes],
    )


def gpu_check(needs: GpuNeeds, node: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(problems, warnings) of restoring tensors with ``needs`` on ``node``: each GPU
    must hold what the restore puts on it (:func:`device_map`)."""
    gpus = sorted(node.get("gpus") or [], key=lambda g: g.get("index", 0))
    if not gpus:
        devices = ", ".join(sorted(needs.device_bytes)) or "cuda"
        return [f"needs a GPU ({devices}) and this node has none"], []
    problems, warnings = [], []
    largest = max(g.get("memory_total", 0) for g in gpus)
    for local, (n, sources) in sorted(needs.load(len(gpus)).items()):
        gpu = gpus[local]
        total = gpu.get("memory_total", 0)
        if n <= total:
            continue
        here = "the largest GPU here" if total == largest else f"cuda:{local} here"
        if sources == [f"cuda:{local}"]:
            what = f"on one GPU ({sources[0]})"
        else:
            what = (
                f"on one GPU: a restore puts {' and '.join(sources)} on cuda:{local} (this "
                f"node has {len(gpus)} GPU(s))"
            )
        problems.append(
            f"needs {_size(n)} of GPU memory {what}; {here} ({gpu.get('name', 'unknown')}) "
            f"has {_size(total)}"
        )
    moved = sorted(
        {(s, t) for mapped in needs.mapping(len(gpus)) for s, t in mapped.items()}
        - {(s, _device_index(s)) for s in needs.device_bytes}
    )
    if moved:
        saved_on = ", ".join(sorted(needs.device_bytes, key=_device_index))
        warnings.append(
            f"tensors saved on {saved_on}; this node has {len(gpus)} GPU(s), so a restore "
            f"maps {', '.join(f'{s} -> cuda:{t}' for s, t in moved)}"
        )
    best = max(
        (c for c in (_capability(g.get("compute_capability")) for g in gpus) if c), default=None
    )
    if needs.compute and best:
        saved = "{}.{}".format(*needs.compute)
        if best[0] < needs.compute[0]:
            problems.append(
                f"saved on a GPU of compute capability {saved}; this node's GPUs have at "
                f"most {best[0]}.{best[1]}"
            )
        elif best < needs.compute:
            warnings.append(
                f"saved on a GPU of compute capability {saved}, this node's is {best[0]}.{best[1]}"
            )
    driver = _release(str(node.get("driver", "")), 1)
    if needs.min_driver and driver is not None and driver[0] < needs.min_driver:
        problems.append(
            f"saved by a framework built for CUDA {needs.cuda}, which needs NVIDIA driver "
            f"{needs.min_driver} or newer; this node has {node['driver']}"
        )
    names = sorted({g.get("name") for g in gpus if g.get("name")})
    if needs.products and names and not set(names) & set(needs.products):
        warnings.append(f"saved on {', '.join(needs.products)}, this node has {', '.join(names)}")
    return problems, warnings


def assess(
    manifest: dict[str, Any], node: dict[str, Any] | None = None, *, here: bool = True
) -> tuple[list[str], list[str]]:
    """(problems, warnings) of restoring ``manifest`` on a node described by ``node``
    (None skips the GPU check). With ``here``, Python and packages the facts do not give
    are this process's; without (the hub, which runs none of the users' software), they
    are not checked."""
    node = node or {}
    problems: list[str] = []
    warnings: list[str] = []
    env = manifest.get("environment", {})
    saved_python = env.get("python", "")
    python = node.get("python") or (platform.python_version() if here else None)
    if python and _release(saved_python, 2) != _release(python, 2):
        problems.append(f"saved with Python {saved_python}, this is Python {python}")
    packages = node.get("packages") or {}
    for module, saved in sorted(env.get("packages", {}).items()):
        if module in packages:
            installed = packages[module]
        elif here:
            installed = _installed_version(module)
        else:
            continue
        if installed is None:
            problems.append(f"{module} {saved} is not installed")
        elif _majors_differ(installed, saved):
            problems.append(f"{module} {saved} saved, {installed} installed (major differs)")
        elif installed != saved:
            warnings.append(f"{module} {saved} saved, {installed} installed")
    needs = gpu_needs(manifest)
    if needs is not None and node:
        gpu_problems, gpu_warnings = gpu_check(needs, node)
        problems += gpu_problems
        warnings += gpu_warnings
    return problems, warnings


def check(
    manifest: dict[str, Any], node: dict[str, Any] | None = None, *, here: bool = True
) -> dict[str, Any]:
    """The verdict on :func:`assess`: ``{"verdict": ..., "reasons": [...]}``, problems
    first."""
    problems, warnings = assess(manifest, node, here=here)
    verdict = "incompatible" if problems else "warnings" if warnings else "compatible"
    return {"verdict": verdict, "reasons": problems + warnings}


def check_all(
    manifests: Iterable[dict[str, Any]], node: dict[str, Any] | None = None, *, here: bool = True
) -> list[dict[str, Any]]:
    """:func:`check` of many images: each distinct environment is checked once (a
    store's history is mostly a few notebooks saved many times, and looking up installed
    versions is the slow part)."""
    checked: dict[str, dict[str, Any]] = {}
    results = []
    for manifest in manifests:
        key = json.dumps(
            [manifest.get("environment"), manifest.get("devices"), gpu_needs(manifest)],
            sort_keys=True,
            default=repr,
        )
        if key not in checked:
            checked[key] = check(manifest, node, here=here)
        results.append(checked[key])
    return results
