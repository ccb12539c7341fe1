"""Pure parts of the library: import records, the one pickle stream, references, sizes, and
the promise that the kernel side imports nothing heavy."""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import re
import subprocess
import sys
import threading
from typing import Any

import numpy as np
import pytest
import torch
from harness import load_namespace, save_namespace

from jupyter_ckpt import image
from jupyter_ckpt.errors import InvalidReference
from jupyter_ckpt.format import human_bytes
from jupyter_ckpt.image.capture import history_sources, import_record
from jupyter_ckpt.kernel.state import moved_cwd
from jupyter_ckpt.store import ImageStore, check_ref

# -- import_record ------------------------------------------------------------------------


def local_function() -> None:
    """Defined in this (importable) module, so it is re-imported, not pickled."""


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (np, {"module": "numpy"}),
        (os.path, {"module": os.path.__name__}),
        (math.sqrt, {"module": "math", "attr": "sqrt"}),
        (collections.OrderedDict, {"module": "collections", "attr": "OrderedDict"}),
        (os.path.join, {"module": os.path.join.__module__, "attr": "join"}),
        (
            argparse.ArgumentParser.parse_args,
            {"module": "argparse", "attr": "ArgumentParser.parse_args"},
        ),
        (local_function, {"module": __name__, "attr": "local_function"}),
    ],
)
def test_import_record_for_importable(value: Any, expected: dict[str, str]) -> None:
    record = import_record("v", value)
    assert record is not None
    record.pop("submodules", None)
    assert record == {"name": "v", **expected}


def test_import_record_lists_loaded_public_submodules() -> None:
    """`import email.mime.text` binds `email`; restore must bring `email.mime.text` back."""
    import email.mime.text  # noqa: F401

    record = import_record("email", sys.modules["email"])
    assert record is not None
    assert "email.mime.text" in record["submodules"]
    assert not any(part.startswith("_") for m in record["submodules"] for part in m.split("."))


def _nested() -> Any:
    def inner() -> None: ...

    return inner


def _notebook_function() -> Any:
    """A function as a notebook cell defines it: its module is __main__."""
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec("def f(): pass", namespace)
    return namespace["f"]


@pytest.mark.parametrize(
    "value",
    [
        3,
        [math.sqrt],
        math.pi,
        np.float64(1.0),
        lambda: None,  # qualname '<lambda>' is not an attribute of its module
        _nested(),  # '<locals>' in the qualname
        _notebook_function(),
        json.JSONDecoder(),
    ],
)
def test_import_record_for_values(value: Any) -> None:
    assert import_record("v", value) is None


def test_module_attributes_are_references() -> None:
    """A name bound to a module's attribute is that attribute, whatever its class: SymPy's
    ``RR`` (an instance) and ``cacheit`` (a decorator factory that does not pickle)."""
    import sympy
    from sympy import RR, cacheit

    assert import_record("RR", RR) == {"name": "RR", "module": RR.__module__, "attr": "RR"}
    assert import_record("cacheit", cacheit)["attr"] == "cacheit"  # type: ignore[index]
    sources = history_sources(["from sympy import RR as field, pi\nfrom sympy import *"])
    assert sources == {"field": ("sympy", "RR"), "pi": ("sympy", "pi"), "sympy": ("sympy", "*")}
    assert import_record("field", RR, sources) == {"name": "field", "module": "sympy", "attr": "RR"}
    assert import_record("QQ", sympy.QQ, sources)["module"] == "sympy"  # type: ignore[index]
    assert import_record("none", None) is None and import_record("flag", True) is None
    # a dict the user may have changed is saved as it is, even where a module holds it
    assert import_record("modules", sys.modules, {"modules": ("sys", "modules")}) is None


def test_module_attributes_restore_as_the_same_object(store: ImageStore) -> None:
    from sympy import RR, cacheit

    namespace = {"RR": RR, "cacheit": cacheit, "f": lambda: 1}
    manifest = save_namespace(store, namespace)
    statuses = {v["name"]: v["status"] for v in manifest["variables"]}
    assert statuses == {"RR": "imported", "cacheit": "imported", "f": "saved"}
    restored = load_namespace(store, manifest["id"])
    assert restored["RR"] is RR and restored["cacheit"] is cacheit


# -- one stream, one pickle per variable ------------------------------------------------


