"""Save a rich namespace with `%ckpt save` in one kernel, restore it in a fresh one.

Kernel A builds the state cell by cell and saves it once; kernel B restores it once. Values
are compared by evaluating the same probe expressions in both kernels (A right after the
save, B right after the restore, before any test mutates anything); identities and
behaviour are asserted in B, where they can only hold if the restore kept them.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Any

import pytest
from harness import Kernel, assert_complete, image_names, restore_and_list

CELLS: dict[str, str] = {
    "plain": """
i, f, s, by, c, none, flag = 42, 2.5, "héllo", b"\\x00\\xff", 3 + 4j, None, True
big_int = 2 ** 100
nested = {"a": [1, 2, {"b": (3, 4)}], "s": {5, 6}, "fs": frozenset({7}), "t": (1, [2])}
""",
    "collections": """
import collections, math
from collections import OrderedDict, defaultdict, Counter, deque, namedtuple
from math import sqrt
from os.path import join
import xml.dom.minidom
od = OrderedDict([("z", 1), ("a", 2)])
dd = defaultdict(lambda: "missing")
dd["x"] = "y"
def make_list():
    return [0]
dd2 = defaultdict(make_list)
dd2["k"].append(1)
cnt = Counter("abracadabra")
dq = deque([1, 2, 3], maxlen=5)
Point = namedtuple("Point", "x y")
pt = Point(1, 2)
cyc = [1]
cyc.append(cyc)
selfd = {}
selfd["me"] = selfd
a = [1, 2, 3]
b = a
shared = {"k": 1}
box1 = [shared]
box2 = {"v": shared}
""",
    "code": """
import dataclasses, enum
from dataclasses import dataclass, field
from typing import NamedTuple
SCALE = 2
OFFSET = 1
def scale(x):
    return x * SCALE
def shifted(x):
    return x + OFFSET
sq = lambda x: x * x
def make_counter():
    n = 0
    def inc():
        nonlocal n
        n += 1
        return n
    return inc
counter = make_counter()
counter(); counter()
class Animal:
    kind = "generic"
    def __init__(self, name):
        self.name = name
    def speak(self):
        return f"{self.name} says {self.sound()}"
    def sound(self):
        return "..."
class Dog(Animal):
    def sound(self):
        return "woof"
rex = Dog("rex")
@dataclass
class Cfg:
    lr: float = 0.1
    layers: list = field(default_factory=list)
cfg = Cfg(0.01, [1, 2])
class Color(enum.Enum):
    RED = 1
    GREEN = 2
fav = Color.GREEN
class Pair(NamedTuple):
    left: int
    right: int = 0
pair = Pair(1)
""",
    "numpy": """
import numpy as np
DTYPES = ["int8", "uint16", "int32", "int64", "float16", "float32", "float64",
          "complex64", "complex128", "bool"]
arrs = {dt: (np.arange(24) % 7).astype(dt).reshape(4, 6) for dt in DTYPES}
obj_arr = np.array([1, "two", None, [3]], dtype=object)
struct = np.array([(1, 2.5, b"ab"), (3, 4.5, b"cd")],
                  dtype=[("i", "i4"), ("f", "f8"), ("s", "S2")])
dt64 = np.array(["2024-01-01T12:00", "2025-06-30T00:00", "NaT"], dtype="datetime64[m]")
td64 = np.array([1, 2, 3], dtype="timedelta64[s]")
ustr = np.array(["ab", "cdé"])
fortran = np.asfortranarray(np.arange(12.0).reshape(3, 4))
big = np.arange(1_000_000, dtype=np.float64)
view = big[10:20]
rev = big[::-1]
wbig = np.arange(300_000, dtype=np.int64)
wview = wbig[100:200:2]
bigF = np.asfortranarray(np.arange(400 * 500, dtype=np.float32).reshape(400, 500))
bigF_view = bigF[:, 1:3]
rng = np.random.default_rng(123)
rng.random(3)
""",
    "pandas_scipy_sklearn": """
