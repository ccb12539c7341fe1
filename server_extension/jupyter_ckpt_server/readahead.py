"""Reading ahead, while a restored kernel's process starts, what its restore will read.

Starting a kernel takes a second or more, most of it the kernel importing its modules;
the restore that follows then reads the image and imports what the image's objects need.
Both come from the disk when the page cache has been dropped (a kernel suspended for
hours, a node under memory pressure). The server knows what the restore will read from
the image's manifest, so it asks the page cache for those files while the kernel starts
(``posix_fadvise(WILLNEED)`` starts the reads and returns), and the restore then finds
them in memory: the chunks of the image's pickle streams and small buffers, which the
kernel copies from the page cache instead of reading them again
(:class:`jupyter_ckpt.store.backends.LocalBackend`), and the modules of the packages
whose objects are in the image, with those the kernel side of jupyter_ckpt imports.

Nothing is read into the server's memory and nothing is unpickled; a file that cannot be
opened is skipped (the restore reports it if it matters).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterable, Iterator
from typing import Any

from jupyter_ckpt.store import ImageStore
from jupyter_ckpt.store.backends import LocalBackend
from jupyter_ckpt.store.layout import chunk_path
from jupyter_ckpt.store.mapping import large_buffers, read_ahead

# What ``jupyter_ckpt.kernel`` imports that a fresh kernel has not imported already.
KERNEL_MODULES = ("jupyter_ckpt", "blake3", "cloudpickle", "cryptography", "psutil")
# What an import reads of a package's files: its compiled modules and its extensions.
LOADED = (f".{sys.implementation.cache_tag}.pyc", ".so", ".pyd")


def image_files(store: ImageStore, manifest: dict[str, Any]) -> list[str]:
    """The chunk files of the image's pickle streams and small buffers. Large buffers
    are left alone: mapped, they are read after the restore (:mod:`.mapping`'s check);
    read, the kernel reads them with direct I/O at the disk's pace, and reading them
    ahead as well would only make the disk read them twice and slow the kernel's start."""
    backend = store.backend
    if not isinstance(backend, LocalBackend):
        return []
    large = large_buffers(manifest)
    return [
        os.path.join(backend.root, chunk_path(digest))
        for index, segment in enumerate(manifest["segments"])
        if index not in large
        for digest, _ in segment["chunks"]
    ]


def module_files(modules: Iterable[str]) -> Iterator[str]:
    """The files an import of the named top-level modules reads (compiled modules and
    extensions, not sources nor tests), as this server's Python finds them (kernels of the
    server's own environment find the same), without importing them."""
    for name in modules:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is None:
            continue
        for location in spec.submodule_search_locations or ():
            for directory, dirs, names in os.walk(location):
                dirs[:] = [d for d in dirs if d != "tests"]
                yield from (os.path.join(directory, n) for n in names if n.endswith(LOADED))
        if spec.origin and os.path.isfile(spec.origin):
            yield spec.origin


def readahead(store: ImageStore, manifest: dict[str, Any]) -> int:
    """Start reading the files the image's restore needs; returns how many. Blocks only
    while the requests are queued (run it on a thread)."""
    packages = manifest.get("environment", {}).get("packages", {})
    files = [*image_files(store, manifest), *module_files([*KERNEL_MODULES, *packages])]
    for path in files:
        read_ahead(path)
    return len(files)