def test_sharing_survives_one_stream(store: ImageStore) -> None:
    """Every variable is its own pickle in one stream; the shared memo keeps sharing."""
    a = [1, 2]
    base = np.arange(200_000.0)
    model = torch.nn.Linear(2, 2)

    def factory() -> list[int]:
        return []

    namespace = {
        "a": a, "b": a, "base": base, "view": base[5:9], "model": model,
        "opt": torch.optim.SGD(model.parameters(), lr=0.1),
        "factory": factory, "dd": collections.defaultdict(factory),
    }  # fmt: skip
    manifest = save_namespace(store, namespace)
    [group] = manifest["groups"]
    assert group["names"] == list(namespace) and len(group["parts"]) == len(namespace)
    sizes = {v["name"]: v["bytes"] for v in manifest["variables"]}
    assert sizes["base"] >= base.nbytes > sizes["view"], "a shared buffer counts once, first"
    restored = load_namespace(store, manifest["id"])
    assert restored["b"] is restored["a"]
    assert np.shares_memory(restored["view"], restored["base"])
    assert restored["dd"].default_factory is restored["factory"]
    assert restored["opt"].param_groups[0]["params"][0] is restored["model"].weight


def test_a_variable_that_fails_midway_leaves_no_trace_in_the_stream(store: ImageStore) -> None:
    """A variable that fails after pickling part of itself (here: the shared list, then a
    lock) is cut back out: the variables after it, which reach the same list, must not
    refer to memo entries the restore never sees."""
    shared = ["data", 1, 2]
    namespace = {
        "before": 0,
        "broken": [shared, threading.Lock()],
        "after": [shared, {"k": shared}],
        "again": shared,
    }
    manifest = image.capture(dict(namespace), namespace, store.writer(), name="midway")
    statuses = {v["name"]: v["status"] for v in manifest["variables"]}
    assert statuses == {"before": "saved", "broken": "lost", "after": "saved", "again": "saved"}
    restored: dict[str, Any] = {}
    report = image.restore(manifest, store.read_segments(manifest), restored)
    assert set(report.missing) == {"broken"}, report.missing
    assert restored == {"before": 0, "after": [shared, {"k": shared}], "again": shared}
    assert restored["after"][0] is restored["after"][1]["k"] is restored["again"]


def test_arrays_and_tensors_are_listed_with_shape_and_dtype(store: ImageStore) -> None:
    """The Details view shows what an array is without loading it."""
    namespace = {
        "a": np.zeros((3, 4), dtype=np.float32),
        "t": torch.ones(2, 5, dtype=torch.int64),
        "s": np.float64(1.5),
        "n": 7,
    }
    manifest = image.capture(dict(namespace), namespace, store.writer(), name="arrays")
    facts = {v["name"]: (v.get("shape"), v.get("dtype")) for v in manifest["variables"]}
    assert facts == {
        "a": ([3, 4], "float32"),
        "t": ([2, 5], "torch.int64"),
        "s": ([], "float64"),
        "n": (None, None),
    }


def test_a_variable_that_fails_to_pickle_is_cut_out(store: ImageStore) -> None:
    """It fails halfway, after other objects and a buffer of it were written: those must
    not stay in the stream, and later variables that share them must still get them."""
    shared = {"k": [1, 2]}
    namespace = {
        "first": shared,
        "bad": [shared, "text", np.ones(100_000), [shared["k"]], threading.Lock()],
        "later": [shared["k"], shared, "text"],
    }
    manifest = image.capture(dict(namespace), namespace, store.writer(), name="cut")
    status = {v["name"]: (v["status"], v.get("reason", "")) for v in manifest["variables"]}
    assert status["bad"][0] == "lost" and "lock" in status["bad"][1]
    assert manifest["groups"][0]["buffers"] == [], "the lost variable's buffer is not written"
    restored: dict[str, Any] = {}
    report = image.restore(manifest, store.read_segments(manifest), restored)
    assert list(report.missing) == ["bad"]
    assert restored["later"] == [[1, 2], {"k": [1, 2]}, "text"]
    assert restored["later"][1] is restored["first"]
    assert restored["later"][0] is restored["first"]["k"]


def test_a_failure_past_a_chunk_of_stream_is_cut_out(store: ImageStore) -> None:
    """The stream is kept in 4 MiB chunks: cutting a failed variable out must work across
    chunk boundaries, and what follows must land where the manifest says."""
    filler = [bytes([i % 251]) * 1000 for i in range(3000)]  # ~3 MiB each, in band
    namespace = {
        "first": filler[:2500],
        "bad": [*filler, threading.Lock()],
        "later": filler[2500:],
        "last": {"k": "v"},
    }
    manifest = image.capture(dict(namespace), namespace, store.writer(), name="chunks")
    restored: dict[str, Any] = {}
    report = image.restore(manifest, store.read_segments(manifest), restored)
    assert list(report.missing) == ["bad"]
    assert restored["first"] == filler[:2500] and restored["later"] == filler[2500:]
    assert restored["last"] == {"k": "v"}


