"""String hashing: the order in which a set of strings iterates.

Python salts ``hash(str)`` (and bytes, datetimes) per process, so ``list({'a', 'b'})``,
a ``random.choice`` over such a list, or a set restored from an image come out in another
order in a new process, even with every random stream restored. The salt is fixed when the
interpreter starts (``PYTHONHASHSEED``), so no restore can set it: kernels must start with
the saved kernel's. The server starts every kernel of a user with one seed derived from
that user's secret (:func:`hash_seed_env`): a restored kernel, on this node or another that
shares the secret, hashes as the saved one did, and the seed stays as unguessable as a
random one to anyone without the secret (hash flooding). A kernel started otherwise with a
random seed gets its save told that the order is not kept.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from .registry import Provider

ENV = "PYTHONHASHSEED"
# hashed to tell whether two processes salt strings alike, without knowing either seed
_PROBE = "jupyter-ckpt string hashing"


def hash_seed_env(derive: Callable[[bytes], bytes]) -> dict[str, str]:
    """The environment that gives a kernel the user's seed (``derive``: the user's
    :meth:`Signer.derive <jupyter_ckpt.store.signing.Signer.derive>`); none where the
    server's own environment fixes a seed already, which its kernels inherit."""
    if os.environ.get(ENV):
        return {}
    key = derive(b"jupyter-ckpt PYTHONHASHSEED")
    # 1..2**32-1: 0 would turn the salt off, which the seed's secrecy is meant to keep
    seed = 1 + int.from_bytes(key[:8], "big") % (2**32 - 1)
    return {ENV: str(seed)}


def _capture() -> int:
    if os.environ.get(ENV, "random") == "random":
        raise RuntimeError(
            "this kernel salts string hashes at random (PYTHONHASHSEED unset or random), so sets "
            "of strings iterate in another order in the restored kernel; the server starts its "
            "kernels with a fixed seed"
        )
    return hash(_PROBE)


def _apply(saved: int) -> None:
    if hash(_PROBE) != saved:
        raise RuntimeError(
            "this kernel salts string hashes unlike the saved one (another PYTHONHASHSEED): "
            "sets of strings iterate in another order"
        )


PROVIDERS = [Provider("string hashing", (), _capture, _apply)]
