"""The image store: content-addressed chunks plus signed manifests.

An image's bytes are a list of *segments* (one packed stream of small pickles and
buffers, then one segment per large buffer). Segments are cut into fixed-size chunks named
by their hash (see :mod:`.layout`), so a second save of a slightly changed session writes
only the chunks that changed. With ``encryption`` on, every object is encrypted under a
key of the user's secret (:mod:`.encryption`).
"""

from __future__ import annotations

import contextlib
import getpass
import io
import json
import os
import tarfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from jupyter_core.paths import jupyter_data_dir
from traitlets import Bool, Dict, Enum, Float, Int, Unicode, default, validate
from traitlets.config import LoggingConfigurable

from ..errors import (
    AmbiguousReference,
    CkptError,
    ImageInUse,
    ImageNotFound,
    IntegrityError,
    StoreUnavailable,
)
from .backends import LocalBackend, local_path, open_backend
from .encryption import (
    ENCRYPTIONS,
    NONE,
    Cipher,
    PlainChunks,
    Sealer,
    chunk_forms,
    chunks_of,
)
from .index import Entry, ManifestIndex
from .layout import (
    BUFFER_BYTES,
    GC_GRACE_SECONDS,
    ID_RE,
    MANIFEST_MAX,
    check_ref,
    chunk_path,
    manifest_path,
)
from .leases import live_leases
from .mapping import Mapper, can_map
from .progress import Progress
from .reading import Segments
from .records import KernelRecords
from .rekey import Outcome, rekey
from .signing import Signer
from .space import ChunkSpace
from .users import check_user, prepare_local, user_prefix
from .writer import ImageWriter

# What JUPYTER_CKPT_MAP_BUFFERS may say to switch mapping off.
OFF = frozenset({"0", "false", "no", "off"})