import pandas as pd
import scipy.sparse
from sklearn.ensemble import RandomForestClassifier
df = pd.DataFrame({
    "cat": pd.Categorical(["a", "b", "a"], categories=["a", "b", "c"]),
    "ts": pd.date_range("2024-03-30", periods=3, freq="D", tz="Europe/Paris"),
    "x": [1.0, 2.5, None],
})
mi = pd.DataFrame({"v": range(4)},
                  index=pd.MultiIndex.from_product([["a", "b"], [1, 2]], names=["l", "n"]))
spm = scipy.sparse.random(60, 40, density=0.1, format="csr", random_state=0)
spc = scipy.sparse.coo_matrix(([1.0, 2.0], ([0, 3], [1, 2])), shape=(5, 5))
_X = np.random.default_rng(0).normal(size=(80, 4))
Xs, ys = _X, (_X[:, 0] + _X[:, 1] > 0).astype(int)
clf = RandomForestClassifier(n_estimators=5, random_state=0).fit(Xs, ys)
""",
    "torch": """
import torch
torch.manual_seed(0)
t_bf16 = torch.randn(4, 4).to(torch.bfloat16)
t_int = torch.arange(6, dtype=torch.int32).reshape(2, 3)
model = torch.nn.Linear(4, 2)
opt = torch.optim.Adam(model.parameters(), lr=0.1)
x = torch.randn(8, 4)
def step():
    opt.zero_grad()
    model(x).pow(2).sum().backward()
    opt.step()
    return model.weight.detach().tolist()
step()
base_t = torch.arange(100_000, dtype=torch.float32)
view_t = base_t[2:5]
""",
    "numpy_torch": """
np_owner = np.arange(100_000, dtype=np.float32)
from_np = torch.from_numpy(np_owner)
t_owner = torch.arange(50_000, dtype=torch.float64)
as_np = t_owner.numpy()
as_np_view = as_np[10:20]
small_np = np.arange(6.0)
small_t = torch.from_numpy(small_np)
""",
    "wrapped": """
import functools
@functools.lru_cache(maxsize=64)
def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)
@functools.cache
def square(x):
    return x * x
fib(25), square(3)
class ByName:
    # a decorator whose result pickles by reference to the notebook, as many do
    def __init__(self, f):
        functools.update_wrapper(self, f)
    def __reduce__(self):
        return self.__qualname__
    def __call__(self, *args):
        return self.__wrapped__(*args)
@ByName
def plus_one(x):
    return x + 1
""",
    "deep": """
class Tree:
    def __init__(self, child):
        self.child = child
linked = None
deep_tree = None
deep_dict = level_dict = {}
for level in range(40_000):
    linked = [level, linked]
    deep_tree = Tree(deep_tree)
    level_dict["k"] = level_dict = {}
""",
    "unsaveable": """
import os, socket, threading
gen = (n for n in range(3))
fh = open("notes.txt", "w")
fh.write("notes")
fh.flush()
reader = open("notes.txt")
lock = threading.Lock()
sock = socket.socket()
scratch = "left out"
keep_me = "included again"
""",
    "names": """
u = v = 0
n1, n2 = 7, 7
s1 = "same"
s2 = "same"
_under, _cache, __x, _ix, _oh_no, _0 = 1, {}, 2, "ix", "oh no", "zero"
Input, Output, exit_code = "in", "out", 3
_ = "mine"
exit = "my exit"
!true
""",
    "kernel_state": """
