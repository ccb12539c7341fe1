"""GPU tensors: restored on the same device, mapped onto fewer GPUs, refused without a GPU
(naming the device), or loaded on the CPU when asked. The GPU is a stand-in
(``fake_devices``) so this runs on any machine; the rest of each kernel is real.
"""

from __future__ import annotations

from typing import Any

import pytest
from fake_devices import FakeDeviceOps
from harness import Kernel

from jupyter_ckpt.errors import DeviceUnavailable
from jupyter_ckpt.image.devices import DeviceMapper
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


def restore_on(kernel: Kernel, gpus: int, options: str = "") -> tuple[str, list[list[Any]]]:
    """Restore the image on a node with ``gpus`` GPUs; return the output and the copies."""
    kernel.run(f"__import__('fake_devices').install(gpus={gpus})")
    kernel.run(f"for _n in {[*GPU_VARS, 'cpu_t']}: globals().pop(_n, None)")
    out = kernel.ckpt(f"restore gpu {options}")
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
