"""After "Suspend anyway": the restore writes no error into the notebook about the variable
left out; a notification says what happened and how to have it back, the panel's entry
shows it left out, and a button there has the kernel save it again."""

from __future__ import annotations

from browser_helpers import (
    STATUS,
    SUSPENDED,
    open_notebook,
    open_panel,
    run_cell,
    run_command,
    screenshot,
    toast,
    toast_action,
)
from browser_lab import RESTORE_WAIT, STEADY_KERNEL, Lab
from playwright.sync_api import Page, expect


def test_a_variable_left_out_by_suspend_anyway_is_said_plainly_and_can_come_back(
    page: Page, lab: Lab
) -> None:
    notebook = lab.notebook("left-out.ipynb", STEADY_KERNEL)
    open_notebook(page, lab, notebook)
    kernel_id = lab.kernel_of(notebook)
    run_cell(page, "gen = (i for i in range(3))")
    run_cell(page, "kept = 41")
    # announced once the cell is done, not at an autosave minutes later
    expect(page.locator(STATUS)).to_have_text("Won't suspend: gen cannot be saved")

    run_command(page, "Suspend Kernel Now")
    toast_action(page, "Not suspended.", "Suspend anyway, losing gen").click()
    expect(page.locator(STATUS)).to_have_text(SUSPENDED, timeout=RESTORE_WAIT)

    output = run_cell(page, "kept + 1")
    expect(output).to_contain_text("42")
    # nothing red in the notebook's saved output about a choice the user made
    expect(output.locator("[data-mime-type='application/vnd.jupyter.stderr']")).to_have_count(0)
    expect(output).not_to_contain_text("ckpt exclude")
    notice = toast(page, "The kernel was restored without gen, left out of its saved state.")
    expect(notice).to_contain_text("In [1] for gen")
    expect(toast_action(page, "restored without gen", "Save it again")).to_be_visible()
    screenshot(page, "notification-left-out")

    # the entry shows the variable left out, and has the kernel save it again
    panel = open_panel(page)
    head = panel.locator(".jp-CkptPanel-list > .jp-CkptRow").filter(has_text="left-out.ipynb")
    line = head.locator(":scope > .jp-CkptRow-leftOut")
    expect(line).to_contain_text("Left out: gen")
    screenshot(panel, "panel-left-out")
    line.get_by_role("button", name="Save gen again in left-out.ipynb").click()
    expect(line).to_contain_text("saved again from the next save on")
    expect(toast(page, "gen will be saved in this kernel's images again")).to_be_visible()
    # the kernel saves it again: its next save says it cannot be saved, not left out
    run_cell(page, "gen = (i for i in range(3))")
    reply = lab.api("POST", f"api/ckpt/kernels/{kernel_id}/checkpoint", {})
    assert list(reply["lost"]) == ["gen"], reply
