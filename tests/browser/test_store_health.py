"""A store that cannot be written: the status says so and why, the panel shows a banner
and keeps Delete disabled, a failed save says why in one short sentence, and all of it
clears once a save succeeds again."""

from __future__ import annotations

import re

from browser_helpers import (
    PANEL,
    confirm,
    image_row,
    open_notebook,
    open_panel,
    run_cell,
    run_command,
    screenshot,
    toast,
    toast_action,
)
from browser_lab import STEADY_KERNEL, Lab
from harness import read_only
from playwright.sync_api import Page, expect


def test_a_read_only_store_shows_a_banner_and_blocks_delete(page: Page, lab: Lab) -> None:
    open_notebook(page, lab, lab.notebook("health.ipynb", STEADY_KERNEL))
    kernel_id = lab.kernel_of("health.ipynb")
    run_cell(page, "h = 1")
    checkpoint = f"api/ckpt/kernels/{kernel_id}/checkpoint"
    image = lab.api("POST", checkpoint, {"name": "before-read-only"})
    panel = open_panel(page)
    row = panel.locator(f".jp-CkptRow[data-image-id='{image['id']}']")
    delete = row.get_by_role("button", name=re.compile(r"^Delete "))
    expect(delete).not_to_have_attribute("aria-disabled", "true")
    banner = panel.locator(".jp-CkptPanel-store")

    with read_only(lab.root.parent / "store"):
        run_cell(page, "h = 2")
        try:
            lab.api("POST", checkpoint, {})
            raise AssertionError("a checkpoint on a read-only store succeeded")
        except AssertionError as exc:
            assert ": 503 " in str(exc), exc
        store = lab.api("GET", "api/ckpt/status")["store"]
        assert (store["ok"], "read-only" in (store["error"] or "")) == (False, True), store
        # the failed save's event reaches the page: the banner and a disabled Delete
        expect(banner).to_contain_text("The store cannot be written now", timeout=15_000)
        expect(banner).to_contain_text("read-only")
        expect(delete).to_have_attribute("aria-disabled", "true")
        expect(delete).to_have_attribute("title", re.compile("no image can be deleted"))
        screenshot(page.locator(PANEL), "panel-store-read-only")
        # Save Now fails in one short sentence, no server path; the rest behind details
        run_command(page, "Save Kernel State Now")
        failed = toast(page, "Could not save the kernel state")
        expect(failed).to_have_text("Could not save the kernel state: the store is read-only.")
        toast_action(page, "Could not save the kernel state", "Show details").click()
        expect(page.locator(".jp-Dialog-content")).to_contain_text("mount it writable")
        confirm(page, "Close")

    # writable again: the next save succeeds, and everything clears
    lab.api("POST", checkpoint, {})
    assert lab.api("GET", "api/ckpt/status")["store"]["ok"] is True
    expect(banner).to_have_count(0, timeout=15_000)
    # the image is an older one of the entry now, folded
    delete = image_row(panel, image["id"]).get_by_role("button", name=re.compile(r"^Delete "))
    expect(delete).not_to_have_attribute("aria-disabled", "true")
