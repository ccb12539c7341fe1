"""A notebook's saved sessions stay one entry through a rename, a reload and a second
tab; a new notebook that takes the old name starts an entry of its own."""

from __future__ import annotations

import re

from browser_helpers import confirm, entries, open_notebook, open_panel, run_cell, wait_until
from browser_lab import STEADY_KERNEL, Lab
from playwright.sync_api import Locator, Page, expect


def entry_of(panel: Locator, name: str) -> Locator:
    """The entries titled ``name`` (the title is followed by the entry's state)."""
    title = panel.page.locator(".jp-CkptRow-title").filter(
        has_text=re.compile(rf"^{re.escape(name)}")
    )
    return entries(panel).filter(has=title)


def images_of(lab: Lab, kernel_id: str) -> list[dict]:
    return [i for i in lab.api("GET", "api/ckpt/images") if i.get("kernel_id") == kernel_id]


def test_one_entry_per_notebook_across_rename_reload_and_tabs(page: Page, lab: Lab) -> None:
    open_notebook(page, lab, lab.notebook("draft.ipynb", STEADY_KERNEL))
    kernel_id = lab.kernel_of("draft.ipynb")
    run_cell(page, "v = 1")
    lab.api("POST", f"api/ckpt/kernels/{kernel_id}/checkpoint", {})

    page.locator(".lm-MenuBar-itemLabel:text-is('File')").click()
    page.locator(".lm-Menu-itemLabel:text-is('Rename Notebook…')").click()
    page.locator(".jp-Dialog input").fill("final.ipynb")
    confirm(page, "Rename")
    wait_until(
        lambda: any(s["path"] == "final.ipynb" for s in lab.api("GET", "api/sessions")),
        30,
        "the session to follow the rename",
    )
    # a save after the rename, from the kernel started as draft.ipynb's
    run_cell(page, "w = 2")
    lab.api("POST", f"api/ckpt/kernels/{kernel_id}/checkpoint", {})
    images = images_of(lab, kernel_id)
    assert len(images) == 2, images
    assert {i["notebook_current_path"] for i in images} == {"final.ipynb"}, images
    assert len({i["notebook_id"] for i in images}) == 1, images

    def one_entry(panel: Locator, drafts: int = 0) -> None:
        expect(entry_of(panel, "final.ipynb")).to_have_count(1)
        expect(entry_of(panel, "draft.ipynb")).to_have_count(drafts)
        # both images in it: the head, and one older folded inside
        older = entry_of(panel, "final.ipynb").locator(".jp-CkptRow[data-image-id]")
        expect(older).to_have_count(1)

    panel = open_panel(page)
    one_entry(panel)
    # the head and the older image have buttons of their own names
    buttons = entry_of(panel, "final.ipynb").locator("button[aria-label]")
    labels = buttons.evaluate_all("buttons => buttons.map(b => b.getAttribute('aria-label'))")
    assert len(labels) == len(set(labels)), labels
    # after a reload, which forgets the renames this page saw
    page.reload()
    one_entry(open_panel(page))
    # in a second tab that never saw the rename
    other = page.context.new_page()
    other.goto(f"{lab.url}/lab/workspaces/second-tab?reset&token={lab.token}")
    one_entry(open_panel(other))

    # a new notebook of the old name: an entry of its own, never the renamed one's
    open_notebook(other, lab, lab.notebook("draft.ipynb", STEADY_KERNEL))
    new_kernel = lab.kernel_of("draft.ipynb")
    assert new_kernel != kernel_id
    run_cell(other, "u = 3")
    lab.api("POST", f"api/ckpt/kernels/{new_kernel}/checkpoint", {})
    [new_image] = images_of(lab, new_kernel)
    assert new_image["notebook_id"] != images[0]["notebook_id"]
    for tab in (page, other):
        panel = open_panel(tab)
        fresh = entry_of(panel, "draft.ipynb")
        expect(fresh).to_have_count(1, timeout=15_000)
        expect(fresh.locator(".jp-CkptRow[data-image-id]")).to_have_count(0)
        one_entry(panel, drafts=1)
