"""Place a returning user's server on a node where their images can be restored.

The hub reads the user's part of the shared store (:mod:`.stores`): the images their
suspended kernels need (kernel records) and the image they chose in the spawn form
("resume saved session", ``user_options["ckpt_image"]``). What those images need of a GPU
(:func:`jupyter_ckpt.compat.gpu_needs`) becomes, for KubeSpawner, required node affinity
on the labels NVIDIA GPU Feature Discovery puts on GPU nodes; images without GPU tensors
need nothing, and no constraint is added. For other spawners the same decision is
:meth:`SpawnHooks.constraints`, and where the facts of the node a server will run on are
known (per KubeSpawner profile, or one node for a local or batch spawner), a spawn that
could not restore the images is refused before it starts, with the reasons, by the same
:func:`jupyter_ckpt.compat.check` the server and ``jupyter ckpt show`` use.

Why the placement goes into ``modify_pod_hook``: JupyterHub awaits ``pre_spawn_hook``
before ``Spawner.start()``, and KubeSpawner applies the chosen profile's
``kubespawner_override`` inside ``start()`` (``KubeSpawner._start`` calls
``load_user_options()``, which calls ``_load_profile``), then builds the pod with
``get_pod_manifest()`` and only then calls ``modify_pod_hook(spawner, pod)``
(kubespawner/spawner.py, ``KubeSpawner._start``, 7.x). ``_apply_overrides`` merges a
dict override into the trait (the environment set in ``pre_spawn_hook`` stays) but
replaces a list: a ``node_affinity_required`` set in ``pre_spawn_hook`` would be lost to
any profile that sets its own. Added to the pod, it holds whatever the profile says.
"""

from __future__ import annotations

import asyncio
import html
import inspect
import logging
import math
import os
import sys
import weakref
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from .. import compat
from ..compat import GpuNeeds
from ..errors import CkptError
from .stores import UserStores

log = logging.getLogger(__name__)

# NVIDIA GPU Feature Discovery node labels
PRODUCT = "nvidia.com/gpu.product"  # the model, spaces as dashes: NVIDIA-H100-80GB-HBM3
MEMORY = "nvidia.com/gpu.memory"  # MiB per GPU
DRIVER_MAJOR = "nvidia.com/cuda.driver.major"  # NVIDIA driver major version: 550
COMPUTE_MAJOR = "nvidia.com/gpu.compute.major"  # compute capability major: 9
COUNT = "nvidia.com/gpu.count"  # GPUs on the node
# MiB free now on the node's GPU with the most free memory: published by the node itself
# (:mod:`jupyter_ckpt.hub.nodelabels`), as no standard label says it
FREE_MEMORY = "jupyter-ckpt.io/gpu.memory.free"
# The NVIDIA device plugin's resource: the GPUs a container gets.
GPU_RESOURCE = "nvidia.com/gpu"
# The spawn form's field and user_options key of the image to resume.
IMAGE_OPTION = "ckpt_image"
PROFILE_FACTS_ENV = "JUPYTER_CKPT_HUB_PROFILE_FACTS"

_MIB = 1 << 20


class SpawnRefused(CkptError):
    """The server would start where the user's images cannot be restored."""


def product_label(name: str) -> str:
    """A GPU model as GFD writes it into ``nvidia.com/gpu.product``."""
    return name.strip().replace(" ", "-")


