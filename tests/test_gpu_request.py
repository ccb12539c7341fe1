"""A kernel's own GPU demand (``request_gpu``, ``%ckpt gpu``) as the kernel side sees it
when no server answers it; the server's side is in tests/server/test_server_demand.py."""

from __future__ import annotations

import os

import pytest

import jupyter_ckpt.kernel as kernel_api
from jupyter_ckpt import gpurequest
from jupyter_ckpt.errors import GpuUnavailable


@pytest.fixture
def demand_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(gpurequest.DEMAND_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(kernel_api, "kernel_id", lambda: "k1")
    return tmp_path


def test_a_demand_no_server_takes_fails_with_the_reason(demand_dir, monkeypatch):
    monkeypatch.setattr(kernel_api, "GPU_NO_ANSWER_SECONDS", 0.3)
    with pytest.raises(GpuUnavailable, match="the server did not take the demand"):
        kernel_api.request_gpu(1024)
    assert os.listdir(demand_dir) == []  # the request is withdrawn
