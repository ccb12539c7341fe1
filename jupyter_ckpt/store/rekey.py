"""Moving a user's images to the current key (`jupyter ckpt rekey`): after the secret
changed, with the old one still at hand, or to encrypt images written before
``ImageStore.encryption`` was switched on.

An image keeps its id, so the kernel records and names that point at it stay valid. Its
chunks are read and checked under the key they were written with, written again under the
current one (encrypted chunks get new names, since names are keyed), and only then is its
manifest replaced, atomically, and the image verified; if that fails the old manifest goes
back. Kernel records go first, so that retention and delete always know which images
suspended kernels need. A rekey that stops anywhere (Ctrl-C, the store gone) leaves every
image and record readable under one key or the other, and only unreferenced chunks behind,
which gc removes; running it again finishes the job. Nothing is ever decrypted back to
plaintext: an encrypted image stays encrypted whatever ``encryption`` says.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import IntegrityError, StoreUnavailable
from .encryption import AES_GCM, NONE, Chunks, Cipher, Sealer, chunk_forms, chunks_of, is_encrypted
from .index import INDEX
from .layout import chunk_path, manifest_path
from .reading import allocate
from .records import KERNEL_ID_RE, record_path

if TYPE_CHECKING:
    from .signing import Signer
    from .space import ChunkSpace

# A key to read with: how it opens JSON objects, and how it reads chunks.
Key = tuple[Sealer, dict[str, Any]]


@dataclass
class Outcome:
    """What happened to one image or kernel record."""

    kind: str  # "image" or "kernel record"
    ident: str
    result: str  # "rekeyed", "current" or "failed"
    detail: str = ""


def rekey(store: ChunkSpace, old: Signer | None = None) -> Iterator[Outcome]:
    """Rewrite, under the store's current secret (and encrypted where the store or the
    object says so), every image and kernel record of the user that is not so already;
    ``old`` opens what was written under the previous secret."""
    keys: list[Key] = [(store.sealer, store.chunk_forms)]
    if old is not None and old.key_id != store.signer.key_id:
        cipher = Cipher(old)
        keys.append((Sealer(old, cipher, False), chunk_forms(cipher)))
    # Records first: once they are readable under the current key, retention and delete
    # see which images suspended kernels need, whichever key those images are still under.
    for name in sorted(store.backend.listdir("kernels")):
        kernel_id = name.removesuffix(".json")
        if name.startswith(".") or kernel_id == name or not KERNEL_ID_RE.match(kernel_id):
            continue
        try:
            yield _rekey_record(store, kernel_id, keys)
        except StoreUnavailable:
            raise  # nothing else would get through either: one message, rerun later
        except (IntegrityError, OSError) as exc:
            yield Outcome("kernel record", kernel_id, "failed", str(exc))
    moved: dict[tuple[str, str, str], str] = {}  # (key id, form, old name) -> new name
    for image_id in sorted(store.image_ids()):
        try:
            yield _rekey_image(store, image_id, keys, moved)
        except StoreUnavailable:
            raise
        except (IntegrityError, OSError) as exc:
            yield Outcome("image", image_id, "failed", str(exc))
    # The index is a cache signed (and maybe encrypted) under the old form: listings
    # rebuild it from the rewritten manifests.
    store.backend.remove(INDEX)


def _open(data: bytes, where: str, kind: str, keys: list[Key]) -> tuple[dict[str, Any], Key]:
    errors = []
    for key in keys:
        try:
            return key[0].open(data, where, kind), key
        except IntegrityError as exc:
            errors.append(str(exc))
    raise IntegrityError(
        errors[0] if len(errors) == 1 else f"{errors[0]}; under the old secret: {errors[1]}"
    )


def _target(store: ChunkSpace, data: bytes) -> tuple[Sealer, Chunks]:
    """How an object is written back: encrypted if the store encrypts or it was already."""
    encrypt = store.sealer.encrypt or is_encrypted(data)
    return Sealer(store.signer, store.cipher, encrypt), store.chunk_forms[
        AES_GCM if encrypt else NONE
    ]


def _rekey_image(
    store: ChunkSpace, image_id: str, keys: list[Key], moved: dict[tuple[str, str, str], str]
) -> Outcome:
    path = manifest_path(image_id)
    data = store.backend.read_bytes(path)
    manifest, (sealer, forms) = _open(data, f"image {image_id}", "manifest", keys)
    if manifest.get("id") != image_id:
        raise IntegrityError(f"image {image_id}: manifest names another id, refusing it")
    source = chunks_of(manifest, forms)
    target_sealer, target = _target(store, data)
    # Plain chunks' names do not depend on the secret; encrypted ones' do.
    keep_chunks = source.encryption == target.encryption and (
        source.encryption == NONE or sealer is store.sealer
    )
    if keep_chunks and sealer is store.sealer and is_encrypted(data) == target_sealer.encrypt:
        return Outcome("image", image_id, "current", source.encryption)
    lease = store.lease()
    try:
        rewritten = 0
        if not keep_chunks:
            rewritten = _move_chunks(store, manifest, (sealer, forms), target, moved)

        def name(digest: str) -> str:
            return digest if keep_chunks else moved[_moved_key(sealer, source, digest)]

        segments = [
            {**s, "chunks": [[name(d), n] for d, n in s["chunks"]]} for s in manifest["segments"]
        ]
        new = {**manifest, "segments": segments, "encryption": target.encryption}
        store.backend.write_atomic(path, target_sealer.seal(new, "manifest"))
        store.backend.sync_dir(f"images/{image_id}")
        try:
            store.check_chunks(store.load_manifest(image_id))
        except BaseException:
            store.backend.write_atomic(path, data)  # as it was: readable under the old key
            raise
    finally:
        lease.release()
    return Outcome(
        "image", image_id, "rekeyed", f"{target.encryption}, {rewritten} chunks rewritten"
    )


def _moved_key(sealer: Sealer, source: Chunks, digest: str) -> tuple[str, str, str]:
    return sealer.signer.key_id, source.encryption, digest


def _move_chunks(
    store: ChunkSpace,
    manifest: dict[str, Any],
    key: Key,
    target: Chunks,
    moved: dict[tuple[str, str, str], str],
) -> int:
    """Read each chunk of the image under its old key, write it under the new one (on the
    I/O pool, published together); returns how many were written. Chunks an image moved
    before are not read again."""
    sealer, forms = key
    source = chunks_of(manifest, forms)
    read = store.chunk_reader(manifest, forms)
    sizes = {d: n for s in manifest["segments"] for d, n in s["chunks"]}
    todo = [(d, n) for d, n in sorted(sizes.items()) if _moved_key(sealer, source, d) not in moved]

    def move(digest: str, size: int) -> tuple[str, str, str | None]:
        buf = allocate(size)
        read(digest, buf)
        # Distinct old chunks hold distinct bytes, so no two of them get one new name.
        new, _, stage = store.put_chunk(buf, lambda _: True, target)
        return digest, new, stage

    futures: list[Future[tuple[str, str, str | None]]] = [
        store.pool.submit(move, d, n) for d, n in todo
    ]
    try:
        results = [f.result() for f in futures]
    except BaseException:
        for f in futures:
            f.cancel()
        for f in futures:  # what was written before the failure goes again
            stage = None if f.cancelled() or f.exception() else f.result()[2]
            if stage:
                store.backend.discard(stage)
        raise
    store.publish([(stage, chunk_path(new)) for _, new, stage in results if stage])
    for old_digest, new, _ in results:
        moved[_moved_key(sealer, source, old_digest)] = new
    return sum(1 for *_, stage in results if stage is not None)


def _rekey_record(store: ChunkSpace, kernel_id: str, keys: list[Key]) -> Outcome:
    path = record_path(kernel_id)
    data = store.backend.read_bytes(path)
    record, (sealer, _) = _open(data, f"kernel record {kernel_id}", "record", keys)
    if record.get("kernel_id") != kernel_id:
        raise IntegrityError(f"kernel record {kernel_id} names another kernel, refusing it")
    target_sealer, _ = _target(store, data)
    if sealer is store.sealer and is_encrypted(data) == target_sealer.encrypt:
        return Outcome("kernel record", kernel_id, "current")
    store.backend.write_atomic(path, target_sealer.seal(record, "record"))
    store.backend.sync_dir("kernels")
    return Outcome("kernel record", kernel_id, "rekeyed")
