"""The kernel-state commands act on the widget in front, notebook or console, and the
command palette finds them by the words users look for."""

from __future__ import annotations

import re

from browser_helpers import (
    STATUS,
    SUSPENDED,
    ckpt_state,
    open_console,
    open_notebook,
    run_cell,
    wait_until,
)
from browser_lab import STEADY_KERNEL, Lab
from playwright.sync_api import Locator, Page, expect

SUSPEND = "jupyter-ckpt:suspend"


def kernel_menu_item(page: Page, command: str) -> Locator:
    """The Kernel menu, opened, and its item for ``command``."""
    page.locator(".lm-MenuBar-itemLabel:text-is('Kernel')").click()
    return page.locator(f".lm-Menu-item[data-command='{command}']")


def new_console(page: Page, lab: Lab) -> str:
    """A new console on a kernel of its own, in front and connected; its kernel's id."""
    before = {s["id"] for s in lab.api("GET", "api/sessions")}
    open_console(page)
    console = page.locator(".jp-CodeConsole:not(.lm-mod-hidden)")
    expect(console.locator(".jp-CodeConsole-banner")).to_contain_text("IPython", timeout=90_000)
    [session] = [
        s
        for s in lab.api("GET", "api/sessions")
        if s["type"] == "console" and s["id"] not in before
    ]
    return session["kernel"]["id"]


def test_suspend_acts_on_the_console_in_front(page: Page, lab: Lab) -> None:
    notebook = lab.notebook("focus.ipynb", STEADY_KERNEL)
    open_notebook(page, lab, notebook)
    run_cell(page, "n = 1")
    notebook_kernel = lab.kernel_of(notebook)
    console_kernel = new_console(page, lab)
    assert console_kernel != notebook_kernel

    # the console is in front: Kernel > Suspend Kernel Now suspends its kernel, not the
    # notebook's
    item = kernel_menu_item(page, SUSPEND)
    expect(item).not_to_have_attribute("aria-disabled", "true")
    item.click()
    wait_until(lambda: ckpt_state(lab, console_kernel) == "suspended", 90, "the console's suspend")
    assert ckpt_state(lab, notebook_kernel) == "running"
    # the page has heard of it: the status bar follows the console in front
    expect(page.locator(STATUS)).to_have_text(SUSPENDED, timeout=30_000)
    # now blocked in the console, which says why
    item = kernel_menu_item(page, SUSPEND)
    expect(item).to_have_attribute("aria-disabled", "true")
    expect(item).to_contain_text("Suspend Kernel Now (kernel suspended)")
    page.keyboard.press("Escape")

    # the notebook in front again: its kernel runs, so the commands are offered for it
    page.locator(".lm-TabBar-tab").filter(has_text="focus.ipynb").click()
    item = kernel_menu_item(page, SUSPEND)
    expect(item).not_to_have_attribute("aria-disabled", "true")
    expect(item).to_have_text(re.compile(r"^Suspend Kernel Now"))
    expect(item).not_to_contain_text("(kernel suspended)")
    page.keyboard.press("Escape")

    # the palette finds the commands by "suspend", "save kernel" and "checkpoint"
    page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook").click()
    page.keyboard.press("Control+Shift+C")
    palette = page.locator(".lm-CommandPalette-input")
    expect(palette).to_be_focused()
    for query, label in (
        ("suspend", "Suspend Kernel Now"),
        ("save kernel", "Save Kernel State Now"),
        ("checkpoint", "Save Kernel State Now"),
    ):
        palette.fill(query)
        expect(page.locator(".lm-CommandPalette-item").filter(has_text=label)).to_be_visible()
    page.keyboard.press("Escape")
