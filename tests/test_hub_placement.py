"""The hub's spawner hooks place a returning user's server where their images can be
restored: a real KubeSpawner builds the pod (no cluster: nothing is sent to one), with the
images of real stores written as on an H100, an A10 and a CPU-only node."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from harness import node_file, save_namespace, save_on_node
from jupyterhub import orm
from jupyterhub.spawner import LocalProcessSpawner
from jupyterhub.user import User
from kubespawner import KubeSpawner

from jupyter_ckpt import compat
from jupyter_ckpt.hub import IMAGE_OPTION, SpawnHooks, SpawnRefused, UserStores, user_secret
from jupyter_ckpt.hub.placement import COUNT
from jupyter_ckpt.store import ImageStore

pytestmark = pytest.mark.anyio
MIB = 1 << 20
# A profile that pins its own nodes: the placement must add to it, not replace it.
POOL = {"key": "pool", "operator": "In", "values": ["gpu"]}
PROFILES = [
    {
        "display_name": "H100",
        "slug": "h100",
        "kubespawner_override": {"node_affinity_required": [{"matchExpressions": [POOL]}]},
    },
    {"display_name": "A10", "slug": "a10"},
    {"display_name": "CPU", "slug": "cpu", "default": True},
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # KubeSpawner and JupyterHub run on asyncio


@pytest.fixture
def hub(tmp_path: Path) -> dict[str, Any]:
    """Stores, node facts and users of one hub (KubeSpawner's kubeconfig: conftest.py)."""
    stores = UserStores(str(tmp_path / "store"), secrets.token_hex(32).encode())
    nodes = {name: node_file(tmp_path, name) for name in ("h100", "a10", "cpu")}
    profiles = {name: compat.node_facts(str(path)) for name, path in nodes.items()}
    db = orm.new_session_factory("sqlite://")()
    return {"stores": stores, "nodes": nodes, "profiles": profiles, "db": db}


def hub_user(hub: dict[str, Any], name: str) -> User:
    row = orm.User(name=name)
    hub["db"].add(row)
    hub["db"].commit()
    return User(row, settings={})


def user_store(hub: dict[str, Any], name: str) -> ImageStore:
    """The user's part of the store, as their server opens it with the hub's secret."""
    stores = hub["stores"]
    return ImageStore(url=stores.url, user=name, secret=stores.secret(name), secret_file="/unused")


def record_suspended(store: Any, manifest: dict[str, Any]) -> None:
    """The record of a kernel suspended to ``manifest``'s image, as the server writes it."""
    store.records.put(
        {
            "kernel_id": str(uuid.uuid4()),
            "kernel_name": "python3",
            "path": "",
            "env": {},
            "image_id": manifest["id"],
            "suspended_at": manifest["created"],
        }
    )


def suspend_on(hub: dict[str, Any], user: str, node: str, gpu_bytes: int) -> dict[str, Any]:
    """A kernel of ``user`` suspended on ``node``: its image, and its record."""
    store = user_store(hub, user)
    manifest = save_on_node(store, hub["nodes"][node], gpu_bytes, name=f"on-{node}")
    record_suspended(store, manifest)
    return manifest


async def pod_for(
    hooks: SpawnHooks, user: User, profile_list: list[dict] = PROFILES, **options: str
) -> dict[str, Any]:
    """Spawn as the hub would, up to the pod it would create: the pre-spawn hook, the
    profile's overrides, KubeSpawner's own manifest, then the pod hook. The pod as the
    Kubernetes API would receive it."""
    spawner = KubeSpawner(
        _mock=True,
        user=user,
        profile_list=profile_list,
        pre_spawn_hook=hooks.pre_spawn_hook,
        modify_pod_hook=hooks.modify_pod_hook,
    )
    spawner.user_options = options
    await spawner.run_pre_spawn_hook()
    await spawner.load_user_options()
    pod = await spawner.get_pod_manifest()
    pod = await spawner.modify_pod_hook(spawner, pod)
    sent = spawner.api.api_client.sanitize_for_serialization(pod)
    env = {e["name"]: e.get("value") for e in sent["spec"]["containers"][0]["env"]}
    assert env["JUPYTER_CKPT_SECRET"] == user_secret(hooks.stores._master, user.name)
    assert env["JUPYTER_CKPT_USER"] == user.name
    assert env["JUPYTER_CKPT_STORE"] == hooks.stores.url
    return sent


def node_affinity(pod: dict[str, Any]) -> dict[str, Any]:
    return pod["spec"].get("affinity", {}).get("nodeAffinity", {})


def required(pod: dict[str, Any]) -> list[list[tuple[str, str, list[str] | None]]]:
    """The pod's required node selector terms, as (key, operator, values) per term."""
    selector = node_affinity(pod).get("requiredDuringSchedulingIgnoredDuringExecution", {})
    return [_expressions(term) for term in selector.get("nodeSelectorTerms", [])]


def _expressions(term: dict[str, Any]) -> list[tuple[str, str, list[str] | None]]:
    return [(e["key"], e["operator"], e.get("values")) for e in term["matchExpressions"]]


def preferred(pod: dict[str, Any]) -> list[tuple[int, list[tuple[str, str, list[str] | None]]]]:
    terms = node_affinity(pod).get("preferredDuringSchedulingIgnoredDuringExecution", [])
    return [(t["weight"], _expressions(t["preference"])) for t in terms]


GPU_EXISTS = ("nvidia.com/gpu.product", "Exists", None)
FREE_NOW_3_MIB = ("jupyter-ckpt.io/gpu.memory.free", "Gt", ["2"])


async def test_an_h100_kernel_lands_on_a_node_of_its_compute_capability(hub):
    suspend_on(hub, "alice", "h100", 3 * MIB)
    hooks = SpawnHooks(hub["stores"], profiles=hub["profiles"])
    pod = await pod_for(hooks, hub_user(hub, "alice"), profile="h100")
    gpu = [
        GPU_EXISTS,
        ("nvidia.com/gpu.memory", "Gt", ["2"]),  # at least 3 MiB on one GPU
        ("nvidia.com/gpu.compute.major", "Gt", ["8"]),  # 9.x
        ("nvidia.com/cuda.driver.major", "Gt", ["524"]),  # runs CUDA 12.1
    ]
    assert required(pod) == [[("pool", "In", ["gpu"]), *gpu]], "the profile's term is kept"
    assert preferred(pod) == [
        (100, [FREE_NOW_3_MIB]),  # a node where the restore suspends no one
        (100, [("nvidia.com/gpu.product", "In", ["NVIDIA-H100-80GB-HBM3"])]),
    ]


async def test_an_a10_kernel_may_go_to_any_gpu_of_its_generation_or_newer(hub):
    suspend_on(hub, "bob", "a10", 2 * MIB)
    hooks = SpawnHooks(hub["stores"], profiles=hub["profiles"])
    bob = hub_user(hub, "bob")
    gpu = [
        GPU_EXISTS,
        ("nvidia.com/gpu.memory", "Gt", ["1"]),
        ("nvidia.com/gpu.compute.major", "Gt", ["7"]),  # 8.x or newer
        ("nvidia.com/cuda.driver.major", "Gt", ["524"]),
    ]
    assert required(await pod_for(hooks, bob, profile="a10")) == [gpu]
    on_h100 = await pod_for(hooks, bob, profile="h100")
    assert required(on_h100) == [[("pool", "In", ["gpu"]), *gpu]]
    assert preferred(on_h100)[1:] == [(100, [("nvidia.com/gpu.product", "In", ["NVIDIA-A10"])])]
    others = await pod_for(hooks, hub_user(hub, "bobby"), profile="h100")
    assert required(others) == [[("pool", "In", ["gpu"])]], "another user's images place nothing"
    assert not (Path(hub["stores"].url) / "users" / "bobby").exists(), "the hub created nothing"


async def test_a_cpu_only_kernel_adds_no_constraint(hub):
    suspend_on(hub, "carol", "cpu", 0)
    hooks = SpawnHooks(hub["stores"], profiles=hub["profiles"])
    pod = await pod_for(hooks, hub_user(hub, "carol"))  # the default profile: cpu
    assert "affinity" not in pod["spec"]
    pod = await pod_for(hooks, hub_user(hub, "carol-2"), profile="h100")
    assert required(pod) == [[("pool", "In", ["gpu"])]]


async def test_a_profile_that_cannot_restore_is_refused_with_the_reasons(hub):
    suspend_on(hub, "dave", "h100", 3 * MIB)
    hooks = SpawnHooks(hub["stores"], profiles=hub["profiles"])
    user = hub_user(hub, "dave")
    with pytest.raises(SpawnRefused) as refused:
        await pod_for(hooks, user, profile="a10")
    message = str(refused.value)
    assert "cannot be restored on profile 'a10'" in message
    assert "compute capability 9.0; this node's GPUs have at most 8.6" in message
    assert "profiles where they can: h100" in message
    with pytest.raises(SpawnRefused, match=r"needs a GPU \(cuda:0\) and this node has none"):
        await pod_for(hooks, user)  # the default: cpu


async def test_no_compatible_profile_refuses_every_spawn(hub):
    small = {
        name: {**facts, "gpus": [{**facts["gpus"][0], "memory_total": 2 * MIB}]}
        for name, facts in hub["profiles"].items()
        if facts["gpus"]
    }
    suspend_on(hub, "erin", "h100", 3 * MIB)
    hooks = SpawnHooks(hub["stores"], profiles={**hub["profiles"], **small})
    user = hub_user(hub, "erin")
    for profile in ("cpu", "a10", "h100"):  # last: the one with the right GPU model
        with pytest.raises(SpawnRefused) as refused:
            await pod_for(hooks, user, profile=profile)
        assert "no configured node can restore them" in str(refused.value)
    assert "needs 3.0 MiB of GPU memory on one GPU (cuda:0)" in str(refused.value)


async def test_kernels_restored_together_need_their_memory_together(hub):
    for _ in range(2):
        suspend_on(hub, "frank", "a10", 2 * MIB)
    hooks = SpawnHooks(hub["stores"], profiles=hub["profiles"])
    pod = await pod_for(hooks, hub_user(hub, "frank"), profile="a10")
    assert ("nvidia.com/gpu.memory", "Gt", ["3"]) in required(pod)[0]


def suspend_on_two_gpus(hub: dict[str, Any], user: str, per_device: int) -> None:
    """A kernel of ``user`` suspended with ``per_device`` bytes on each of cuda:0 and
    cuda:1 of a two-H100 node."""
    import fake_devices
    import torch

    from jupyter_ckpt.image import devices

    h100 = compat.node_facts(str(hub["nodes"]["h100"]))
    two = node_file(
        hub["nodes"]["h100"].parent, "h100", gpus=[*h100["gpus"], {**h100["gpus"][0], "index": 1}]
    )
    saved_ops, saved_facts = devices.device_ops, os.environ.get(compat.NODE_FACTS_ENV)
    os.environ[compat.NODE_FACTS_ENV] = str(two)
    try:
        ops = fake_devices.install(gpus=2)
        namespace = {f"w{i}": torch.zeros(per_device, dtype=torch.uint8) for i in range(2)}
        for i, tensor in enumerate(namespace.values()):
            ops.pretend(tensor, f"cuda:{i}")
        store = user_store(hub, user)
        manifest = save_namespace(store, namespace, "two-gpus")
    finally:
        devices.device_ops = saved_ops
        if saved_facts is None:
            del os.environ[compat.NODE_FACTS_ENV]
        else:
            os.environ[compat.NODE_FACTS_ENV] = saved_facts
    assert manifest["gpu"]["device_bytes"] == {"cuda:0": per_device, "cuda:1": per_device}
    record_suspended(store, manifest)


def gpus_profile(gpus: int) -> dict[str, Any]:
    """A profile whose server gets ``gpus`` GPUs of the node (the device plugin's limit)."""
    override = {"extra_resource_limits": {"nvidia.com/gpu": str(gpus)}}
    return {
        "display_name": f"{gpus} GPUs",
        "slug": f"gpus-{gpus}",
        "kubespawner_override": override,
    }


async def test_saved_devices_that_would_share_a_gpu_need_a_gpu_for_their_memory(hub):
    """A restore maps saved devices modulo the GPUs the server gets: an image from cuda:0
    and cuda:1 needs, on one GPU, the memory of both."""
    suspend_on_two_gpus(hub, "jill", 3 * MIB)
    jill = hub_user(hub, "jill")
    hooks = SpawnHooks(hub["stores"])
    profiles = [gpus_profile(1), gpus_profile(2), {"display_name": "any", "slug": "any"}]

    def memory_and_count(pod: dict[str, Any]) -> list[tuple[str, str, list[str] | None]]:
        return [e for e in required(pod)[0] if e[0] in ("nvidia.com/gpu.memory", COUNT)]

    one = await pod_for(hooks, jill, profiles, profile="gpus-1")
    assert memory_and_count(one) == [("nvidia.com/gpu.memory", "Gt", ["5"])]  # 6 MiB
    two = await pod_for(hooks, jill, profiles, profile="gpus-2")
    assert memory_and_count(two) == [("nvidia.com/gpu.memory", "Gt", ["2"])]
    # no GPU limit: the server sees the node's GPUs, so a node with one for each device
    unknown = await pod_for(hooks, jill, profiles, profile="any")
    assert memory_and_count(unknown) == [
        ("nvidia.com/gpu.memory", "Gt", ["2"]),
        (COUNT, "Gt", ["1"]),
    ]
    constraints = await hooks.constraints(LocalProcessSpawner(user=jill))
    assert (COUNT, "Gt", ["1"]) in _expressions(constraints["node_affinity_required"][0])

    small = {"gpus": [{**hub["profiles"]["h100"]["gpus"][0], "memory_total": 4 * MIB}]}
    with pytest.raises(SpawnRefused) as refused:
        await SpawnHooks(hub["stores"], node={**hub["profiles"]["h100"], **small}).pre_spawn_hook(
            LocalProcessSpawner(user=jill)
        )
    assert "needs 6.0 MiB of GPU memory on one GPU: a restore puts cuda:0 and cuda:1 on" in str(
        refused.value
    )


async def test_the_spawn_form_lists_images_per_profile_and_places_the_chosen_one(hub):
    manifest = save_on_node(user_store(hub, "gina"), hub["nodes"]["h100"], MIB, name="big")
    hooks = SpawnHooks(hub["stores"], profiles=hub["profiles"])
    user = hub_user(hub, "gina")
    spawner = KubeSpawner(_mock=True, user=user, profile_list=PROFILES)
    form = await hooks.options_form(spawner)
    assert 'name="profile"' in form, "KubeSpawner's own profile form comes first"
    assert f'<option value="{manifest["id"]}">big (' in form
    verdicts = [c.split(">")[1] for c in form.split('<td class="ckpt-')[1:]]
    assert verdicts == ["compatible</td", "incompatible</td", "incompatible</td"]
    assert "compute capability 9.0" in form
    formdata = {"profile": ["h100"], IMAGE_OPTION: [manifest["id"]]}
    options = hooks.options_from_form(formdata, spawner)
    assert options == {"profile": "h100", IMAGE_OPTION: manifest["id"]}
    pod = await pod_for(hooks, user, **options)
    assert ("nvidia.com/gpu.compute.major", "Gt", ["8"]) in required(pod)[0]
    with pytest.raises(SpawnRefused, match="compute capability"):
        await pod_for(hooks, user, profile="a10", **{IMAGE_OPTION: manifest["id"]})


async def test_a_spawn_link_and_a_submitted_form_give_the_same_options(hub):
    """As the JupyterHub guide sets it: JupyterHub parses a submitted form with
    ``run_options_from_form`` (which passes the spawner) and a spawn link
    (/hub/spawn?profile=...) with ``options_from_query`` (which does not)."""
    manifest = save_on_node(user_store(hub, "gus"), hub["nodes"]["h100"], MIB, name="big")
    hooks = SpawnHooks(hub["stores"], profiles=hub["profiles"])
    spawner = KubeSpawner(
        _mock=True,
        user=hub_user(hub, "gus"),
        profile_list=PROFILES,
        options_form=hooks.options_form,
        options_from_form=hooks.options_from_form,
    )
    query = {"profile": ["h100"], IMAGE_OPTION: [manifest["id"]]}
    expected = {"profile": "h100", IMAGE_OPTION: manifest["id"]}
    assert spawner.options_from_query(query) == expected
    assert spawner.run_options_from_form(query) == expected
    with pytest.raises(TypeError, match="needs the spawner"):
        hooks.options_from_form(query)


async def test_other_spawners_get_the_constraints_and_the_refusal(hub):
    suspend_on(hub, "hank", "h100", 3 * MIB)
    user = hub_user(hub, "hank")
    on_a10 = SpawnHooks(hub["stores"], node=hub["profiles"]["a10"])
    spawner = LocalProcessSpawner(user=user)
    with pytest.raises(SpawnRefused, match="cannot be restored on this node"):
        await on_a10.pre_spawn_hook(spawner)
    on_h100 = SpawnHooks(hub["stores"], node=hub["profiles"]["h100"])
    await on_h100.pre_spawn_hook(spawner)
    assert spawner.environment["JUPYTER_CKPT_USER"] == "hank"
    constraints = await on_h100.constraints(spawner)
    assert ("nvidia.com/gpu.compute.major", "Gt", ["8"]) in _expressions(
        constraints["node_affinity_required"][0]
    )
    nothing = await on_h100.constraints(LocalProcessSpawner(user=hub_user(hub, "ivy")))
    assert nothing == {"node_affinity_required": [], "node_affinity_preferred": []}


def test_the_hub_package_imports_nothing_heavy():
    code = (
        "import sys, jupyter_ckpt.hub; "
        "print([m for m in ('jupyter_ckpt.store', 'jupyter_ckpt_server', 'kubespawner', "
        "'kubernetes_asyncio', 'numpy', 'torch', 'fsspec', 'jupyter_server', 'tornado') "
        "if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.replace("'", '"')) == []


HUB_CONFIG = """
import asyncio, json
from jupyterhub import orm
from jupyterhub.spawner import LocalProcessSpawner
from jupyterhub.user import User
from jupyter_ckpt.hub import pre_spawn_hook

db = orm.new_session_factory("sqlite://")()
db.add(orm.User(name="alice"))
db.commit()
spawner = LocalProcessSpawner(user=User(db.query(orm.User).first(), settings={}))
asyncio.run(pre_spawn_hook(spawner))
print(json.dumps(spawner.environment))
"""


def test_the_module_hooks_are_configured_by_the_hubs_environment(tmp_path):
    """As hub.extraConfig uses them: the store and master secret from the environment."""
    master = tmp_path / "master"
    master.write_text(secrets.token_hex(32))
    env = {
        **os.environ,
        "JUPYTER_CKPT_HUB_STORE": str(tmp_path / "store"),
        "JUPYTER_CKPT_HUB_SECRET_FILE": str(master),
    }
    run = subprocess.run(
        [sys.executable, "-c", HUB_CONFIG], env=env, capture_output=True, text=True, check=True
    )
    given = json.loads(run.stdout.splitlines()[-1])
    assert given == UserStores(str(tmp_path / "store"), master.read_bytes()).environment("alice")
    del env["JUPYTER_CKPT_HUB_SECRET_FILE"]
    run = subprocess.run(
        [sys.executable, "-c", HUB_CONFIG], env=env, capture_output=True, text=True
    )
    assert run.returncode == 1
    assert "need JUPYTER_CKPT_HUB_SECRET_FILE in the hub's environment" in run.stderr
