"""The server with its S3 store down (moto's server behind a forwarder that is stopped):
every part of the extension starts regardless, the status says why the store is
unreachable, REST answers 503 with one line, a suspend that cannot write its image leaves
the kernel running, and once the store is back the suspended kernels are listed and idle
kernels are suspended again, without a restart."""

from __future__ import annotations

import itertools
import json
import logging
import re
from pathlib import Path
from typing import Any

import numpy as np
from harness import (
    BUCKET,
    CREDENTIALS,
    S3_TIMEOUTS,
    Outage,
    S3Paths,
    read_only,
    s3_store,
    save_namespace,
)
from jupyter_ckpt_server.storehealth import StoreHealth
from server_helpers import ServerProcess, poll
from tornado.httpclient import HTTPClientError

UNREACHABLE = re.compile(
    r"cannot reach the store s3://\S+ \([^\n]+\); check that it is up and reachable from "
    r"here \(endpoint, network, credentials\), then try again"
)
SUSPENDED_EARLIER = "5e1f0000-0000-4000-8000-000000000001"


def suspended_earlier(outage: Outage, tmp_path: Path) -> str:
    """What an earlier server left in the store: an image and the record of the kernel
    suspended to it. Returns the image id."""
    store = s3_store(outage.url, tmp_path, "tester", "secret")
    image = save_namespace(store, {"steps": np.arange(5)}, name="earlier")
    store.records.put(
        {
            "kernel_id": SUSPENDED_EARLIER,
            "kernel_name": "python3",
            "path": None,
            "env": {},
            "image_id": image["id"],
            "suspended_at": "2026-12-01T10:00:00+00:00",
            "sessions": [],
        }
    )
    return image["id"]


async def kernel_status(server: ServerProcess, kernel_id: str) -> dict[str, Any]:
    status = await server.get(f"ckpt/status?kernel_id={kernel_id}")
    return status["kernels"][0]


async def test_s3_down_at_start_then_back(outage: Outage, tmp_path: Path) -> None:
    image_id = suspended_earlier(outage, tmp_path)
    options = {"endpoint_url": outage.url, **CREDENTIALS, **S3_TIMEOUTS}
    server = ServerProcess(
        tmp_path,
        {"idle_timeout": 2, "check_interval": 1, "suspend_on_shutdown": False},
        {
            "JUPYTER_CKPT_STORE": f"s3://{BUCKET}/{tmp_path.name}",
            "JUPYTER_CKPT_USER": "tester",
            "JUPYTER_CKPT_SECRET_FILE": str(tmp_path / "secret"),
            "FSSPEC_S3": json.dumps(options),
        },
    )
    outage.stop()
    await server.start()
    try:
        status = await server.get("ckpt/status")
        store = status["store"]
        assert store["ok"] is False and UNREACHABLE.fullmatch(store["error"]), store
        assert [k["kernel_id"] for k in status["kernels"]] == []
        assert server.log().count("The store is unavailable") == 1

        try:
            await server.get("ckpt/images")
            raise AssertionError("listing images with the store down succeeded")
        except HTTPClientError as exc:
            assert exc.code == 503, exc
            assert UNREACHABLE.fullmatch(json.loads(exc.response.body)["message"])

        # the idle monitor runs: its suspend fails, and the kernel keeps running
        kernel_id = (await server.fetch("POST", "kernels", {"name": "python3"}))["id"]

        async def suspend_failed() -> bool:
            kernel = await kernel_status(server, kernel_id)
            failure = kernel.get("last_failure") or {}
            return failure.get("action") == "suspend" and kernel["state"] == "running"

        await poll(suspend_failed, timeout=120, what="an idle suspend to fail")
        failure = (await kernel_status(server, kernel_id))["last_failure"]
        assert "cannot reach the store" in failure["reason"], failure
        assert (await server.run_cell(kernel_id, "print(6 * 7)")).strip() == "42"

        outage.start()

        async def store_back() -> bool:
            return (await server.get("ckpt/status"))["store"]["ok"]

        await poll(store_back, timeout=60, what="the server to see the store again")
        kernels = {k["kernel_id"]: k for k in (await server.get("ckpt/status"))["kernels"]}
        assert kernels[SUSPENDED_EARLIER]["state"] == "suspended"
        assert kernels[SUSPENDED_EARLIER]["image"] == image_id
        assert "The store s3://" in server.log() and "answers again" in server.log()

        last: dict[str, Any] = {}

        async def suspended() -> bool:
            last.update(await kernel_status(server, kernel_id))
            return last["state"] == "suspended"

        try:
            await poll(suspended, timeout=120, what="the idle kernel to be suspended")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; its status: {last}") from None
    finally:
        outage.start()
        server.kill()


async def test_a_suspend_or_checkpoint_during_an_outage_answers_503(
    outage: Outage, tmp_path: Path
) -> None:
    """The store goes down under a running kernel: a suspend and a checkpoint answer 503
    with the store's one line, and the kernel runs on with its variables."""
    server = ServerProcess(tmp_path, {}, S3Paths(tmp_path, outage.url, S3_TIMEOUTS).env())
    await server.start()
    try:
        kernel_id = (await server.fetch("POST", "kernels", {"name": "python3"}))["id"]
        await server.run_cell(kernel_id, "x = 41")
        outage.stop()
        for action in ("suspend", "checkpoint"):
            try:
                await server.fetch("POST", f"ckpt/kernels/{kernel_id}/{action}", {})
                raise AssertionError(f"a {action} with the store down succeeded")
            except HTTPClientError as exc:
                message = json.loads(exc.response.body)["message"]
                assert (exc.code, "cannot reach the store" in message) == (503, True), message
        outage.start()
        assert (await server.run_cell(kernel_id, "print(x + 1)")).strip() == "42"
    finally:
        outage.start()
        server.kill()


async def test_a_store_that_turns_read_only_is_not_reported_ok(tmp_path: Path) -> None:
    """Every save fails on a store that turned read-only while it still reads: the status
    says the store is not ok, and why, until a save succeeds again."""
    server = ServerProcess(tmp_path)
    await server.start()
    try:
        kernel_id = (await server.fetch("POST", "kernels", {"name": "python3"}))["id"]
        await server.run_cell(kernel_id, "x = 41")
        checkpoint = f"ckpt/kernels/{kernel_id}/checkpoint"
        with read_only(tmp_path / "store"):
            try:
                await server.fetch("POST", checkpoint, {})
                raise AssertionError("a checkpoint on a read-only store succeeded")
            except HTTPClientError as exc:
                assert exc.code == 503, exc
            store = (await server.get("ckpt/status"))["store"]
            assert (store["ok"], "read-only" in (store["error"] or "")) == (False, True), store
        await server.fetch("POST", checkpoint, {})
        assert (await server.get("ckpt/status"))["store"]["ok"] is True
    finally:
        server.kill()


def test_the_retry_delay_doubles_up_to_its_cap() -> None:
    """After a long outage the retry comes within ``max_delay`` of the store's return,
    not hours later."""
    health = StoreHealth("s3://b/u", logging.getLogger("test"), first_delay=1, max_delay=60)
    delays = list(itertools.islice(health.delays(), 12))
    assert delays[:7] == [1, 2, 4, 8, 16, 32, 60]
    assert set(delays[6:]) == {60}
