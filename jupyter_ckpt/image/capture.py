"""Write a namespace to an image.

Nothing is tracked while the user works; all the work happens here, in one pass: every
variable is pickled into one stream (see :mod:`.stream` for why one stream, and how one
variable that fails does not sink the others), big buffers only referenced, not copied. A
variable that fails is recorded as lost with the reason and the rest go on.

The pickle stream and small buffers are packed into one segment (a stream bigger than a
pack is its own segment); each large buffer becomes its own segment, so its chunks line up
between saves and unchanged data is not written again.
"""

from __future__ import annotations

import contextlib
import functools
import mmap
import platform
import re
import sys
import time
import types
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from typing import Any

import cloudpickle
from cloudpickle import cloudpickle as _cp

from .. import process
from ..store import BUFFER_BYTES, CHUNK_SIZE
from . import devices
from . import pickler as _pickler
from .identity import CANONICAL_MAX, canonical_digest, same_state
from .stream import Stream
from .stream import load as load_stream

# Buffers up to this size are packed together; larger ones get their own chunks.
PACK_MAX = 1 << 20
# Packed buffers start at multiples of this, so restored arrays and tensors are aligned.
PACK_ALIGN = 64


def type_name(value: Any) -> str:
    cls = type(value)
    module = cls.__module__
    return (
        cls.__qualname__ if module in ("builtins", "__main__") else f"{module}.{cls.__qualname__}"
    )


def array_facts(value: Any) -> dict[str, Any]:
    """Shape and dtype of an array or tensor (anything with a tuple ``shape`` and a
    ``dtype``), for the Details view; {} for anything else."""
    try:
        shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
        if not isinstance(shape, tuple) or dtype is None:
            return {}
        return {"shape": [int(n) for n in shape], "dtype": str(dtype)}
    except Exception:  # a user object's attributes may raise anything
        return {}


def import_record(
    name: str, value: Any, sources: dict[str, tuple[str, str]] | None = None
) -> dict[str, Any] | None:
    """How to re-import a module alias or a `from x import y` binding, if it is one.

    ``sources``: where the input history says names came from (name -> (module, attr);
    attr "*" for a star import, under the module's name). A value is a binding of a module
    attribute when ``getattr(module, attr) is value`` for a loaded module: the one the
    history names, or the module (or a package above it) that the value or its class
    says it comes from. Such a value is imported again on restore, not pickled: it is the
    module's object (SymPy's ``RR``, a decorator factory), whatever its class.
    """
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
    if (
        isinstance(module, str)
        and isinstance(qualname, str)
        and module != "__main__"
        and isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType))
    ):
        target: Any = sys.modules.get(module)
        for part in qualname.split("."):
            target = getattr(target, part, None)
        if target is value:
            return {"name": name, "module": module, "attr": qualname}
    if type(value) in (dict, list, set, bytearray):
        return None  # one the user may have changed: saved as it is now
    with contextlib.suppress(Exception):  # user objects' and modules' attributes may raise
        for source, attr in _candidates(name, value, sources or {}):
            if getattr(sys.modules.get(source), attr, _ABSENT) is value:
                return {"name": name, "module": source, "attr": attr}
    return None


_ABSENT = object()


def _candidates(
    name: str, value: Any, sources: dict[str, tuple[str, str]]
) -> list[tuple[str, str]]:
    """(module, attribute) pairs that may hold ``value``, most likely first."""
    found = [sources[name]] if name in sources else []
    found += [(module, name) for module, attr in sources.values() if attr == "*"]
    for owner in (value, type(value)):
        module = getattr(owner, "__module__", None)
        while isinstance(module, str) and module and module != "__main__":
            found.append((module, name))
            module = module.rpartition(".")[0]
    return found


_FROM_IMPORT = re.compile(r"^\s*from\s+([\w.]+)\s+import\s+(?:\(([^)]*)\)|([^#\n]+))", re.MULTILINE)


def history_sources(history: list[str]) -> dict[str, tuple[str, str]]:
    """Names bound by `from x import a, b as c` and `from x import *` in the input history:
    name -> (module, attribute); a star import as module -> (module, "*")."""
    sources: dict[str, tuple[str, str]] = {}
    for cell in history:
        for module, grouped, names in _FROM_IMPORT.findall(cell):
            for item in (grouped or names).split(","):
                words = item.split("#")[0].split()
                if words == ["*"]:
                    sources[module] = (module, "*")
                elif len(words) == 1:
                    sources[words[0]] = (module, words[0])
                elif len(words) == 3 and words[1] == "as":
                    sources[words[2]] = (module, words[0])
    return sources