FRAGILE = """
class Fragile:
    def __init__(self, v):
        self.v = v
    def __setstate__(self, state):
        if state["v"] == "bad" and FAIL:
            raise RuntimeError("refusing to come back")
        self.__dict__.update(state)
text = "a shared string"
bad = Fragile("bad")
bad.note = text
holder = {"it": [bad], "text": text}
good = Fragile("ok")
good.note = text
after = [text, None, re.IGNORECASE, math.sqrt]
"""


def test_a_variable_that_fails_to_load_takes_only_what_needs_it(store: ImageStore) -> None:
    """Restore goes on past a variable that fails to unpickle. Those that need its objects
    are reported with its reason; those sharing only strings, constants, library functions
    or its class come back."""
    namespace: dict[str, Any] = {"__name__": "__main__", "re": re, "math": math}
    exec(FRAGILE, namespace)
    variables = {k: v for k, v in namespace.items() if not k.startswith("__")}
    manifest = image.capture(variables, namespace, store.writer(), name="fragile")
    restored: dict[str, Any] = {"FAIL": True}
    report = image.restore(manifest, store.read_segments(manifest), restored)
    reason = "RuntimeError: refusing to come back"
    assert report.missing == {"bad": reason, "holder": reason}
    assert type(restored["good"]) is restored["Fragile"]
    assert restored["good"].note == restored["text"] == "a shared string"
    assert restored["after"] == ["a shared string", None, re.IGNORECASE, math.sqrt]


def test_views_stay_shared_after_a_second_generation(store: ImageStore) -> None:
    """Save, restore, save the restored arrays again: views still share their base."""
    base = np.arange(300_000, dtype=np.int64)
    namespace: dict[str, Any] = {"base": base, "view": base[10:20], "rev": base[::-1]}
    for _ in range(2):
        namespace = load_namespace(store, save_namespace(store, namespace)["id"])
        assert np.shares_memory(namespace["view"], namespace["base"])
        assert np.shares_memory(namespace["rev"], namespace["base"])
        namespace["view"][0] = -5
        assert namespace["base"][10] == -5 and namespace["rev"][-11] == -5


VIEWS = {
    "slice": lambda b: b[3:7, 10:20],
    "reversed": lambda b: b[::-2, ::-3],
    "transpose": lambda b: b.T,
    "diagonal": np.diagonal,  # read-only view
    "broadcast": lambda b: np.broadcast_to(b[0], (3, b.shape[1])),  # read-only, stride 0
    "reinterpret": lambda b: b.ravel(order="K").view(np.uint8)[:100],
    "zero_d": lambda b: b[3, 4, ...],
    "flat": lambda b: b.ravel(order="K")[5:100],  # memory order: a view for C and F
}


@pytest.mark.parametrize("make", VIEWS.values(), ids=list(VIEWS))
@pytest.mark.parametrize("order", ["C", "F"])
def test_views_share_their_base(store: ImageStore, make: Any, order: str) -> None:
    base = np.asarray(np.arange(400 * 500, dtype=np.float64).reshape(400, 500), order=order)
    view = make(base)
    restored = load_namespace(store, save_namespace(store, {"base": base, "view": view})["id"])
    new_base, new_view = restored["base"], restored["view"]
    assert np.array_equal(new_view, view) and new_view.strides == view.strides
    assert np.shares_memory(new_view, new_base)
    assert new_view.flags.writeable == view.flags.writeable
    assert new_base.flags.f_contiguous == base.flags.f_contiguous


class Sub(np.ndarray):
    """A user's ndarray subclass."""


def test_views_of_array_subclasses_share_their_base(store: ImageStore) -> None:
    """recarray, masked-array and user-subclass views come back as views of their base,
    of their class, with their attributes (a masked array's mask)."""
    data = np.zeros(4, dtype=[("age", "i4"), ("w", "f8")])
    x = np.arange(10.0)
    masked = np.ma.array(np.arange(6.0), mask=[0, 1, 0, 0, 1, 0])
    namespace = {
        "data": data, "rec": data.view(np.recarray), "x": x, "sub": x[2:8].view(Sub)[1:3],
        "masked": masked, "part": masked[1:4], "plain": np.asarray(data.view(np.recarray)),
    }  # fmt: skip
    restored = load_namespace(store, save_namespace(store, namespace)["id"])
    restored["data"]["age"][0] = 99
    restored["x"][3] = -1.0
    assert type(restored["rec"]) is np.recarray and restored["rec"].age[0] == 99
    assert type(restored["sub"]) is Sub and restored["sub"].tolist() == [-1.0, 4.0]
    assert type(restored["part"]) is np.ma.MaskedArray
    assert restored["part"].mask.tolist() == [True, False, False]
    assert np.shares_memory(restored["part"], restored["masked"])
    assert np.shares_memory(restored["plain"], restored["data"])


