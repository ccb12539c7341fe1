"""The issue's flow: a suspended notebook kernel comes back under its id when a cell runs."""

from __future__ import annotations

from browser_helpers import (
    KERNEL_IDLE,
    STATUS,
    SUSPENDED,
    entries,
    open_notebook,
    open_panel,
    run_cell,
    screenshot,
    suspend_idle,
)
from browser_lab import Lab
from playwright.sync_api import Page, expect


def test_running_a_cell_restores_the_suspended_kernel_under_its_id(page: Page, lab: Lab) -> None:
    notebook = lab.notebook("restore.ipynb")
    open_notebook(page, lab, notebook)
    kernel_id = lab.kernel_of(notebook)
    run_cell(page, "x = 41")
    status = page.locator(STATUS)
    suspend_idle(lab, kernel_id)
    expect(status).to_have_text(SUSPENDED, timeout=30_000)
    # the notebook does not look dead: its kernel reads as idle while suspended
    kernel_state = page.locator(".jp-StatusBar-TextItem").filter(has_text=KERNEL_IDLE)
    expect(kernel_state).to_be_visible(timeout=20_000)
    panel = open_panel(page)
    expect(entries(panel).filter(has_text="restore.ipynb")).to_contain_text("Suspended kernel")
    screenshot(page, "lab-suspended")  # the documentation's first picture
    expect(run_cell(page, "x + 1")).to_contain_text("42")
    assert lab.kernel_of(notebook) == kernel_id
    # the execution count goes on from the kernel's: no second [1] in the notebook
    prompts = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-InputArea-prompt")
    expect(prompts.nth(0)).to_have_text("[1]:")
    expect(prompts.nth(1)).to_have_text("[2]:")
    expect(status).to_contain_text("suspends in")
    screenshot(page.locator(".jp-StatusBar-Widget"), "statusbar-restored")
