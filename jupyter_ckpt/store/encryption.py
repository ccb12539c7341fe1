"""Encryption at rest: with ``ImageStore.encryption = "aes-256-gcm"`` nothing the store
holds for a user can be read without that user's secret.

Keys are derived from the user's secret (the signing secret, kept outside the store; see
:mod:`.signing`) with HKDF, one per purpose:

* an AES-256-GCM key for contents. Every object is encrypted on its own (each chunk,
  manifest, kernel record, the image index, each lease), with a fresh random 96-bit nonce
  and associated data naming what it is: a chunk's own name, or a JSON object's kind
  (whose content names it again, checked after decryption). A chunk swapped for another,
  or an object put in another's place, does not decrypt. Chunks stay independent, so a
  restore reads and decrypts only the chunks of the segments it needs;
* a BLAKE3 key for chunk names. An encrypted chunk is named by the keyed hash of its
  plaintext: one user's images still share equal chunks, but without the key nobody can
  tell what a chunk holds or find the same data in another user's part of the store.

An encrypted object is ``MAGIC + key id + nonce + ciphertext + tag``; a chunk is padded
with zeros to a multiple of 4 KiB, so a restore reads it whole with direct I/O as it does
a plain one (the padding must be zeros). The key id (also in every signed envelope) names
the secret, so an object under another one is refused as such. What stays visible is what
the layout shows: how many objects, their sizes and times. Signatures stay too: an
encrypted manifest holds the signed envelope, so every check that a plaintext image gets
still runs after decryption.

Manifests say how their chunks are stored (``"encryption"``), and objects are recognised
by their first bytes, so images written before encryption was switched on stay readable,
and encrypted ones stay readable after it is switched off (the key comes from the secret,
not from the setting).
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

import blake3
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..errors import IntegrityError
from .layout import CHUNK_SIZE, Buffer, chunk_hash
from .reading import allocate

if TYPE_CHECKING:
    from .signing import Signer

NONE = "none"
AES_GCM = "aes-256-gcm"
ENCRYPTIONS = (NONE, AES_GCM)

MAGIC = b"jupyter-ckpt/aes-256-gcm\n"
KEY_ID = 16  # hex characters, as Signer.key_id
NONCE = 12
TAG = 16
HEADER = len(MAGIC) + KEY_ID + NONCE
OVERHEAD = HEADER + TAG
PAGE = 4096  # encrypted chunks fill whole pages: direct I/O reads need aligned lengths


def is_encrypted(data: Buffer) -> bool:
    return bytes(memoryview(data)[: len(MAGIC)]) == MAGIC


class Cipher:
    """AES-256-GCM and keyed chunk names under one user's secret."""

    def __init__(self, signer: Signer) -> None:
        self.key_id = signer.key_id
        self._header_id = signer.key_id.encode()
        self._aead = AESGCM(signer.derive(b"jupyter-ckpt/1 content key"))
        self._name_key = signer.derive(b"jupyter-ckpt/1 chunk name key")

    def chunk_name(self, data: Buffer) -> str:
        return blake3.blake3(data, key=self._name_key).hexdigest()

    def encrypt(self, data: Buffer, context: bytes) -> bytearray:
        """``data`` sealed under a fresh nonce, bound to ``context``."""
        out = bytearray(len(memoryview(data).cast("B")) + OVERHEAD)
        self.encrypt_into(data, context, memoryview(out))
        return out

    def encrypt_into(self, data: Buffer, context: bytes, out: memoryview) -> None:
        """:meth:`encrypt` into ``out``, exactly ``OVERHEAD`` bytes longer than ``data``."""
        nonce = os.urandom(NONCE)
        out[:HEADER] = MAGIC + self._header_id + nonce
        self._aead.encrypt_into(nonce, data, context, out[HEADER:])

    def decrypt_into(self, blob: memoryview, context: bytes, out: memoryview, what: str) -> None:
        """Decrypt ``blob`` into ``out`` (exactly its plaintext's size); nothing that fails
        authentication is returned as plaintext (the caller drops ``out`` on error)."""
        self._check_header(blob, what)
        nonce = bytes(blob[len(MAGIC) + KEY_ID : HEADER])
        try:
            self._aead.decrypt_into(nonce, blob[HEADER:], context, out)
        except (InvalidTag, ValueError):  # ValueError: a length that cannot be ours
            raise IntegrityError(
                f"{what} was altered or moved (it does not decrypt under your key)"
            ) from None

    def decrypt(self, blob: Buffer, context: bytes, what: str) -> bytes:
        view = memoryview(blob).cast("B")
        if len(view) < OVERHEAD:
            raise IntegrityError(f"{what} was altered (too short to be encrypted data)")
        out = bytearray(len(view) - OVERHEAD)
        self.decrypt_into(view, context, memoryview(out), what)
        return bytes(out)

    def _check_header(self, blob: memoryview, what: str) -> None:
        if not is_encrypted(blob):
            raise IntegrityError(f"{what} was altered (it is not encrypted, but should be)")
        key_id = bytes(blob[len(MAGIC) : len(MAGIC) + KEY_ID])
        if key_id != self._header_id:
            raise IntegrityError(
                f"{what}: encrypted with a different secret (key "
                f"{key_id.decode('ascii', 'replace')}, ours is {self.key_id}); refusing it"
            )


