"""A restore the computation cannot notice: kernel A sets the process state a notebook
relies on without naming it, saves with `%ckpt save`, and then evaluates what it would
use next; a fresh kernel B restores the image and evaluates the same. Every probe must
give the same answer in both: what an uninterrupted run would see.

The probes run in A after the save (a save that drew a random number or reset an option
would show here) and in B right after the restore.
"""

from __future__ import annotations

import shutil
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from harness import SHARED_COUNTER, Kernel

from jupyter_ckpt.process.hashing import ENV

# Each topic: the cells that set the state, and the probes (JSON-able expressions).
SETUP: dict[str, str] = {
    "random streams": """
import random, numpy as np, torch
random.seed(1); np.random.seed(0); torch.manual_seed(3)
random.random(); np.random.rand(); torch.rand(1)  # streams part-way, not at their seed
np.random.randn()  # numpy's legacy gauss cache holds the second of a pair now
words = ['alpha', 'beta', 'gamma', 'delta', 'epsilon', 'zeta']
""",
    "library options": """
import decimal, sys, warnings, logging, socket
import numpy as np, pandas as pd, matplotlib as mpl, torch
np.set_printoptions(precision=3, suppress=True); np.seterr(all='raise')
decimal.getcontext().prec = 50; decimal.getcontext().rounding = decimal.ROUND_DOWN
sys.setrecursionlimit(4321); socket.setdefaulttimeout(7.5)
pd.set_option('display.max_rows', 7); pd.set_option('display.precision', 2)
mpl.rcParams['lines.linewidth'] = 5.5; mpl.rcParams['axes.grid'] = True
warnings.filterwarnings('error', message='a deliberate failure')
logging.getLogger('project.io').setLevel(logging.ERROR)
logging.basicConfig(level=logging.INFO, format='%(levelname)s|%(message)s')
torch.set_num_threads(1); torch.use_deterministic_algorithms(True, warn_only=True)
torch.set_default_dtype(torch.float64)
import gc, locale, os, sklearn
gc.set_threshold(1234, 11, 12); sys.setswitchinterval(0.002); os.umask(0o027)
locale.setlocale(locale.LC_NUMERIC, 'C.UTF-8')
sklearn.set_config(transform_output='pandas', assume_finite=True)
""",
    "ipython": """
%load_ext autoreload
%autoreload 2
%precision 3
%config PlainTextFormatter.max_seq_length = 17
%xmode Verbose
%alias shout echo LOUD %s
""",
    "sharing": """
import os, sys, collections
import matplotlib as mpl
rc = mpl.rcParams
environ = os.environ
search_path, out = sys.path, sys.stdout
settings = {'rc': mpl.rcParams}
"""
    + SHARED_COUNTER
    + """
inc(); inc()
class Point(collections.namedtuple('Point', 'x y')):
    __slots__ = ()
class Slotted:
    __slots__ = ('a', 'b')
    def __init__(self):
        self.a, self.b = 1, 2
pt, sl = Point(1, 2), Slotted()
""",
    "user modules": """
import sys
sys.path.append('src')
from shapes import Square, REGISTRY
import shapes
sq = Square(5)
REGISTRY['unit'] = 1
""",
}

PROBES: dict[str, list[str]] = {
    "random streams": [
        "random.random()",
        "np.random.rand()",
        "np.random.randn()",
        "torch.rand(1).item()",
        # a set of strings iterates in its process's hash order
        "random.choice(list(set(words)))",
        "list(set(words))",
    ],
    "library options": [
        "np.get_printoptions()['precision']",
        "np.get_printoptions()['suppress']",
        "np.geterr()['divide']",
        "decimal.getcontext().prec",
        "str(decimal.getcontext().rounding)",
        "sys.getrecursionlimit()",
        "socket.getdefaulttimeout()",
        "pd.get_option('display.max_rows')",
        "pd.get_option('display.precision')",
        "mpl.rcParams['lines.linewidth']",
        "mpl.rcParams['axes.grid']",
        "[f[0] for f in warnings.filters if f[1] and f[1].pattern == 'a deliberate failure']",
        "logging.getLogger('project.io').level",
        "logging.root.level",
        "[h.formatter._fmt for h in logging.root.handlers if h.formatter]",
        "torch.get_num_threads()",
        "torch.are_deterministic_algorithms_enabled()",
        "str(torch.get_default_dtype())",
        "gc.get_threshold()",
        "(lambda mask: (os.umask(mask), mask)[1])(os.umask(0o022))",
        "sys.getswitchinterval()",
        "locale.setlocale(locale.LC_NUMERIC)",
        "sklearn.get_config()['transform_output']",
        "sklearn.get_config()['assume_finite']",
    ],
    "ipython": [
        "get_ipython().display_formatter.formatters['text/plain'].float_precision",
        "get_ipython().display_formatter.formatters['text/plain'].max_seq_length",
        "'autoreload' in get_ipython().extension_manager.loaded",
        "get_ipython().magics_manager.registry['AutoreloadMagics']._reloader.check_all",
        "get_ipython().magics_manager.registry['AutoreloadMagics']._reloader.enabled",
        "get_ipython().InteractiveTB.mode",
        "get_ipython().alias_manager.is_alias('shout')",
    ],
    "sharing": [
        "rc is mpl.rcParams",
        "environ is os.environ",
        "settings['rc'] is mpl.rcParams",
        "search_path is sys.path and out is sys.stdout",
        "[inc(), get()]",
        "hasattr(pt, '__dict__') or hasattr(sl, '__dict__')",
        "Slotted.__slots__",
    ],
    "user modules": [
        "'src' in sys.path",
        "type(sq).__module__",
        "sq.area()",
        "REGISTRY is shapes.REGISTRY and REGISTRY == {'unit': 1}",
    ],
}

