"""Stores with history: listing, name resolution and the retention scan with 1,000+ images.

A store is filled with small images whose manifests carry a realistic input history
(``--cells`` cells of ``--cell-bytes`` each, written the way the kernel writes them), then
each operation is timed as a new process does it (a fresh ``ImageStore``: the signed index
is read and checked) and as the server does it (the same ``ImageStore`` again), against a
baseline measured in the same run: reading every manifest file plainly (no signature
check), which is the least any listing that opens each manifest must do. The median of
``--rounds`` rounds is reported.

On S3 (moto's server on loopback, started here) the same listing is counted in requests,
against the baseline of one GET per manifest. The script's own S3 store is filled by
uploading the local one.

    python benchmarks/bench_listing.py --images 1000,2000 --rounds 5
    python benchmarks/bench_listing.py --images 200 --rounds 1 --no-s3     # checks the script
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from benchlib import Timings, make_store, table, timed

from jupyter_ckpt import compat
from jupyter_ckpt.format import image_summary
from jupyter_ckpt.store import ImageStore, manifest_path
from jupyter_ckpt.store.backends import FsspecBackend

PLAIN_READ = "plain read of every manifest (baseline)"
CLI_BASELINE = "python + import the CLI (baseline)"
NAMES = 20  # images share this many names, as repeated suspends of a few notebooks do
CREDENTIALS = {"key": "bench", "secret": "bench"}
BUCKET = "ckpt-bench"


def history(cells: int, cell_bytes: int, twice: bool) -> dict[str, Any]:
    """A kernel's input history as its manifest stores it (``twice``: as images written
    before it was stored once, with the raw and parsed cells both in full)."""
    raw = [""] + [f"x{i} = {'1 + ' * (cell_bytes // 4)}1" for i in range(cells)]
    if twice:
        return {"raw": raw, "parsed": raw}
    from jupyter_ckpt.kernel.state import compact_history

    return compact_history(raw, raw)


def fill(store: ImageStore, count: int, cells: int, cell_bytes: int, twice: bool) -> None:
    """``count`` small images, one minute apart, each with its own chunk."""
    start = datetime.now(timezone.utc) - timedelta(minutes=count)
    facts: dict[str, Any] = {"id": None, "cwd": "/home/user", "env": {"set": {}, "unset": []}}
    for n in range(count):
        writer = store.writer()
        writer.add_segment(n.to_bytes(8, "little") * 128)
        created = (start + timedelta(minutes=n)).isoformat(timespec="milliseconds")
        writer.commit(
            {
                "name": f"notebook-{n % NAMES}",
                "created": created,
                "parent": None,
                "kernel": {
                    **facts,
                    "execution_count": cells,
                    "history": history(cells, cell_bytes, twice),
                },
                "variables": [
                    {"name": f"v{i}", "type": "builtins.list", "status": "saved", "bytes": 1024}
                    for i in range(20)
                ],
                "imports": [{"name": "np", "module": "numpy"}],
                "groups": [{"names": ["v0"], "pickle": [0, 0, 1024], "buffers": []}],
                "excluded": [],
                "environment": {"python": "3.12.0", "packages": {"numpy": "2.0.0"}},
                "devices": [],
            }
        )


def plain_read(store: ImageStore) -> int:
    """The baseline: every manifest file read and parsed, nothing checked."""
    backend = store.backend
    ids = backend.listdir("images")
    for image_id in ids:
        json.loads(backend.read_bytes(manifest_path(image_id)))
    return len(ids)


def verified_read(store: ImageStore) -> int:
    """Listing without the index, as before it: every manifest read and its signature
    checked, one after another."""
    return len([store.load_manifest(i) for i in store.image_ids()])


def rest_listing(store: ImageStore) -> int:
    """What ``GET /api/ckpt/images`` computes beside the listing: summaries and verdicts."""
    manifests = [m for _, m, _ in store.iter_manifests() if m is not None]
    verdicts = compat.check_all(manifests, None)
    return len(
        [{**image_summary(m), "compatibility": v} for m, v in zip(manifests, verdicts, strict=True)]
    )


def contenders(
    fresh: Callable[[], ImageStore], warm: ImageStore, name: str
) -> dict[str, Callable[[], Any]]:
    """Operation -> a call; 'new process' ones get a fresh store made outside the clock."""

    def in_new_process(op: Callable[[ImageStore], Any]) -> Callable[[], Any]:
        def run() -> Any:
            store = fresh()
            return timed(lambda: op(store))[0]

        return run

    def retention_scan(store: ImageStore) -> list[str]:
        store.retention_days, store.max_images = 3650, 100_000
        return store.expired(set())

    return {
        PLAIN_READ: in_new_process(plain_read),
        "verified read of every manifest (no index)": in_new_process(verified_read),
        "list, new process": in_new_process(lambda s: list(s.iter_manifests())),
        "list, same process": lambda: timed(lambda: list(warm.iter_manifests()))[0],
        "REST list (+ compatibility), same process": lambda: timed(lambda: rest_listing(warm))[0],
        "resolve a name, new process": in_new_process(lambda s: s.resolve(name)),
        "retention scan, new process": in_new_process(retention_scan),
        "retention after a save, same process": lambda: timed(
            lambda: warm.enforce_retention(collect=None)
        )[0],
    }


def measure_local(
    where: str, count: int, args: argparse.Namespace, timings: Timings
) -> dict[str, float]:
    store = make_store(where, fsync=False)
    fill(store, count, args.cells, args.cell_bytes, args.history_twice)
    sizes = [
        os.path.getsize(os.path.join(store.backend.root, manifest_path(i)))
        for i in store.image_ids()
    ]
    index = os.path.join(store.backend.root, "index.json")

    def fresh() -> ImageStore:
        return make_store(where, fsync=False)

    # The first listing ever (no index yet) reads every manifest and writes the index.
    first = fresh()
    seconds, _ = timed(lambda: list(first.iter_manifests()))
    warm = fresh()
    warm.enforce_retention(collect=None)  # the first one in a process collects chunks
    rest_listing(warm)  # and the first compatibility check lists the installed packages
    workload = f"{count} images"
    ops = contenders(fresh, warm, "notebook-3")
    for _ in range(args.rounds):
        for op, run in ops.items():
            timings.add(workload, "local", op, run())
    timings.add(workload, "local", "first list ever (builds the index)", seconds)
    fill(warm, 1, args.cells, args.cell_bytes, args.history_twice)
    timings.add(
        workload, "local", "list after one new image", timed(lambda: list(warm.iter_manifests()))[0]
    )
    return {
        "manifest": sum(sizes) / len(sizes),
        "index": os.path.getsize(index) if os.path.exists(index) else 0,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_url(url: str, process: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 120
    while True:
        try:
            urllib.request.urlopen(url, timeout=5).close()
            return
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"{what} did not answer at {url}") from None
            time.sleep(0.2)


def measure_processes(
    where: str, store: ImageStore, workload: str, rounds: int, timings: Timings
) -> None:
    """``GET /api/ckpt/images`` from a real jupyter server with the extension, and
    ``jupyter ckpt list`` as a new process, against the same process starting and
    importing the CLI (its fixed cost, whatever the store holds)."""
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": os.path.join(where, "config"),
        "JUPYTER_CKPT_STORE": os.path.join(where, "store"),
        "JUPYTER_CKPT_SECRET_FILE": store.secret_file,
        "JUPYTER_CKPT_USER": store.user,
    }
    port = free_port()
    config = {
        "ServerApp": {
            "port": port,
            "open_browser": False,
            "allow_root": True,
            "root_dir": where,
            "jpserver_extensions": {"jupyter_ckpt_server": True},
            "kernel_manager_class": "jupyter_ckpt_server.kernelmanager.CkptKernelManager",
        },
        "IdentityProvider": {"token": "bench"},
        "SuspendPolicy": {"check_interval": 3600},
    }
    os.makedirs(env["JUPYTER_CONFIG_DIR"], exist_ok=True)
    with open(os.path.join(env["JUPYTER_CONFIG_DIR"], "jupyter_server_config.json"), "w") as f:
        json.dump(config, f)
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter_server"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/api/ckpt/images?token=bench"
    try:
        wait_for_url(f"http://127.0.0.1:{port}/api/status?token=bench", server, "the server")
        first, reply = timed(lambda: urllib.request.urlopen(url, timeout=60).read())
        assert len(json.loads(reply)) == len(store.image_ids()), "the server lists every image"
        timings.add(workload, "server", "GET /api/ckpt/images, first", first)
        for _ in range(rounds):
            seconds, _ = timed(lambda: urllib.request.urlopen(url, timeout=60).read())
            timings.add(workload, "server", "GET /api/ckpt/images, again", seconds)
    finally:
        server.terminate()
        server.wait(timeout=60)
    imports = [sys.executable, "-c", "import jupyter_ckpt.cli"]
    cli = [sys.executable, "-c", "from jupyter_ckpt.cli import main; main()", "list"]
    for _ in range(rounds):
        seconds, _ = timed(lambda: subprocess.run(imports, env=env, check=True))
        timings.add(workload, "cli", CLI_BASELINE, seconds)
        seconds, _ = timed(lambda: subprocess.run(cli, env=env, check=True, capture_output=True))
        timings.add(workload, "cli", "jupyter ckpt list", seconds)


class Moto:
    """moto's S3 server on a free loopback port, counting the requests the store sends."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(self.url, timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    self.process.kill()
                    raise
                time.sleep(0.2)
        import s3fs

        s3fs.S3FileSystem(endpoint_url=self.url, **CREDENTIALS).mkdir(BUCKET)
        self.requests = 0
        self._counted: set[int] = set()

    def count(self, store: ImageStore) -> None:
        """Count every request ``store``'s S3 client sends from now on (fsspec shares one
        client between stores with the same options)."""
        fs = s3_files(store)
        if id(fs) in self._counted:
            return
        self._counted.add(id(fs))
        fs.connect()

        def sent(**_: Any) -> None:
            self.requests += 1

        fs.s3.meta.events.register("before-send.s3", sent)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def s3_files(store: ImageStore) -> Any:
    """The fsspec file system under an S3 store."""
    assert isinstance(store.backend, FsspecBackend), store.backend
    return store.backend.fs


