"""Any interleaving of a kernel's lifecycle events keeps its state: a stateful property test.

Hypothesis drives a real `jupyter server` process (SIGKILLed, stopped and started again on
the same store), real ipykernel kernels and the real store through public surfaces only:
the kernels, sessions and ckpt REST APIs, kernel websockets, signals to the server, and
faults of the store (an outage window, a record write that fails, a store slow to answer),
and the overlaps where paths meet: a cell on a new socket during a suspend's commit, an
outage during a restore followed by a suspend of the empty kernel and retention, a slow
record put during a shutdown or a stop. The test models each
kernel's variables; after every step a fresh :class:`ImageStore` reads the store as a new
server would and checks the lifecycle's invariant:

- every kernel that holds state and was not shut down by the user has a record, and the
  record names an image as new as the kernel's newest committed image (one a checkpoint or
  suspend answered with, or one a record named), whose variables are ones the kernel had;
- no record names a missing image, and no kernel's newest committed image is removed;
- only the user's shutdown drops a kernel's record;
- ``GET /api/kernels`` lists each kernel once, with the state the model expects.

Profiles (``JUPYTER_CKPT_STATEFUL_PROFILE``): ``ci`` (the default) runs examples of 6
steps, 3 on the local store and 2 on S3, without shrinking, so that both fit a CI budget;
``long`` runs 300 examples of 12 steps and shrinks a failure to a minimal one (hours on
2 cores; ``JUPYTER_CKPT_STATEFUL_EXAMPLES=N`` sets another number of examples)::

    JUPYTER_CKPT_STATEFUL_PROFILE=long pytest --timeout=0 -s -n 0 \\
        tests/server/test_server_lifecycle_stateful.py

Every run prints its seed; ``JUPYTER_CKPT_STATEFUL_SEED=<seed>`` replays it, and a failure
prints the ``@reproduce_failure`` blob of its example.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from harness import S3_TIMEOUTS, MotoServer, Outage, Paths, S3Paths, load_namespace, read_only
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis import strategies as st
from hypothesis.errors import StopTest
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from jupyter_client.session import Session
from server_helpers import ServerProcess, poll
from tornado.httpclient import HTTPClientError

from jupyter_ckpt.errors import ImageNotFound
from jupyter_ckpt.store import ImageStore

PROFILE_ENV = "JUPYTER_CKPT_STATEFUL_PROFILE"
SEED_ENV = "JUPYTER_CKPT_STATEFUL_SEED"
EXAMPLES_ENV = "JUPYTER_CKPT_STATEFUL_EXAMPLES"
_COMMON = {
    "deadline": None,
    "print_blob": True,
    "database": None,
    "suppress_health_check": list(HealthCheck),
}
settings.register_profile(
    "ci",
    max_examples=3,
    stateful_step_count=6,
    phases=(Phase.explicit, Phase.generate),
    **_COMMON,
)
settings.register_profile("long", max_examples=300, stateful_step_count=12, **_COMMON)

# Autosave soon after a cell, so that a step can wait for it; no idle suspends: the test
# suspends by itself. A restore waits for a store that is down this long (the outage
# rules keep it down longer, so that the restore fails).
RESTORE_PATIENCE = 15
POLICY = {
    "autosave_interval": 2,
    "autosave_idle": 0.5,
    "check_interval": 0.5,
    "checkpoint_timeout": RESTORE_PATIENCE,
}
MAX_KERNELS = 2  # kernels are slow to start on a small machine
NAMES = ("a", "b", "c")
NAMESPACE = re.compile(r"^NS=(\{.*\})$", re.MULTILINE)
T = TypeVar("T")


@dataclass
class KernelModel:
    """What the test expects of one kernel."""

    id: str
    namespace: dict[str, int] = field(default_factory=dict)
    # every namespace the kernel had, oldest first: an image must hold one of them
    history: list[dict[str, int]] = field(default_factory=lambda: [{}])
    suspended: bool = False
    stateful: bool = False  # ran a cell or came from an image: it has state to keep
    committed: dict[str, str] = field(default_factory=dict)  # image id -> created

    def set(self, namespace: dict[str, int]) -> None:
        self.namespace = dict(namespace)
        if namespace not in self.history:
            self.history.append(dict(namespace))

    def newest(self) -> tuple[str, str] | None:
        """(created, image id) of its newest committed image."""
        return max(((c, i) for i, c in self.committed.items()), default=None)


class Store:
    """Where one example's server keeps its store, and how to break it for a while."""

    def __init__(self, paths: Paths, outage: Outage | None = None) -> None:
        self.paths = paths
        self.outage = outage

    def fresh(self) -> ImageStore:
        """The store as a new server opens it (never the checker's earlier instance)."""
        return self.paths.open_store()

    @contextmanager
    def down(self) -> Iterator[None]:
        """The store is unreachable (S3) or refuses writes (a local disk) for a while."""
        if self.outage is None:
            self.paths.store.mkdir(parents=True, exist_ok=True)
            with read_only(self.paths.store):
                yield
            return
        self.outage.stop()
        try:
            yield
        finally:
            self.outage.start()

    def records_dir(self) -> Path:
        store = self.fresh()
        try:
            return Path(store.backend.url) / "kernels"
        finally:
            store.close()


