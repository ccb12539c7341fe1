"""Bring an image back into a namespace.

Order matters for safety and for the user: every chunk is verified against its hash before
its bytes reach the unpickler (segments are read group by group, so a restore never holds
the whole image at once), every group is rebuilt aside, and only at the end are the rebuilt
values swapped into the namespace in one step. A group that fails to unpickle names its
variables and the reason; it never takes the others down with it (in the one stream of
newer images, a variable fails alone, or with those that need its objects: see
:mod:`.stream`). A chunk that fails its check aborts the whole restore and leaves the
namespace as it was.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import process
from . import devices, module_objects, pickler, stream


@dataclass
class RestoreReport:
    restored: list[str] = field(default_factory=list)
    # name -> why it is not back (failed now, or not saved in the first place)
    missing: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"restored": self.restored, "missing": self.missing, "warnings": self.warnings}


def _import(record: dict[str, Any]) -> Any:
    for submodule in record.get("submodules", ()):
        importlib.import_module(submodule)
    value: Any = importlib.import_module(record["module"])
    for part in record.get("attr", "").split(".") if record.get("attr") else ():
        value = getattr(value, part)
    return value


def restore(
    manifest: dict[str, Any],
    segments: Sequence[memoryview],
    namespace: dict[str, Any],
    *,
    map_location: str | None = None,
) -> RestoreReport:
    """Rebuild the image's variables and swap them into ``namespace``.

    ``segments`` must come from :meth:`ImageStore.read_segments`, which verifies each one
    as it is first indexed.
    """
    report = RestoreReport()
    for var in manifest["variables"]:
        if var["status"] in ("lost", "excluded"):
            report.missing[var["name"]] = f"not saved: {var['reason']}"
    unsaved = set(report.missing)  # in the stream, but found not to load when it was saved
    for provider, why in manifest.get("process", {}).get("lost", {}).items():
        unsaved.add(process.PREFIX + provider)
        report.warnings.append(f"{provider} was not saved: {why}")

    mapper = devices.DeviceMapper(devices.device_ops, manifest.get("devices", []), map_location)
    staged: dict[str, Any] = {}

    def view(ref: list[Any]) -> memoryview:
        segment, offset, length = ref
        return segments[segment][offset : offset + length]

    token = devices.current_mapper.set(mapper)
    try:
        for group in manifest["groups"]:
            names = group["names"]
            # Read (and verified) outside the try: a bad chunk fails the whole restore.
            data, buffers = view(group["pickle"]), [view(r) for r in group["buffers"]]
            if "parts" in group:  # one pickle per variable in one stream
                values, missing = stream.load(data, buffers, names, group["parts"], namespace)
                staged.update((n, v) for n, v in values.items() if n not in unsaved)
                report.missing.update((n, r) for n, r in missing.items() if n not in unsaved)
                continue
            try:  # one pickle of the group's variables, as images before streams hold
                value = pickler.loads(data, buffers, namespace)
            except Exception as exc:
                for name in names:
                    report.missing[name] = f"{type(exc).__name__}: {exc}"
                continue
            staged.update(zip(names, value, strict=True) if len(names) > 1 else [(names[0], value)])
    finally:
        devices.current_mapper.reset(token)

    for record in manifest["imports"]:
        try:
            staged[record["name"]] = _import(record)
        except Exception as exc:
            report.missing[record["name"]] = f"cannot re-import {record['module']}: {exc}"

    # The process state the variables lived in, before they are back (see
    # :mod:`jupyter_ckpt.process`; sys.path and the working directory came first).
    states = {
        name.removeprefix(process.PREFIX): staged.pop(name)
        for name in list(staged)
        if name.startswith(process.PREFIX)
    }
    report.warnings.extend(process.apply_states(states, process.PROVIDERS))
    for name in list(report.missing):
        if name.startswith(process.PREFIX):
            why = report.missing.pop(name)
            report.warnings.append(f"{name.removeprefix(process.PREFIX)} not restored: {why}")
    # in the order they were saved in: the next save lists (and pickles) them in the
    # namespace's order, and an unchanged state must come out the same
    order = [v["name"] for v in manifest["variables"]]
    namespace.update((n, staged[n]) for n in order if n in staged)
    namespace.update(staged)
    for var in manifest["variables"]:
        if "module_attr" in var and var["name"] in staged:
            module, attr = var["module_attr"]
            try:
                module_objects.rebind(module, attr, staged[var["name"]])
            except Exception as exc:
                report.warnings.append(
                    f"{var['name']} is no longer {module}.{attr}: {type(exc).__name__}: {exc}"
                )
    report.restored = [n for n in order if n in staged]
    report.warnings.extend(mapper.warnings)
    return report
