"""Helpers for the image tests: real ipykernel processes driven through jupyter_client,
and in-process saves and loads on a store."""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deadlines import scaled
from jupyter_client.manager import KernelManager, start_new_kernel

from jupyter_ckpt import image
from jupyter_ckpt.compat import NODE_FACTS_ENV
from jupyter_ckpt.process import hash_seed_env
from jupyter_ckpt.store import ImageStore, Signer, chunk_path
from jupyter_ckpt.store.writer import ImageWriter

TESTS_DIR = Path(__file__).resolve().parent
# The S3 server of the tests (moto, on loopback: see the `endpoint` fixture)
BUCKET = "ckpt-test"
CREDENTIALS = {"key": "testing", "secret": "testing"}
# Short client timeouts, so a stopped S3 server shows as an error within seconds.
S3_TIMEOUTS = {
    "config_kwargs": {"connect_timeout": 1, "read_timeout": 2, "retries": {"max_attempts": 1}}
}
EXEC_TIMEOUT = 120
# S3 clients that give up within seconds when the server is gone, not after minutes
S3_TIMEOUTS = {
    "config_kwargs": {"connect_timeout": 1, "read_timeout": 2, "retries": {"max_attempts": 1}}
}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


# Two closures over one cell, for the tests that check they still share it after a restore
SHARED_COUNTER = """
def make_counter():
    n = 0
    def inc():
        nonlocal n
        n += 1
        return n
    def get():
        return n
    return inc, get
inc, get = make_counter()
"""


class KernelError(AssertionError):
    """A cell raised in the kernel; the message carries the kernel's traceback."""


@dataclass
class Paths:
    """Where one test module keeps its store, secret and kernel working directories, and
    how its store is encrypted (``ImageStore.encryption``)."""

    root: Path
    encryption: str = "none"

    @property
    def store(self) -> Path:
        return self.root / "store"

    @property
    def secret(self) -> Path:
        return self.root / "keys" / "secret"

    def open_store(self) -> ImageStore:
        """The kernels' store, opened in the test process."""
        return ImageStore(
            url=str(self.store), secret_file=str(self.secret), encryption=self.encryption
        )

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "JUPYTER_CKPT_STORE": str(self.store),
            "JUPYTER_CKPT_SECRET_FILE": str(self.secret),
            "JUPYTER_CKPT_ENCRYPTION": self.encryption,
            "IPYTHONDIR": str(self.root / "ipython"),
            # as the server starts its kernels: a restore keeps string hashing (sets' order)
            **hash_seed_env(Signer(str(self.secret)).derive),
            # so kernels can import the test stand-ins (fake_devices)
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(TESTS_DIR), os.environ.get("PYTHONPATH")) if p
            ),
        }


class S3Paths(Paths):
    """Kernels whose store is on S3, configured through the environment only; ``options``
    go to fsspec too (timeouts, retries)."""

    def __init__(self, root: Path, endpoint: str, options: dict[str, Any] | None = None) -> None:
        super().__init__(root)
        self.endpoint = endpoint
        self.options = options or {}

    @property
    def url(self) -> str:
        return f"s3://{BUCKET}/{self.root.name}"

    def env(self) -> dict[str, str]:
        return {
            **super().env(),
            "JUPYTER_CKPT_STORE": self.url,
            "FSSPEC_S3": json.dumps({"endpoint_url": self.endpoint, **CREDENTIALS, **self.options}),
        }

    def open_store(self) -> ImageStore:
        """The kernels' store, opened in the test process."""
        return ImageStore(
            url=self.url,
            secret_file=str(self.secret),
            # listings as they are now: the tests watch the store change
            storage_options={
                "endpoint_url": self.endpoint,
                **CREDENTIALS,
                "use_listings_cache": False,
            },
        )


