"""One user's part of the store as its writers see it: chunks put and published on the
I/O pool, manifests read and checked, leases, the store's encryption setting.

:class:`ChunkSpace` sits below the modules that write through a store (:mod:`.writer`,
:mod:`.rekey`, :mod:`.records`) and below :class:`.imagestore.ImageStore`, which is one
and adds the configuration, names, listings, retention and moving images between stores:
the writers import this module, never ImageStore, so the store's modules form no loop.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ..errors import ImageNotFound, IntegrityError, InvalidReference
from .encryption import AES_GCM, Chunks, Cipher, Sealer, chunks_of
from .layout import GC_GRACE_SECONDS, ID_RE, chunk_path, manifest_path
from .leases import Lease
from .reading import allocate

if TYPE_CHECKING:
    import logging

    from .backends import FsspecBackend, LocalBackend
    from .signing import Signer

# Where a store that holds encrypted images says so (:meth:`ChunkSpace.follow_store_encryption`).
ENCRYPTION_SETTING = "encryption.json"


class ChunkSpace:
    """What writing, rekeying and recording through one user's store needs; the
    attributes are set by the store that is one (:class:`.imagestore.ImageStore`)."""

    #: This user's part of the store: every read and write goes through it.
    backend: LocalBackend | FsspecBackend
    signer: Signer
    cipher: Cipher
    #: Signs (and with encryption, encrypts) manifests, records, the index and leases.
    sealer: Sealer
    #: How each encryption's chunks are named and encoded under this store's secret.
    chunk_forms: dict[str, Chunks]
    #: How this store writes chunks; each image is read as its manifest says.
    chunks: Chunks
    #: The I/O threads that hash, write and read chunks.
    pool: ThreadPoolExecutor
    log: logging.Logger
    encryption: str

    def follow_store_encryption(self) -> None:
        """Encrypt what this store writes from now on if the store says its images are
        encrypted (``rekey --encryption`` wrote that), whatever ``encryption`` says here:
        a kernel or server configured without it must not add plaintext to an encrypted
        store. Removing ``<url>/users/<user>/encryption.json`` allows plaintext again.
        The file is not checked: whoever could plant one can only make writes encrypted."""
        if self.sealer.encrypt or not self.backend.exists(ENCRYPTION_SETTING):
            return
        self.log.info("The store %s is encrypted: new images are too", self.backend.url)
        self.encryption = AES_GCM
        self.sealer.encrypt = True
        self.chunks = self.chunk_forms[AES_GCM]

    def mark_encrypted(self) -> None:
        """Record in the store that its images are encrypted (see
        :meth:`follow_store_encryption`)."""
        setting = self.sealer.seal({"encryption": AES_GCM}, "setting")
        self.backend.write_atomic(ENCRYPTION_SETTING, setting)

    def put_chunk(
        self, data: memoryview, claim: Callable[[str], bool], chunks: Chunks | None = None
    ) -> tuple[str, int, str | None]:
        """(digest, bytes written, staged file or None); :meth:`publish` makes the staged
        file the chunk. Written as this store writes chunks, or as ``chunks`` says (a rekey).

        The chunk is hashed (and encrypted) from one private copy: a thread that changes
        the buffer meanwhile can make the image a mix of old and new values, but never a
        chunk whose bytes do not match its name.
        """
        chunks = chunks or self.chunks
        data = memoryview(bytes(data))
        digest = chunks.name(data)
        path = chunk_path(digest)
        # A reusable chunk is refreshed, not skipped: an unreferenced one (of a deleted
        # image) would otherwise look old to a concurrent gc and go before our manifest.
        if not claim(digest) or self.backend.reusable(path, GC_GRACE_SECONDS / 2):
            return digest, 0, None
        return digest, len(data), self.backend.stage(path, chunks.encode(digest, data))

    def publish(self, staged: list[tuple[str, str]]) -> None:
        """Make staged chunks durable and visible, then their directory entries durable:
        all on the pool, so the fsyncs overlap and the file system batches them."""
        pool = self.pool
        list(pool.map(lambda s: self.backend.publish(*s), staged))
        dirs = {p.rpartition("/")[0] for _, p in staged}
        list(pool.map(self.backend.sync_dir, sorted(dirs | {"chunks"} if dirs else dirs)))

    def lease(self) -> Lease:
        """Tell gc that a writer may be reusing unreferenced chunks (see :mod:`.leases`)."""
        return Lease(self.backend, self.sealer)

    def missing_chunks(self, manifest: dict[str, Any]) -> list[str]:
        """The chunks an image names that are not in the store."""
        digests = sorted({d for s in manifest["segments"] for d, _ in s["chunks"]})
        present = self.pool.map(lambda d: self.backend.exists(chunk_path(d)), digests)
        return [d for d, ok in zip(digests, present, strict=True) if not ok]

    def image_ids(self) -> list[str]:
        return [i for i in self.backend.listdir("images") if ID_RE.match(i)]

    def load_manifest(self, image_id: str) -> dict[str, Any]:
        """The verified manifest of one image id."""
        if not isinstance(image_id, str) or not ID_RE.match(image_id):
            raise InvalidReference(f"invalid image id {image_id!r}: 32 hex digits expected")
        path = manifest_path(image_id)
        try:
            data = self.backend.read_bytes(path)
        except FileNotFoundError:
            raise ImageNotFound(f"no image with id {image_id} in {self.backend.url}") from None
        manifest = self.sealer.open(data, f"image {image_id}", "manifest")
        if manifest.get("id") != image_id:
            raise IntegrityError(f"image {image_id}: manifest names another id, refusing it")
        return manifest

    def chunk_reader(
        self, manifest: dict[str, Any], forms: dict[str, Chunks] | None = None
    ) -> Callable[[str, memoryview], None]:
        """Reads one chunk of the image into a buffer of its size and checks it (hash, or
        decryption) before anyone can use it; ``forms`` decode under another secret."""
        chunks = chunks_of(manifest, forms or self.chunk_forms)

        def read(digest: str, out: memoryview) -> None:
            stored = chunks.buffer(chunks.stored_size(len(out)), out)
            try:
                n = self.backend.read_into(chunk_path(digest), stored)
            except FileNotFoundError:
                raise IntegrityError(f"chunk {digest} is missing from the store") from None
            chunks.decode_into(digest, stored[:n], out)

        return read

    def check_chunks(self, manifest: dict[str, Any]) -> None:
        """Read and check every chunk of the image. Unpickles nothing, and holds only one
        chunk per I/O thread in memory, whatever the image's size."""
        read = self.chunk_reader(manifest)
        chunks = [chunk for segment in manifest["segments"] for chunk in segment["chunks"]]
        for _ in self.pool.map(lambda c: read(c[0], allocate(c[1])), chunks):
            pass
