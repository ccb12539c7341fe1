"""The GPU probe against a stand-in for NVML (the only stand-in DESIGN section 9 allows)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from harness import wait_for
from server_helpers import FakeNvml

from jupyter_ckpt.gpu import GpuProbe
from jupyter_ckpt.hub import nodelabels


@dataclass
class Tree:
    kernel: int
    child: int
    grandchild: int
    stranger: int


@pytest.fixture
def tree() -> Iterator[Tree]:
    """Real processes: a "kernel" (sh) with a child sh that has a sleeping child of its
    own, and an unrelated process."""
    kernel = subprocess.Popen(["sh", "-c", 'sh -c "sleep 60 & wait" & wait'])
    stranger = subprocess.Popen(["sleep", "60"])
    root = psutil.Process(kernel.pid)
    wait_for(lambda: len(root.children(recursive=True)) == 2, 10, "the grandchild")
    (child,) = root.children()
    (grandchild,) = child.children()
    yield Tree(kernel.pid, child.pid, grandchild.pid, stranger.pid)
    for process in (grandchild, child):
        with contextlib.suppress(psutil.NoSuchProcess):  # exits once its child is gone
            process.kill()
    for popen in (kernel, stranger):
        popen.kill()
        popen.wait()


def fd_links(root: Path, pid: int, links: dict[str, str]) -> None:
    """Open-file links of ``pid`` as /proc shows them, under a stand-in /proc."""
    fd_dir = root / str(pid) / "fd"
    fd_dir.mkdir(parents=True)
    for fd, target in links.items():
        os.symlink(target, fd_dir / fd)


def test_node_facts():
    node = GpuProbe(FakeNvml({})).node()
    assert node["available"] and node["driver"] == "550.54.15" and node["cuda"] == "12.4"
    assert node["gpus"][1] == {
        "index": 1,
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": "GPU-00000001",
        "compute_capability": "9.0",
        "memory_total": 80 << 30,
        "memory_used": 2 << 30,
    }


def test_memory_of_the_whole_process_tree_per_device_without_v3_calls(tree):
    nvml = FakeNvml(
        {
            0: [(tree.kernel, 1 << 30), (tree.stranger, 5 << 30)],
            1: [(tree.grandchild, 2 << 30), (tree.child, 1 << 20)],
        }
    )
    probe = GpuProbe(nvml)
    usage = probe.usage(tree.kernel)
    assert usage.source == "nvml"
    assert usage.by_device == {0: 1 << 30, 1: (2 << 30) + (1 << 20)}
    assert probe.usage(tree.stranger).by_device == {0: 5 << 30}


def test_v3_calls_are_used_when_the_driver_has_them(tree):
    nvml = FakeNvml({}, v3=True)
    nvml.nvmlDeviceGetComputeRunningProcesses_v3 = lambda h: [
        SimpleNamespace(pid=tree.kernel, usedGpuMemory=7)
    ]
    nvml.nvmlDeviceGetGraphicsRunningProcesses_v3 = lambda h: []
    assert GpuProbe(nvml).usage(tree.kernel).by_device == {0: 7, 1: 7}


def test_unknown_memory_still_counts_as_holding_a_gpu(tree):
    usage = GpuProbe(FakeNvml({0: [(tree.child, None)]})).usage(tree.kernel)
    assert usage.holds_gpu and usage.total == 0


def test_host_pids_fall_back_to_open_nvidia_devices(tree, tmp_path):
    fd_links(tmp_path, tree.kernel, {"3": "/dev/nvidiactl", "4": "/dev/null"})
    fd_links(tmp_path, tree.grandchild, {"5": "/dev/nvidia0"})
    fd_links(tmp_path, tree.stranger, {"3": "/dev/nvidiactl", "4": "/dev/nvidia-uvm"})
    probe = GpuProbe(FakeNvml({0: [(987654, 1 << 30)]}), str(tmp_path))  # a host PID
    usage = probe.usage(tree.kernel)
    assert (usage.source, usage.holds_gpu, usage.by_device) == ("proc-fd", True, {})
    assert not probe.usage(tree.stranger).holds_gpu, "CUDA loaded but no context on a GPU"


def test_utilization_per_process_of_the_tree_only(tree):
    nvml = FakeNvml({0: [(tree.grandchild, 1 << 30), (tree.stranger, 1 << 30)]})
    nvml.utilization = {0: [(tree.grandchild, 87), (tree.stranger, 99)]}
    probe = GpuProbe(nvml)
    assert probe.usage(tree.kernel).busy == {0: 87}
    nvml.utilization = {}  # no sample in the window: idle
    assert probe.usage(tree.kernel).busy == {}


def test_device_utilization_counts_only_for_the_sole_process_on_it(tree):
    nvml = FakeNvml({0: [(tree.kernel, 1 << 30)], 1: [(tree.child, 1), (tree.stranger, 1)]})
    nvml.device_utilization = {0: 64, 1: 90}  # no per-process samples (MIG, old drivers)
    assert GpuProbe(nvml).usage(tree.kernel).busy == {0: 64}


def test_without_nvml_nothing_crashes_and_it_says_so_once(tree, caplog):
    class Broken:
        calls = 0

        def nvmlInit(self) -> None:
            Broken.calls += 1
            raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    probe = GpuProbe(Broken())
    with caplog.at_level("INFO", logger="jupyter_ckpt.gpu"):
        assert not probe.usage(tree.kernel).holds_gpu
        assert probe.memory_by_pid() == {}
        node = probe.node()
    assert not node["available"] and "libnvidia-ml" in node["reason"]
    assert Broken.calls == 1
    assert sum("NVML is not available" in r.message for r in caplog.records) == 1


def test_free_memory_counts_every_process_and_the_node_publishes_it():
    nvml = FakeNvml({0: [(1, 30 << 30)], 1: []})  # 80 GiB GPUs; 1 and 2 GiB held before
    probe = GpuProbe(nvml)
    assert probe.free_memory() == {0: (80 - 1 - 30) << 30, 1: (80 - 2) << 30}
    # the hub's placement prefers nodes with the memory free now: the freer GPU's MiB
    assert nodelabels.labels(probe) == {"jupyter-ckpt.io/gpu.memory.free": str(78 * 1024)}

    class Broken:
        def nvmlInit(self) -> None:
            raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    assert GpuProbe(Broken()).free_memory() == {}
    assert nodelabels.labels(GpuProbe(Broken())) == {}, "no GPU, no label"


def test_real_pynvml_on_this_machine():
    """This process never creates a CUDA context: whether the machine has GPUs or not, it
    holds no GPU memory; without NVML the probe says why, with it the GPUs are listed."""
    probe = GpuProbe()
    node = probe.node()
    usage = probe.usage(os.getpid()).to_json()
    assert (usage["bytes"], usage["by_device"]) == (0, {})
    if node["available"]:
        assert node["gpus"] and all(gpu["memory_total"] > 0 for gpu in node["gpus"])
        assert os.getpid() not in probe.memory_by_pid()
    else:
        assert node["reason"].startswith("NVML") and node["gpus"] == []
        assert usage == {
            "bytes": 0,
            "by_device": {},
            "busy": {},
            "source": "none",
            "holds_gpu": False,
        }
