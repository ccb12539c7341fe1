"""Peak memory of one store operation, in a fresh process: ``python store_memory.py
ACTION STORE SECRET [ARG]`` prints the growth of the peak RSS (bytes) that ACTION caused.

ACTION is ``write`` (ARG: MiB of state, in 8 variables of bytes), ``restore``, ``export``
(ARG: tar file) or ``import`` (ARG: tar file).
"""

from __future__ import annotations

import os
import resource
import sys

from jupyter_ckpt import image
from jupyter_ckpt.store import ImageStore


def peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main() -> None:
    action, url, secret, *rest = sys.argv[1:]
    store = ImageStore(url=url, secret_file=secret)
    if action == "write":
        each = (int(rest[0]) << 20) // 8
        ns = {f"v{i}": os.urandom(each) for i in range(8)}
        image.capture(ns, ns, store.writer(), name="big")
        return
    before = peak()
    if action == "restore":
        manifest = store.open("big")
        ns: dict[str, bytes] = {}
        report = image.restore(manifest, store.read_segments(manifest), ns)
        assert not report.missing and len(ns) == 8, report.missing
    elif action == "export":
        store.export("big", rest[0])
    elif action == "import":
        store.import_(rest[0])
    print(peak() - before)


if __name__ == "__main__":
    main()
