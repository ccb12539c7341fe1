"""An idle notebook kernel is suspended and shown as such, and its image is kept."""

from __future__ import annotations

import re

from browser_helpers import (
    PANEL,
    STATUS,
    SUSPENDED,
    assert_contrast,
    open_notebook,
    open_panel,
    run_cell,
    screenshot,
    suspend_idle,
)
from browser_lab import Lab
from playwright.sync_api import Page, expect


def test_idle_kernel_is_suspended_and_its_image_kept(page: Page, lab: Lab) -> None:
    notebook = lab.notebook("idle.ipynb")
    open_notebook(page, lab, notebook)
    kernel_id = lab.kernel_of(notebook)
    run_cell(page, "x = 41")
    status = page.locator(STATUS)
    expect(status).to_contain_text("suspends in")

    suspend_idle(lab, kernel_id)
    expect(status).to_have_text(SUSPENDED, timeout=30_000)
    assert_contrast(status)  # AA on the light theme's status bar
    # the kernel keeps its id: the notebook's session still points at it
    assert lab.kernel_of(notebook) == kernel_id
    screenshot(page.locator(".jp-StatusBar-Widget"), "statusbar-suspended")
    # the notebook's toolbar keeps its kernel-state buttons, disabled, saying why
    toolbar = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-NotebookPanel-toolbar")
    suspend = toolbar.locator("[data-jp-item-name='ckpt-suspend'] button")
    expect(suspend).to_be_disabled()
    expect(suspend).to_have_attribute(
        "aria-label", re.compile(r"Not available now: the kernel is suspended")
    )
    # JupyterLab's own kernel indicator in the toolbar is marked suspended
    indicator = toolbar.locator("[data-jp-item-name='executionProgress']")
    expect(indicator).to_have_class(re.compile(r"\bjp-mod-ckptSuspended\b"))
    expect(indicator).to_have_attribute("title", re.compile(r"^Kernel suspended"))
    # and so does the Kernel menu, in a few words
    page.locator(".lm-MenuBar-itemLabel:text-is('Kernel')").click()
    item = page.locator(".lm-Menu-item[data-command='jupyter-ckpt:suspend']")
    expect(item).to_have_attribute("aria-disabled", "true")
    expect(item).to_contain_text("Suspend Kernel Now (kernel suspended)")
    page.keyboard.press("Escape")

    panel = open_panel(page)
    row = panel.locator(".jp-CkptRow").filter(has_text="idle.ipynb")
    expect(row.locator(".jp-CkptBadge.jp-mod-suspended")).to_have_text("Suspended kernel")
    expect(row.get_by_role("button", name="Open idle.ipynb")).to_be_visible()

    # the image a suspended kernel needs cannot be deleted; the button says why
    delete = row.get_by_role("button", name="Delete idle.ipynb")
    expect(delete).to_be_disabled()  # aria-disabled: its tooltip still shows on hover
    expect(delete).to_have_attribute("title", re.compile("A suspended kernel needs this image"))
    screenshot(page.locator(PANEL), "panel-suspended")
    assert any(i.get("kernel_id") == kernel_id for i in lab.api("GET", "api/ckpt/images"))

    # shut down here: the entry follows at once (well before the panel's once-a-minute
    # refresh), and its button resumes the image instead of opening a kernel that is gone
    page.locator(".lm-MenuBar-itemLabel:text-is('Kernel')").click()
    page.locator(".lm-Menu-itemLabel:text-is('Shut Down Kernel')").click()
    expect(row.locator(".jp-CkptBadge")).to_have_text("Saved", timeout=15_000)
    expect(row.get_by_role("button", name="Resume idle.ipynb")).to_be_visible()
    expect(indicator).not_to_have_class(re.compile(r"\bjp-mod-ckptSuspended\b"))