os.makedirs("work/sub", exist_ok=True)
os.chdir("work/sub")
os.environ["CKPT_TEST_SETTING"] = "on"
os.environ["CKPT_TEST_AGREED"] = "user"
del os.environ["CKPT_TEST_UNSET"]
del os.environ["CKPT_TEST_UNSET_LATER"]
""",
}

# The launch environments of the kernels (A saves, B restores and saves, C restores B's):
# what the user unset in A stays unset, and what A set stays set, in B and C, including
# where B's launch environment happens to agree with the image.
LAUNCH_ENV = {
    "a": {"CKPT_TEST_UNSET": "a", "CKPT_TEST_UNSET_LATER": "a"},
    "b": {"CKPT_TEST_UNSET": "b", "CKPT_TEST_AGREED": "user"},
    "c": {"CKPT_TEST_UNSET": "c", "CKPT_TEST_UNSET_LATER": "c"},
}
ENV_AFTER_RESTORE = {
    "CKPT_TEST_SETTING": "on",
    "CKPT_TEST_AGREED": "user",
    "CKPT_TEST_UNSET": None,
    "CKPT_TEST_UNSET_LATER": None,
}
ENV_PROBE = f"{{k: __import__('os').environ.get(k) for k in {sorted(ENV_AFTER_RESTORE)}}}"


_SCOPES = (ast.FunctionDef, ast.ClassDef, ast.Lambda, ast.ListComp, ast.SetComp,
           ast.DictComp, ast.GeneratorExp)  # fmt: skip


def bound_names(code: str) -> set[str]:
    """The global names a cell binds, read from its source (IPython syntax stripped)."""
    tree = ast.parse("\n".join(line for line in code.splitlines() if not line.startswith("!")))
    names: set[str] = set()
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).partition(".")[0] for a in node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        if not isinstance(node, _SCOPES):
            todo.extend(ast.iter_child_nodes(node))
    return names


# Every user name the cells bind: exactly these (less the ones not saved) come back.
USER_NAMES = set().union(*(bound_names(code) for code in CELLS.values()))
# Names whose values compare by repr in A and B.
REPR_NAMES = [
    "u", "v", "n1", "n2", "s1", "s2", "_under", "_cache", "__x", "_ix", "_oh_no", "_0",
    "Input", "Output", "exit_code", "_", "exit", "i", "f", "s", "by", "c", "none", "flag",
    "big_int", "nested", "SCALE", "OFFSET", "fav", "pair", "cfg", "keep_me", "ys",
]  # fmt: skip
REPR_PROBE = f"[repr(globals().get(n, 'MISSING')) for n in {REPR_NAMES}]"


def start_with_env(start_kernel, ckpt_paths, which: str) -> Kernel:
    """Start kernel ``which`` (a, b or c) in its own directory and launch environment."""
    with pytest.MonkeyPatch.context() as env:
        for key in ENV_AFTER_RESTORE:
            env.delenv(key, raising=False)
        for key, value in LAUNCH_ENV[which].items():
            env.setenv(key, value)
        return start_kernel(cwd=ckpt_paths.root / f"cwd-{which}")


UNSAVEABLE = {
    "gen": "TypeError: cannot pickle 'generator' object",
    "fh": "TypeError: cannot save an open file ('notes.txt')",
    "reader": "TypeError: cannot save an open file ('notes.txt')",
    "lock": "TypeError: cannot pickle '_thread.lock' object",
    "sock": "TypeError: cannot pickle 'socket' object",
    "plus_one": "PicklingError: ByName 'plus_one' is saved by reference to the notebook's "
    "namespace, which a restore cannot look into",
}

# Fingerprints of arrays: dtype, shape, memory order and the exact bytes.
PROBE_PRELUDE = """
def _fp(a):
    import hashlib
    import numpy as np
    a = np.asarray(a)
    if a.dtype.hasobject:
        return repr(a.tolist())
    data = hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()
    return [a.dtype.str, list(a.shape), bool(a.flags.f_contiguous),
            bool(a.flags.c_contiguous), data]
def _depth(x, step):
    n = 0
    while x is not None:
        x, n = step(x), n + 1
    return n
