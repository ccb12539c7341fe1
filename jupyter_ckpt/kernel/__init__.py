"""The kernel side: what `%ckpt` and the server run inside a kernel.

The server calls :func:`checkpoint`, :func:`restore` and :func:`describe` through a
silent execute and reads their JSON-able results; it never unpickles user objects itself.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import time
from typing import Any

from .. import gpurequest, image, process
from ..errors import GpuUnavailable
from ..store import ImageStore, check_ref
from ..store.mapping import Checker
from ..store.progress import Progress
from . import background
from .activity import describe as describe
from .activity import idle_ok as idle_ok
from .caches import apply_caches, cache_facts
from .probe import Probe
from .state import (
    adopt,
    apply_kernel_facts,
    defining_cells,
    enter_saved_place,
    expand_history,
    fresh_kernel,
    kernel_facts,
    kernel_id,
    user_variables,
)
from .summary import failure, host_bytes, newest_manifest, unsaveable_ids
from .summary import summarize_save as summarize_save

# From the server's first call into this kernel on, probes and reconnects leave the
# notebook's random stream alone (see process.streams).
process.streams.keep_ipython_off_the_stream()


def _default_name() -> str:
    notebook = os.environ.get("JPY_SESSION_NAME")
    if notebook:
        stem = os.path.splitext(os.path.basename(notebook))[0]
        cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-._")
        if cleaned:
            return cleaned[:128]
    kid = kernel_id()
    return f"kernel-{kid[:8]}" if kid else "session"


class KernelSession:
    """Per-kernel state: the variables excluded from images and the last image written
    or restored (the parent of the next one)."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.excluded: set[str] = set()
        self.last_image: str | None = None
        # name -> id() of each value the last save could not write (no reference kept)
        self.unsaveable: dict[str, int] = {}
        # the cheap look after each cell for variables that cannot be saved
        self.probe = Probe()
        # the last image's bytes held in host memory: what a forked save may copy
        self.last_bytes = 0
        # name -> why: restored variables whose mapped data failed its later check
        self.damaged: dict[str, str] = {}
        # process states the last restored image did not hold, as they were then
        self.untouched: dict[str, bytes] = {}
        self._store: ImageStore | None = None

    @property
    def store(self) -> ImageStore:
        if self._store is None:
            self._store = ImageStore(config=self.shell.config)
        return self._store

    def save(
        self,
        name: str | None = None,
        progress: str | None = None,
        verify: bool = False,
        trigger: str = "manual",
    ) -> dict[str, Any]:
        """Write an image; a failure comes back as ``{"error": why}``, not raised. An
        exception would stay in ``sys.last_traceback`` (IPython keeps the last one), and
        with it every copy the failed save's frames held. ``progress``: a file to keep
        the bytes written in (see :mod:`jupyter_ckpt.store.progress`). ``verify``: load
        the image back first; a variable that would not load is reported as not saved.
        Without a ``name``, a state identical to the newest image's writes no image: that
        image comes back, with ``unchanged`` set. A name asks for an image of its own (a
        manifest: the chunks are shared)."""
        started = time.perf_counter()
        background.collect(self)  # a finished autosave's image is the parent
        try:
            newest = None if name else self.newest()
            # A name is looked up later like an id, so it obeys the same rules (no paths).
            name = check_ref(name, "image name") if name else _default_name()
            states = self.process_states()
            manifest = self.capture(
                self.store,
                self.store.writer(Progress(progress)),
                name=name,
                verify=verify,
                trigger=trigger,
                newest=newest,
                states=states,
            )
        except Exception as exc:
            return failure(exc)
        self.last_image = manifest["id"]
        self.untouched = self.untouched_after(states)
        self.unsaveable = unsaveable_ids(manifest, self.shell.user_ns)
        self.last_bytes = host_bytes(manifest)
        summary = summarize_save(manifest, time.perf_counter() - started)
        parsed = self.shell.history_manager.input_hist_parsed
        return {**summary, "cells": defining_cells(parsed, summary["lost"])}

    def process_states(self) -> tuple[dict[str, Any], dict[str, str]]:
        """The process state an image of this kernel holds now (see :mod:`..process`), and
        what the process state will be compared with once that image is written: the
        providers it leaves out as they are (a library imported by the save itself is not
        the user's until its state changes)."""
        states, lost = process.capture_states(process.PROVIDERS, self.untouched)
        return states, lost

    def capture(
        self,
        store: ImageStore,
        writer: Any,
        *,
        name: str,
        verify: bool,
        trigger: str,
        newest: dict[str, Any] | None,
        states: tuple[dict[str, Any], dict[str, str]] | None = None,
    ) -> dict[str, Any]:
        """The namespace and the process state it lives in (``states``, taken now if not
        given), into ``writer``: what every save of this kernel writes, here or in an
        autosave's forked child (whose states are the kernel's at the fork: a fork
        reseeds ``random`` in the child)."""
        process_states, lost_states = states or self.process_states()
        variables = user_variables(self.shell)
        return image.capture(
            variables,
            self.shell.user_ns,
            writer,
            name=name,
            exclude=self.excluded,
            kernel={**kernel_facts(self.shell), "caches": cache_facts(self.shell, variables)},
            parent=self.last_image,
            buffer_bytes=store.buffer_bytes,
            verify=verify,
            trigger=trigger,
            newest=newest,
            process_states=process_states,
            process_lost=lost_states,
            fresh_kernel=fresh_kernel(),
        )

    def untouched_after(self, states: tuple[dict[str, Any], dict[str, str]]) -> dict[str, bytes]:
        """The providers an image with ``states`` left out, as they are now."""
        return process.untouched(process.PROVIDERS, [*states[0], *states[1]])

    def newest(self) -> dict[str, Any] | None:
        """The manifest of the image last written or restored, while it is in the store."""
        return newest_manifest(self.store, self.last_image)

    def still_unsaveable(self) -> list[str]:
        """The variables the last save (here or in an autosave's child) could not write
        that still hold the same values: not deleted, rebound or excluded since. While
        there are some, a suspend with on_unsaveable=keep fails again; once there are
        none, it need not be retried to know that."""
        background.collect(self)
        namespace = self.shell.user_ns
        return sorted(
            name
            for name, value_id in self.unsaveable.items()
            if name not in self.excluded and name in namespace and id(namespace[name]) == value_id
        )

    def unsaveable_now(self) -> dict[str, str]:
        """name -> why, for the variables a suspend now would leave out, as far as a
        cheap look tells (see :mod:`.probe`): those the last save could not write that
        still hold the same values, and those bound since that cannot be saved."""
        found = self.probe.look(user_variables(self.shell), self.excluded)
        for name in self.still_unsaveable():
            found.setdefault(name, "the last save could not write it")
        return dict(sorted(found.items()))

    def restore(
        self,
        ref: str,
        map_location: str | None = None,
        progress: str | None = None,
        kernel_id: str | None = None,
        notebook: str | None = None,
        notebook_id: str | None = None,
    ) -> dict[str, Any]:
        started = time.perf_counter()
        adopt(self.shell, kernel_id, notebook, notebook_id)
        manifest = self.store.open(ref)
        opened = time.perf_counter()
        facts = manifest.get("kernel", {})
        place_warnings = enter_saved_place(facts)
        segments = self.store.read_segments(manifest, Progress(progress))
        report = image.restore(manifest, segments, self.shell.user_ns, map_location=map_location)
        segments.progress.finish()
        restored = time.perf_counter()
        history = facts.get("history")
        cells = defining_cells(expand_history(history)[1], report.missing) if history else {}
        report.warnings[:0] = place_warnings
        apply_kernel_facts(self.shell, facts)
        apply_caches(self.shell, facts, set(report.restored))
        self.excluded = set(manifest.get("excluded", []))
        saved_states = manifest.get("process", {})
        self.untouched = self.untouched_after(
            (dict.fromkeys(saved_states.get("kept", [])), saved_states.get("lost", {}))
        )
        self.last_image = manifest["id"]
        self.last_bytes = host_bytes(manifest)
        mapper = segments.mapper
        if mapper is not None and mapper.checker.chunks:  # last: it keeps the disk busy
            mapper.checker.start(functools.partial(self._mapped_checked, manifest))
        return {
            "id": manifest["id"],
            "name": manifest["name"],
            **report.to_json(),
            # of the missing, those left out on purpose (Exclude, Suspend anyway, `%ckpt
            # exclude`): the user chose it, the client says so without calling it a failure
            "excluded": sorted(self.excluded & report.missing.keys()),
            "cells": cells,  # what to re-run to make a missing variable again
            "seconds": time.perf_counter() - started,
            # where the time went, for the server's restore timeline
            "steps": {
                "manifest": opened - started,
                "read": segments.read_seconds,
                "unpickle": restored - opened - segments.read_seconds,
                "history": time.perf_counter() - restored,
            },
            "mapped_bytes": 0 if mapper is None else mapper.bytes,
        }

    def _mapped_checked(self, manifest: dict[str, Any], checker: Checker) -> None:
        """Say which restored variables hold data whose chunk did not match its hash (the
        check runs after the restore for mapped buffers: see :mod:`..store.mapping`)."""
        if not checker.failed:
            return
        bad = {
            index
            for index, segment in enumerate(manifest["segments"])
            if any(digest in checker.failed for digest, _ in segment["chunks"])
        }
        names = sorted(
            name
            for group in manifest["groups"]
            if any(ref[0] in bad for ref in group["buffers"])
            for name in group["names"]
        )
        why = "; ".join(sorted(set(checker.failed.values())))
        self.damaged.update(dict.fromkeys(names, why))
        print(
            f"jupyter-ckpt: image {manifest['id']} was damaged on disk: the data of "
            f"{', '.join(names) or 'some variables'} does not match what was saved; "
            "load it from another image or make it again",
            file=sys.stderr,
        )