SHAPES = """
REGISTRY = {}
class Square:
    def __init__(self, side):
        self.side = side
    def area(self):
        return self.side ** 2
"""


@dataclass
class Continuation:
    save_output: str
    restore_output: str
    uninterrupted: dict[str, list[Any]]
    restored: dict[str, list[Any]]
    kernel: Kernel


def _probe(kernel: Kernel) -> dict[str, list[Any]]:
    return {topic: [kernel.eval(p) for p in probes] for topic, probes in PROBES.items()}


@pytest.fixture(scope="module")
def continued(start_kernel, ckpt_paths) -> Continuation:
    a_dir, b_dir = ckpt_paths.root / "a", ckpt_paths.root / "b"
    (a_dir / "src").mkdir(parents=True)
    (a_dir / "src" / "shapes.py").write_text(textwrap.dedent(SHAPES))
    b_dir.mkdir()
    a = start_kernel(cwd=a_dir)
    for cells in SETUP.values():
        a.run(cells)
    save_output = a.ckpt("save continuity")
    uninterrupted = _probe(a)
    a.shutdown()
    # B starts elsewhere, with the default sys.path, options and streams
    b = start_kernel(cwd=b_dir)
    restore_output = b.ckpt("restore continuity")
    return Continuation(save_output, restore_output, uninterrupted, _probe(b), b)


@pytest.mark.parametrize("topic", list(PROBES))
def test_a_restored_kernel_goes_on_as_the_saved_one_would(
    continued: Continuation, topic: str
) -> None:
    assert "Not restored" not in continued.restore_output, continued.restore_output
    assert "Warning" not in continued.restore_output, continued.restore_output
    restored, uninterrupted = continued.restored[topic], continued.uninterrupted[topic]
    differ = [
        f"{probe}: {was!r} -> {now!r}"
        for probe, was, now in zip(PROBES[topic], uninterrupted, restored, strict=True)
        if was != now
    ]
    assert not differ, differ


def test_the_probes_see_what_the_setup_set(continued: Continuation) -> None:
    """The probes measure something: in the saving kernel they differ from a fresh one's."""
    options = continued.uninterrupted["library options"]
    fresh = dict(zip(PROBES["library options"], options, strict=True))
    assert fresh["np.get_printoptions()['precision']"] == 3
    assert fresh["sys.getrecursionlimit()"] == 4321
    assert fresh["(lambda mask: (os.umask(mask), mask)[1])(os.umask(0o022))"] == 0o027
    assert fresh["sklearn.get_config()['transform_output']"] == "pandas"
    sharing = dict(zip(PROBES["sharing"], continued.uninterrupted["sharing"], strict=True))
    assert sharing["[inc(), get()]"] == [3, 3]
    assert continued.uninterrupted["user modules"] == [True, "shapes", 25, True]


def test_the_save_names_nothing_it_could_not_keep(continued: Continuation) -> None:
    assert continued.save_output.startswith("Saved"), continued.save_output
    assert "Warning" not in continued.save_output and "Not saved" not in continued.save_output


def test_writes_through_a_library_object_reach_the_library(continued: Continuation) -> None:
    continued.kernel.run("rc['lines.linewidth'] = 2.25; environ['CKPT_CONTINUITY'] = 'yes'")
    continued.kernel.check(
        "mpl.rcParams['lines.linewidth'] == 2.25", "os.environ['CKPT_CONTINUITY'] == 'yes'"
    )