class Sealer:
    """The store's JSON objects (manifests, kernel records, the index, leases): signed,
    and with ``encrypt`` also encrypted. Reads accept both forms, whatever ``encrypt``
    says: a plaintext object must still carry our signature."""

    def __init__(self, signer: Signer, cipher: Cipher, encrypt: bool) -> None:
        self.signer = signer
        self.cipher = cipher
        self.encrypt = encrypt

    def wrap(self, data: bytes, kind: str) -> bytes:
        """``data`` as stored: encrypted when encryption is on."""
        return bytes(self.cipher.encrypt(data, _context(kind))) if self.encrypt else data

    def reveal(self, data: bytes, where: str, kind: str) -> bytes:
        """The plaintext of a stored object, encrypted or not (not checked further)."""
        return self.cipher.decrypt(data, _context(kind), where) if is_encrypted(data) else data

    def seal(self, obj: dict[str, Any], kind: str) -> bytes:
        return self.wrap(self.signer.seal(obj), kind)

    def open(self, data: bytes, where: str, kind: str) -> dict[str, Any]:
        """A verified object; raises IntegrityError if it is not exactly what we wrote."""
        return self.signer.open(self.reveal(data, where, kind), where)


def _context(kind: str) -> bytes:
    return b"jupyter-ckpt/1 " + kind.encode()


class PlainChunks:
    """Chunks stored as they are, named by their BLAKE3 hash."""

    encryption = NONE

    def stored_size(self, size: int) -> int:
        return size

    def name(self, data: Buffer) -> str:
        return chunk_hash(data)

    def encode(self, digest: str, data: memoryview) -> memoryview:
        return data

    def buffer(self, size: int, out: memoryview) -> memoryview:
        """Where to read a stored chunk whose plaintext goes to ``out``: ``out`` itself."""
        return out

    def decode_into(self, digest: str, stored: memoryview, out: memoryview) -> None:
        """Check a chunk read into ``out`` (which :meth:`buffer` returned)."""
        self.check(digest, stored, len(out))

    def check(self, digest: str, stored: Buffer, size: int) -> None:
        if len(stored) != size or chunk_hash(stored) != digest:
            raise IntegrityError(f"chunk {digest} was altered (content does not match its hash)")


class EncryptedChunks:
    """Chunks encrypted one by one, named by a keyed hash of their plaintext.

    Each I/O thread encrypts into, and reads into, one page-aligned buffer of its own,
    reused from chunk to chunk: no allocation or page faults per chunk, and reads can use
    direct I/O. (A chunk is staged, or decrypted, before its thread takes the next.)"""

    encryption = AES_GCM

    def __init__(self, cipher: Cipher) -> None:
        self.cipher = cipher
        self._scratch = threading.local()

    def stored_size(self, size: int) -> int:
        return -(-(size + OVERHEAD) // PAGE) * PAGE

    def name(self, data: Buffer) -> str:
        return self.cipher.chunk_name(data)

    def encode(self, digest: str, data: memoryview) -> memoryview:
        """The stored chunk, in this thread's buffer: valid until its next chunk."""
        end = len(data) + OVERHEAD
        stored = self.buffer(self.stored_size(len(data)), data)
        self.cipher.encrypt_into(data, _chunk_context(digest), stored[:end])
        stored[end:] = bytes(len(stored) - end)
        return stored

    def buffer(self, size: int, out: memoryview) -> memoryview:
        """This thread's buffer, ``size`` bytes of it, to read a stored chunk into."""
        scratch: memoryview | None = getattr(self._scratch, "buf", None)
        if scratch is None or len(scratch) < size:
            scratch = allocate(max(size, self.stored_size(CHUNK_SIZE)))
            self._scratch.buf = scratch
        return scratch[:size]

    def decode_into(self, digest: str, stored: memoryview, out: memoryview) -> None:
        end = len(out) + OVERHEAD
        if len(stored) != self.stored_size(len(out)) or stored[end:] != bytes(len(stored) - end):
            raise IntegrityError(f"chunk {digest} was altered (its size or padding is wrong)")
        self.cipher.decrypt_into(stored[:end], _chunk_context(digest), out, f"chunk {digest}")

    def check(self, digest: str, stored: Buffer, size: int) -> None:
        self.decode_into(digest, memoryview(stored).cast("B"), memoryview(bytearray(size)))


def _chunk_context(digest: str) -> bytes:
    return _context("chunk " + digest)


Chunks = PlainChunks | EncryptedChunks


def chunk_forms(cipher: Cipher) -> dict[str, Chunks]:
    """Each way chunks may be stored, by the name manifests give it."""
    return {NONE: PlainChunks(), AES_GCM: EncryptedChunks(cipher)}


def chunks_of(manifest: dict[str, Any], forms: dict[str, Chunks]) -> Chunks:
    """How the chunks of an image are stored, as its (verified) manifest says; images
    written before encryption existed say nothing and are plain."""
    kind = manifest.get("encryption", NONE)
    if kind not in forms:
        raise IntegrityError(f"image {manifest.get('id')}: unknown encryption {kind!r}")
    return forms[kind]
