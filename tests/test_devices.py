"""GPU tensors: restored on the same device, mapped onto fewer GPUs, refused without a GPU
(naming the device), or loaded on the CPU when asked. The GPU is a stand-in
(``fake_devices``) so this runs on any machine; the rest of each kernel is real.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import psutil
import pytest
from fake_devices import FakeDeviceOps
from harness import Kernel, wait_for

from jupyter_ckpt.errors import DeviceUnavailable
from jupyter_ckpt.image.devices import DeviceMapper
from jupyter_ckpt.kernel.background import fork_blocker, free_memory
from jupyter_ckpt.store import ImageStore

FAKE = "__import__('fake_devices').current"
N = 100_000

SETUP = f"""
import fake_devices, torch
_ops = fake_devices.install(gpus=2)
gpu_w = torch.arange({N}, dtype=torch.float32)
gpu_v = gpu_w[10:20]
gpu0 = torch.full((50,), 7, dtype=torch.int64)
cpu_t = torch.ones(3)
_ops.pretend(gpu_w, "cuda:1")
_ops.pretend(gpu0, "cuda:0")
del _ops, fake_devices
"""

GPU_VARS = ["gpu_w", "gpu_v", "gpu0"]
CHECKS = [
    f"int(gpu_w.to(torch.int64).sum()) == {sum(range(N))}",
    "gpu_v.tolist() == list(range(10, 20))",
    "gpu_v.untyped_storage().data_ptr() == gpu_w.untyped_storage().data_ptr()",
    "gpu0.tolist() == [7] * 50",
]


@pytest.fixture(scope="module")
def saved(start_kernel, kernel_store: ImageStore) -> dict[str, Any]:
    a = start_kernel()
    a.run(SETUP)
    out = a.ckpt("save gpu")
    assert a.eval(f"{FAKE}.to_host_calls") == 2, "each device storage is copied once"
    a.shutdown()
    return kernel_store.open("gpu") | {"output": out}


@pytest.fixture(scope="module")
def kernel(start_kernel, saved) -> Kernel:
    return start_kernel()


def restore_on(
    kernel: Kernel, gpus: int, options: str = "", ref: str = "gpu"
) -> tuple[str, list[list[Any]]]:
    """Restore the image on a node with ``gpus`` GPUs; return the output and the copies."""
    kernel.run(f"__import__('fake_devices').install(gpus={gpus})")
    kernel.run(f"for _n in {[*GPU_VARS, 'cpu_t']}: globals().pop(_n, None)")
    out = kernel.ckpt(f"restore {ref} {options}")
    return out, kernel.eval(f"{FAKE}.sent")


def test_manifest_records_devices(saved: dict[str, Any]) -> None:
    assert saved["output"].startswith("Saved ") and "Not saved" not in saved["output"]
    assert saved["devices"] == ["cpu", "cuda:0", "cuda:1"]
    devices = {v["name"]: v.get("devices") for v in saved["variables"]}
    assert devices["gpu_w"] == ["cuda:1"] and devices["gpu0"] == ["cuda:0"]
    assert devices["cpu_t"] == ["cpu"]


def test_same_index_restore(kernel: Kernel) -> None:
    out, sent = restore_on(kernel, gpus=2)
    assert sorted(sent) == [["cuda:0", 50 * 8], ["cuda:1", N * 4]]
    assert "Warning" not in out and "Not restored" not in out
    kernel.check(*CHECKS)


def test_fewer_gpus_maps_with_warning(kernel: Kernel) -> None:
    out, sent = restore_on(kernel, gpus=1)
    assert sorted(sent) == [["cuda:0", 50 * 8], ["cuda:0", N * 4]]
    assert "Warning: this node has 1 GPU(s); mapped cuda:1 -> cuda:0" in out.splitlines()
    kernel.check(*CHECKS)


def test_no_gpu_reports_variables_not_restored(kernel: Kernel) -> None:
    out, sent = restore_on(kernel, gpus=0)
    assert sent == []
    lines = out.splitlines()
    hint = "and this node has no GPU; restore with --map-location cpu to load it on the CPU"
    for name, device in [("gpu_w", "cuda:1"), ("gpu_v", "cuda:1"), ("gpu0", "cuda:0")]:
        assert f"  {name}: DeviceUnavailable: a tensor was saved on {device} {hint}" in lines
    assert kernel.falsy(*(f"'{n}' in globals()" for n in GPU_VARS)) == [
        f"'{n}' in globals()" for n in GPU_VARS
    ]
    kernel.check("cpu_t.tolist() == [1.0, 1.0, 1.0]")


def test_map_location_cpu(kernel: Kernel) -> None:
    out, sent = restore_on(kernel, gpus=0, options="--map-location cpu")
    assert sent == []
    assert "Not restored" not in out and "Warning" not in out
    kernel.check(*CHECKS, "gpu_w.device.type == 'cpu'")


# -- an autosave: device state copied in the kernel, written by the forked child ------------

KERNEL = "__import__('jupyter_ckpt.kernel').kernel"
DEVICE_BYTES = N * 4 + 50 * 8  # gpu_w (gpu_v is a view of it) and gpu0


def autosave(kernel: Kernel) -> dict[str, Any]:
    """An autosave as the server starts it; with its child's result once there is one."""
    begun = kernel.eval(f"{KERNEL}.autosave()")
    if begun["state"] != "started":
        return begun
    result: dict[str, Any] = {}
    wait_for(
        lambda: (
            result.update(kernel.eval(f"{KERNEL}.autosave_result()")) or result["state"] == "done"
        ),
        120,
        "the autosave's child",
    )
    return {**begun, **result}


