"""Failures in one short sentence, the whole message behind Show details. When the panel
cannot load its list it says which part failed: the Jupyter server (stopped), or its
image store (an S3 endpoint that does not answer), whose long URL wraps inside the
panel; a list that cannot be reloaded keeps its rows, but their buttons wait. A restore
that failed says so in one sentence too."""

from __future__ import annotations

import re
import socket
from collections.abc import Callable
from typing import Any

from browser_helpers import (
    PANEL,
    STATUS,
    SUSPENDED,
    assert_inside,
    confirm,
    open_notebook,
    open_panel,
    run_cell,
    screenshot,
    toast,
    toast_action,
)
from browser_lab import RESTORE_WAIT, STEADY_KERNEL
from harness import BUCKET, CREDENTIALS, S3_TIMEOUTS
from playwright.sync_api import Page, expect

ERROR = ".jp-CkptPanel-message.jp-mod-error:not(.jp-CkptPanel-store)"


def _closed_port() -> int:
    """A loopback port nothing listens on: connections to it are refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_stopped_server_is_named_and_the_stale_list_waits(
    page: Page, start_lab: Callable[..., Any]
) -> None:
    with start_lab() as lab:
        notebook = lab.notebook("down.ipynb", STEADY_KERNEL)
        open_notebook(page, lab, notebook)
        run_cell(page, "x = 1")
        lab.api("POST", f"api/ckpt/kernels/{lab.kernel_of(notebook)}/checkpoint", {})
        panel = open_panel(page)
        details = panel.get_by_role("button", name="Details of down.ipynb")
        expect(details).to_be_enabled()
    # the server is stopped now: the next refresh fails (JupyterLab's own "Server
    # Connection Error" dialog may cover the page by then: the click goes to the button)
    panel.locator(".jp-CkptPanel-toolbar button").dispatch_event("click")
    error = panel.locator(ERROR)
    expect(error).to_contain_text(
        "The Jupyter server does not answer: it may have stopped, or the network is down."
    )
    expect(error).not_to_contain_text("server extension")
    expect(error).to_contain_text("as it was last loaded")
    for name in ("Details of down.ipynb", "Resume down.ipynb", "Delete down.ipynb"):
        expect(panel.get_by_role("button", name=name)).to_be_disabled()
    screenshot(page.locator(PANEL), "panel-server-down")


def test_an_unreachable_store_is_named_and_its_url_wraps(
    page: Page, start_lab: Callable[..., Any]
) -> None:
    url = f"s3://{BUCKET}/" + "team-notebooks-checkpoints-" * 6 + "images"
    options = {
        "endpoint_url": f"http://127.0.0.1:{_closed_port()}",
        **CREDENTIALS,
        **S3_TIMEOUTS,
    }
    with start_lab(url, {"ImageStore": {"storage_options": options}}) as lab:
        page.goto(f"{lab.url}/lab?reset&token={lab.token}")
        panel = open_panel(page)
        error = panel.locator(ERROR)
        expect(error).to_contain_text(
            "The server cannot use its image store: cannot reach the store.", timeout=60_000
        )
        expect(error).not_to_contain_text("server extension")
        details = error.locator(".jp-CkptPanel-storeError")
        expect(details).to_be_hidden()  # the URL waits behind Show details
        error.locator("summary").filter(has_text="Show details").click()
        expect(details).to_contain_text(re.compile(rf"cannot reach the store {re.escape(url)}"))
        assert_inside(details, page.locator(PANEL))
        screenshot(page.locator(PANEL), "panel-store-unreachable")


def test_a_failed_restore_is_one_sentence_with_the_rest_behind_details(
    page: Page, start_lab: Callable[..., Any]
) -> None:
    with start_lab() as lab:
        notebook = lab.notebook("broken.ipynb", STEADY_KERNEL)
        open_notebook(page, lab, notebook)
        kernel_id = lab.kernel_of(notebook)
        run_cell(page, "weights = list(range(50_000))")
        lab.api("POST", f"api/ckpt/kernels/{kernel_id}/suspend", {})
        expect(page.locator(STATUS)).to_have_text(SUSPENDED, timeout=RESTORE_WAIT)
        for chunk in (lab.root.parent / "store").rglob("*"):  # damaged on disk since
            if "chunks" in chunk.parts and chunk.is_file():
                chunk.write_bytes(b"altered" + chunk.read_bytes()[7:])

        run_cell(page, "print('running')")
        lead = f"Could not restore kernel {kernel_id[:8]}"
        failed = toast(page, lead)
        expect(failed).to_be_visible(timeout=RESTORE_WAIT)
        text = failed.inner_text()
        assert re.fullmatch(rf"{lead}: [^/]+\.", text) and len(text) <= 140, text
        toast_action(page, lead, "Show details").click()
        dialog = page.locator(".jp-Dialog-content")
        expect(dialog).to_contain_text("runs without its saved variables; the image is kept")
        confirm(page, "Close")