def _attribute_path(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if part.startswith("_"):
            return None
        obj = getattr(obj, part, None)
    return obj


def package_versions(modules: set[str]) -> dict[str, str]:
    """The installed version of each top-level module's distribution, where it has one."""
    versions = {}
    for module in sorted(modules):
        version = _version_of(module)
        if version is not None:
            versions[module] = version
    return versions


@functools.cache
def _version_of(module: str) -> str | None:
    """The version of the distribution that provides the top-level ``module``: the one
    named like it where that one has it (numpy, torch), else the first whose files list it
    (scikit-learn for sklearn). Once per module and kernel, reading only what it needs:
    ``packages_distributions()`` reads every distribution's file list (about 1 s) on
    every save that runs in a fresh process, such as an autosave's forked child."""
    with contextlib.suppress(metadata.PackageNotFoundError):
        named = metadata.distribution(module)
        if _provides(named, module):
            return named.version
    found = next((d for d in metadata.distributions() if _provides(d, module)), None)
    return found.version if found is not None else None


def _provides(dist: metadata.Distribution, module: str) -> bool:
    top = dist.read_text("top_level.txt")
    if top is not None:
        return module in top.split()
    record = dist.read_text("RECORD") or ""
    pattern = rf"^{re.escape(module)}(/|\.py,|\.[^,/]*\.(so|pyd),)"
    return re.search(pattern, record, re.MULTILINE) is not None


@dataclass
class _Pickled:
    """One pass of pickling a namespace (see :func:`_pickle_all`)."""

    stream: Stream
    records: dict[str, dict[str, Any]]
    imports: list[dict[str, Any]]
    names: list[str]  # the stream's entries: variables, then process states
    process_lost: dict[str, str]


def _pickle_all(
    variables: dict[str, Any],
    namespace: dict[str, Any],
    exclude: set[str],
    sources: dict[str, tuple[str, str]],
    process_states: dict[str, Any],
    by_value: frozenset[str] = frozenset(),
) -> _Pickled:
    """Every variable into one stream, then the process states; an import of a module in
    ``by_value`` is saved by value, as its module's classes and functions are."""
    pickled = _Pickled(Stream(namespace), {}, [], [], {})
    for var, value in variables.items():
        record = {"name": var, "type": type_name(value), **array_facts(value)}
        pickled.records[var] = record
        if var in exclude:
            record.update(status="excluded", reason="excluded with %ckpt exclude")
            continue
        imported = import_record(var, value, sources)
        interpreter = pickled.stream.library_objects.interpreter.get(id(value))
        if interpreter is not None:  # a list or dict of the interpreter's: by reference
            imported = {"name": var, "module": interpreter[0], "attr": interpreter[1]}
        if imported is not None and not _within(imported["module"], by_value):
            pickled.imports.append(imported)
            record.update(status="imported", module=imported["module"])
            continue
        try:
            nbytes, devices = pickled.stream.add(value)
        except Exception as exc:
            record.update(status="lost", reason=f"{type(exc).__name__}: {exc}")
            continue
        record.update(status="saved", bytes=nbytes, devices=sorted(devices))
        bound = pickled.stream.library_objects.of_users_modules().get(id(value))
        if bound is not None:  # shared with one of the user's modules: see rebind
            record["module_attr"] = list(bound)
        pickled.names.append(var)
    for provider, state in process_states.items():
        try:
            pickled.stream.add(state)
        except Exception as exc:
            pickled.process_lost[provider] = f"{type(exc).__name__}: {exc}"
            continue
        pickled.names.append(process.PREFIX + provider)
    return pickled


def _within(module: str, packages: frozenset[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


@contextlib.contextmanager
def _saved_by_value(modules: Iterable[str]) -> Iterator[None]:
    """cloudpickle saves the classes and functions of ``modules`` by value meanwhile."""
    registered = [sys.modules[m] for m in modules if m in sys.modules]
    for module in registered:
        cloudpickle.register_pickle_by_value(module)
    try:
        yield
    finally:
        for module in registered:
            cloudpickle.unregister_pickle_by_value(module)


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
    verify: bool = False,
    trigger: str | None = None,
    newest: dict[str, Any] | None = None,
    process_states: dict[str, Any] | None = None,
    process_lost: dict[str, str] | None = None,
    fresh_kernel: process.FreshKernel | None = None,
) -> dict[str, Any]:
    """Pickle ``variables`` (functions bound to ``namespace``) through ``writer``; return
    the committed manifest. Copies made for writing (device data to the host, packed
    small buffers) take about ``buffer_bytes`` of host memory at most; a save that
    fails leaves nothing in the store that gc would not remove. With ``verify``, the
    stream is loaded back first (see :func:`verify_stream`), and a variable that would not
    load is listed as not saved, with the reason. ``trigger``: why the image is written
    (``manual``, ``autosave``, ``idle``, ``shutdown``...), shown with it. ``newest``: the
    manifest of the kernel's newest image; when this save holds the same state (see
    :mod:`.identity`) no image is written and that manifest comes back, with
    ``unchanged`` (this save's time and execution count) added.

    ``process_states``: the process-state providers' states (:mod:`jupyter_ckpt.process`),
    saved in the stream after the variables; ``process_lost``: providers whose state
    could not be read, and why. ``fresh_kernel``: how a restore's kernel starts; the
    modules the image refers to that it would not import as this kernel did (a module
    from a folder since removed, or made in memory) are saved by value, and named in the
    manifest's ``warnings``."""
    sources = history_sources((kernel or {}).get("history", {}).get("raw", []))
    states = process_states or {}
    pickled = _pickle_all(variables, namespace, exclude, sources, states)
    warnings: list[str] = []
    if fresh_kernel is not None:
        refused = fresh_kernel.unimportable(
            pickled.stream.pickler.modules | {i["module"] for i in pickled.imports}
        )
        if refused:
            with _saved_by_value(refused):
                pickled = _pickle_all(
                    variables, namespace, exclude, sources, states, frozenset(refused)
                )
            warnings += [
                f"module {m}: {why}; its classes and functions were saved with the image"
                for m, why in sorted(refused.items())
            ]
    stream, records, names = pickled.stream, pickled.records, pickled.names
    lost_states = {**(process_lost or {}), **pickled.process_lost}

    verified = None
    if verify and names:
        started = time.perf_counter()
        failed = verify_stream(stream, names)
        for entry, reason in failed.items():
            if entry.startswith(process.PREFIX):
                lost_states[entry.removeprefix(process.PREFIX)] = f"would not load: {reason}"
                continue
            records[entry].update(status="lost", reason=f"saved, but would not load: {reason}")
            records[entry].pop("bytes", None)
        verified = round(time.perf_counter() - started, 6)
    # read before it is written: a large stream's pieces go as they are
    pickled_stream = b"".join(stream.out.pieces) if stream.out.size <= CANONICAL_MAX else None
    try:
        group_entries = _write_stream(names, stream, writer, part_bytes(buffer_bytes))
    except BaseException:
        writer.abandon()
        raise
    if pickled_stream is not None:
        for group in group_entries:
            held = group["pickle"][0]
            packed = [
                buffer
                for buffer, ref in zip(stream.buffers, group["buffers"], strict=True)
                if ref[0] == held and isinstance(buffer, memoryview)
            ]
            group["canonical"] = canonical_digest(pickled_stream, packed)
    modules: set[str] = {i["module"].partition(".")[0] for i in pickled.imports}
    modules |= {m.partition(".")[0] for m in stream.pickler.modules}

    manifest: dict[str, Any] = {
        "name": name,
        "created": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
        "parent": parent,
        "trigger": trigger,
        "kernel": kernel or {},
        "variables": list(records.values()),
        "imports": pickled.imports,
        # what of the process was kept besides the variables, and what not (and why)
        "process": {
            "kept": sorted(s for s in states if s not in lost_states),
            "lost": lost_states,
        },
        "warnings": warnings,
        "groups": group_entries,
        "excluded": sorted(exclude),
        "environment": {
            "python": platform.python_version(),
            "implementation": platform.python_implementation(),
            "platform": sys.platform,
            "machine": platform.machine(),
            "packages": package_versions(modules - {"__main__", "builtins"}),
        },
        "devices": sorted(stream.devices),
        "verify_seconds": verified,
    }
    if any(d.startswith("cuda") for d in manifest["devices"]):
        manifest["gpu"] = {**gpu_facts(), "device_bytes": stream.device_bytes()}
    count = (kernel or {}).get("execution_count")

    def keep(complete: dict[str, Any]) -> dict[str, Any] | None:
        if newest is None or not same_state(complete, newest):
            return None
        return {**newest, "unchanged": {"created": complete["created"], "execution_count": count}}

    return writer.commit(manifest, keep)


def verify_stream(stream: Stream, names: list[str]) -> dict[str, str]:
    """Load the stream as a restore would, into a scratch namespace; return the variables
    that do not come back and why. Arrays and tensors come back over the saved memory,
    not copies; device storages over untouched anonymous memory, on the CPU. The objects
    are built again, though: for object-heavy state this costs about a ``pickle.loads``,
    and that much memory until it returns."""
    data = memoryview(b"".join(stream.out.pieces))
    buffers = [
        b if isinstance(b, memoryview) else memoryview(mmap.mmap(-1, b.nbytes)) if b.nbytes else b""
        for b in stream.buffers
    ]
    token = devices.current_mapper.set(devices.DeviceMapper(devices.device_ops, [], "cpu"))
    try:
        with _fresh_classes():
            _, missing = load_stream(data, buffers, names, stream.parts, {})
    finally:
        devices.current_mapper.reset(token)
    return missing


@contextlib.contextmanager
def _fresh_classes() -> Iterator[None]:
    """Classes saved by value are built anew while the stream is loaded back. In the
    process that saved them, cloudpickle would hand back the live class and set the
    loaded methods on it, bound to the scratch namespace: the kernel's own class would
    change under the user."""
    track = _cp._lookup_class_or_track
    _cp._lookup_class_or_track = lambda class_tracker_id, class_def: class_def
    try:
        yield
    finally:
        _cp._lookup_class_or_track = track


def part_bytes(buffer_bytes: int) -> int:
    """The size of the pieces a buffer of ``buffer_bytes`` is written in: two are in
    flight at a time (one copied while the other is written), each whole chunks."""
    return max(CHUNK_SIZE, buffer_bytes // 2 // CHUNK_SIZE * CHUNK_SIZE)


def _write_stream(names: list[str], stream: Stream, writer: Any, part: int) -> list[dict[str, Any]]:
    """Hand the stream and its buffers to ``writer``; return the manifest's group entries
    (one group, whose ``parts`` locate each variable in the stream; none if no variable
    was saved).

    Host memory stays bounded by about two ``part``s besides the stream (whose chunks go
    as they are written) whatever the state's size: device storages are copied to the
    host a part at a time as they are written, and the pack of small buffers is written
    out whenever it reaches a part.
    """
    if not names:
        return []
    # what will be written, as far as known before it is: every pickled byte and buffer
    writer.progress.expect(stream.out.size + sum(b.nbytes for b in stream.buffers))
    pack = bytearray()
    pack_refs: list[list[Any]] = []
    placed: dict[int, list[Any]] = {}  # a device buffer reached twice goes once

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

    entry = {
        "names": names,
        "pickle": (
            place(memoryview(stream.out.pieces[0]))
            if stream.out.size <= PACK_MAX
            else [writer.add_segment_parts(stream.out.drain()), 0, stream.out.size]
        ),
        "buffers": [place(b) for b in stream.buffers],
        "parts": stream.parts,
    }
    if pack_refs:
        flush()
    return [entry]


def gpu_facts() -> dict[str, Any]:
    """The node's GPUs and the CUDA runtime torch was built for: what restore must match
    (:mod:`jupyter_ckpt.compat`). The node is probed, or described by its facts file."""
    from ..compat import GPU_KEYS, node_facts

    facts = node_facts()
    gpu = {k: v for k, v in facts.items() if k in GPU_KEYS}
    torch = sys.modules.get("torch")
    runtime = torch.version.cuda if torch is not None else None
    # a CPU build of torch has none: a facts file may name the node's
    gpu["torch_cuda"] = runtime or facts.get("torch_cuda")
    return gpu
