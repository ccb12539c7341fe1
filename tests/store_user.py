"""Run store actions as another OS user: ``python store_user.py '<json>'``, started as root.

Everything the actions need is imported first, as root; then the process drops to the
given uid/gid (which need no passwd entry) and runs the actions, printing one JSON result
per action. This is how the tests get two real users on one shared store.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any

import numpy as np

from jupyter_ckpt import image
from jupyter_ckpt.store import ImageStore


def run(store: ImageStore, action: str, *args: Any) -> Any:
    if action == "save":
        name, seed, mib = args
        data = np.random.default_rng(seed).random(mib << 17)  # mib MiB of float64
        ns = {"data": data}
        manifest = image.capture(ns, ns, store.writer(), name=name)
        return {"id": manifest["id"], "written": manifest["sizes"]["written"]}
    if action == "verify":
        return store.verify(args[0])["id"]
    if action == "list":
        return [[i, e] for i, _, e in store.iter_manifests()]
    if action == "resolve":
        return store.resolve(args[0])
    if action == "delete":
        return store.delete(args[0])
    if action == "gc":
        result = store.gc(grace_seconds=0)
        return {"files": result.files, "notes": result.notes}
    if action == "mkdir":  # make a directory by hand, as a neighbour on the store could
        os.mkdir(args[0])
        os.chmod(args[0], args[1])
        return "made"
    if action == "symlink":
        os.symlink(args[0], args[1])
        return "linked"
    if action == "rmtree":  # try to remove a directory of the store by hand
        os.rename(args[0], args[0] + ".gone")
        return "renamed"
    raise ValueError(action)


def main() -> None:
    spec = json.loads(sys.argv[1])
    import fsspec  # noqa: F401  (whatever the store may need, imported before dropping root)
    import s3fs  # noqa: F401

    os.setgroups([])
    os.setgid(spec["gid"])
    os.setuid(spec["uid"])
    os.environ["HOME"] = spec["home"]
    os.umask(0o022)
    try:
        store = ImageStore(**spec["store"])
    except Exception as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        return
    for action in spec["actions"]:
        try:
            print(json.dumps({"ok": run(store, *action)}), flush=True)
        except Exception as exc:
            print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
            traceback.print_exc()


if __name__ == "__main__":
    main()
