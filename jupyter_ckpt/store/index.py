"""A signed index of one user's manifests: a listing reads one object, not one per image.

The index is a cache, never the truth. Every listing first lists the manifest files with
a fingerprint each (one directory walk on disk, one LIST per 1,000 keys on S3: inode,
size and change times locally, ETag, size and time on object stores). An index entry is
used only while its fingerprint still matches the manifest file it was made from;
anything new or changed is read and verified from its manifest, and an image whose
manifest is gone is gone whatever the index says. The index itself is signed with the
user's secret (like a manifest, and encrypted like one) and ignored if the signature
fails, so a stale,
replayed or tampered index can cost extra reads but never hide an image or forge one.

Nothing updates the index on commit or delete. A listing that finds a few manifests it
has not seen (up to ``ImageStore.index_slack``) reads just those; with more it reads the
index, and rewrites it once the index misses more than that many. So a run of saves
costs an index write every ``index_slack`` images, and a listing at most that many extra
reads. Processes racing to write it may overwrite each other; the loser's entries are
simply read again later. Entries hold what listings, name resolution and retention
need (:func:`summary`), not the byte layout or the input history, so the index stays
small however large the images are.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..errors import CkptError, ImageNotFound, IntegrityError, StoreUnavailable
from .layout import ID_RE, MANIFEST

if TYPE_CHECKING:
    from .backends import Backend
    from .encryption import Sealer

INDEX = "index.json"
KIND = "jupyter-ckpt/index"

#: (image id, summary or None, error or None), as :meth:`ImageStore.iter_manifests` yields.
Entry = tuple[str, dict[str, Any] | None, str | None]


def summary(manifest: dict[str, Any]) -> dict[str, Any]:
    """What a listing needs of a manifest: all of it but the byte layout and the input
    history (which restores need, and which grows with every cell run)."""
    kept = {k: v for k, v in manifest.items() if k not in ("segments", "groups")}
    if "kernel" in kept:
        kept["kernel"] = {k: v for k, v in kept["kernel"].items() if k != "history"}
    return kept


class ManifestIndex:
    """This process's verified summaries, backed by the signed index object of the store."""

    def __init__(self, backend: Backend, sealer: Sealer, log: logging.Logger) -> None:
        self.backend = backend
        self.sealer = sealer
        self.log = log
        # id -> (fingerprint, summary); only ever holds summaries we verified.
        self._known: dict[str, tuple[str, dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def manifest_files(self) -> dict[str, str]:
        """Fingerprint of every manifest file, by image id."""
        found = {}
        for path, fingerprint in self.backend.fingerprints("images", MANIFEST):
            image_id = path.split("/")[1]
            if ID_RE.match(image_id):
                found[image_id] = fingerprint
        return found

    def scan(
        self,
        load: Callable[[str], dict[str, Any]],
        map_: Callable[[Callable[[str], Entry], Iterable[str]], Iterable[Entry]] = map,
        slack: int = 0,
    ) -> list[Entry]:
        """Every image, newest first; ``load`` reads and verifies one manifest, ``map_``
        runs those reads (in parallel on a pool).

        Up to ``slack`` manifests this process has not seen are read directly; more, and
        the stored index is read first. It is rewritten once more than ``slack`` of its
        entries are missing or out of date, so a run of saves rewrites it every ``slack``
        images, not after each one."""
        with self._lock:
            found = self.manifest_files()
            known = {i: e for i, e in self._known.items() if found.get(i) == e[0]}
            stale = [i for i in found if i not in known]
            drift = None  # entries the stored index lacks or holds in vain, if it was read
            if len(stale) > slack:
                stored = self._read()
                usable = {i: e for i, e in stored.items() if found.get(i) == e[0]}
                known.update(usable)
                stale = [i for i in stale if i not in known]
                drift = len(stored) - len(usable)

            def read(image_id: str) -> Entry:
                try:
                    return image_id, summary(load(image_id)), None
                except (IntegrityError, ImageNotFound) as exc:
                    return image_id, None, str(exc)
                except StoreUnavailable:
                    raise  # the whole listing fails with it: no image is "bad" for a moment
                except OSError as exc:  # e.g. a file another user put here, unreadable to us
                    return image_id, None, f"image {image_id}: cannot read it ({exc})"

            entries: list[Entry] = [(i, s, None) for i, (_, s) in known.items()]
            for image_id, loaded, error in map_(read, stale):
                entries.append((image_id, loaded, error))
                if loaded is not None:
                    known[image_id] = (found[image_id], loaded)
                    drift = None if drift is None else drift + 1
                else:
                    self.log.debug("Skipping image %s: %s", image_id, error)
            self._known = known
            if drift is not None and drift > slack:
                self._write(known)
        entries.sort(key=lambda e: (e[1] or {}).get("created", ""), reverse=True)
        return entries

    def _read(self) -> dict[str, tuple[str, dict[str, Any]]]:
        """The stored index's entries; none if it is missing, unreadable or not ours."""
        try:
            data = self.backend.read_bytes(INDEX)
        except FileNotFoundError:
            return {}
        except StoreUnavailable:
            raise
        except OSError as exc:
            self.log.warning("Ignoring the image index: cannot read it (%s)", exc)
            return {}
        try:
            where = f"the image index {self.backend.url}/{INDEX}"
            index = self.sealer.open(data, where, "index")
            if index.get("kind") != KIND:
                raise IntegrityError(f"{INDEX} is not an image index")
            entries = index["entries"]
            return {i: (str(fp), dict(s)) for i, (fp, s) in entries.items() if ID_RE.match(i)}
        except (IntegrityError, KeyError, TypeError, ValueError, AttributeError) as exc:
            self.log.warning("Ignoring the image index, reading the manifests instead: %s", exc)
            return {}

    def _write(self, known: dict[str, tuple[str, dict[str, Any]]]) -> None:
        """Store the index; a failure only means the next process reads manifests."""
        entries = {i: list(e) for i, e in known.items()}
        sealed = self.sealer.seal({"kind": KIND, "entries": entries}, "index")
        try:
            self.backend.write_atomic(INDEX, sealed)
        except (OSError, CkptError) as exc:
            self.log.warning("Could not update the image index: %s", exc)
