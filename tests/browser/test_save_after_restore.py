"""The first save after a restore keeps the restored image when nothing changed."""

from __future__ import annotations

from browser_helpers import (
    STATUS,
    SUSPENDED,
    open_notebook,
    run_cell,
    run_command,
    suspend_idle,
    toast,
)
from browser_lab import RESTORE_WAIT, Lab
from playwright.sync_api import Page, expect


def test_save_right_after_a_restore_writes_no_image(page: Page, lab: Lab) -> None:
    notebook = lab.notebook("unchanged.ipynb")
    open_notebook(page, lab, notebook)
    kernel_id = lab.kernel_of(notebook)
    run_cell(page, "import numpy as np; a = np.arange(100_000); f = lambda x: x + 1")
    suspend_idle(lab, kernel_id)
    expect(page.locator(STATUS)).to_have_text(SUSPENDED, timeout=30_000)
    [suspended] = [i for i in lab.api("GET", "api/ckpt/images") if i["kernel_id"] == kernel_id]

    # a cell that only reads restores the kernel and changes nothing
    expect(run_cell(page, "print(f(a[-1]))")).to_contain_text("100000", timeout=RESTORE_WAIT)
    run_command(page, "Save Kernel State Now")
    expect(toast(page, "Nothing changed since image")).to_contain_text(suspended["id"][:8])
    mine = [i["id"] for i in lab.api("GET", "api/ckpt/images") if i["kernel_id"] == kernel_id]
    assert mine == [suspended["id"]], mine