class Rig:
    """A server on its own store, with the event loop that talks to it."""

    def __init__(self, tmp: Path, moto: MotoServer | None) -> None:
        self.loop = asyncio.new_event_loop()
        self.outage = Outage(moto.url) if moto else None
        if moto and self.outage:
            self.store = Store(S3Paths(tmp, moto.url), self.outage)
            env = S3Paths(tmp, self.outage.url, S3_TIMEOUTS).env()
        else:
            self.store = Store(Paths(tmp))
            env = self.store.paths.env()
        self.server = ServerProcess(tmp, POLICY, env)

    def close(self) -> None:
        try:
            if self.server.process is not None and self.server.process.poll() is None:
                self.server.crash()
        finally:
            if self.outage is not None:
                self.outage.close()
            self.loop.close()


class Rigs:
    """The rigs of one test run: an example that passes hands its running server on to
    the next (servers are slow to start); a failing one's is thrown away, so that a
    replay of the failure starts as it did."""

    def __init__(self, tmp_path: Path, moto: MotoServer | None) -> None:
        self.tmp_path = tmp_path
        self.moto = moto
        self.made = 0
        self.kept: Rig | None = None

    def take(self) -> Rig:
        if self.kept is not None:
            rig, self.kept = self.kept, None
            return rig
        self.made += 1
        directory = self.tmp_path / f"server-{self.made}"
        directory.mkdir()
        return Rig(directory, self.moto)

    def close(self) -> None:
        if self.kept is not None:
            self.kept.close()