def s3_store(endpoint: str, directory: Path, user: str, secret: str, **options: Any) -> ImageStore:
    """``user``'s part of a store on the S3 server, named for ``directory``, opened with the
    secret file ``directory/secret``; listings as they are now."""
    return ImageStore(
        url=f"s3://{BUCKET}/{directory.name}",
        user=user,
        secret_file=str(directory / secret),
        storage_options={"endpoint_url": endpoint, **CREDENTIALS, "use_listings_cache": False},
        **options,
    )


class MotoServer:
    """moto's S3 server on a free loopback port, with one bucket."""

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
        try:
            wait_for(self._answers, 60, "the S3 server to answer")
        except AssertionError:
            self.process.kill()
            raise
        import s3fs

        s3fs.S3FileSystem(endpoint_url=self.url, **CREDENTIALS).mkdir(BUCKET)

    def _answers(self) -> bool:
        assert self.process.poll() is None, f"moto server exited with {self.process.returncode}"
        try:
            urllib.request.urlopen(self.url, timeout=1).close()
        except OSError:
            return False
        return True

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


class Outage:
    """A TCP forwarder in front of a server: ``stop`` resets every connection and every
    new one, as a crashed server's host would, and ``start`` forwards again, to the server
    with its data as it was. The port stays bound throughout, so that nothing else (a
    kernel picking ports) can take it while the server is "down"."""

    def __init__(self, target: str) -> None:
        self.target = target.removeprefix("http://").split(":")
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.streams: set[asyncio.StreamWriter] = set()
        self.down = False
        # seconds each piece of a request waits before it is passed on (a slow store)
        self.latency = 0.0

        async def listen() -> asyncio.Server:
            return await asyncio.start_server(self._forward, "127.0.0.1", 0)

        self.server = self._call(listen())
        self.port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def start(self) -> None:
        self.down = False

    def stop(self) -> None:
        async def reset() -> None:
            self.down = True
            for stream in self.streams:
                stream.transport.abort()
            self.streams.clear()

        self._call(reset())

    def close(self) -> None:
        self.stop()

        async def close() -> None:
            self.server.close()

        self._call(close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.down:
            writer.transport.abort()
            return
        host, port = self.target
        try:
            up_reader, up_writer = await asyncio.open_connection(host, int(port))
        except OSError:
            writer.transport.abort()
            return
        self.streams |= {writer, up_writer}

        async def pipe(
            src: asyncio.StreamReader, dst: asyncio.StreamWriter, slow: bool = False
        ) -> None:
            try:
                while data := await src.read(1 << 16):
                    if slow and self.latency:
                        await asyncio.sleep(self.latency)
                    dst.write(data)
                    await dst.drain()
            except OSError:
                pass
            finally:
                dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer, slow=True), pipe(up_reader, writer))


# how many kernels a test's Kernel starts at most when one dies before it answers
KERNEL_START_ATTEMPTS = 3