def test_structured_field_view_shares(store: ImageStore) -> None:
    table = np.zeros(100_000, dtype=[("a", "i4"), ("b", "f8")])
    restored = load_namespace(store, save_namespace(store, {"table": table, "b": table["b"]})["id"])
    restored["b"][7] = 2.5
    assert restored["table"]["b"][7] == 2.5


def test_lazy_conj_and_neg_tensors_keep_their_values(store: ImageStore) -> None:
    namespace = {
        "conj": torch.tensor([1 + 2j, 3 - 1j]).conj(),
        "neg": torch.tensor([1.0, 2.0])._neg_view(),
    }
    restored = load_namespace(store, save_namespace(store, namespace)["id"])
    assert restored["conj"].tolist() == [1 - 2j, 3 + 1j]
    assert restored["neg"].tolist() == [-1.0, -2.0]


def test_packed_buffers_come_back_aligned(store: ImageStore) -> None:
    """Mid-sized buffers share one packed segment; each must start aligned for its dtype."""
    namespace = {
        "odd": "x" * 13,  # a pickle of odd length goes first in the pack
        "f8": np.arange(20_000, dtype=np.float64),
        "c16": np.arange(10_000, dtype=np.complex128),
        "t": torch.arange(20_000, dtype=torch.float64),
    }
    restored = load_namespace(store, save_namespace(store, namespace)["id"])
    assert restored["f8"].flags.aligned and restored["c16"].flags.aligned
    assert restored["t"].data_ptr() % 16 == 0
    assert restored["f8"].base is not None, "restored in place from the segment, not copied"


# -- references and sizes -----------------------------------------------------------------


@pytest.mark.parametrize("ref", ["a", "rt", "my-image_1.v2", "A" * 128, "0" * 32, "9lives"])
def test_check_ref_accepts(ref: str) -> None:
    assert check_ref(ref) == ref


@pytest.mark.parametrize("ref", ["", "-a", "_a", ".a", "a" * 129, "a/b", "a\0b", "a\nb", None])
def test_check_ref_refuses(ref: Any) -> None:
    with pytest.raises(InvalidReference, match="invalid image id"):
        check_ref(ref, "image id")


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"),
        (5 << 20, "5.0 MiB"), (3 << 30, "3.0 GiB"), (1 << 40, "1024.0 GiB"),
    ],
)  # fmt: skip
def test_human_bytes(n: int, text: str) -> None:
    assert human_bytes(n) == text


# -- the kernel side stays light ----------------------------------------------------------


def test_kernel_side_imports_nothing_heavy() -> None:
    heavy = ["jupyter_server", "tornado", "torch", "pandas", "numpy"]
    code = (
        "import sys, json, jupyter_ckpt, jupyter_ckpt.kernel, jupyter_ckpt.image\n"
        f"print(json.dumps([m for m in {heavy!r} if m in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(out.stdout) == []


@pytest.mark.parametrize(
    ("cwd", "saved", "now", "expected"),
    [
        # a respawn on a node that mounts the home elsewhere: same place under the new root
        (
            "/n1/home/ann/data",
            "/n1/home/ann/nb.ipynb",
            "/n2/home/ann/nb.ipynb",
            "/n2/home/ann/data",
        ),
        ("/n1/home/ann", "/n1/home/ann/sub/nb.ipynb", "/mnt/x/sub/nb.ipynb", "/mnt/x"),
        # same notebook path, or no notebook known: the saved directory as it was
        (
            "/n1/home/ann/data",
            "/n1/home/ann/nb.ipynb",
            "/n1/home/ann/nb.ipynb",
            "/n1/home/ann/data",
        ),
        ("/n1/home/ann/data", None, "/n2/home/ann/nb.ipynb", "/n1/home/ann/data"),
        ("/n1/home/ann/data", "/n1/home/ann/nb.ipynb", None, "/n1/home/ann/data"),
        # outside the notebook's root, or another notebook altogether: left alone
        ("/tmp/scratch", "/n1/home/ann/nb.ipynb", "/n2/home/ann/nb.ipynb", "/tmp/scratch"),
        ("/n1/home/ann/data", "/n1/home/ann/a.ipynb", "/n2/home/ann/b.ipynb", "/n1/home/ann/data"),
    ],
)
def test_a_restored_working_directory_follows_the_notebook(cwd, saved, now, expected):
    assert moved_cwd(cwd, saved, now) == expected