def test_autosave_copies_device_state_in_the_kernel_for_the_child_to_write(
    kernel: Kernel,
) -> None:
    kernel.run(SETUP)
    done = autosave(kernel)
    assert (done["state"], done["mode"], done.get("error")) == ("done", "fork", None), done
    assert done["copy_bytes"] == DEVICE_BYTES and done["stall"] >= done["copy_seconds"] > 0
    # copied before the fork, through the staging path; none read as a blocking save does
    assert kernel.eval(f"[{FAKE}.copied_ahead, {FAKE}.to_host_calls]") == [DEVICE_BYTES, 0]
    # the stand-in fails in a forked child, as CUDA does: nothing was lost to it
    assert done["lost"] == {} and set(GPU_VARS) <= set(done["saved"]), done
    out, sent = restore_on(kernel, gpus=2, ref=done["id"])
    assert sorted(sent) == [["cuda:0", 50 * 8], ["cuda:1", N * 4]]
    assert "Not restored" not in out
    kernel.check(*CHECKS)


# -- DeviceMapper, without kernels ---------------------------------------------------------


def mapper(saved: list[str], gpus: int, map_location: str | None = None) -> DeviceMapper:
    return DeviceMapper(FakeDeviceOps(gpus), saved, map_location)


@pytest.mark.parametrize(
    ("saved", "gpus", "expected", "warning"),
    [
        (["cuda:0", "cuda:1"], 2, ["cuda:0", "cuda:1"], None),
        (["cuda:1"], 4, ["cuda:1"], None),
        (["cuda:1"], 1, ["cuda:0"], "this node has 1 GPU(s); mapped cuda:1 -> cuda:0"),
        (["cuda:0", "cuda:3"], 2, ["cuda:0", "cuda:1"], "mapped cuda:3 -> cuda:1"),
        (["cuda:10", "cuda:2"], 2, ["cuda:1", "cuda:0"], "cuda:2 -> cuda:0, cuda:10 -> cuda:1"),
        (["cuda:0", "cuda:1", "cuda:2"], 2, ["cuda:0", "cuda:1", "cuda:0"], "cuda:2 -> cuda:0"),
        (["cpu", "cuda:0"], 1, ["cpu", "cuda:0"], None),
    ],
)  # fmt: skip
def test_mapper_places_devices(
    saved: list[str], gpus: int, expected: list[str], warning: str | None
) -> None:
    m = mapper(saved, gpus)
    assert [m.resolve(d) for d in saved] == expected
    if warning is None:
        assert m.warnings == []
    else:
        assert len(m.warnings) == 1 and warning in m.warnings[0]


def test_mapper_without_gpu_refuses_naming_device() -> None:
    m = mapper(["cpu", "cuda:2"], gpus=0)
    assert m.resolve("cpu") == "cpu"
    with pytest.raises(DeviceUnavailable, match=r"saved on cuda:2 .*--map-location cpu"):
        m.resolve("cuda:2")