class Kernel:
    """A running ipykernel and a blocking client to talk to it."""

    def __init__(self, paths: Paths, cwd: Path | None = None) -> None:
        self.paths = paths
        workdir = cwd or paths.root / "cwd"
        workdir.mkdir(parents=True, exist_ok=True)
        self.manager: KernelManager
        for attempt in range(KERNEL_START_ATTEMPTS):
            try:
                self.manager, self.client = start_new_kernel(
                    kernel_name="python3",
                    env=paths.env(),
                    cwd=str(workdir),
                    startup_timeout=scaled(EXEC_TIMEOUT),
                )
                break
            except RuntimeError:
                # jupyter_client picks free ports and the kernel binds them later: under
                # parallel tests another process (an S3 server, a kernel) may take one
                # between the two, and the kernel exits with "Address already in use"
                if attempt + 1 == KERNEL_START_ATTEMPTS:
                    raise
        self.last_execution_count: int | None = None

    def run(self, code: str, timeout: float = EXEC_TIMEOUT) -> str:
        """Execute a cell; return its stdout (and result text). Raise with the traceback."""
        out: list[str] = []
        error: list[str] = []

        def hook(msg: dict[str, Any]) -> None:
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream" and content["name"] == "stdout":
                out.append(content["text"])
            elif kind == "execute_result":
                out.append(content["data"].get("text/plain", "") + "\n")
            elif kind == "error":
                error.append(_ANSI.sub("", "\n".join(content["traceback"])))

        reply = self.client.execute_interactive(code, output_hook=hook, timeout=scaled(timeout))
        self.last_execution_count = reply["content"].get("execution_count")
        if reply["content"]["status"] != "ok":
            raise KernelError(f"cell failed:\n{code}\n--- traceback ---\n" + "\n".join(error))
        return "".join(out)

    def eval(self, expr: str) -> Any:
        """The JSON value of an expression in the kernel (non-JSON values become repr)."""
        return json.loads(self.run(f"print(__import__('json').dumps({expr}, default=repr))"))

    def falsy(self, *conditions: str) -> list[str]:
        """The expressions that are not true in the kernel."""
        listing = ", ".join(f"bool({c})" for c in conditions)
        results = self.eval(f"[{listing}]")
        return [c for c, ok in zip(conditions, results, strict=True) if not ok]

    def check(self, *conditions: str) -> None:
        """Assert that each expression is true in the kernel, naming the ones that are not."""
        failed = self.falsy(*conditions)
        assert not failed, f"false in the kernel: {failed}"

    @property
    def pid(self) -> int:
        return self.manager.provisioner.process.pid  # type: ignore[union-attr]

    def ckpt(self, line: str) -> str:
        return self.run(f"%ckpt {line}")

    def shutdown(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


# The names (no dunders) a cell bound or rebound, given the ids of the globals before it.
# IPython's own names (its caches of the cells: _i3, _3, _) are those it hides, and these
_IPYTHON_UNHIDDEN = ("_exit_code",)
_CHANGED = (
    "sorted(k for k, v in globals().items() if {!r}.get(k) != id(v)"
    " and not (k.startswith('__') and k.endswith('__'))"
    " and not (k in get_ipython().user_ns_hidden and get_ipython().user_ns_hidden[k] is v)"
    f" and k not in {_IPYTHON_UNHIDDEN!r})"
)


def restore_and_list(kernel: Kernel, ref: str) -> tuple[str, set[str]]:
    """`%ckpt restore ref`; return its output and the names the restore bound or rebound,
    seen from the kernel's globals, not from what jupyter_ckpt reports."""
    before = kernel.eval("{k: id(v) for k, v in globals().items()}")
    out = kernel.ckpt(f"restore {ref}")
    changed = set(kernel.eval(_CHANGED.format(before)))
    return out, changed


def save_namespace(
    store: ImageStore, namespace: dict[str, Any], name: str = "test"
) -> dict[str, Any]:
    """Capture every variable of ``namespace`` (as a kernel would); return the manifest.
    The manifest must account for every variable, each one saved or imported."""
    manifest = image.capture(dict(namespace), namespace, store.writer(), name=name)
    statuses = {v["name"]: v["status"] for v in manifest["variables"]}
    assert statuses.keys() == namespace.keys(), "the manifest's variables are not the namespace's"
    assert image_names(manifest) == set(namespace), f"not all saved: {statuses}"
    return manifest


# Nodes the tests play, described as jupyter_ckpt.compat.node_facts reads them from a file.
NODES: dict[str, dict[str, Any]] = {
    "h100": {
        "available": True,
        "driver": "550.54.15",
        "cuda": "12.4",
        "torch_cuda": "12.1",
        "gpus": [
            {
                "index": 0,
                "name": "NVIDIA H100 80GB HBM3",
                "compute_capability": "9.0",
                "memory_total": 85_520_809_984,
                "memory_used": 0,
            }
        ],
    },
    "a10": {
        "available": True,
        "driver": "535.104.05",
        "cuda": "12.2",
        "torch_cuda": "12.1",
        "gpus": [
            {
                "index": 0,
                "name": "NVIDIA A10",
                "compute_capability": "8.6",
                "memory_total": 23_609_475_072,
                "memory_used": 0,
            }
        ],
    },
    "cpu": {"available": False, "reason": "no GPU on this node", "gpus": []},
}


def node_file(directory: Path, node: str, **changes: Any) -> Path:
    """A node facts file for ``NODES[node]``, with ``changes`` to its top-level facts."""
    path = directory / f"{node}-{len(list(directory.glob(f'{node}-*.json')))}.json"
    path.write_text(json.dumps({**NODES[node], **changes}))
    return path


def save_on_node(
    store: ImageStore, facts: Path, gpu_bytes: int = 0, name: str = "test"
) -> dict[str, Any]:
    """An image saved in this process as on the node ``facts`` describes; with
    ``gpu_bytes``, it holds a tensor of that many bytes on cuda:0 (tests/fake_devices)."""
    import fake_devices
    import torch

    from jupyter_ckpt.image import devices

    saved_ops, saved_facts = devices.device_ops, os.environ.get(NODE_FACTS_ENV)
    os.environ[NODE_FACTS_ENV] = str(facts)
    try:
        namespace: dict[str, Any] = {"step": 1}
        if gpu_bytes:
            weights = namespace["weights"] = torch.zeros(gpu_bytes, dtype=torch.uint8)
            fake_devices.install(gpus=1).pretend(weights, "cuda:0")
        return save_namespace(store, namespace, name)
    finally:
        devices.device_ops = saved_ops
        if saved_facts is None:
            del os.environ[NODE_FACTS_ENV]
        else:
            os.environ[NODE_FACTS_ENV] = saved_facts


def image_names(manifest: dict[str, Any]) -> set[str]:
    """The names an image says it holds: its saved and imported variables."""
    return {v["name"] for v in manifest["variables"] if v["status"] in ("saved", "imported")}


def assert_complete(manifest: dict[str, Any], restored: set[str] | list[str]) -> None:
    """What came back is exactly what the image says it holds, no name more or less."""
    held = image_names(manifest)
    assert set(restored) == held, (
        f"missing: {sorted(held - set(restored))}, extra: {sorted(set(restored) - held)}"
    )


def load_namespace(store: ImageStore, ref: str) -> dict[str, Any]:
    """Restore an image into a fresh namespace; every variable must come back."""
    manifest = store.open(ref)
    namespace: dict[str, Any] = {}
    report = image.restore(manifest, store.read_segments(manifest), namespace)
    assert report.missing == {}
    assert_complete(manifest, report.restored)
    assert_complete(manifest, namespace)
    return namespace


def plaintext_in(files: dict[str, bytes], known: dict[str, bytes]) -> dict[str, list[str]]:
    """Which of the ``known`` plaintexts (label -> bytes) each raw file shows, as someone
    with the store's files but not the key would search them; only files with a hit."""
    found = {name: [k for k, text in known.items() if text in data] for name, data in files.items()}
    return {name: hits for name, hits in found.items() if hits}


class _Payload:
    """Unpickling this creates ``marker``: the stand-in for arbitrary code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return open, (str(self.marker), "w")


def payload(marker: Path) -> bytes:
    """A pickle that creates ``marker`` when loaded: what a crafted image would carry."""
    return pickle.dumps(_Payload(marker), protocol=5)


def write_foreign_image(
    store: ImageStore, marker: Path, secret_name: str, pad_to: int | None = None, **options: Any
) -> tuple[ImageStore, str]:
    """A well-formed image in ``store``'s place whose ``value`` is the payload, written
    under another secret (and ``options``, e.g. encryption); its one chunk is ``pad_to``
    bytes if given, to stand in for one of ours. The store that wrote it, and its id."""
    other = ImageStore(
        url=store.root_url,
        user=store.user,
        secret_file=str(marker.parent / secret_name),
        **options,
    )
    writer = other.writer()
    evil = payload(marker)
    segment = writer.add_segment(evil.ljust(pad_to or len(evil), b"\0"))
    manifest = commit_groups(writer, "foreign", [(["value"], segment, len(evil))])
    return other, manifest["id"]


def commit_groups(
    writer: ImageWriter, name: str, groups: list[tuple[list[str], int, int]]
) -> dict[str, Any]:
    """Commit an image of the earlier format, one pickle of its variables per group:
    ``(names, segment, length)`` each, the pickle at the start of its segment. Its manifest."""
    return writer.commit(
        {
            "name": name,
            "created": "2026-01-01T00:00:00.000+00:00",
            "variables": [
                {"name": n, "type": "object", "status": "saved"} for g in groups for n in g[0]
            ],
            "imports": [],
            "groups": [
                {"names": names, "pickle": [segment, 0, length], "buffers": []}
                for names, segment, length in groups
            ],
        }
    )


def write_groups(store: ImageStore, groups: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """An image of the earlier format holding ``groups`` of variables, each group pickled
    whole into a segment of its own (a restore reads them one after the other)."""
    writer = store.writer()
    layout = []
    for group in groups:
        values = tuple(group.values())
        data = pickle.dumps(values if len(values) > 1 else values[0])
        layout.append((list(group), writer.add_segment(data), len(data)))
    return commit_groups(writer, name, layout)


def group_of(manifest: dict[str, Any], name: str) -> dict[str, Any]:
    """The group of an image that holds variable ``name``."""
    return next(g for g in manifest["groups"] if name in g["names"])


def chunk_files(manifest: dict[str, Any]) -> set[str]:
    """The store paths of an image's chunks."""
    return {chunk_path(d) for s in manifest["segments"] for d, _ in s["chunks"]}


@contextmanager
def tmpfs(directory: Path, size: str) -> Iterator[Path]:
    """A small tmpfs mounted on ``directory``, for stores that run out of space (needs root:
    a test that cannot mount one is skipped, which the suite counts as a failure)."""
    import pytest

    # private, as the store makes its directories (a tmpfs root is world-writable)
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(directory)]
    if subprocess.run(mount, capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=True)


