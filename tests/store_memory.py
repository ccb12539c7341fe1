"""Peak memory of one store operation, in a fresh process: ``python store_memory.py
ACTION STORE SECRET [ARG]`` prints the growth of the peak RSS (bytes) that ACTION caused.

ACTION is ``write`` (ARG: MiB of state, then ``arrays`` or ``bytes``: 8 variables of
that kind), ``restore``, ``export`` (ARG: tar file) or ``import`` (ARG: tar file).
"""

from __future__ import annotations

import os
import sys

import numpy as np

from jupyter_ckpt import image
from jupyter_ckpt.store import ImageStore


def peak() -> int:
    """This process's peak RSS. Not getrusage's ``ru_maxrss``: Linux carries it over exec
    from the process that forked, so a child of a large test process would start at its
    parent's peak and show no growth."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def main() -> None:
    action, url, secret, *rest = sys.argv[1:]
    store = ImageStore(url=url, secret_file=secret)
    if action == "write":
        each = (int(rest[0]) << 20) // 8
        rng = np.random.default_rng(0)
        make = {"bytes": os.urandom, "arrays": lambda n: rng.integers(0, 255, n, np.uint8)}
        ns = {f"v{i}": make[rest[1]](each) for i in range(8)}
        image.capture(ns, ns, store.writer(), name="big")
        return
    before = peak()
    if action == "restore":
        manifest = store.open("big")
        ns: dict[str, object] = {}
        report = image.restore(manifest, store.read_segments(manifest), ns)
        assert not report.missing and len(ns) == 8, report.missing
    elif action == "export":
        store.export("big", rest[0])
    elif action == "import":
        store.import_(rest[0])
    print(peak() - before)


if __name__ == "__main__":
    main()
