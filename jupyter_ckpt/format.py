"""Human-readable text for images, shared by the `%ckpt` magics and `jupyter ckpt`."""

from __future__ import annotations

from typing import Any

from .store import ImageStore


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def saved_count(manifest: dict[str, Any]) -> int:
    """Variables that come back on restore (saved by value or re-imported)."""
    return sum(v["status"] in ("saved", "imported") for v in manifest["variables"])


def list_images(store: ImageStore) -> list[str]:
    lines = []
    for image_id, manifest, error in store.iter_manifests():
        if manifest is None:
            lines.append(f"{image_id[:12]}  INVALID: {error}")
            continue
        lines.append(
            f"{image_id[:12]}  {manifest['created'][:19].replace('T', ' ')}  "
            f"{human_bytes(manifest['sizes']['logical']):>10}  {saved_count(manifest):>4} vars  "
            f"{manifest['name']}"
        )
    return lines or [f"No images in {store.backend.url}"]


def list_entries(store: ImageStore) -> list[dict[str, Any]]:
    """`list_images` as data for scripts; an image that fails to load has an ``error``."""
    entries: list[dict[str, Any]] = []
    for image_id, manifest, error in store.iter_manifests():
        if manifest is None:
            entries.append({"id": image_id, "error": error})
            continue
        entries.append(
            {
                "id": image_id,
                "name": manifest["name"],
                "created": manifest["created"],
                "logical_bytes": manifest["sizes"]["logical"],
                "saved_variables": saved_count(manifest),
                "devices": manifest.get("devices", []),
            }
        )
    return entries


# How the bytes are laid out: needed to load an image, noise to anyone reading about it.
LAYOUT_KEYS = frozenset({"segments", "groups"})


def image_summary(manifest: dict[str, Any]) -> dict[str, Any]:
    """`describe_image` as data for scripts: the manifest without its byte layout."""
    return {k: v for k, v in manifest.items() if k not in LAYOUT_KEYS}


def describe_image(manifest: dict[str, Any]) -> list[str]:
    kernel = manifest.get("kernel", {})
    env = manifest.get("environment", {})
    lines = [
        f"Image {manifest['id']}  '{manifest['name']}'",
        f"  created {manifest['created']}  parent {manifest.get('parent') or '-'}",
        f"  kernel {kernel.get('id') or '-'}  notebook {kernel.get('notebook_path') or '-'}",
        f"  python {env.get('python')}  devices {', '.join(manifest.get('devices', [])) or 'cpu'}",
        f"  size {human_bytes(manifest['sizes']['logical'])}",
        "  variables:",
    ]
    for var in manifest["variables"]:
        detail = {
            "saved": human_bytes(var.get("bytes", 0)),
            "imported": f"import {var.get('module')}",
        }.get(var["status"], f"{var['status'].upper()}: {var.get('reason')}")
        lines.append(f"    {var['name']:<20} {var['type']:<32} {detail}")
    return lines