class Lifecycle(RuleBasedStateMachine):
    """One server on one store; rules are the events of a kernel's lifecycle."""

    rigs: Rigs  # set by the test

    def __init__(self) -> None:
        super().__init__()
        self.rig = self.rigs.take()
        self.loop, self.server, self.store = self.rig.loop, self.rig.server, self.rig.store
        self.outage = self.rig.outage
        self.kernels: dict[str, KernelModel] = {}
        self.gone: set[str] = set()  # shut down by the user: no record may remain
        self.images: dict[str, dict[str, int]] = {}  # image id -> the variables it holds
        self.counter = 0
        self.notebooks = 0

    def run(self, coro: Awaitable[T]) -> T:
        return self.loop.run_until_complete(coro)

    # -- helpers -------------------------------------------------------------------------

    def next_value(self) -> int:
        self.counter += 1
        return self.counter

    @staticmethod
    def choose(data: st.DataObject, items: list[Any]) -> Any:
        """One of ``items`` (None if there is none), drawn the same way however many there
        are, in the order the run made them: what the server did by itself (an autosave
        made an image, or not yet) must not change the shape of the draws, or Hypothesis
        finds its replays inconsistent (FlakyStrategyDefinition)."""
        index = data.draw(st.integers(0, 63))
        return items[index % len(items)] if items else None

    def pick(self, data: st.DataObject, which: Callable[[KernelModel], bool]) -> KernelModel:
        kernel = self.choose(data, [k for k in self.kernels.values() if which(k)])
        assert kernel is not None, "a precondition let a rule run without its kernel"
        return kernel

    def any_kernel(self, which: Callable[[KernelModel], bool]) -> bool:
        return any(which(k) for k in self.kernels.values())

    async def new_session(self) -> KernelModel:
        self.notebooks += 1
        path = f"nb{self.notebooks}.ipynb"
        body = {"path": path, "name": path, "type": "notebook", "kernel": {"name": "python3"}}
        model = await self.server.fetch("POST", "sessions", body)
        kernel = self.kernels[model["kernel"]["id"]] = KernelModel(model["kernel"]["id"])
        return kernel

    @staticmethod
    def code(values: dict[str, int]) -> str:
        """A cell that sets ``values`` and prints the namespace the test models."""
        assign = "".join(f"{k} = {v}\n" for k, v in values.items())
        listing = f"{{k: globals()[k] for k in {NAMES!r} if k in globals()}}"
        return f"{assign}print('NS=' + __import__('json').dumps({listing}))"

    @staticmethod
    def shown(text: str) -> dict[str, int]:
        found = NAMESPACE.findall(text)
        assert found, f"the cell printed no namespace: {text!r}"
        return json.loads(found[-1])

    async def run_cell(self, kernel: KernelModel, values: dict[str, int]) -> None:
        """Run a cell; the kernel must show the modelled variables (restored, if it was
        suspended) plus the cell's own."""
        text = await self.server.run_cell(kernel.id, self.code(values))
        expected = {**kernel.namespace, **values}
        assert self.shown(text) == expected, (
            f"kernel {kernel.id} has other variables than expected (was "
            f"{'suspended' if kernel.suspended else 'running'}): {text!r}, expected {expected}"
        )
        kernel.set(expected)
        kernel.suspended = False
        kernel.stateful = True

    def committed(self, kernel: KernelModel, summary: dict[str, Any]) -> None:
        """A checkpoint or suspend answered with this image: it holds the namespace now."""
        self.images[summary["id"]] = dict(kernel.namespace)
        store = self.store.fresh()
        try:
            kernel.committed[summary["id"]] = store.load_manifest(summary["id"])["created"]
        finally:
            store.close()

    def record_of(self, store: ImageStore, kernel_id: str) -> dict[str, Any] | None:
        try:
            return store.records.get(kernel_id)
        except ImageNotFound:
            return None

    def variables_of(self, store: ImageStore, image_id: str) -> dict[str, int]:
        if image_id not in self.images:
            namespace = load_namespace(store, image_id)
            self.images[image_id] = {k: namespace[k] for k in NAMES if k in namespace}
        return self.images[image_id]

    async def restarted_server(self) -> None:
        """After a stop or a crash: the model takes each kernel's state from its record
        (checked by the invariant before the stop), and forgets kernels without one."""
        await self.server.start()
        store = self.store.fresh()
        try:
            for kernel in list(self.kernels.values()):
                record = self.record_of(store, kernel.id)
                if record is None:
                    lost = kernel.stateful and kernel.newest() is not None
                    assert not lost, f"kernel {kernel.id} lost its record"
                    del self.kernels[kernel.id]
                    continue
                kernel.set(self.variables_of(store, record["image_id"]))
                kernel.suspended = True
        finally:
            store.close()

    def wait_autosaved(self, kernel: KernelModel) -> None:
        """Wait until the kernel's running record names an image of its variables now."""

        def autosaved() -> bool:
            store = self.store.fresh()
            try:
                record = self.record_of(store, kernel.id)
                if record is None or record.get("state") != "running":
                    return False
                try:
                    return self.variables_of(store, record["image_id"]) == kernel.namespace
                except ImageNotFound:
                    return False
            finally:
                store.close()

        self.run(poll(autosaved, timeout=60, what=f"an autosave of kernel {kernel.id}"))

    # -- rules ---------------------------------------------------------------------------

    @initialize()
    def start_server(self) -> None:
        if self.server.process is None or self.server.process.poll() is not None:
            self.run(self.server.start())

    @precondition(lambda self: len(self.kernels) < MAX_KERNELS)
    @rule()
    def start_kernel(self) -> None:
        self.run(self.new_session())

    @precondition(lambda self: self.kernels)
    @rule(data=st.data(), values=st.dictionaries(st.sampled_from(NAMES), st.just(0), max_size=2))
    def cell(self, data: st.DataObject, values: dict[str, int]) -> None:
        """A cell sets some variables (none: it only reads them), on any kernel: one
        suspended restores on it."""
        kernel = self.pick(data, lambda k: True)
        self.run(self.run_cell(kernel, {k: self.next_value() for k in values}))

    @precondition(lambda self: self.any_kernel(lambda k: not k.suspended))
    @rule(data=st.data())
    def checkpoint(self, data: st.DataObject) -> None:
        kernel = self.pick(data, lambda k: not k.suspended)
        summary = self.run(self.server.fetch("POST", f"ckpt/kernels/{kernel.id}/checkpoint", {}))
        self.committed(kernel, summary)

    @precondition(lambda self: self.any_kernel(lambda k: k.stateful and not k.suspended))
    @rule(data=st.data())
    def suspend(self, data: st.DataObject) -> None:
        kernel = self.pick(data, lambda k: k.stateful and not k.suspended)
        summary = self.run(self.server.fetch("POST", f"ckpt/kernels/{kernel.id}/suspend", {}))
        self.committed(kernel, summary)
        kernel.suspended = True

    @precondition(lambda self: self.any_kernel(lambda k: k.suspended))
    @rule(data=st.data())
    def websocket_dropped_mid_restore(self, data: st.DataObject) -> None:
        """The first cell wakes a suspended kernel and the socket drops while it restores;
        JupyterLab reconnects with the same session and must get the cell's reply."""
        kernel = self.pick(data, lambda k: k.suspended)
        values = {"a": self.next_value()}

        async def drop_and_reconnect() -> None:
            session = Session()
            client = await self.server.connect(kernel.id, session)
            msg_id = client.send("execute_request", {"code": self.code(values), "silent": False})
            client.close()
            client = await self.server.connect(kernel.id, Session(session=session.session))
            try:
                await client.reply_to(msg_id, timeout=90)
            finally:
                client.close()

        try:
            self.run(drop_and_reconnect())
        except (TimeoutError, asyncio.TimeoutError) as exc:
            raise AssertionError(
                f"a cell sent to suspended kernel {kernel.id} got no reply after its "
                "websocket dropped during the restore and the same session reconnected"
            ) from exc
        kernel.namespace = {**kernel.namespace, **values}
        self.run(self.run_cell(kernel, {}))  # the cell ran on the restored variables

    @precondition(lambda self: self.any_kernel(lambda k: k.stateful and not k.suspended))
    @rule(data=st.data())
    def autosave_tick(self, data: st.DataObject) -> None:
        """An idle running kernel's state reaches the store by itself, within a deadline."""
        self.wait_autosaved(self.pick(data, lambda k: k.stateful and not k.suspended))

    @precondition(lambda self: self.kernels)
    @rule(data=st.data())
    def interrupt(self, data: st.DataObject) -> None:
        kernel = self.pick(data, lambda k: True)
        self.run(self.server.fetch("POST", f"kernels/{kernel.id}/interrupt", {}))

    @precondition(lambda self: self.any_kernel(lambda k: not k.suspended))
    @rule(data=st.data())
    def restart(self, data: st.DataObject) -> None:
        """The user restarts a running kernel: its variables are gone, by request."""
        kernel = self.pick(data, lambda k: not k.suspended)
        self.run(self.server.fetch("POST", f"kernels/{kernel.id}/restart", {}))
        self.run(self.server.wait_idle(kernel.id))
        kernel.set({})
        # a fresh kernel: its images are saved images now, which no record has to name
        kernel.stateful = False
        kernel.committed.clear()

    @precondition(lambda self: self.kernels)
    @rule(data=st.data())
    def shutdown(self, data: st.DataObject) -> None:
        self.shut_down(self.pick(data, lambda k: True))

    def shut_down(self, kernel: KernelModel) -> None:
        """The user shuts a kernel down: the only event that may drop its record."""
        self.run(self.server.fetch("DELETE", f"kernels/{kernel.id}"))
        del self.kernels[kernel.id]
        self.gone.add(kernel.id)

    def known_images(self) -> list[str]:
        store = self.store.fresh()
        try:
            stored = set(store.image_ids())
            return [i for i in self.images if i in stored]
        finally:
            store.close()

    @precondition(lambda self: len(self.kernels) < MAX_KERNELS)
    @rule(data=st.data(), into_notebook=st.booleans())
    def resume(self, data: st.DataObject, into_notebook: bool) -> None:
        """Resume an image into a new kernel: of a new notebook, or of a console."""
        image_id = self.choose(data, self.known_images())
        if image_id is None:
            return
        body: dict[str, Any] = {}
        if into_notebook:
            self.notebooks += 1
            body["path"] = f"nb{self.notebooks}.ipynb"
        answer = self.run(self.server.fetch("POST", f"ckpt/images/{image_id}/resume", body))
        kernel = self.kernels[answer["kernel"]["id"]] = KernelModel(answer["kernel"]["id"])
        kernel.set(self.images[image_id])
        kernel.stateful = True

    @rule(data=st.data())
    def delete_image(self, data: st.DataObject) -> None:
        """The user deletes an image; the server refuses one a kernel needs. A running
        kernel's checkpoint may go (its state is live; its record goes back to the one
        before): by the user's request, it is no longer an image the kernel must keep."""
        image_id = self.choose(data, self.known_images())
        if image_id is None:
            return
        try:
            self.run(self.server.fetch("DELETE", f"ckpt/images/{image_id}"))
        except HTTPClientError as exc:
            assert exc.code == 409, f"deleting image {image_id}: {exc}"
            return
        for kernel in self.kernels.values():
            kernel.committed.pop(image_id, None)

    @precondition(lambda self: self.kernels)
    @rule()
    def suspend_all(self) -> None:
        answer = self.run(self.server.fetch("POST", "ckpt/suspend-all", {}))
        assert not answer["failed"], f"suspend-all failed on idle kernels: {answer}"
        for kernel_id in answer["suspended"]:
            self.kernels[kernel_id].suspended = True

    @precondition(lambda self: self.any_kernel(lambda k: k.stateful))
    @rule()
    def orderly_restart(self) -> None:
        """SIGTERM: the server suspends every kernel with variables, and the next one
        lists them; nothing a kernel held is lost."""
        expected = {k.id: dict(k.namespace) for k in self.kernels.values() if k.namespace}
        self.server.terminate()
        self.run(self.restarted_server())
        lost = {
            i: (expected[i], k.namespace)
            for i, k in self.kernels.items()
            if i in expected and k.namespace != expected[i]
        }
        missing = set(expected) - set(self.kernels)
        assert not lost and not missing, (
            f"an orderly stop lost state: kernels {sorted(missing)} are gone, "
            f"and these came back with other variables (expected, got): {lost}"
        )

    @precondition(lambda self: self.any_kernel(lambda k: k.stateful))
    @rule()
    def crash_and_new_server(self) -> None:
        """SIGKILL the server and its kernels; a new server on the store brings them back
        from their records."""
        self.server.crash()
        self.run(self.restarted_server())

    @precondition(lambda self: self.any_kernel(lambda k: k.stateful and not k.suspended))
    @rule(data=st.data())
    def store_outage(self, data: st.DataObject) -> None:
        """While the store is down a cell runs and a suspend fails: the kernel keeps
        running with its variables, and the cell's state reaches the store once it is
        back."""
        kernel = self.pick(data, lambda k: k.stateful and not k.suspended)
        with self.store.down():
            self.run(self.run_cell(kernel, {"b": self.next_value()}))
            with pytest.raises(HTTPClientError):
                self.run(self.server.fetch("POST", f"ckpt/kernels/{kernel.id}/suspend", {}))
        self.run(self.run_cell(kernel, {}))  # still running, with every variable
        self.wait_autosaved(kernel)

    @precondition(
        lambda self: (
            self.outage is None and self.any_kernel(lambda k: k.stateful and not k.suspended)
        )
    )
    @rule(data=st.data())
    def failed_record_write(self, data: st.DataObject) -> None:
        """The image is written but its record is not (a full disk, a 5xx): the suspend
        fails, the kernel keeps running, no record names an image that is gone, and the
        kernel's state reaches the store once records can be written again."""
        kernel = self.pick(data, lambda k: k.stateful and not k.suspended)
        records = self.store.records_dir()
        records.mkdir(parents=True, exist_ok=True)
        with read_only(records):
            self.run(self.run_cell(kernel, {"c": self.next_value()}))
            with pytest.raises(HTTPClientError):
                self.run(self.server.fetch("POST", f"ckpt/kernels/{kernel.id}/suspend", {}))
        self.run(self.run_cell(kernel, {}))
        self.wait_autosaved(kernel)

    @precondition(lambda self: self.any_kernel(lambda k: k.stateful and not k.suspended))
    @rule(data=st.data(), delay=st.floats(0, 0.3))
    def cell_on_a_new_socket_during_a_suspend(self, data: st.DataObject, delay: float) -> None:
        """A suspend runs while a new socket opens and sends a cell: the suspend commits
        or aborts, and either way the cell is answered, by the process that holds the
        kernel's variables."""
        kernel = self.pick(data, lambda k: k.stateful and not k.suspended)
        values = {"c": self.next_value()}

        async def race() -> dict[str, Any] | None:
            suspend = asyncio.ensure_future(
                self.server.fetch("POST", f"ckpt/kernels/{kernel.id}/suspend", {})
            )
            await asyncio.sleep(delay)  # where in the suspend the socket comes
            client = await self.server.connect(kernel.id)
            try:
                content = {"code": self.code(values), "silent": False}
                msg_id = client.send("execute_request", content)
                reply = await client.reply_to(msg_id, timeout=120)
            finally:
                client.close()
            assert reply["content"]["status"] == "ok", reply["content"]
            try:
                return await suspend
            except HTTPClientError as exc:
                assert exc.code == 409, f"the suspend raced by a cell answered {exc}"
                return None

        try:
            summary = self.run(race())
        except (TimeoutError, asyncio.TimeoutError) as exc:
            raise AssertionError(f"a cell sent during a suspend got no reply: {exc!r}") from exc
        if summary is not None:  # its image holds the variables from before the cell
            self.committed(kernel, summary)
        kernel.namespace = {**kernel.namespace, **values}
        kernel.suspended = False
        self.run(self.run_cell(kernel, {}))  # the cell ran on the kernel's variables

    @precondition(lambda self: self.outage is not None and self.any_kernel(lambda k: k.suspended))
    @rule(data=st.data())
    def outage_during_a_restore_then_suspend_and_retention(self, data: st.DataObject) -> None:
        """The store stays down while a cell wakes a suspended kernel: the restore fails
        and the kernel runs empty. Once the store is back, the empty kernel is suspended
        (as the idle monitor, suspend-all or a stop would) and retention runs: the
        kernel's record still restores its variables, and keeps their image."""
        kernel = self.pick(data, lambda k: k.suspended)
        with self.store.down():
            text = self.run(self.server.run_cell(kernel.id, self.code({})))
        assert self.shown(text) == {}, f"the restore with the store down brought {text!r}"
        self.run(self.server.fetch("POST", f"ckpt/kernels/{kernel.id}/suspend", {}))
        store = self.store.fresh()
        try:
            store.max_images = 1
            store.enforce_retention(collect=None)
        finally:
            store.close()
        kernel.suspended = True  # on the image it had: the empty kernel is no newer state

    @precondition(
        lambda self: (
            self.outage is not None and self.any_kernel(lambda k: k.stateful and not k.suspended)
        )
    )
    @rule(data=st.data(), stop=st.booleans(), delay=st.floats(0, 3))
    def slow_store_at_a_shutdown_or_stop(
        self, data: st.DataObject, stop: bool, delay: float
    ) -> None:
        """Every request to the store takes longer (an object store's latency) when the
        user shuts a kernel down, or the server stops, maybe while an autosave's record
        is being put: nothing that put does lands after it."""
        kernel = self.pick(data, lambda k: k.stateful and not k.suspended)
        self.run(self.run_cell(kernel, {"a": self.next_value()}))  # an autosave comes due
        assert self.outage is not None
        self.outage.latency = 0.3
        try:
            self.run(asyncio.sleep(delay))  # when the user or the stop comes
            if stop:
                self.orderly_restart()
            else:
                self.shut_down(kernel)
        finally:
            self.outage.latency = 0.0

    # -- the invariant -------------------------------------------------------------------

    @invariant()
    def a_new_server_brings_back_every_kernel(self) -> None:
        store = self.store.fresh()
        try:
            self.check_store(store)
        finally:
            store.close()
        self.run(self.check_listing())

    def check_store(self, store: ImageStore) -> None:
        records, refused = store.records.all()
        assert not refused, f"records a new server would refuse: {refused}"
        images = set(store.image_ids())
        for kernel_id, record in records.items():
            assert record["image_id"] in images, (
                f"the record of kernel {kernel_id} names image {record['image_id']}, "
                "which is not in the store"
            )
        for kernel_id in self.gone:
            assert kernel_id not in records, f"kernel {kernel_id} was shut down, its record kept"
        for kernel in self.kernels.values():
            record = records.get(kernel.id)
            if record is not None:
                manifest = store.load_manifest(record["image_id"])
                kernel.committed.setdefault(record["image_id"], manifest["created"])
            newest = kernel.newest()
            if newest is None or not kernel.stateful:
                continue
            created, newest_id = newest
            assert newest_id in images, (
                f"image {newest_id}, the newest committed image of kernel {kernel.id}, was removed"
            )
            assert record is not None, (
                f"kernel {kernel.id} has committed image {newest_id} but no record: "
                "a new server would not bring it back"
            )
            assert kernel.committed[record["image_id"]] >= created, (
                f"the record of kernel {kernel.id} names image {record['image_id']}, older "
                f"than its newest committed image {newest_id}"
            )
            variables = self.variables_of(store, record["image_id"])
            assert variables in kernel.history, (
                f"the record of kernel {kernel.id} names image {record['image_id']} with "
                f"variables {variables}, never the kernel's: {kernel.history}"
            )

    async def check_listing(self) -> None:
        listed = await self.server.get("kernels")
        ids = [k["id"] for k in listed]
        assert len(ids) == len(set(ids)), f"a kernel is listed twice: {ids}"
        assert set(ids) == set(self.kernels), (
            f"GET /api/kernels lists {sorted(ids)}, the model has {sorted(self.kernels)}"
        )
        states = {k["id"]: k.get("ckpt", {}).get("state") == "suspended" for k in listed}
        expected = {i: k.suspended for i, k in self.kernels.items()}
        assert states == expected, f"suspended, as listed: {states}; as modelled: {expected}"

    def teardown(self) -> None:
        stopped = sys.exc_info()[1]
        # failed: a replay starts from a new server (StopTest only ends an example early)
        if stopped is not None and not isinstance(stopped, StopTest):
            self.rig.close()
            return
        try:  # the user shuts every kernel down; the next example gets a bare server
            for kernel in list(self.kernels.values()):
                self.shut_down(kernel)
            self.a_new_server_brings_back_every_kernel()
        except BaseException:
            self.rig.close()
            raise
        self.rigs.kept = self.rig