"""

# Evaluated in A after the save and in B after the restore: the results must be equal.
PROBES: dict[str, list[str]] = {
    "plain": ["[repr(v) for v in (i, f, s, by, c, none, flag, big_int)]", "repr(nested)"],
    "collections": [
        "repr(od)", "sorted(dd.items())", "dict(dd2)", "repr(cnt)", "repr(dq)", "repr(pt)",
    ],
    "code": ["[scale(3), sq(4), rex.speak(), repr(cfg), repr(fav), repr(pair)]"],
    "numpy": [
        "{k: _fp(v) for k, v in arrs.items()}",
        "[_fp(v) for v in (obj_arr, struct, dt64, td64, ustr, fortran, big, view, rev)]",
        "[_fp(v) for v in (wbig, wview, bigF, bigF_view)]",
        "rng.random(3).tolist()",
    ],
    "pandas_scipy_sklearn": [
        "repr(df)", "df.dtypes.astype(str).to_dict()", "repr(mi)",
        "[spm.format, spm.nnz, _fp(spm.toarray()), spc.format, _fp(spc.toarray())]",
        "clf.predict_proba(Xs).tolist()",
    ],
    "torch": [
        "[str(t_bf16.dtype), t_bf16.view(torch.int16).tolist(), t_int.tolist()]",
        "{k: v.tolist() for k, v in model.state_dict().items()}",
        "step()",
    ],
    "numpy_torch": ["[float(np_owner.sum()), from_np[:4].tolist(), as_np[:4].tolist()]"],
    "wrapped": ["[fib(30), fib.cache_parameters(), square(7)]"],
    "deep": [
        "[_depth(linked, lambda x: x[1]), _depth(deep_tree, lambda t: t.child)]",
        "_depth(deep_dict, lambda d: d.get('k'))",
    ],
}  # fmt: skip

# True in B only if identities, types and behaviour came back. They must not change state:
# they run right after the restore, before the probes.
TRUTHS: dict[str, list[str]] = {
    "collections": [
        "b is a", "box1[0] is box2['v']", "box1[0] is shared", "cyc[1] is cyc",
        "selfd['me'] is selfd", "type(od) is OrderedDict", "list(od) == ['z', 'a']",
        "dd.default_factory() == 'missing'", "dd2.default_factory is make_list",
        "isinstance(pt, Point) and pt.x == 1", "cnt.most_common(1) == [('a', 5)]",
        "dq.maxlen == 5", "type(nested['fs']) is frozenset",
    ],
    "imports": [
        "sqrt is math.sqrt", "join is __import__('os').path.join",
        "OrderedDict is collections.OrderedDict", "np is __import__('sys').modules['numpy']",
        "namedtuple is collections.namedtuple", "field is dataclasses.field",
        # `import a.b.c` binds `a`: the restore must import the submodules too
        "xml.dom.minidom.parseString('<a/>').documentElement.tagName == 'a'",
    ],
    "code": [
        "type(rex) is Dog", "isinstance(rex, Animal)", "rex.speak() == 'rex says woof'",
        "Dog.kind == 'generic'", "counter.__closure__[0].cell_contents == 2",
        "make_counter()() == 1",
        "dataclasses.is_dataclass(cfg)", "cfg == Cfg(0.01, [1, 2])", "Cfg().layers == []",
        "fav is Color.GREEN", "Color(2) is fav", "isinstance(fav, enum.Enum)",
        "pair == Pair(1, 0)", "isinstance(pair, Pair)", "pair._replace(right=5).right == 5",
    ],
    "numpy": [
        "np.shares_memory(view, big)", "np.shares_memory(rev, big)",
        "np.shares_memory(bigF_view, bigF)", "np.shares_memory(wview, wbig)",
        "fortran.flags.f_contiguous and not fortran.flags.c_contiguous",
        "bigF.flags.f_contiguous", "struct.dtype.names == ('i', 'f', 's')",
        "obj_arr[3] == [3] and obj_arr[2] is None", "arrs['float16'].dtype == np.float16",
        "isinstance(rng, np.random.Generator)", "big.flags.writeable",
    ],
    "pandas_scipy_sklearn": [
        "isinstance(df['cat'].dtype, pd.CategoricalDtype)",
        "df['cat'].cat.categories.tolist() == ['a', 'b', 'c']",
        "str(df['ts'].dt.tz) == 'Europe/Paris'", "mi.index.names == ['l', 'n']",
        "int(mi.loc[('b', 2), 'v']) == 3", "scipy.sparse.issparse(spm)",
        "(clf.predict(Xs) == ys).mean() > 0.9",
    ],
    "torch": [
        "opt.param_groups[0]['params'][0] is model.weight",
        "opt.param_groups[0]['params'][1] is model.bias",
        "isinstance(model.weight, torch.nn.Parameter) and model.weight.requires_grad",
        "int(opt.state[model.weight]['step']) == 1",
        "opt.state[model.weight]['exp_avg'].shape == model.weight.shape",
        "view_t.untyped_storage().data_ptr() == base_t.untyped_storage().data_ptr()",
        "view_t.storage_offset() == 2", "t_bf16.dtype == torch.bfloat16",
    ],
    "numpy_torch": [
        "from_np.untyped_storage().data_ptr() == np_owner.ctypes.data",
        "as_np.ctypes.data == t_owner.untyped_storage().data_ptr()",
        "np.shares_memory(as_np_view, as_np)",
        "small_t.untyped_storage().data_ptr() == small_np.ctypes.data",
    ],
    "wrapped": [
        "isinstance(fib, functools._lru_cache_wrapper) and fib.__wrapped__.__name__ == 'fib'",
        "isinstance(square, functools._lru_cache_wrapper)",
    ],
    "deep": ["linked[0] == 39_999 and type(deep_tree) is Tree", "level_dict == {}"],
}  # fmt: skip


RAW_HISTORY = "get_ipython().history_manager.input_hist_raw[:{}]"


@dataclass
class RoundTrip:
    kernel: Kernel
    save_output: str
    restore_output: str
    saved_probes: dict[str, list[Any]]
    restored_probes: dict[str, list[Any]]
    truths_in_a: list[str]
    truths_in_b: dict[str, list[str]]
    save_count: int
    count_after_restore: int
    saved_cwd: str
    saved_history: list[str]
    saved_raw_history: list[str]
    saved_reprs: list[str]
    restored_reprs: list[str]
    restored_names: set[str]
    env: dict[str, str | None]


def probe_all(kernel: Kernel) -> dict[str, list[Any]]:
    kernel.run(PROBE_PRELUDE)
    return {topic: [kernel.eval(e) for e in exprs] for topic, exprs in PROBES.items()}


@pytest.fixture(scope="module")
def rt(start_kernel, ckpt_paths) -> RoundTrip:
    """Kernel A builds and saves the state, then stops; kernel B restores it."""
    a = start_with_env(start_kernel, ckpt_paths, "a")
    for code in CELLS.values():
        a.run(code)
    truths_in_a = a.falsy(*(t for truths in TRUTHS.values() for t in truths))
    a.ckpt("exclude scratch keep_me")
    a.ckpt("include keep_me")
    save_output = a.ckpt("save rt")
    save_count = a.last_execution_count
    assert save_count is not None
    saved_cwd = a.eval("__import__('os').getcwd()")
    saved_history = a.eval(f"In[:{save_count + 1}]")
    saved_raw_history = a.eval(RAW_HISTORY.format(save_count + 1))
    saved_reprs = a.eval(REPR_PROBE)
    saved_probes = probe_all(a)
    a.shutdown()

    b = start_with_env(start_kernel, ckpt_paths, "b")
    restore_output, restored_names = restore_and_list(b, "rt")
    count_after_restore = b.last_execution_count
    assert count_after_restore is not None
    truths_in_b = {topic: b.falsy(*truths) for topic, truths in TRUTHS.items()}
    restored_reprs = b.eval(REPR_PROBE)
    env = b.eval(ENV_PROBE)
    b.ckpt("save rt2")  # the restored state, untouched yet, for the second generation
    return RoundTrip(
        b, save_output, restore_output, saved_probes, probe_all(b), truths_in_a, truths_in_b,
        save_count, count_after_restore, saved_cwd, saved_history, saved_raw_history,
        saved_reprs,
        restored_reprs, restored_names, env,
    )  # fmt: skip


@dataclass
class SecondGeneration:
    kernel: Kernel
    probes: dict[str, list[Any]]
    falsy: list[str]
    restored_names: set[str]
    reprs: list[str]
    env: dict[str, str | None]


@pytest.fixture(scope="module")
def gen2(rt: RoundTrip, start_kernel, ckpt_paths) -> SecondGeneration:
    """Kernel C restores the image that B wrote right after its own restore."""
    c = start_with_env(start_kernel, ckpt_paths, "c")
    out, names = restore_and_list(c, "rt2")
    assert out.startswith("Restored"), out
    falsy = c.falsy(*(t for truths in TRUTHS.values() for t in truths))
    reprs, env = c.eval(REPR_PROBE), c.eval(ENV_PROBE)
    return SecondGeneration(c, probe_all(c), falsy, names, reprs, env)


@pytest.mark.parametrize("topic", list(PROBES))
def test_values_equal_after_restore(rt: RoundTrip, topic: str) -> None:
    """The same expressions give the same results in the saving and the restored kernel."""
    assert rt.restored_probes[topic] == rt.saved_probes[topic]


RESTORABLE = USER_NAMES - set(UNSAVEABLE) - {"scratch"}


def test_restores_exactly_the_user_names(rt: RoundTrip, kernel_store) -> None:
    """Every name the cells bound comes back, and nothing else: no name dropped for
    looking like IPython's, none of IPython's own taken for the user's."""
    assert {"_", "exit", "_cache", "__x", "_ix", "_oh_no", "_0", "Input", "u", "v"} <= USER_NAMES
    assert_complete(kernel_store.open("rt"), rt.restored_names)
    assert rt.restored_names == RESTORABLE
    assert image_names(kernel_store.open("rt")) == RESTORABLE
    assert f"Restored {len(RESTORABLE)} variables" in rt.restore_output