def measure_s3(where: str, count: int, moto: Moto, timings: Timings) -> dict[str, int]:
    local = make_store(where, fsync=False)
    options = {"endpoint_url": moto.url, **CREDENTIALS}
    url = f"s3://{BUCKET}/{count}"

    def fresh() -> ImageStore:
        return ImageStore(
            url=url, user=local.user, secret_file=local.secret_file, storage_options=options
        )

    s3 = fresh()
    s3_files(s3).put(
        os.path.join(local.backend.root, "images"), f"{s3.backend.root}/", recursive=True
    )
    moto.count(s3)
    requests: dict[str, int] = {}
    workload = f"{count} images"

    def counted(op: str, run: Callable[[], Any]) -> None:
        moto.requests = 0
        seconds, _ = timed(run)
        requests[op] = moto.requests
        timings.add(workload, "s3", op, seconds)

    counted(PLAIN_READ, lambda: plain_read(fresh()))
    counted("verified read of every manifest (no index)", lambda: verified_read(fresh()))
    counted("first list ever (builds the index)", lambda: list(fresh().iter_manifests()))
    counted("list, new process", lambda: list(fresh().iter_manifests()))
    warm = fresh()
    list(warm.iter_manifests())
    counted("list, same process", lambda: list(warm.iter_manifests()))
    counted("resolve a name, new process", lambda: fresh().resolve("notebook-3"))
    return requests


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", default="1000,2000", help="store sizes (1000,2000)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per operation (median)")
    parser.add_argument("--cells", type=int, default=100, help="input history cells per image")
    parser.add_argument("--cell-bytes", type=int, default=500, help="bytes per history cell")
    parser.add_argument(
        "--history-twice",
        action="store_true",
        help="write manifests as earlier versions did (raw and parsed history both in full)",
    )
    parser.add_argument("--no-s3", action="store_true", help="skip the S3 request counts")
    parser.add_argument("--dir", default=None, help="scratch directory (default: system temp)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    counts = [int(c) for c in args.images.split(",")]
    timings = Timings()
    sizes = {}
    requests = {}
    moto = None if args.no_s3 else Moto()
    try:
        for count in counts:
            with tempfile.TemporaryDirectory(dir=args.dir, prefix="ckpt-listing-") as where:
                sizes[count] = measure_local(where, count, args, timings)
                store = make_store(where, fsync=False)
                measure_processes(where, store, f"{count} images", args.rounds, timings)
                if moto is not None:
                    requests[count] = measure_s3(where, count, moto, timings)
    finally:
        if moto is not None:
            moto.stop()

    print(f"rounds: {args.rounds}; history: {args.cells} cells of {args.cell_bytes} bytes")
    rows = []
    for workload, where, op, _, spread, _ in timings.rows():
        median = timings.median(workload, where, op)
        baseline = CLI_BASELINE if where == "cli" else PLAIN_READ
        base = timings.median(workload, "local" if where == "server" else where, baseline)
        count = int(workload.split()[0])
        n = requests.get(count, {}).get(op, "-") if where == "s3" else "-"
        rows.append(
            [workload, where, op, f"{median * 1000:.1f}", spread, f"{median / base:.3f}", n]
        )
    header = [
        "store",
        "backend",
        "operation",
        "ms (median)",
        "range s",
        "x baseline",
        "S3 requests",
    ]
    print(table(header, rows))
    for count, size in sizes.items():
        print(
            f"{count} images: manifest {size['manifest'] / 1024:.1f} KiB on average, "
            f"index {size['index'] / 1024:.1f} KiB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