_session: KernelSession | None = None


def session() -> KernelSession:
    """The session of the running IPython kernel."""
    global _session
    if _session is None:
        from IPython import get_ipython

        shell = get_ipython()
        if shell is None:
            raise RuntimeError("jupyter_ckpt.kernel runs inside an IPython kernel")
        _session = KernelSession(shell)
    return _session


def checkpoint(
    name: str | None = None, progress: str | None = None, trigger: str = "manual"
) -> dict[str, Any]:
    """The server's save, before a suspend or a server stop (and on request): verified,
    so that a variable reported saved is one that loads, and a kernel whose variables
    would not all come back is kept running under ``on_unsaveable = "keep"``."""
    return session().save(name, progress, verify=True, trigger=trigger)


def restore(
    ref: str,
    map_location: str | None = None,
    progress: str | None = None,
    kernel_id: str | None = None,
    notebook: str | None = None,
    notebook_id: str | None = None,
) -> dict[str, Any]:
    """Restore image ``ref`` into this kernel. The server names the kernel it restores
    (``kernel_id``, the ``notebook`` it runs for and that file's ``notebook_id``): it may
    be a process it started ahead, as no one's (see ``jupyter_ckpt_server.standby``)."""
    return session().restore(ref, map_location, progress, kernel_id, notebook, notebook_id)