def test_a_module_a_fresh_kernel_cannot_import_is_saved_with_the_image(
    start_kernel, ckpt_paths
) -> None:
    """A module from a folder removed since, or made in memory: the save says so, and its
    classes and functions travel by value, so the variables come back."""
    folder = ckpt_paths.root / "gone"
    folder.mkdir()
    (folder / "scratch_shapes.py").write_text(textwrap.dedent(SHAPES))
    a = start_kernel(cwd=ckpt_paths.root)
    a.run(
        f"import sys, types\nsys.path.insert(0, {str(folder)!r})\n"
        "import scratch_shapes\nsq = scratch_shapes.Square(3)\n"
        "made = types.ModuleType('made_here')\n"
        "exec('def twice(x):\\n    return 2 * x', made.__dict__)\n"
        "sys.modules['made_here'] = made\nfrom made_here import twice\n"
    )
    shutil.rmtree(folder)
    out = a.ckpt("save gone")
    assert "Warning: module scratch_shapes: a fresh kernel would not find it" in out, out
    assert "Warning: module made_here" in out, out
    a.shutdown()
    b = start_kernel(cwd=ckpt_paths.root)
    restored = b.ckpt("restore gone")
    assert "Not restored" not in restored, restored
    assert b.eval("[sq.area(), twice(21), type(sq).__name__]") == [9, 42, "Square"]


def test_an_option_a_restore_cannot_set_is_named(start_kernel, ckpt_paths) -> None:
    """A provider that fails at restore says which state did not come back."""
    a = start_kernel(cwd=ckpt_paths.root)
    a.run("import numpy as np\nnp.set_printoptions(precision=4)")
    a.ckpt("save options")
    a.shutdown()
    b = start_kernel(cwd=Path(ckpt_paths.root))
    b.run(
        "import numpy as np\n_real = np.set_printoptions\n"
        "def _refuse(**kw): raise ValueError('refused here')\n"
        "np.set_printoptions = _refuse"
    )
    out = b.ckpt("restore options")
    b.run("np.set_printoptions = _real")
    assert "Warning: numpy not restored: ValueError: refused here" in out, out


def test_the_cells_caches_come_back(start_kernel, ckpt_paths) -> None:
    """IPython's caches of the cells: the last outputs (`_`, `Out`, `_5`), the inputs
    (`_i`, `_i2`), the last shell command's exit code and the %cd history."""
    cells = [
        "x = 41",
        "x + 1",
        "import pandas as pd; df = pd.DataFrame({'a': [1]})",
        "df",
        "!false",
        "'text'",
        f"%cd {ckpt_paths.root}",
    ]
    probe = (
        "[repr(_), repr(__), repr(___), sorted(Out), _i3, _i, _ii, _iii, _3, _exit_code, "
        "[str(d) for d in _dh], Out[5] is df and _5 is df and __ is df]"
    )
    a = start_kernel(cwd=ckpt_paths.root / "cwd")
    for cell in cells:
        a.run(cell)
    a.ckpt("save caches")
    uninterrupted = a.eval(probe)
    assert uninterrupted[3] == [3, 5, 7] and uninterrupted[-1] is True, uninterrupted
    a.shutdown()
    b = start_kernel(cwd=ckpt_paths.root)
    assert "Warning" not in b.ckpt("restore caches")
    assert b.eval(probe) == uninterrupted


def test_string_hashing_unlike_the_saved_kernel_s_is_named(
    start_kernel, ckpt_paths, monkeypatch
) -> None:
    """Kernels started with a random hash seed cannot be restored into one that iterates
    sets alike: the save says so; a kernel of another seed, the restore."""
    launch = ckpt_paths.env
    for seed, says in (("random", "Warning: string hashing not kept"), ("7", None)):
        monkeypatch.setattr(ckpt_paths, "env", lambda seed=seed: {**launch(), ENV: seed})
        a = start_kernel(cwd=ckpt_paths.root)
        saved = a.ckpt(f"save seed-{seed}")
        assert says in saved if says else "Warning" not in saved, saved
        a.shutdown()
    monkeypatch.setattr(ckpt_paths, "env", launch)
    b = start_kernel(cwd=ckpt_paths.root)
    out = b.ckpt("restore seed-random")
    assert "Warning: string hashing was not saved" in out, out
    out = b.ckpt("restore seed-7")
    assert "Warning: string hashing not restored" in out, out


def test_a_restore_leaves_the_kernel_its_own_launch(start_kernel, ckpt_paths) -> None:
    """The kernel application's settings are its process's (connection file, ports): a
    restore into another kernel keeps that kernel's."""
    own = "__import__('ipykernel.kernelapp').kernelapp.IPKernelApp.instance()"
    probe = f"[{own}.connection_file, {own}.shell_port]"
    a = start_kernel(cwd=ckpt_paths.root)
    a.ckpt("save launch")
    a.shutdown()
    b = start_kernel(cwd=ckpt_paths.root)
    before = b.eval(probe)
    b.ckpt("restore launch")
    assert b.eval(probe) == before
