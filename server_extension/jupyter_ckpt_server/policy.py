"""When kernels are suspended and restored: the ``SuspendPolicy`` configuration.

Every trait is settable in ``jupyter_server_config.py`` (``c.SuspendPolicy.idle_timeout =
600``) and on the command line (``--SuspendPolicy.idle_timeout=600``). Bad values are
refused when the server starts, with the trait's name and the allowed range, rather than
surfacing later as a kernel that is never (or too eagerly) suspended.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from traitlets import Bool, Dict, Enum, Float, Int, List, TraitError, Unicode, default, validate
from traitlets.config import Configurable

log = logging.getLogger(__name__)

# What background_work may list, in the order the monitor checks them.
BACKGROUND_KINDS = ("threads", "tasks", "children", "gpu")

# Kernelspec metadata key: {"metadata": {"jupyter_ckpt": {"idle_timeout": 600}}}
SPEC_METADATA_KEY = "jupyter_ckpt"

# What a deployment sets when it cannot write the server's config (e.g. KubeSpawner's
# `environment`), next to the grace period it gives the pod.
STOP_GRACE_ENV = "JUPYTER_CKPT_STOP_GRACE_PERIOD"


def _at_least(proposal: Any, minimum: float, strict: bool = False) -> Any:
    value = proposal["value"]
    if value < minimum or (strict and value == minimum):
        relation = "greater than" if strict else "at least"
        raise TraitError(
            f"SuspendPolicy.{proposal['trait'].name} must be {relation} {minimum}, got {value!r}"
        )
    return value


class SuspendPolicy(Configurable):
    """Which idle kernels are written to an image and shut down, and how they come back."""

    idle_timeout = Float(
        1800,
        help="""Seconds a kernel must be idle (no execution, no messages) before it is
        suspended. 0 turns idle suspension off (manual and shutdown suspend still work).
        A kernelspec may override it with metadata {"jupyter_ckpt": {"idle_timeout": N}}.""",
    ).tag(config=True)

    check_interval = Float(30, help="Seconds between two checks of the idle monitor.").tag(
        config=True
    )

    gpu_only = Bool(
        True,
        help="""Only suspend kernels whose process tree holds GPU memory. Kernels without
        a GPU are cheap to keep; suspending them would only cost the user a restore.""",
    ).tag(config=True)

    min_gpu_memory_mb = Int(
        0, help="With gpu_only, the GPU memory (MiB) a kernel must hold to be suspended."
    ).tag(config=True)

    suspend_connected = Bool(
        True,
        help="""Suspend idle kernels that still have a client connected (an open but
        unattended browser tab). False keeps every connected kernel running.""",
    ).tag(config=True)

    on_unsaveable = Enum(
        ["keep", "suspend"],
        "keep",
        help="""What to do when some variables cannot be saved: "keep" leaves the kernel
        running and reports which variables block suspension; "suspend" accepts their loss.""",
    ).tag(config=True)

    restore_on = Enum(
        ["first-message", "connect"],
        "first-message",
        help="""When a suspended kernel is restored: on the first message that needs the
        kernel (execute, complete, inspect, ...), or as soon as a client connects.""",
    ).tag(config=True)

    suspend_on_shutdown = Bool(
        True,
        help="""When the server stops (a stop signal, the shutdown API, a hub cull, an
        eviction), suspend every kernel that would lose state, before the kernels are
        stopped.""",
    ).tag(config=True)

    shutdown_timeout = Float(
        120, help="Seconds the server may spend suspending kernels when it stops."
    ).tag(config=True)

    stop_grace_period = Float(
        help="""Seconds the deployment gives the server between the first stop signal and
        SIGKILL (Kubernetes' terminationGracePeriodSeconds, LocalProcessSpawner's
        interrupt_timeout + term_timeout, `docker stop -t`, systemd's TimeoutStopSec),
        which the server cannot read itself. When it is shorter than shutdown_timeout plus
        a margin, the server warns at start. Default: $JUPYTER_CKPT_STOP_GRACE_PERIOD,
        else 0 (unknown).""",
    ).tag(config=True)

    checkpoint_timeout = Float(
        600, help="Seconds one kernel may take to write its image before the attempt fails."
    ).tag(config=True)

    exclude_kernel_names = List(
        Unicode(), help="Kernel spec names that are never suspended (e.g. ['ir'])."
    ).tag(config=True)

    background_work = List(
        Enum(BACKGROUND_KINDS),
        list(BACKGROUND_KINDS),
        help="""What counts as work in a kernel no cell is running, and keeps it from being
        suspended: "threads" (threads running the user's code that woke during the last
        check window, and any thread that used busy_cpu_percent of a core or moved
        busy_io_bytes_per_second over it), "tasks" (the user's asyncio tasks that ran
        during the window, or are pending while the kernel's main thread is that busy),
        "children" (live child processes of the kernel: a suspend would
        kill them), "gpu" (the kernel's processes keep a GPU busy). The idle clock
        restarts when such work ends. [] suspends on execution idleness alone.""",
    ).tag(config=True)

    busy_cpu_percent = Float(
        2,
        help="""CPU time (% of one core) a thread must use over a check window to count as
        work. A thread at rest (tqdm's monitor, a logging listener, a metrics writer, a
        debugger waiting for its client) uses far less; one training a model far more.""",
    ).tag(config=True)

    busy_io_bytes_per_second = Int(
        65536,
        help="""Bytes per second a thread must read or write (files and pipes, as Linux
        counts them per thread) over a check window to count as work: a download saved
        to disk, a copy. A thread that only logs now and then stays below it.""",
    ).tag(config=True)

    background_thread_ignore = List(
        Unicode(),
        help="""Name patterns (fnmatch, e.g. "prefetch-*") of threads that are helpers, not
        work: matched against the thread's name and the function it runs. A user marks
        such work in one kernel with `%ckpt idle-ok`.""",
    ).tag(config=True)

    gpu_busy_percent = Int(
        5,
        min=0,
        max=100,
        help="With background_work including gpu: SM utilization (%) that counts as busy.",
    ).tag(config=True)

    activity_timeout = Float(
        2,
        help="""Seconds the kernel may take to answer the background-work check (capped at
        check_interval). A kernel that does not answer counts as busy.""",
    ).tag(config=True)

    autosave_interval = Float(
        600,
        help="""Seconds between two background checkpoints (autosaves) of a kernel that ran
        something since its last image; they bound what a crash (SIGKILL, OOM, a dead
        node) loses, and the next server lists such a kernel as recoverable. 0 turns
        autosave off. A kernelspec may override it like idle_timeout.""",
    ).tag(config=True)

    autosave_idle = Float(
        30,
        help="""Seconds a kernel must have been idle (no execution, no messages) before an
        autosave may start. A kernelspec may override it like idle_timeout.""",
    ).tag(config=True)

    autosave_concurrency = Int(
        1,
        help="""Autosaves running at once. Each forked save holds copy-on-write pages,
        up to its kernel's state, against the memory of the server's pod.""",
    ).tag(config=True)

    gpu_demand = Bool(
        True,
        help="""When a kernel needs GPU memory the node does not have free (a kernel spec
        that asks for it, the restore of an image that held GPU memory, or the kernel's
        own request: `%ckpt gpu` or jupyter_ckpt.kernel.request_gpu()), suspend idle GPU
        kernels to make room, the longest idle first, and queue the demand fairly until
        there is room. False: demands are granted at once and nothing is suspended for
        them.""",
    ).tag(config=True)

    min_idle_on_demand = Float(
        120,
        help="""Seconds a kernel must have been idle before a GPU demand may suspend it
        (the idle monitor's own judgement decides what is idle; a busy kernel is never
        suspended).""",
    ).tag(config=True)

    demand_timeout = Float(
        300,
        help="""Seconds a GPU demand may wait in the queue; then it is refused with the
        reason (the holders are busy, or too young to suspend), rather than letting the
        kernel run out of GPU memory.""",
    ).tag(config=True)

    demand_kernel_specs = Dict(
        value_trait=Int(),
        help="""Kernel spec name -> GPU memory (MiB) a kernel of that spec needs when it
        starts: the start waits in the GPU demand queue. A kernel spec may say so itself
        with metadata {"jupyter_ckpt": {"gpu_memory_mb": N}}.""",
    ).tag(config=True)

    demand_accounting = Enum(
        ["device", "node"],
        "device",
        help="""How free GPU memory is counted for a demand: "device" (the demand needs
        its memory on one GPU; each GPU has its own queue) or "node" (the free memory of
        all GPUs together; one queue).""",
    ).tag(config=True)

    @default("stop_grace_period")
    def _stop_grace_period_from_env(self) -> float:
        value = os.environ.get(STOP_GRACE_ENV, "0")
        try:
            seconds = float(value)
        except ValueError:
            seconds = float("nan")
        if not seconds >= 0:
            raise TraitError(f"{STOP_GRACE_ENV} must be a number of seconds >= 0, got {value!r}")
        return seconds

    @validate(
        "idle_timeout",
        "min_gpu_memory_mb",
        "stop_grace_period",
        "autosave_interval",
        "autosave_idle",
        "busy_cpu_percent",
        "busy_io_bytes_per_second",
        "min_idle_on_demand",
    )
    def _non_negative(self, proposal: Any) -> Any:
        return _at_least(proposal, 0)

    @validate(
        "check_interval",
        "shutdown_timeout",
        "checkpoint_timeout",
        "activity_timeout",
        "autosave_concurrency",
        "demand_timeout",
    )
    def _positive(self, proposal: Any) -> Any:
        return _at_least(proposal, 0, strict=True)

    @validate("demand_kernel_specs")
    def _mib_per_spec(self, proposal: Any) -> Any:
        bad = {name: mib for name, mib in proposal["value"].items() if mib < 0}
        if bad:
            raise TraitError(f"SuspendPolicy.demand_kernel_specs must give MiB >= 0, got {bad!r}")
        return proposal["value"]

    def idle_timeout_for(self, spec_metadata: dict[str, Any] | None) -> float:
        """The idle timeout of a kernel spec: its metadata override, else the policy's."""
        return self.for_spec("idle_timeout", spec_metadata)

    def for_spec(self, name: str, spec_metadata: dict[str, Any] | None) -> float:
        """Seconds of trait ``name`` (idle_timeout, autosave_interval, autosave_idle) for a
        kernel spec: its metadata override, else the policy's."""
        default = getattr(self, name)
        override = (spec_metadata or {}).get(SPEC_METADATA_KEY, {})
        value = override.get(name) if isinstance(override, dict) else None
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            log.warning(
                "kernelspec metadata %s.%s=%r is not a number >= 0; using %s",
                SPEC_METADATA_KEY,
                name,
                value,
                default,
            )
            return default
        return float(value)

    def gpu_demand_of(self, kernel_name: str, spec_metadata: dict[str, Any] | None) -> int:
        """Bytes of GPU memory a kernel of this spec needs at start (0: none): its
        metadata's ``gpu_memory_mb``, else ``demand_kernel_specs``."""
        override = (spec_metadata or {}).get(SPEC_METADATA_KEY, {})
        value = override.get("gpu_memory_mb") if isinstance(override, dict) else None
        if value is None:
            value = self.demand_kernel_specs.get(kernel_name, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            log.warning(
                "kernelspec metadata %s.gpu_memory_mb=%r is not a whole number >= 0; ignored",
                SPEC_METADATA_KEY,
                value,
            )
            return 0
        return value * 2**20

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.class_own_traits(config=True)}