def still_unsaveable() -> list[str]:
    return session().still_unsaveable()


def unsaveable_now() -> dict[str, str]:
    return session().unsaveable_now()


def autosave(timeout: float = background.DEFAULT_CHILD_TIMEOUT) -> dict[str, Any]:
    """Start a background save (see :mod:`.background`); returns at once."""
    return background.start(session(), _default_name(), timeout)


def autosave_result() -> dict[str, Any]:
    return background.collect(session())


# how often a kernel waiting for a GPU reads the server's answer
GPU_ANSWER_POLL_SECONDS = 0.1
# the server answers a request file within a second (it reads them every half second): no
# answer at all after this long means no server takes demands (it stopped, or is too old)
GPU_NO_ANSWER_SECONDS = 30.0


def request_gpu(mib: float, device: int | None = None, timeout: float | None = None) -> int | None:
    """Wait until the server has ``mib`` MiB of GPU memory free for this kernel (on
    ``device``, else the one with the most room), suspending idle kernels to make room;
    call it before allocating, from a cell, a library or a startup file. The device
    granted (None when the server counts the node's GPUs together, or when no server
    takes demands: then there is nothing to wait for). While it waits it prints the
    kernel's place ("Waiting for a GPU: 2 ahead of you"); a demand no suspension can
    satisfy raises :class:`~jupyter_ckpt.errors.GpuUnavailable` with the reason, instead
    of the out-of-memory error the allocation would meet. Interrupting the cell
    withdraws the demand. See :mod:`jupyter_ckpt.gpurequest` for why files carry it."""
    directory = os.environ.get(gpurequest.DEMAND_DIR_ENV)
    kid = kernel_id()
    if not directory or not kid:
        return None
    request = gpurequest.request_path(directory, kid)
    answer = gpurequest.answer_path(directory, kid)
    gpurequest.remove(answer)  # a previous demand's
    user = os.environ.get("JUPYTER_CKPT_USER")
    gpurequest.write(request, {"bytes": int(mib * 2**20), "device": device, "user": user})
    asked = time.monotonic()
    deadline = None if timeout is None else asked + timeout
    shown = None
    heard = False
    try:
        while True:
            reply = gpurequest.read(answer) or {}
            heard = heard or bool(reply)
            if not heard and time.monotonic() - asked > GPU_NO_ANSWER_SECONDS:
                raise GpuUnavailable(
                    f"the server did not take the demand within {GPU_NO_ANSWER_SECONDS:.0f} s"
                    " (is the jupyter-ckpt server extension running?)"
                )
            if reply.get("state") == "granted":
                gpurequest.remove(answer)
                return reply.get("device")
            if reply.get("state") == "refused":
                gpurequest.remove(answer)
                raise GpuUnavailable(reply.get("message", "the server refused the demand"))
            message = reply.get("message")
            if message and message != shown:
                print(message, flush=True)
                shown = message
            if deadline is not None and time.monotonic() > deadline:
                raise GpuUnavailable(f"no GPU memory free for {mib:.0f} MiB within {timeout} s")
            time.sleep(GPU_ANSWER_POLL_SECONDS)
    finally:
        gpurequest.remove(request)  # withdrawn if the wait ended any other way