def required_expressions(
    needs: GpuNeeds | None, same_product: bool = False, gpus: int | None = None
) -> list[dict]:
    """Node selector requirements (Kubernetes ``NodeSelectorRequirement``) on GFD labels
    that a node must meet to restore images with ``needs``; none without GPU tensors.
    ``Gt`` takes one integer: "at least n" is written "greater than n - 1".

    ``gpus`` is how many GPUs the server gets (its pod's ``nvidia.com/gpu`` limit): a
    restore maps the saved devices onto them, so with fewer GPUs than saved devices the
    memory of those sharing one adds up (:func:`jupyter_ckpt.compat.device_map`). When
    it is not known, the node must have a GPU for every saved index."""
    if needs is None:
        return []
    expressions: list[dict[str, Any]] = [{"key": PRODUCT, "operator": "Exists"}]
    per_gpu = needs.per_gpu if gpus is None else needs.per_gpu_on(gpus)
    if per_gpu:
        mib = math.ceil(per_gpu / _MIB)
        expressions.append({"key": MEMORY, "operator": "Gt", "values": [str(mib - 1)]})
    if gpus is None and needs.spread > 1:
        expressions.append({"key": COUNT, "operator": "Gt", "values": [str(needs.spread - 1)]})
    if needs.compute:
        major = needs.compute[0]
        expressions.append({"key": COMPUTE_MAJOR, "operator": "Gt", "values": [str(major - 1)]})
    if needs.min_driver:
        driver = needs.min_driver
        expressions.append({"key": DRIVER_MAJOR, "operator": "Gt", "values": [str(driver - 1)]})
    if same_product and needs.products:
        values = [product_label(p) for p in needs.products]
        expressions.append({"key": PRODUCT, "operator": "In", "values": values})
    return expressions


def pod_gpus(pod: Any) -> int | None:
    """The GPUs KubeSpawner's pod gives the server: its notebook container's
    ``nvidia.com/gpu`` limit (e.g. a profile's ``extra_resource_limits``); None when it
    sets none."""
    for container in pod.spec.containers or []:
        if container.name == "notebook" and container.resources is not None:
            limit = (container.resources.limits or {}).get(GPU_RESOURCE)
            if limit is not None and str(limit).isdigit() and int(limit) > 0:
                return int(limit)
    return None


def preferred_terms(
    needs: GpuNeeds | None, same_product: bool = False, gpus: int | None = None
) -> list[dict]:
    """Kubernetes ``PreferredSchedulingTerm``: a node whose GPU has the memory the
    restore needs free now (:data:`FREE_MEMORY`), so that no one's idle kernel is
    suspended for it; failing that, any node the required terms allow, where GPU demand
    suspends idle kernels to make room. And the GPU model the images were saved on,
    where it is not required (same speed and memory layout as before)."""
    if needs is None:
        return []
    terms = []
    per_gpu = needs.per_gpu if gpus is None else needs.per_gpu_on(gpus)
    if per_gpu:
        mib = math.ceil(per_gpu / _MIB)
        free = {"key": FREE_MEMORY, "operator": "Gt", "values": [str(mib - 1)]}
        terms.append({"weight": 100, "preference": {"matchExpressions": [free]}})
    if not same_product and needs.products:
        values = [product_label(p) for p in needs.products]
        expression = {"key": PRODUCT, "operator": "In", "values": values}
        terms.append({"weight": 100, "preference": {"matchExpressions": [expression]}})
    return terms


@dataclass
class Placement:
    """The images a spawn must be able to restore, and what they need together."""

    #: (why it is needed: "suspended kernel <id>" or "chosen to resume", manifest)
    images: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    @property
    def needs(self) -> GpuNeeds | None:
        merged: GpuNeeds | None = None
        for _, manifest in self.images:
            needs = compat.gpu_needs(manifest)
            if needs is not None:
                merged = needs if merged is None else merged.merge(needs)
        return merged

    def problems(self, node: dict[str, Any]) -> list[str]:
        """Why the images cannot be restored on ``node`` (Python and packages only where
        its facts give them: the hub runs none of the users' software)."""
        reasons = []
        for why, manifest in self.images:
            problems = compat.assess(manifest, node, here=False)[0]
            if problems:
                reasons.append(f"image '{manifest.get('name')}' ({why}): {'; '.join(problems)}")
        needs = self.needs
        if len(self.images) > 1 and needs is not None and not reasons:
            # each fits alone, but together on one node?
            reasons += [f"the images together: {p}" for p in compat.gpu_check(needs, node)[0]]
        return reasons