@contextmanager
def read_only(directory: Path) -> Iterator[Path]:
    """Every write under ``directory`` fails for a while, as on a disk gone read-only or a
    store mount lost: a read-only bind mount for root (whom permission bits do not stop;
    a test that cannot mount one is skipped, which the suite counts as a failure), the
    permission bits of each directory otherwise."""
    import pytest

    if os.geteuid() != 0:
        modes = {d: d.stat().st_mode for d in [directory, *directory.rglob("*")] if d.is_dir()}
        for path in modes:
            path.chmod(0o500)
        try:
            yield directory
        finally:
            for path, mode in modes.items():
                path.chmod(mode)
        return
    for command in (["mount", "--bind"], ["mount", "-o", "remount,ro,bind"]):
        mounted = subprocess.run([*command, str(directory), str(directory)], capture_output=True)
        if mounted.returncode:
            subprocess.run(["umount", "-l", str(directory)], capture_output=True)
            pytest.skip("a read-only bind mount needs root with CAP_SYS_ADMIN")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=True)


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``timeout`` seconds
    (on an idle machine: see :mod:`deadlines`)."""
    deadline = time.monotonic() + scaled(timeout)
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


class CountingBackend:
    """A store backend that records every call made to it as (method, path): on an object
    store each call is at least one request, so tests can bound requests without timing."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[tuple[str, str]] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, str(args[0]) if args else ""))
            return attr(*args, **kwargs)

        return counted

    def count(self, method: str, suffix: str = "") -> int:
        return sum(m == method and p.endswith(suffix) for m, p in self.calls)


def counting(store: ImageStore) -> CountingBackend:
    """Route all of ``store``'s reads and writes through a fresh :class:`CountingBackend`."""
    backend = CountingBackend(store.backend)
    store.backend = store._index.backend = backend
    return backend