def test_equal_values_and_lookalikes_keep_their_values(rt: RoundTrip) -> None:
    assert rt.restored_reprs == rt.saved_reprs
    assert dict(zip(REPR_NAMES, rt.saved_reprs, strict=True))["exit"] == "'my exit'"


def test_environment_changes_restored(rt: RoundTrip) -> None:
    """Variables the user unset are unset again, in a kernel launched with them."""
    assert rt.env == ENV_AFTER_RESTORE


def test_truths_hold_in_the_saving_kernel(rt: RoundTrip) -> None:
    """The checks below are about the restore, not about wrong expectations."""
    assert rt.truths_in_a == []


@pytest.mark.parametrize("topic", list(TRUTHS))
def test_identities_and_behaviour(rt: RoundTrip, topic: str) -> None:
    assert rt.truths_in_b[topic] == [], "false after restore"


def test_closure_keeps_counting(rt: RoundTrip) -> None:
    assert rt.kernel.eval("[counter(), counter()]") == [3, 4]


def test_restore_reports_every_variable(rt: RoundTrip) -> None:
    """Everything saveable is back; the output names each variable that is not."""
    assert "Restored" in rt.restore_output and "'rt'" in rt.restore_output
    restored = rt.kernel.eval("sorted(k for k in globals() if not k.startswith('_'))")
    missing = set(UNSAVEABLE) | {"scratch"}
    for name in ["a", "rex", "big", "df", "clf", "model", "opt", "keep_me", "np", "sqrt"]:
        assert name in restored
    assert not missing & set(restored)
    for name, reason in UNSAVEABLE.items():
        assert f"  {name}: not saved: {reason}" in rt.restore_output
    assert "  scratch: not saved: excluded with %ckpt exclude" in rt.restore_output