def read_placement(store: Any, chosen: str | None) -> Placement:
    """The images of the user's suspended kernels and the one they chose (blocking I/O)."""
    placement = Placement()
    records, errors = store.records.all()
    for kernel_id, why in errors.items():
        log.warning("Ignoring the record of suspended kernel %s: %s", kernel_id, why)
    for kernel_id, record in sorted(records.items()):
        try:
            manifest = store.load_manifest(record["image_id"])
        except CkptError as exc:
            log.warning("Suspended kernel %s: its image cannot be read: %s", kernel_id, exc)
            continue
        placement.images.append((f"suspended kernel {kernel_id}", manifest))
    if chosen:
        placement.images.append(("chosen to resume", store.open(chosen)))
    return placement


def _default_profile(profile_list: Any) -> str | None:
    """The slug KubeSpawner starts when the user chose none: the default, else the first."""
    if not isinstance(profile_list, list) or not profile_list:
        return None
    chosen = next((p for p in profile_list if p.get("default")), profile_list[0])
    return chosen.get("slug")


class SpawnHooks:
    """``pre_spawn_hook``, ``modify_pod_hook`` and the spawn form's "resume saved session".

    ``profiles`` maps KubeSpawner profile slugs to the facts of their nodes
    (:func:`jupyter_ckpt.compat.node_facts` format); ``node`` gives the facts of where any
    server starts (a local or batch spawner). Where the target's facts are known, a spawn
    that could not restore the user's images is refused with the reasons. ``same_product``
    requires the GPU model the images were saved on instead of preferring it.
    """

    def __init__(
        self,
        stores: UserStores,
        profiles: dict[str, dict[str, Any]] | None = None,
        node: dict[str, Any] | None = None,
        same_product: bool = False,
    ) -> None:
        self.stores = stores
        self.profiles = profiles or {}
        self.node = node
        self.same_product = same_product
        self._placements: weakref.WeakKeyDictionary[Any, Placement] = weakref.WeakKeyDictionary()

    async def placement(self, spawner: Any) -> Placement:
        """What the spawn must restore, read from the user's part of the store."""
        chosen = (spawner.user_options or {}).get(IMAGE_OPTION) or None
        return await asyncio.to_thread(self._read, spawner.user.name, chosen)

    def _read(self, user: str, chosen: str | None) -> Placement:
        try:
            store = self.stores.open(user)
            if store is None:
                if chosen:
                    raise SpawnRefused(f"no saved sessions of {user} to resume {chosen!r} from")
                return Placement()
            try:
                return read_placement(store, chosen)
            finally:
                store.close()
        except OSError as exc:
            # The user can still work; their server refuses to restore what it cannot.
            log.error("Cannot read %s's saved sessions (%s): placing without them", user, exc)
            return Placement()

    def target(self, spawner: Any) -> tuple[str, dict[str, Any]] | None:
        """(name, facts) of where the server will start, when they are known."""
        if self.profiles:
            slug = (spawner.user_options or {}).get("profile") or _default_profile(
                getattr(spawner, "profile_list", None)
            )
            if slug in self.profiles:
                return f"profile '{slug}'", self.profiles[slug]
        if self.node is not None:
            return "this node", self.node
        return None

    async def pre_spawn_hook(self, spawner: Any) -> None:
        """Give the server its store and secret; refuse a spawn on a node (or profile)
        whose facts are known and where the user's images cannot be restored."""
        spawner.environment = {**spawner.environment, **self.stores.environment(spawner.user.name)}
        placement = await self.placement(spawner)
        self._placements[spawner] = placement
        target = self.target(spawner)
        if target is None:
            return
        name, facts = target
        problems = placement.problems(facts)
        if problems:
            others = [s for s, f in self.profiles.items() if not placement.problems(f)]
            where = (
                f"profiles where they can: {', '.join(others)}"
                if others
                else "no configured node can restore them"
            )
            raise SpawnRefused(
                f"{spawner.user.name}'s saved sessions cannot be restored on {name}: "
                + "; ".join(problems)
                + f" ({where})"
            )

    async def constraints(self, spawner: Any, gpus: int | None = None) -> dict[str, list[dict]]:
        """The placement as Kubernetes node affinity terms (empty when the images need no
        GPU): for spawners that place servers themselves (translate them to batch
        constraints). ``gpus``: how many GPUs the server gets, when known (see
        :func:`required_expressions`)."""
        needs = (await self._placement_of(spawner)).needs
        expressions = required_expressions(needs, self.same_product, gpus)
        return {
            "node_affinity_required": [{"matchExpressions": expressions}] if expressions else [],
            "node_affinity_preferred": preferred_terms(needs, self.same_product, gpus),
        }

    async def _placement_of(self, spawner: Any) -> Placement:
        placement = self._placements.pop(spawner, None)
        return placement if placement is not None else await self.placement(spawner)

    async def modify_pod_hook(self, spawner: Any, pod: Any) -> Any:
        """Add the placement to the pod KubeSpawner built, after the profile's overrides
        (not in ``pre_spawn_hook``: see the module's docstring)."""
        constraints = await self.constraints(spawner, pod_gpus(pod))
        if constraints["node_affinity_required"] or constraints["node_affinity_preferred"]:
            add_node_affinity(pod, constraints)
        return pod

    async def options_form(self, spawner: Any) -> str:
        """The spawner's own form (KubeSpawner's profile list) and "resume saved
        session": the user's images with their compatibility on each profile."""
        form = spawner.trait_defaults("options_form")
        if callable(form):
            form = form(spawner)
            if asyncio.iscoroutine(form):
                form = await form
        images = await asyncio.to_thread(self._images, spawner.user.name)
        return (form or "") + self.resume_fragment(images)

    def options_from_form(
        self, formdata: dict[str, list[str]], spawner: Any = None
    ) -> dict[str, Any]:
        """The spawner's own options, plus the image chosen to resume.

        JupyterHub passes ``spawner`` from a submitted form (``run_options_from_form``
        does when the hook has that parameter), but not from a spawn link
        (/hub/spawn?profile=..., ``Spawner.options_from_query`` calls the hook with the
        query alone): then the spawner is the caller's ``self``, as it is for
        KubeSpawner's own parser, a method of the spawner."""
        if spawner is None:
            spawner = _calling_spawner(sys._getframe(1))
        parse = spawner.trait_defaults("options_from_form")
        if "spawner" in inspect.signature(parse).parameters:
            options = dict(parse(formdata, spawner=spawner))
        else:
            options = dict(parse(formdata))
        chosen = (formdata.get(IMAGE_OPTION) or [""])[0]
        if chosen:
            options[IMAGE_OPTION] = chosen
        return options

    def _images(self, user: str) -> list[dict[str, Any]]:
        store = self.stores.open(user)
        if store is None:
            return []
        try:
            return [m for _, m, _ in store.iter_manifests() if m is not None]
        finally:
            store.close()

    def resume_fragment(self, images: list[dict[str, Any]]) -> str:
        """HTML: a choice of image, and a table of each one's verdict per profile."""
        targets = dict(self.profiles) or ({"this node": self.node} if self.node else {})
        rows, options = [], ['<option value="">Start without resuming a session</option>']
        for manifest in images:
            label = f"{manifest['name']} ({manifest['created'][:16].replace('T', ' ')})"
            options.append(
                f'<option value="{html.escape(manifest["id"])}">{html.escape(label)}</option>'
            )
            cells = []
            for facts in targets.values():
                result = compat.check(manifest, facts, here=False)
                reasons = html.escape("; ".join(result["reasons"]), quote=True)
                cells.append(
                    f'<td class="ckpt-{result["verdict"]}" title="{reasons}">'
                    f"{result['verdict']}</td>"
                )
            rows.append(f"<tr><td>{html.escape(label)}</td>{''.join(cells)}</tr>")
        head = "".join(f"<th>{html.escape(name)}</th>" for name in targets)
        table = (
            f'<table class="table"><tr><th>Saved session</th>{head}</tr>{"".join(rows)}</table>'
            if images and targets
            else ""
        )
        return (
            '<div class="form-group" id="jupyter-ckpt-resume">'
            f'<label for="{IMAGE_OPTION}">Resume saved session</label>'
            f'<select class="form-control" name="{IMAGE_OPTION}" id="{IMAGE_OPTION}">'
            f"{''.join(options)}</select>{table}</div>"
        )


