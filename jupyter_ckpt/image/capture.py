"""Write a namespace to an image.

Nothing is tracked while the user works; all the work happens here, in two passes:

1. every variable is pickled on its own (big buffers are only referenced, not copied).
   A variable that fails is recorded as lost with the reason and the rest go on. Each
   pickler's memo says which objects the variable reaches;
2. variables that reach a common object (``b is a``, a model and its optimizer, a view and
   its base) are joined into one group and pickled together, so sharing survives restore.
   Variables alone in their group reuse their first-pass pickle.

Pickle streams and small buffers are packed into one segment; each large buffer becomes its
own segment, so its chunks line up between saves and unchanged data is not written again.
"""

from __future__ import annotations

import enum
import platform
import sys
import types
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from typing import Any

from ..store import BUFFER_BYTES, CHUNK_SIZE
from . import pickler as _pickler

# Objects whose identity carries no meaning: sharing them must not join two variables.
_NO_IDENTITY = (
    str, bytes, int, float, complex, bool, type(None), tuple, frozenset, range, type,
    types.ModuleType, types.BuiltinFunctionType, _pickler._NamespaceRef,
)  # fmt: skip
# Buffers up to this size are packed together; larger ones get their own chunks.
PACK_MAX = 1 << 20
# Packed buffers start at multiples of this, so restored arrays and tensors are aligned.
PACK_ALIGN = 64


@dataclass
class _Pickled:
    names: list[str]
    data: bytes
    buffers: list[Any]
    modules: set[str] = field(default_factory=set)
    devices: set[str] = field(default_factory=set)
    shared: set[int] = field(default_factory=set)
    # The objects behind ``shared``: alive until grouping is done, so that the id of a
    # temporary made while pickling one variable is not reused by another one's.
    keepalive: list[Any] = field(default_factory=list, repr=False)

    @property
    def nbytes(self) -> int:
        return len(self.data) + sum(b.nbytes for b in self.buffers)


def type_name(value: Any) -> str:
    cls = type(value)
    module = cls.__module__
    return (
        cls.__qualname__ if module in ("builtins", "__main__") else f"{module}.{cls.__qualname__}"
    )


def import_record(name: str, value: Any) -> dict[str, Any] | None:
    """How to re-import a module alias or a `from x import y` binding, if it is one."""
    if isinstance(value, types.ModuleType):
        record: dict[str, Any] = {"name": name, "module": value.__name__}
        # `import a.b.c` binds `a`; its public submodules are imported again on restore.
        prefix = f"{value.__name__}."
        submodules = sorted(
            m
            for m, mod in list(sys.modules.items())
            if m.startswith(prefix) and _attribute_path(value, m[len(prefix) :]) is mod
        )
        if submodules:
            record["submodules"] = submodules
        return record
    module = getattr(value, "__module__", None)
    qualname = getattr(value, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or module == "__main__":
        return None
    if not isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType)):
        return None
    target: Any = sys.modules.get(module)
    for part in qualname.split("."):
        target = getattr(target, part, None)
    if target is not value:
        return None
    return {"name": name, "module": module, "attr": qualname}