class ImageStore(LoggingConfigurable, ChunkSpace):
    """Where images live: ``ImageStore.url`` (or ``JUPYTER_CKPT_STORE``) is the root, and
    this store reads and writes only ``<root>/users/<ImageStore.user>/`` (:mod:`.users`)."""

    url = Unicode(
        help="Store location: a local path or an fsspec URL (s3://bucket/prefix). "
        "Default: $JUPYTER_CKPT_STORE, else <jupyter data dir>/ckpt."
    ).tag(config=True)

    @default("url")
    def _default_url(self) -> str:
        return os.environ.get("JUPYTER_CKPT_STORE") or os.path.join(jupyter_data_dir(), "ckpt")

    user = Unicode(
        help="Whose part of the store to use: images live under <url>/users/<user>/. "
        "Default: $JUPYTER_CKPT_USER (set by the server for its kernels), else "
        "$JUPYTERHUB_USER, else the login name.",
    ).tag(config=True)

    @default("user")
    def _default_user(self) -> str:
        for name in ("JUPYTER_CKPT_USER", "JUPYTERHUB_USER"):
            if os.environ.get(name):
                return os.environ[name]
        try:
            return getpass.getuser()
        except (KeyError, OSError):  # a uid without a passwd entry (containers)
            return f"uid-{os.getuid()}"

    @validate("user")
    def _validate_user(self, proposal: Any) -> str:
        return check_user(proposal["value"])

    secret_file = Unicode(
        help="Per-user signing secret, kept outside the store (created 0600 on first use); "
        "$JUPYTER_CKPT_SECRET, the secret itself, is used before any file. "
        "Default: $JUPYTER_CKPT_SECRET_FILE, else <jupyter data dir>/ckpt-secret."
    ).tag(config=True)

    @default("secret_file")
    def _default_secret_file(self) -> str:
        return os.environ.get("JUPYTER_CKPT_SECRET_FILE") or os.path.join(
            jupyter_data_dir(), "ckpt-secret"
        )

    create_secret = Bool(
        True,
        help="Create the secret file if it is missing. Off where the user named the file "
        "(`jupyter ckpt --secret-file`): a typo must not become a new secret.",
    )

    create_store = Bool(
        True,
        help="Create a local store's directory if it is missing. Off where the user named "
        "the store (`jupyter ckpt --store`) for a command that only reads it: a typo must "
        "not become a new, empty store.",
    )

    secret = Unicode(
        help="The signing secret itself (32+ characters), used instead of secret_file: "
        "JupyterHub's hooks give each user's server its own (jupyter_ckpt.hub). Not read "
        "from config files, which are no place for a secret. Default: $JUPYTER_CKPT_SECRET."
    )

    @default("secret")
    def _default_secret(self) -> str:
        return os.environ.get("JUPYTER_CKPT_SECRET", "")

    encryption = Enum(
        ENCRYPTIONS,
        help="Encrypt what is written from now on (chunks, manifests, kernel records, the "
        "image index) with AES-256-GCM under a key derived from the user's secret: "
        "recommended on shared and object stores. Images of either kind stay readable "
        "with the secret; `jupyter ckpt rekey` encrypts older ones. Kernels read "
        "$JUPYTER_CKPT_ENCRYPTION. Default: $JUPYTER_CKPT_ENCRYPTION, else 'none'.",
    ).tag(config=True)

    @default("encryption")
    def _default_encryption(self) -> str:
        return os.environ.get("JUPYTER_CKPT_ENCRYPTION") or NONE

    fsync = Bool(True, help="fsync chunks and manifests before an image counts as committed.").tag(
        config=True
    )

    io_threads = Int(
        8,
        min=1,
        help="Threads that hash, write and read chunks in parallel; more than cores, since "
        "they mostly wait for the disk (8 beat 4 on a 2-core machine, benchmarks/README.md).",
    ).tag(config=True)

    direct_io = Bool(
        True,
        help="Read chunks of a local store with O_DIRECT where the file system supports it "
        "(faster and lighter on the CPU for cold reads; falls back by itself).",
    ).tag(config=True)

    map_buffers = Bool(
        help="Map large array buffers from the chunk files of a local, unencrypted store "
        "(private, copy-on-write) instead of reading them during a restore: the first "
        "cell runs before the data is read, and each page is read when first touched "
        "(docs/admin-guide.md). Network file systems, encrypted images and object stores "
        "are always read. Kernels read JUPYTER_CKPT_MAP_BUFFERS. "
        "Default: $JUPYTER_CKPT_MAP_BUFFERS ('0' is off), else on.",
    ).tag(config=True)

    @default("map_buffers")
    def _default_map_buffers(self) -> bool:
        return os.environ.get("JUPYTER_CKPT_MAP_BUFFERS", "1").strip().lower() not in OFF

    buffer_bytes = Int(
        BUFFER_BYTES,
        min=1,
        help="Host memory a save may use for the copies it writes (GPU data on its way to "
        "the store, packed small buffers), whatever the size of the state. Kernels read "
        "JUPYTER_CKPT_BUFFER_BYTES. Default: $JUPYTER_CKPT_BUFFER_BYTES, else 256 MiB.",
    ).tag(config=True)

    @default("buffer_bytes")
    def _default_buffer_bytes(self) -> int:
        return int(os.environ.get("JUPYTER_CKPT_BUFFER_BYTES") or BUFFER_BYTES)

    storage_options = Dict(
        help="fsspec options for a remote store (e.g. {'endpoint_url': ...} for an "
        "S3-compatible server). Kernels read fsspec's own config instead (FSSPEC_S3=<json>), "
        "so the server and its kernels can share one setting through the environment.",
    ).tag(config=True)

    retention_days = Float(
        0, min=0, help="Remove images older than this many days (0: keep regardless of age)."
    ).tag(config=True)
    max_images = Int(
        0, min=0, help="Keep at most this many images, newest first (0: no limit)."
    ).tag(config=True)
    quota_bytes = Int(
        0,
        min=0,
        help="Remove the oldest images while the store holds more than this (0: no quota).",
    ).tag(config=True)
    index_slack = Int(
        16,
        min=0,
        help="Manifests new since the image index was written that a listing reads one by "
        "one before it reads the index instead; the index is rewritten once it misses "
        "more than this many (see jupyter_ckpt/store/index.py).",
    ).tag(config=True)
    gc_interval = Float(
        3600,
        min=0,
        help="Seconds between the chunk collections that retention after a save runs (each "
        "walks every chunk file); `jupyter ckpt gc` always collects.",
    ).tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        options = {"fsync": self.fsync, "direct_io": self.direct_io, **self.storage_options}
        path = local_path(self.url)
        if not self.create_store and path is not None and not os.path.isdir(path):
            raise ImageNotFound(f"no store at {path}: check the path (nothing was created there)")
        root = open_backend(self.url, **options)
        if isinstance(root, LocalBackend):
            prefix = prepare_local(root.root, self.user)
        else:
            prefix = f"{root.url}/{user_prefix(self.user)}"
        #: The store's root as kernels and other processes must be given it (absolute).
        self.root_url = root.url
        self.backend = open_backend(prefix, **options)
        self.signer = Signer(self.secret_file, self.secret or None, self._may_create_secret())
        self.cipher = Cipher(self.signer)
        self.sealer = Sealer(self.signer, self.cipher, self.encryption != NONE)
        self.chunk_forms = chunk_forms(self.cipher)
        self.chunks = self.chunk_forms[self.encryption]
        self.pool = ThreadPoolExecutor(max(1, self.io_threads), thread_name_prefix="ckpt-io")
        self._index = ManifestIndex(self.backend, self.sealer, self.log)
        self._collected_at = -float("inf")

    def _may_create_secret(self) -> bool:
        """Whether a missing secret file is created: not where the user named it
        (``create_secret``), nor where a config file names one in a directory that does
        not exist (a mistyped ``ImageStore.secret_file`` must not quietly become a new
        directory and a secret that opens none of the user's images)."""
        if not self.create_secret or self.secret:
            return self.create_secret
        if "secret_file" not in self.config.get("ImageStore", {}):
            return True
        return os.path.isdir(os.path.dirname(os.path.abspath(os.path.expanduser(self.secret_file))))

    def close(self) -> None:
        """Stop the I/O threads (a long-lived process that opens many stores, as a hub)."""
        self.pool.shutdown(wait=False)

    # -- writing -------------------------------------------------------------------------

    def writer(self, progress: Progress | None = None) -> ImageWriter:
        self.follow_store_encryption()
        return ImageWriter(self, progress)

    # -- reading -------------------------------------------------------------------------

    def iter_manifests(self) -> Iterator[Entry]:
        """(id, summary or None, error) for every image, newest first; bad ones are named.

        A summary is the verified manifest without its byte layout and input history
        (:func:`.index.summary`); :meth:`open` gives the whole manifest. Summaries come
        from the signed index where it is current (:mod:`.index`), so a listing reads
        only the manifests that are new since."""
        yield from self._index.scan(self.load_manifest, self.pool.map, self.index_slack)

    def resolve(self, ref: str) -> str:
        """An image id from an id, a unique id prefix, or a name (the newest image of it)."""
        check_ref(ref)
        if ID_RE.match(ref) and self.backend.exists(manifest_path(ref)):
            return ref
        entries = list(self.iter_manifests())
        named = [(m["created"], i) for i, m, _ in entries if m and m["name"] == ref]
        if named:
            return max(named)[1]
        prefixed = [i for i, _, _ in entries if i.startswith(ref)] if len(ref) >= 4 else []
        if len(prefixed) == 1:
            return prefixed[0]
        if len(prefixed) > 1:
            raise AmbiguousReference(f"{ref!r} matches {len(prefixed)} images; give more of the id")
        unreadable = {i: e for i, m, e in entries if m is None}
        for image_id, error in unreadable.items():
            if self._claimed_name(image_id) == ref:  # it is there, but not usable: say why
                raise IntegrityError(f"image '{ref}' ({image_id}) cannot be used: {error}")
        hint = ""
        if unreadable:
            first = next(iter(unreadable.items()))
            hint = (
                f"; {len(unreadable)} image(s) there cannot be read and may be it "
                f"({first[0]}: {first[1]}): `jupyter ckpt list` shows them"
            )
        raise ImageNotFound(f"no image named or with id {ref!r} in {self.backend.url}{hint}")

    def _claimed_name(self, image_id: str) -> str | None:
        """The name an unreadable image's manifest gives itself, unverified: only to say
        what is wrong with it. None if it is encrypted or not a manifest at all."""
        try:
            data = self.backend.read_bytes(manifest_path(image_id))
            name = json.loads(data)["manifest"]["name"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return name if isinstance(name, str) else None

    def open(self, ref: str) -> dict[str, Any]:
        return self.load_manifest(self.resolve(ref))

    def read_segments(self, manifest: dict[str, Any], progress: Progress | None = None) -> Segments:
        """The image's segments, each read and verified when first used and dropped after
        its last use, so a restore holds one group's data at a time, not the image. Large
        buffers are mapped instead where :meth:`mapper` allows."""
        return Segments(
            manifest, self.chunk_reader(manifest), self.pool, progress, self.mapper(manifest)
        )

    def mapper(self, manifest: dict[str, Any]) -> Mapper | None:
        """What maps the image's large buffers, or None where they must be read: mapping
        off, a remote store, a network file system, or an encrypted image."""
        backend = self.backend
        if not self.map_buffers or not isinstance(backend, LocalBackend):
            return None
        if not isinstance(chunks_of(manifest, self.chunk_forms), PlainChunks):
            return None
        if not can_map(backend.root):
            return None
        return Mapper(manifest, lambda digest: os.path.join(backend.root, chunk_path(digest)))

    def verify(self, ref: str) -> dict[str, Any]:
        """Check signature and every chunk; return the manifest. Unpickles nothing, and
        holds only one chunk per I/O thread in memory, whatever the image's size."""
        manifest = self.open(ref)
        self.check_chunks(manifest)
        return manifest

    # -- removing ------------------------------------------------------------------------

    @property
    def records(self) -> KernelRecords:
        """The records of suspended kernels kept in this store."""
        return KernelRecords(self)

    def delete(self, ref: str) -> str:
        """Remove an image we signed that no suspended kernel needs."""
        image_id = self.resolve(ref)
        try:
            self.load_manifest(image_id)
        except IntegrityError as exc:
            raise IntegrityError(
                f"refusing to delete image {image_id}: it is not one of ours ({exc})"
            ) from exc
        except StoreUnavailable:
            raise
        except OSError as exc:
            raise IntegrityError(
                f"refusing to delete image {image_id}: cannot read its manifest ({exc})"
            ) from exc
        holder = self.records.pins().holder(image_id)
        if holder is not None:
            raise ImageInUse(
                f"image {image_id} is needed by {holder}; resume or shut down that kernel first"
            )
        # Removing the manifest first makes the image vanish at once; chunks go in gc().
        self.backend.remove(manifest_path(image_id))
        self.backend.remove(f"images/{image_id}")
        return image_id

    def gc(self, grace_seconds: float = GC_GRACE_SECONDS) -> GcResult:
        """Remove chunks no image references.

        Chunks younger than ``grace_seconds`` are kept: a writer in another process writes
        its chunks before its manifest, and they must survive until the manifest lands.
        While any writer holds a live lease (:mod:`.leases`) no unreferenced chunk is
        removed at all, since it may be reusing one; and a manifest we cannot read may
        reference any chunk, so one of those also keeps every chunk (as does one encrypted
        under another secret, e.g. the one before a rotation that ``rekey`` has not seen).
        """
        referenced: set[str] = set()
        notes = []
        for image_id in self.image_ids():
            path = manifest_path(image_id)
            try:
                data = self.sealer.reveal(self.backend.read_bytes(path), path, "manifest")
                segments = json.loads(data)["manifest"]["segments"]
            except (FileNotFoundError, ValueError, KeyError, TypeError):
                continue  # gone, or not a manifest: it references nothing
            except (OSError, IntegrityError) as exc:
                notes.append(
                    f"image {image_id}: cannot read its manifest ({exc}); no chunk is "
                    "removed while an unreadable image may reference it"
                )
                continue
            referenced.update(digest for s in segments for digest, _ in s["chunks"])
        now = time.time()
        cutoff = now - grace_seconds
        candidates = [
            (path, size)
            for path, mtime, size in list(self.backend.walk_files("chunks"))
            if path.rsplit("/", 1)[-1] not in referenced and mtime <= cutoff
        ]
        leases = live_leases(self.backend, self.sealer, now)
        if leases and candidates:
            notes.append(
                f"{len(leases)} save(s) in progress: unreferenced chunks are kept until they finish"
            )
        for note in notes:
            self.log.warning("gc: %s", note)
        if notes:
            return GcResult(0, 0, notes)
        removed = freed = 0
        for path, size in candidates:
            # Look again: a writer may have reused (refreshed) it since the listing.
            mtime_now = self.backend.mtime(path)
            if mtime_now is None or mtime_now > cutoff:
                continue
            self.backend.remove(path)
            removed += 1
            freed += size
        return GcResult(removed, freed, notes)

    def expired(self, pinned: set[str], now: float | None = None) -> list[str]:
        """Image ids the retention rules remove, oldest first. Images in ``pinned``
        (needed by suspended kernels) and images that fail to load are never chosen.

        Decided from the summaries (:meth:`iter_manifests`); only a quota that the images'
        logical sizes together exceed needs their chunk lists, and so their manifests."""
        now = time.time() if now is None else now
        images = [(i, m) for i, m, _ in self.iter_manifests() if m is not None]  # newest first
        doomed: set[str] = set()
        if self.retention_days > 0:
            cutoff = now - self.retention_days * 86400
            doomed |= {i for i, m in images if _created(m) < cutoff}
        if self.max_images > 0:
            doomed |= {i for i, _ in images[self.max_images :]}
        kept = [(i, m) for i, m in images if i not in doomed]
        # Shared chunks count once, so the stored bytes are at most the logical sum.
        if 0 < self.quota_bytes < sum(m["sizes"]["logical"] for _, m in kept):
            layouts = dict(self.pool.map(self._chunks_of, [i for i, _ in kept]))
            kept = [(i, layout) for i, _ in kept if (layout := layouts[i]) is not None]
            while _stored_bytes(m for _, m in kept) > self.quota_bytes:
                removable = [i for i, _ in kept if i not in pinned]
                if not removable:
                    break
                doomed.add(removable[-1])
                kept = [(i, m) for i, m in kept if i != removable[-1]]
        return [i for i, _ in reversed(images) if i in doomed and i not in pinned]

    def _chunks_of(self, image_id: str) -> tuple[str, dict[str, Any] | None]:
        try:
            return image_id, self.load_manifest(image_id)
        except (IntegrityError, ImageNotFound, OSError):
            return image_id, None  # gone or not ours since it was listed: not ours to count

    def enforce_retention(
        self,
        now: float | None = None,
        grace_seconds: float = GC_GRACE_SECONDS,
        collect: bool | None = True,
    ) -> RetentionResult:
        """Delete expired images, then unreferenced chunks.
        Unpacks as (image ids removed, chunk files removed, bytes freed).

        ``collect=None`` runs the chunk collection only if ``gc_interval`` has passed
        since this store's last one: it walks every chunk file and reads every manifest,
        too much to do after every save. Manifests go first and chunks after: a crash in
        between, or a collection left for later, leaves only unreferenced chunks, which
        the next collection removes."""
        removed = []
        pins = self.records.pins()
        note = pins.note()
        if note is not None:
            self.log.warning("retention: %s", note)
        for image_id in [] if note else self.expired(set(pins.images), now):
            self.delete(image_id)
            removed.append(image_id)
        notes = [note] if note else []
        if collect is None:
            collect = time.monotonic() - self._collected_at >= self.gc_interval
        if not collect:
            return RetentionResult(removed, 0, 0, notes)
        self._collected_at = time.monotonic()
        result = self.gc(grace_seconds)
        return RetentionResult(removed, result.files, result.freed, notes + result.notes)

    def rekey(self, old_secret_file: str | None = None) -> Iterator[Outcome]:
        """Bring every image and kernel record to the current secret and encryption
        (see :mod:`.rekey`); ``old_secret_file`` opens what the previous secret wrote.
        Yields what happened to each, as it goes."""
        old = Signer(old_secret_file, create=False) if old_secret_file else None
        self.follow_store_encryption()
        if self.sealer.encrypt:
            self.mark_encrypted()  # first: from now on every writer encrypts
        return rekey(self, old)

    # -- moving images between stores -----------------------------------------------------

    def export(self, ref: str, file: str) -> str:
        """Write one image (manifest and chunks) to a tar file, private to the user (0600)
        and complete or absent: it is written aside and renamed into place."""
        manifest = self.verify(ref)
        image_id = manifest["id"]
        target = os.path.abspath(file)
        tmp = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.tmp-{image_id}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        except OSError as exc:  # named for the file the user asked for, not our temp
            raise CkptError(f"cannot write {target}: {exc.strerror}") from exc
        try:
            with os.fdopen(fd, "wb") as out, tarfile.open(fileobj=out, mode="w") as tar:
                digests = sorted({d for s in manifest["segments"] for d, _ in s["chunks"]})
                for name in ["manifest.json"] + [chunk_path(d) for d in digests]:
                    path = manifest_path(image_id) if name == "manifest.json" else name
                    self._tar_add(tar, name, self.backend.read_bytes(path))
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return image_id

    @staticmethod
    def _tar_add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mode = 0o600
        tar.addfile(info, io.BytesIO(data))

    def import_(self, file: str) -> str:
        """Add an exported image. It must be signed with our secret; its manifest is
        written only once every chunk checked out. Streams one chunk at a time."""
        try:
            tar = tarfile.open(file, "r")  # noqa: SIM115 (closed by the with below)
        except tarfile.TarError:
            raise IntegrityError(
                f"{file}: not a jupyter-ckpt export (not a tar file); give a file written "
                "by `jupyter ckpt export`"
            ) from None
        except OSError as exc:
            raise CkptError(f"cannot read {file}: {exc.strerror}") from exc
        with tar:
            members = {m.name: m for m in tar.getmembers() if m.isfile()}
            if "manifest.json" not in members:
                raise IntegrityError(f"{file}: not a jupyter-ckpt export (no manifest.json)")
            sealed = self._tar_read(tar, members["manifest.json"], MANIFEST_MAX)
            manifest = self.sealer.open(sealed, file, "manifest")
            image_id = check_ref(manifest.get("id", ""), "image id")
            if not ID_RE.match(image_id):
                raise IntegrityError(f"{file}: bad image id {image_id!r}")
            chunks = chunks_of(manifest, self.chunk_forms)
            lease = self.lease()
            staged: list[tuple[str, str]] = []
            try:
                sizes = {d: n for s in manifest["segments"] for d, n in s["chunks"]}
                for digest, size in sorted(sizes.items()):
                    path = chunk_path(digest)
                    member = members.get(path)
                    if member is None:
                        raise IntegrityError(f"{file}: chunk {digest} is missing")
                    data = self._tar_read(tar, member, chunks.stored_size(size))
                    try:
                        chunks.check(digest, data, size)
                    except IntegrityError as exc:
                        raise IntegrityError(f"{file}: {exc}") from None
                    if not self.backend.reusable(path, GC_GRACE_SECONDS / 2):
                        staged.append((self.backend.stage(path, data), path))
                self.publish(staged)
            except BaseException:
                for stage, _ in staged:
                    self.backend.discard(stage)
                lease.release()
                raise
        try:
            self.backend.write_atomic(manifest_path(image_id), sealed)
            self.backend.sync_dir(f"images/{image_id}")
        finally:
            lease.release()
        return image_id

    @staticmethod
    def _tar_read(tar: tarfile.TarFile, member: tarfile.TarInfo, limit: int) -> bytes:
        """A member's bytes; one larger than it may be is refused before it is read."""
        if member.size > limit:
            raise IntegrityError(f"{member.name}: {member.size} bytes, expected at most {limit}")
        f = tar.extractfile(member)
        assert f is not None
        return f.read()


@dataclass
class GcResult:
    """What gc did, and why it kept chunks it would otherwise have removed."""

    files: int
    freed: int
    notes: list[str] = field(default_factory=list)

    def __iter__(self) -> Iterator[int]:
        """Unpacks as (files removed, bytes freed)."""
        return iter((self.files, self.freed))

    def __getitem__(self, index: int) -> int:
        return tuple(self)[index]


@dataclass
class RetentionResult:
    images: list[str]
    files: int
    freed: int
    notes: list[str] = field(default_factory=list)

    def __iter__(self) -> Iterator[Any]:
        """Unpacks as (image ids removed, chunk files removed, bytes freed)."""
        return iter((self.images, self.files, self.freed))


def _created(manifest: dict[str, Any]) -> float:
    return datetime.fromisoformat(manifest["created"]).timestamp()


def _stored_bytes(manifests: Any) -> int:
    """Bytes of the distinct chunks the images reference (shared chunks count once)."""
    chunks = {(d, n) for m in manifests for s in m["segments"] for d, n in s["chunks"]}
    return sum(n for _, n in chunks)
