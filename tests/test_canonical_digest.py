"""The canonical digest of a pickle stream: the same state gives the same digest whichever
equal strings were one object, and any other difference changes it."""

from __future__ import annotations

import pickle

from jupyter_ckpt.image.identity import canonical_digest


def digest(value: object) -> str:
    return canonical_digest(pickle.dumps(value, protocol=5), [])


def test_equal_strings_that_were_one_object_or_two_digest_alike() -> None:
    one = "hello world"
    two = "".join(["hello ", "world"])  # equal, not the same object
    assert pickle.dumps([one, one], protocol=5) != pickle.dumps([one, two], protocol=5)
    assert digest([one, one]) == digest([one, two])


def test_any_other_difference_changes_the_digest() -> None:
    shared = [1]
    assert digest(["a", "b"]) != digest(["a", "c"])
    assert digest([shared, shared]) != digest([[1], [1]])  # a shared list is state
    assert digest({"n": 1}) != digest({"n": 2})


def test_an_int_longer_than_str_converts_is_digested() -> None:
    # a notebook may hold one (a factorial); str() refuses ints of over 4300 digits
    assert digest(10**5000) != digest(10**5000 + 1)