def test_function_sees_later_global_change(rt: RoundTrip) -> None:
    """Restored notebook functions read the kernel's globals, not a frozen copy."""
    assert rt.kernel.eval("shifted(1)") == 2
    rt.kernel.run("OFFSET = 5")
    assert rt.kernel.eval("shifted(1)") == 6


@pytest.mark.parametrize(
    ("write", "read", "expected"),
    [
        ("view[0] = -1.0", "big[10]", -1.0),
        ("wview[1] = -7", "wbig[102]", -7),
        ("bigF_view[3, 0] = -2.0", "bigF[3, 1]", -2.0),
        ("view_t[0] = 100.0", "base_t[2].item()", 100.0),
    ],
)
def test_writes_through_views_reach_the_base(
    rt: RoundTrip, write: str, read: str, expected: float
) -> None:
    rt.kernel.run(write)
    assert rt.kernel.eval(f"float({read})") == expected


def test_kernel_state_restored(rt: RoundTrip) -> None:
    """cwd, the execution count and `In` come back."""
    k = rt.kernel
    assert k.eval("__import__('os').getcwd()") == rt.saved_cwd
    assert rt.saved_cwd.endswith("cwd-a/work/sub")
    assert rt.count_after_restore == rt.save_count + 1
    assert k.eval(f"In[:{rt.save_count + 1}]") == rt.saved_history
    assert any("class Dog(Animal)" in cell for cell in rt.saved_history)
    # the raw form too (what %history and the frontends show): magics as typed
    assert k.eval(RAW_HISTORY.format(rt.save_count + 1)) == rt.saved_raw_history
    assert "%ckpt save rt" in rt.saved_raw_history