def _calling_spawner(frame: FrameType) -> Any:
    """The spawner whose method (``options_from_query``) runs in ``frame``."""
    from jupyterhub.spawner import Spawner

    caller = frame.f_locals.get("self")
    if not isinstance(caller, Spawner):
        raise TypeError(
            "SpawnHooks.options_from_form needs the spawner: pass it, or set the hook as "
            "the spawner's options_from_form for JupyterHub to call"
        )
    return caller


def add_node_affinity(pod: Any, constraints: dict[str, list[dict]]) -> None:
    """Add required expressions to every required node selector term of ``pod`` (terms
    are ORed, a term's expressions ANDed), or as the one term if it has none; add the
    preferred terms. ``pod`` is KubeSpawner's ``V1Pod``."""
    from kubernetes_asyncio.client import (
        V1Affinity,
        V1NodeAffinity,
        V1NodeSelector,
        V1NodeSelectorRequirement,
        V1NodeSelectorTerm,
        V1PreferredSchedulingTerm,
    )
    from kubespawner.utils import get_k8s_model

    spec = pod.spec
    spec.affinity = spec.affinity or V1Affinity()
    node = spec.affinity.node_affinity = spec.affinity.node_affinity or V1NodeAffinity()
    required = constraints["node_affinity_required"]
    if required:
        wanted = [
            get_k8s_model(V1NodeSelectorRequirement, e) for e in required[0]["matchExpressions"]
        ]
        selector = node.required_during_scheduling_ignored_during_execution
        if selector is None or not selector.node_selector_terms:
            selector = V1NodeSelector(node_selector_terms=[V1NodeSelectorTerm()])
            node.required_during_scheduling_ignored_during_execution = selector
        for term in selector.node_selector_terms:
            term.match_expressions = [*(term.match_expressions or []), *wanted]
    preferred = [
        get_k8s_model(V1PreferredSchedulingTerm, t) for t in constraints["node_affinity_preferred"]
    ]
    if preferred:
        existing = node.preferred_during_scheduling_ignored_during_execution or []
        node.preferred_during_scheduling_ignored_during_execution = [*existing, *preferred]