def run_lifecycle(tmp_path: Path, moto: MotoServer | None, examples_in_ci: int) -> None:
    """Run the machine under the profile of ``PROFILE_ENV``, printing its seed."""
    profile = os.environ.get(PROFILE_ENV, "ci")
    chosen_settings = settings.get_profile(profile)
    if profile == "ci":
        chosen_settings = settings(chosen_settings, max_examples=examples_in_ci)
    if os.environ.get(EXAMPLES_ENV):
        chosen_settings = settings(chosen_settings, max_examples=int(os.environ[EXAMPLES_ENV]))
    chosen = int(os.environ.get(SEED_ENV) or random.randrange(2**32))
    print(f"\nstateful lifecycle: profile {profile}, seed {chosen} ({SEED_ENV}={chosen})")
    rigs = Rigs(tmp_path, moto)
    machine = type("LifecycleRun", (Lifecycle,), {"rigs": rigs})
    try:
        run_state_machine_as_test(seed(chosen)(machine), settings=chosen_settings)
    finally:
        rigs.close()


def test_lifecycle_local_store(tmp_path: Path) -> None:
    run_lifecycle(tmp_path, None, examples_in_ci=3)


def test_lifecycle_s3_store(tmp_path: Path, moto: MotoServer) -> None:
    run_lifecycle(tmp_path, moto, examples_in_ci=2)
