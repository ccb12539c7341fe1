"""What keeping the process state costs a save and a restore, against baselines measured
in the same run.

With numpy, pandas, matplotlib and torch imported (what a notebook of that kind has
loaded), in this process:

* providers: ``process.capture_states`` (every provider whose library is imported) and
  ``process.apply_states`` of the result, against ``pickle.dumps`` of the same states;
* library objects: the walk of numpy's, matplotlib's and torch's modules that a save
  makes when it meets objects of theirs (``ModuleObjects``: the library objects saved as
  references), against a fresh interpreter's start (``python -c pass``), the smallest
  part of a kernel start;
* loadability: the check that a fresh kernel would import the image's modules
  (``FreshKernel.unimportable``) for ``--modules`` modules of the user's (made in a
  temporary folder on ``sys.path``), against the same interpreter start. A notebook that
  uses only installed packages skips it (measured too: no user module).

    python benchmarks/bench_continuity.py --rounds 5 --modules 20
"""

from __future__ import annotations

import argparse
import importlib
import pickle
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchlib import report_figure, table, timed

SCRIPT = "bench_continuity"


def median_of(rounds: int, fn: object) -> float:
    return statistics.median(timed(fn)[0] for _ in range(rounds))  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--modules", type=int, default=20, help="user modules to check")
    args = parser.parse_args()

    for name in ("pandas", "matplotlib.pyplot"):
        importlib.import_module(name)
    import matplotlib
    import numpy
    import torch

    from jupyter_ckpt import process
    from jupyter_ckpt.image.module_objects import ModuleObjects

    folder = Path(tempfile.mkdtemp(prefix="ckpt-bench-modules-"))
    names = [f"bench_user_module_{i}" for i in range(args.modules)]
    for name in names:
        (folder / f"{name}.py").write_text("class Thing:\n    pass\n")
    sys.path.append(str(folder))
    for name in names:
        importlib.import_module(name)

    states, _ = process.capture_states(process.PROVIDERS)
    start = median_of(args.rounds, lambda: subprocess.run([sys.executable, "-c", "pass"]))
    kernel = process.FreshKernel(list(sys.path), {}, str(folder))
    rows = [
        ("capture every provider", median_of(args.rounds, lambda: process.capture_states(
            process.PROVIDERS)), "pickle.dumps of the states",
         median_of(args.rounds, lambda: pickle.dumps(states, protocol=5))),
        ("apply every provider", median_of(args.rounds, lambda: process.apply_states(
            states, process.PROVIDERS)), "pickle.dumps of the states",
         median_of(args.rounds, lambda: pickle.dumps(states, protocol=5))),
        ("library objects: numpy, matplotlib, torch walked", median_of(args.rounds, lambda: [
            found.find(x) for found in [ModuleObjects()]
            for x in (numpy.zeros(1), matplotlib.rcParams, torch.zeros(1))]),
         "python -c pass", start),
        (f"fresh-kernel check, {args.modules} user modules",
         median_of(args.rounds, lambda: kernel.unimportable(names)), "python -c pass", start),
        ("fresh-kernel check, no user module",
         median_of(args.rounds, lambda: kernel.unimportable(["numpy", "torch"])),
         "python -c pass", start),
    ]  # fmt: skip
    print(f"{len(sys.modules)} modules loaded; providers kept: {', '.join(sorted(states))}")
    print(
        table(
            ["step", "seconds", "baseline", "baseline s", "ratio"],
            [
                (step, f"{s:.4f}", base, f"{b:.4f}", f"{s / b:.2f}" if b else "-")
                for step, s, base, b in rows
            ],
        )
    )
    for step, seconds, base, base_seconds in rows:
        report_figure(SCRIPT, step, seconds, base, base_seconds)


if __name__ == "__main__":
    main()