def make_spawn_hooks(
    store_url: str,
    secret_file: str,
    *,
    profiles: dict[str, dict[str, Any]] | None = None,
    node: dict[str, Any] | None = None,
    same_product: bool = False,
    storage_options: dict[str, Any] | None = None,
) -> SpawnHooks:
    """Hooks for one shared store (``store_url``) and the hub's master secret (the file
    ``secret_file``). Set ``c.Spawner.pre_spawn_hook = hooks.pre_spawn_hook`` and, for
    KubeSpawner, ``c.KubeSpawner.modify_pod_hook = hooks.modify_pod_hook``."""
    from .stores import read_master_secret

    stores = UserStores(store_url, read_master_secret(secret_file), storage_options)
    return SpawnHooks(stores, profiles=profiles, node=node, same_product=same_product)


_env_hooks: SpawnHooks | None = None


def _from_env() -> SpawnHooks:
    """Hooks configured by the hub's environment (made on the first spawn)."""
    global _env_hooks
    if _env_hooks is None:
        profiles = None
        if os.environ.get(PROFILE_FACTS_ENV):
            profiles = compat.node_facts(os.environ[PROFILE_FACTS_ENV]).get("profiles")
        _env_hooks = SpawnHooks(UserStores.from_env(), profiles=profiles)
    return _env_hooks


async def pre_spawn_hook(spawner: Any) -> None:
    """:meth:`SpawnHooks.pre_spawn_hook` configured from ``JUPYTER_CKPT_HUB_STORE`` and
    ``JUPYTER_CKPT_HUB_SECRET_FILE`` (and ``JUPYTER_CKPT_HUB_PROFILE_FACTS``, a JSON file
    ``{"profiles": {slug: node facts}}``)."""
    await _from_env().pre_spawn_hook(spawner)


async def modify_pod_hook(spawner: Any, pod: Any) -> Any:
    """:meth:`SpawnHooks.modify_pod_hook` configured from the environment."""
    return await _from_env().modify_pod_hook(spawner, pod)
