"""The GPU probe against a stand-in for NVML (the only stand-in DESIGN section 9 allows)."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from server_helpers import FakeNvml

from jupyter_ckpt.gpu import GpuProbe


def make_proc(root: Path, pid: int, ppid: int, fds: dict[str, str] | None = None) -> None:
    """A /proc entry: stat with a command name that holds spaces and parentheses."""
    entry = root / str(pid)
    (entry / "fd").mkdir(parents=True)
    (entry / "stat").write_text(f"{pid} (python (x) y) S {ppid} 1 1 0")
    for fd, target in (fds or {}).items():
        os.symlink(target, entry / "fd" / fd)


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    make_proc(tmp_path, 100, 1)  # the kernel
    make_proc(tmp_path, 101, 100)  # a worker it forked
    make_proc(tmp_path, 102, 101)  # and its child
    make_proc(tmp_path, 200, 1)  # someone else
    return tmp_path


def test_node_facts(proc):
    node = GpuProbe(FakeNvml({}), str(proc)).node()
    assert node["available"] and node["driver"] == "550.54.15" and node["cuda"] == "12.4"
    assert node["gpus"][1] == {
        "index": 1,
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": "GPU-00000001",
        "compute_capability": "9.0",
        "memory_total": 80 << 30,
        "memory_used": 2 << 30,
    }


def test_memory_of_the_whole_process_tree_per_device_without_v3_calls(proc):
    nvml = FakeNvml({0: [(100, 1 << 30), (200, 5 << 30)], 1: [(102, 2 << 30), (101, 1 << 20)]})
    probe = GpuProbe(nvml, str(proc))
    usage = probe.usage(100)
    assert usage.source == "nvml"
    assert usage.by_device == {0: 1 << 30, 1: (2 << 30) + (1 << 20)}
    assert probe.usage(200).by_device == {0: 5 << 30}


def test_v3_calls_are_used_when_the_driver_has_them(proc):
    nvml = FakeNvml({}, v3=True)
    nvml.nvmlDeviceGetComputeRunningProcesses_v3 = lambda h: [
        SimpleNamespace(pid=100, usedGpuMemory=7)
    ]
    nvml.nvmlDeviceGetGraphicsRunningProcesses_v3 = lambda h: []
    assert GpuProbe(nvml, str(proc)).usage(100).by_device == {0: 7, 1: 7}


def test_unknown_memory_still_counts_as_holding_a_gpu(proc):
    usage = GpuProbe(FakeNvml({0: [(101, None)]}), str(proc)).usage(100)
    assert usage.holds_gpu and usage.total == 0


def test_host_pids_fall_back_to_open_nvidia_devices(proc):
    make_proc(proc, 300, 1, {"3": "/dev/nvidiactl", "4": "/dev/null"})
    make_proc(proc, 301, 300, {"5": "/dev/nvidia0"})
    make_proc(proc, 400, 1, {"3": "/dev/nvidiactl", "4": "/dev/nvidia-uvm"})
    probe = GpuProbe(FakeNvml({0: [(987654, 1 << 30)]}), str(proc))  # a host PID
    usage = probe.usage(300)
    assert (usage.source, usage.holds_gpu, usage.by_device) == ("proc-fd", True, {})
    assert not probe.usage(400).holds_gpu, "CUDA loaded but no context on a GPU"


def test_without_nvml_nothing_crashes_and_it_says_so_once(proc, caplog):
    class Broken:
        calls = 0

        def nvmlInit(self) -> None:
            Broken.calls += 1
            raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    probe = GpuProbe(Broken(), str(proc))
    with caplog.at_level("INFO", logger="jupyter_ckpt.gpu"):
        assert not probe.usage(100).holds_gpu
        assert probe.memory_by_pid() == {}
        node = probe.node()
    assert not node["available"] and "libnvidia-ml" in node["reason"]
    assert Broken.calls == 1
    assert sum("NVML is not available" in r.message for r in caplog.records) == 1


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
        assert usage == {"bytes": 0, "by_device": {}, "source": "none", "holds_gpu": False}