def test_unsaveable_named_in_save_output(rt: RoundTrip) -> None:
    lines = rt.save_output.splitlines()
    assert lines[0].startswith("Saved ")
    assert f"Not saved ({len(UNSAVEABLE)}):" in lines
    for name, reason in UNSAVEABLE.items():
        assert f"  {name}: {reason}" in lines
    assert "Excluded: scratch" in lines


def test_show_lists_lost_and_excluded(rt: RoundTrip) -> None:
    shown = rt.kernel.ckpt("show rt").splitlines()
    by_name = {line.split()[0]: line for line in shown if line.startswith("    ")}
    for name, reason in UNSAVEABLE.items():
        assert f"LOST: {reason}" in by_name[name]
    assert "EXCLUDED: excluded with %ckpt exclude" in by_name["scratch"]
    assert "import numpy" in by_name["np"]
    assert "MiB" in by_name["big"]


def test_exclusions_survive_restore(rt: RoundTrip) -> None:
    """The restored kernel keeps the saved exclusions, so its next image also skips them."""
    status = rt.kernel.ckpt("status")
    assert "Excluded: scratch" in status.splitlines()


@pytest.mark.parametrize("topic", list(PROBES))
def test_second_generation_values(rt: RoundTrip, gen2: SecondGeneration, topic: str) -> None:
    """An image saved by a restored kernel gives back the values the first one held."""
    assert gen2.probes[topic] == rt.saved_probes[topic]


def test_second_generation_identities(gen2: SecondGeneration) -> None:
    assert gen2.falsy == []


def test_second_generation_names(rt: RoundTrip, gen2: SecondGeneration, kernel_store) -> None:
    """B's image, written right after its restore, holds exactly A's names."""
    assert_complete(kernel_store.open("rt2"), gen2.restored_names)
    assert gen2.restored_names == RESTORABLE
    assert gen2.reprs == rt.saved_reprs


def test_second_generation_environment(gen2: SecondGeneration) -> None:
    """B's image keeps A's environment changes, including those B's own launch
    environment happened to agree with (so B saw no change of its own)."""
    assert gen2.env == ENV_AFTER_RESTORE