def test_mapper_map_location_overrides() -> None:
    m = mapper(["cuda:0", "cuda:5"], gpus=0, map_location="cpu")
    assert [m.resolve(d) for d in ("cuda:0", "cuda:5", "cpu")] == ["cpu"] * 3
    assert m.warnings == []


# -- the autosave's guards: a CUDA context from any framework, the cgroup's memory -----------


def fd_links(proc: Path, links: dict[str, str]) -> str:
    """This process's open-file links as /proc shows them, under a stand-in /proc."""
    fd_dir = proc / str(os.getpid()) / "fd"
    fd_dir.mkdir(parents=True)
    for fd, target in links.items():
        os.symlink(target, fd_dir / fd)
    return str(proc)


def test_a_gpu_device_open_blocks_the_fork_whichever_framework_opened_it(tmp_path: Path) -> None:
    # what CuPy, JAX, numba or TensorFlow leave behind: no torch, a GPU device open
    proc = fd_links(tmp_path / "gpu", {"0": "/dev/null", "7": "/dev/nvidia0"})
    assert fork_blocker(proc) == (
        "the kernel has a CUDA context (/dev/nvidia0 is open) and a forked child cannot use it"
    )
    # importing a CUDA library opens these, but no context exists yet: fork is fine
    proc = fd_links(tmp_path / "import", {"3": "/dev/nvidiactl", "4": "/dev/nvidia-uvm"})
    assert fork_blocker(proc) is None


def cgroups(root: Path, proc_self: str, files: dict[str, str]) -> str:
    """A stand-in root with /proc/self/cgroup and cgroup files under /sys/fs/cgroup."""
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/cgroup").write_text(proc_self)
    for path, text in files.items():
        (root / "sys/fs/cgroup" / path).parent.mkdir(parents=True, exist_ok=True)
        (root / "sys/fs/cgroup" / path).write_text(text)
    return str(root)


NODE = "the node's available memory"
POD = "the room left under the pod's/container's memory limit"
PARENT = "kubepods.slice/pod1.slice"
POD_V2 = f"{PARENT}/cri-abc.scope"


@pytest.mark.parametrize(
    ("proc_self", "files", "expected"),
    [
        # v2: the container's limit leaves 64 MiB
        ("0::/" + POD_V2, {f"{POD_V2}/memory.max": f"{128 << 20}\n",
                           f"{POD_V2}/memory.current": f"{64 << 20}\n"}, (64 << 20, POD)),
        # v2: no limit on the container, the pod's (its parent's) applies
        ("0::/" + POD_V2, {f"{POD_V2}/memory.max": "max\n",
                           f"{POD_V2}/memory.current": f"{1 << 30}\n",
                           f"{PARENT}/memory.max": f"{1 << 30}\n",
                           f"{PARENT}/memory.current": f"{(1 << 30) - (5 << 20)}\n"},
         (5 << 20, POD)),
        # v2 in a cgroup namespace: the container's cgroup is the root; over the limit: 0
        ("0::/\n", {"memory.max": f"{1 << 20}", "memory.current": f"{2 << 20}"}, (0, POD)),
        # v2 with no limit anywhere
        ("0::/user.slice\n", {"user.slice/memory.max": "max", "user.slice/memory.current": "1"},
         None),
        # v1: the path names a host cgroup; the container sees its own at the root
        ("12:cpu,cpuacct:/kubepods/pod1/abc\n9:memory:/kubepods/pod1/abc\n",
         {"memory/memory.limit_in_bytes": f"{256 << 20}",
          "memory/memory.usage_in_bytes": f"{200 << 20}"}, (56 << 20, POD)),
        # v1 without a limit: a huge number
        ("9:memory:/\n", {"memory/memory.limit_in_bytes": "9223372036854771712",
                          "memory/memory.usage_in_bytes": "1"}, None),
        # no memory controller at all
        ("1:name=systemd:/init.scope\n", {}, None),
    ],
)  # fmt: skip
def test_free_memory_is_the_smaller_of_the_node_and_the_cgroup(
    tmp_path: Path, proc_self: str, files: dict[str, str], expected: tuple[int, str] | None
) -> None:
    free, limit = free_memory(cgroups(tmp_path, proc_self, files))
    if expected is None:  # the node's, which moves: only its order of magnitude is checked
        assert limit == NODE
        assert abs(free - psutil.virtual_memory().available) < 1 << 30
    else:
        assert (free, limit) == expected