def _attribute_path(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if part.startswith("_"):
            return None
        obj = getattr(obj, part, None)
    return obj


def _value_types() -> tuple[type, ...]:
    """Library singletons that unpickle to an equal object wherever they are used (dtypes,
    devices, enum members): reaching one says nothing about sharing."""
    found: list[type] = [enum.Enum]
    np = sys.modules.get("numpy")
    if np is not None:
        found.append(np.dtype)
    torch = sys.modules.get("torch")
    if torch is not None:
        found += [torch.dtype, torch.device, torch.layout, torch.memory_format]
    return tuple(found)


def _has_identity(obj: Any, value_types: tuple[type, ...]) -> bool:
    if isinstance(obj, (_NO_IDENTITY, value_types)):
        return False
    # A function pickled by reference (a library function, a reconstructor the pickler
    # itself emits) comes back as the same object anyway; notebook functions do count.
    return not (
        isinstance(obj, (types.FunctionType, types.BuiltinFunctionType))
        and import_record("", obj) is not None
    )


class _Dumper:
    """Pickles variables and says which objects each one reaches, for grouping."""

    def __init__(self, namespace: dict[str, Any]) -> None:
        self.namespace = namespace
        self.storages: dict = {}
        self.value_types = _value_types()
        self.classes: dict[int, type] = {}  # notebook classes pickled by value

    def dump(self, names: list[str], obj: Any) -> _Pickled:
        data, p = _pickler.dumps(obj, self.namespace, self.storages)
        memo = [o for _, o in p.memo.copy().values()]
        reached = [o for o in memo if _has_identity(o, self.value_types)]
        for cls in memo:
            if isinstance(cls, type) and import_record("", cls) is None:
                self.classes[id(cls)] = cls
        shared = {id(o) for o in reached}
        return _Pickled(names, data, p.buffers, p.modules, p.devices, shared, reached)

    def drop_class_parts(self, pickled: list[_Pickled]) -> None:
        """Objects of a notebook class's definition (methods, their code, class attributes)
        do not join variables: a class comes back as one class object wherever it is
        pickled, so instances reaching it share no state through it. Done after the first
        pass, since pickling instances can add to a class (copyreg's ``__slotnames__``)."""
        parts: set[int] = set()
        for cls in self.classes.values():
            _, p = _pickler.dumps(cls, self.namespace, self.storages)
            parts.update(p.memo.copy())
        for single in pickled:
            single.shared -= parts


def _join_sharing(singles: list[_Pickled]) -> list[list[_Pickled]]:
    """Union-find over variables that reach a common object."""
    parent = list(range(len(singles)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[int, int] = {}
    for i, single in enumerate(singles):
        for obj_id in single.shared:
            j = owner.setdefault(obj_id, i)
            if j != i:
                parent[find(i)] = find(j)
    joined: dict[int, list[_Pickled]] = {}
    for i, single in enumerate(singles):
        joined.setdefault(find(i), []).append(single)
    return list(joined.values())


_dists: dict[str, list[str]] | None = None


def package_versions(modules: set[str]) -> dict[str, str]:
    global _dists
    if _dists is None:
        _dists = metadata.packages_distributions()
    versions = {}
    for module in sorted(modules):
        for dist in _dists.get(module, []):
            try:
                versions[module] = metadata.version(dist)
            except metadata.PackageNotFoundError:
                continue
            break
    return versions


def capture(
    variables: dict[str, Any],
    namespace: dict[str, Any],
    writer: Any,
    *,
    name: str,
    exclude: set[str] = frozenset(),  # type: ignore[assignment]
    kernel: dict[str, Any] | None = None,
    parent: str | None = None,
    buffer_bytes: int = BUFFER_BYTES,
) -> dict[str, Any]:
    """Pickle ``variables`` (functions bound to ``namespace``) through ``writer``; return
    the committed manifest. Copies made for writing (device data to the host, packed
    small buffers) take about ``buffer_bytes`` of host memory at most; a save that
    fails leaves nothing in the store that gc would not remove."""
    records: dict[str, dict[str, Any]] = {}
    imports = []
    singles: list[_Pickled] = []
    dumper = _Dumper(namespace)
    for var, value in variables.items():
        record = records[var] = {"name": var, "type": type_name(value)}
        if var in exclude:
            record.update(status="excluded", reason="excluded with %ckpt exclude")
            continue
        imported = import_record(var, value)
        if imported is not None:
            imports.append(imported)
            record.update(status="imported", module=imported["module"])
            continue
        try:
            single = dumper.dump([var], value)
        except Exception as exc:
            record.update(status="lost", reason=f"{type(exc).__name__}: {exc}")
            continue
        record.update(status="saved", bytes=single.nbytes, devices=sorted(single.devices))
        singles.append(single)

    dumper.drop_class_parts(singles)
    groups = []
    for members in _join_sharing(singles):
        if len(members) == 1:
            groups.append(members[0])
            continue
        names = [n for m in members for n in m.names]
        try:
            groups.append(dumper.dump(names, tuple(variables[n] for n in names)))
        except Exception:  # pickles alone but not together: keep values, lose the sharing
            groups.extend(members)

    try:
        group_entries = _write_groups(groups, writer, part_bytes(buffer_bytes))
    except BaseException:
        writer.abandon()
        raise
    modules: set[str] = {i["module"].partition(".")[0] for i in imports}
    for group in groups:
        modules |= group.modules

    manifest = {
        "name": name,
        "created": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
        "parent": parent,
        "kernel": kernel or {},
        "variables": list(records.values()),
        "imports": imports,
        "groups": group_entries,
        "excluded": sorted(exclude),
        "environment": {
            "python": platform.python_version(),
            "implementation": platform.python_implementation(),
            "platform": sys.platform,
            "machine": platform.machine(),
            "packages": package_versions(modules - {"__main__", "builtins"}),
        },
        "devices": sorted({d for g in groups for d in g.devices}),
    }
    if any(d.startswith("cuda") for d in manifest["devices"]):
        manifest["gpu"] = gpu_facts()
    return writer.commit(manifest)


def part_bytes(buffer_bytes: int) -> int:
    """The size of the pieces a buffer of ``buffer_bytes`` is written in: two are in
    flight at a time (one copied while the other is written), each whole chunks."""
    return max(CHUNK_SIZE, buffer_bytes // 2 // CHUNK_SIZE * CHUNK_SIZE)


def _write_groups(groups: list[_Pickled], writer: Any, part: int) -> list[dict[str, Any]]:
    """Hand every group's pickle and buffers to ``writer``; return the groups' entries.

    Host memory stays bounded by about two ``part``s whatever the state's size: device
    storages are copied to the host a part at a time as they are written, and the pack
    of small buffers is written out whenever it reaches a part.
    """
    pack = bytearray()
    pack_refs: list[list[Any]] = []
    placed: dict[int, list[Any]] = {}  # device buffers reached from two groups go once

    def flush() -> None:
        nonlocal pack
        index = writer.add_segment_parts([pack])
        for ref in pack_refs:
            ref[0] = index
        pack, pack_refs[:] = bytearray(), []

    def place(buffer: memoryview | _pickler.DeviceBuffer) -> list[Any]:
        if isinstance(buffer, _pickler.DeviceBuffer):
            if id(buffer) not in placed:
                segment = writer.add_segment_parts(buffer.host_parts(part))
                placed[id(buffer)] = [segment, 0, buffer.nbytes]
            return placed[id(buffer)]
        if buffer.nbytes > PACK_MAX:
            return [writer.add_segment(buffer), 0, buffer.nbytes]
        if len(pack) + buffer.nbytes > part:
            flush()
        pack.extend(bytes(-len(pack) % PACK_ALIGN))
        ref = [None, len(pack), buffer.nbytes]
        pack.extend(buffer)
        pack_refs.append(ref)
        return ref

    entries = [
        {
            "names": group.names,
            "pickle": place(memoryview(group.data)),
            "buffers": [place(b) for b in group.buffers],
        }
        for group in groups
    ]
    flush()
    return entries


def gpu_facts() -> dict[str, Any]:
    """The node's GPUs and the CUDA runtime torch was built for: what restore must match."""
    from ..gpu import GpuProbe

    facts = GpuProbe().node()
    torch = sys.modules.get("torch")
    if torch is not None:
        facts["torch_cuda"] = torch.version.cuda
    return facts
