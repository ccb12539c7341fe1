"""The panel's list as a file browser's: a context menu and keys on each image, multiple
selection and bulk deletes, a remembered sort order, and a filter by notebook, variable,
label and trigger."""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterator

import pytest
from browser_helpers import (
    assert_contrast,
    confirm,
    entries,
    image_row,
    open_panel,
    toast,
    wait_until,
)
from browser_lab import OUTPUT, STEADY_KERNEL, Lab
from harness import read_only
from jupyter_client import BlockingKernelClient
from playwright.sync_api import Locator, Page, expect


def run_code(lab: Lab, kernel_id: str, code: str) -> None:
    """Run ``code`` in the kernel as a second frontend does, through its connection file."""
    client = BlockingKernelClient(
        connection_file=str(lab.root.parent / "runtime" / f"kernel-{kernel_id}.json")
    )
    client.load_connection_file()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=90)
        reply = client.execute_interactive(code, timeout=90, output_hook=lambda msg: None)
        assert reply["content"]["status"] == "ok", reply["content"]
    finally:
        client.stop_channels()


def save_images(
    lab: Lab, name: str, steps: list[tuple[str, str]], keep_kernel: bool = False
) -> list[str]:
    """A notebook ``name`` whose kernel runs each step's code, then saves an image named
    as the step says; the kernel is shut down after (unless ``keep_kernel``), so that
    every image is only saved. The images' ids, oldest first."""
    lab.notebook(name, STEADY_KERNEL)
    session = lab.api(
        "POST",
        "api/sessions",
        {"path": name, "name": name, "type": "notebook", "kernel": {"name": STEADY_KERNEL}},
    )
    kernel_id = session["kernel"]["id"]
    ids = []
    for code, image in steps:
        run_code(lab, kernel_id, code)
        ids.append(
            lab.api("POST", f"api/ckpt/kernels/{kernel_id}/checkpoint", {"name": image})["id"]
        )
    if not keep_kernel:
        lab.api("DELETE", f"api/sessions/{session['id']}")
    return ids


def open_lab(page: Page, lab: Lab, workspace: str) -> Locator:
    """JupyterLab with no document open, and the panel."""
    page.goto(f"{lab.url}/lab/workspaces/{workspace}?reset&token={lab.token}")
    return open_panel(page)


def menu_item(page: Page, label: str | re.Pattern[str]) -> Locator:
    return page.locator(".lm-Menu-item").filter(
        has=page.locator(".lm-Menu-itemLabel").filter(
            has_text=re.compile(rf"^{re.escape(label)}$") if isinstance(label, str) else label
        )
    )


def titles(panel: Locator) -> list[str]:
    """The notebooks of the entries, in order (a title is followed by its state)."""
    texts = entries(panel).locator(":scope > .jp-CkptRow-title").all_inner_texts()
    return [re.sub(r"\.ipynb.*", ".ipynb", text, flags=re.S) for text in texts]


def selected(panel: Locator) -> Locator:
    return panel.locator(".jp-CkptRow.jp-mod-selected")


def shot(page: Page, name: str, *parts: Locator) -> None:
    """A screenshot of what ``parts`` cover together (the panel and a menu over it)."""
    boxes = [box for part in parts if (box := part.bounding_box())]
    left, top = min(b["x"] for b in boxes), min(b["y"] for b in boxes)
    right = max(b["x"] + b["width"] for b in boxes)
    bottom = max(b["y"] + b["height"] for b in boxes)
    OUTPUT.mkdir(parents=True, exist_ok=True)
    page.screenshot(
        path=OUTPUT / f"{name}.png",
        clip={"x": left, "y": top, "width": right - left, "height": bottom - top},
    )


@pytest.fixture
def clipboard_page(page: Page) -> Iterator[Page]:
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    yield page


def test_context_menu_and_keys_act_on_a_row(clipboard_page: Page, lab: Lab) -> None:
    page = clipboard_page
    one, two = save_images(lab, "ctx.ipynb", [("alpha = 1", "ctx-one"), ("beta = 2", "ctx-two")])
    (gone,) = save_images(lab, "ctx-gone.ipynb", [("gamma = 3", "ctx-gone")])
    lab.api("DELETE", "api/contents/ctx-gone.ipynb")
    panel = open_lab(page, lab, "panel-list-ctx")
    panel.get_by_role("searchbox", name="Filter saved sessions").fill("ctx")
    head = image_row(panel, two)
    expect(entries(panel)).to_have_count(2)

    head.locator(":scope > .jp-CkptRow-title").click(button="right")
    menu = page.locator(".lm-Menu")
    for label in (
        "Resume",
        "Details",
        "Copy Image ID",
        "Show Notebook in File Browser",
        "Delete",
        "Delete Older Images of ctx.ipynb",
        "Delete Images Older Than…",
    ):
        expect(menu_item(page, label)).to_have_count(1)
    shot(page, "panel-context-menu", panel, menu)
    menu_item(page, "Copy Image ID").click()
    wait_until(lambda: page.evaluate("navigator.clipboard.readText()") == two, 30, "the id copied")

    head.locator(":scope > .jp-CkptRow-title").click(button="right")
    menu_item(page, "Show Notebook in File Browser").click()
    browser_item = page.locator("#filebrowser .jp-DirListing-item.jp-mod-selected")
    expect(browser_item).to_have_count(1)
    expect(browser_item).to_contain_text("ctx.ipynb")
    page.locator(".jp-SideBar [data-id='jupyter-ckpt-sessions']").click()
    expect(panel).to_be_visible()

    # the notebook deleted: the item stays, disabled, and says why
    image_row(panel, gone).locator(":scope > .jp-CkptRow-title").click(button="right")
    item = menu_item(page, "Show Notebook in File Browser (the notebook was deleted)")
    expect(item).to_have_class(re.compile(r"\blm-mod-disabled\b"))
    page.keyboard.press("Escape")
    expect(menu).to_have_count(0)

    # Details from the menu of an older image
    older = image_row(panel, one)
    older.locator(":scope > .jp-CkptRow-facts").click(button="right")
    menu_item(page, "Details").click()
    expect(page.locator(".jp-Dialog tr[data-variable='alpha']")).to_be_visible()
    confirm(page, "Close")

    # keys on the entry in focus: Shift+F10 opens its menu; Delete asks as the button
    # does; Enter resumes
    head.focus()
    page.keyboard.press("Shift+F10")
    expect(menu_item(page, "Copy Image ID")).to_be_visible()
    page.keyboard.press("Escape")
    expect(menu).to_have_count(0)
    head.focus()
    page.keyboard.press("Delete")
    expect(page.locator(".jp-Dialog-content")).to_contain_text(
        f"Delete image ctx-two ({two[:8]}) of ctx.ipynb?"
    )
    confirm(page, "Cancel")
    head.focus()
    page.keyboard.press("Enter")
    expect(page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")).to_be_visible(timeout=90_000)
    wait_until(
        lambda: any(s["path"] == "ctx.ipynb" for s in lab.api("GET", "api/sessions")),
        90,
        "ctx.ipynb resumed",
    )
    assert any(i["id"] == two for i in lab.api("GET", "api/ckpt/images"))


def test_select_several_images_and_delete_them_at_once(page: Page, lab: Lab) -> None:
    a_ids = save_images(lab, "bulk-a.ipynb", [("a = 1", "a1"), ("a = 2", "a2"), ("a = 3", "a3")])
    b_ids = save_images(lab, "bulk-b.ipynb", [("b = 1", "b1"), ("b = 2", "b2")])
    panel = open_lab(page, lab, "panel-list-bulk")
    panel.get_by_role("searchbox", name="Filter saved sessions").fill("bulk-")
    expect(entries(panel)).to_have_count(2)
    rows = {i: image_row(panel, i) for i in a_ids + b_ids}  # unfolded
    status = panel.locator(".jp-CkptPanel-selection [role='status']")

    # click, Ctrl+click, Shift+click, as in the File Browser
    rows[a_ids[2]].locator(":scope > .jp-CkptRow-title").click()
    expect(selected(panel)).to_have_count(1)
    expect(status).to_have_text(re.compile(r"^1 image selected \([\d.]+ [KM]?B\)$"))
    # readable on the selection's tint
    assert_contrast(rows[a_ids[2]].locator(":scope > .jp-CkptRow-facts"))
    assert_contrast(rows[a_ids[2]].locator(":scope > .jp-CkptRow-title .jp-CkptBadge"))
    # a3 (head of bulk-a) to a1 (its oldest): the rows between too, as shown
    rows[a_ids[0]].locator(":scope > .jp-CkptRow-facts").click(modifiers=["Shift"])
    expect(status).to_have_text(re.compile(r"^3 images selected"))
    rows[b_ids[1]].locator(":scope > .jp-CkptRow-title").click(modifiers=["Control"])
    expect(selected(panel)).to_have_count(4)
    rows[b_ids[1]].locator(":scope > .jp-CkptRow-title").click(modifiers=["Control"])
    expect(selected(panel)).to_have_count(3)
    page.keyboard.press("Escape")
    expect(selected(panel)).to_have_count(0)
    page.keyboard.press("Control+a")
    expect(status).to_have_text(re.compile(r"^5 images selected"))
    page.keyboard.press("Escape")
    expect(status).to_have_text("")

    # the context menu on one of the rows selected deletes them all, asking once
    rows[b_ids[1]].locator(":scope > .jp-CkptRow-title").click()
    rows[b_ids[0]].locator(":scope > .jp-CkptRow-facts").click(modifiers=["Control"])
    rows[b_ids[0]].locator(":scope > .jp-CkptRow-facts").click(button="right")
    shot(page, "panel-selection", panel, page.locator(".lm-Menu"))
    menu_item(page, "Delete 2 Selected Images").click()
    expect(page.locator(".jp-Dialog-content")).to_contain_text(
        re.compile(r"Delete 2 images \([\d.]+ [KM]?B\) of bulk-b\.ipynb\?")
    )
    confirm(page, "Delete 2 images")
    expect(toast(page, "Deleted 2 images")).to_be_visible()
    remaining = {i["id"] for i in lab.api("GET", "api/ckpt/images")}
    assert not remaining & set(b_ids), remaining
    expect(entries(panel)).to_have_count(1)

    # a notebook's older images, its newest kept
    rows[a_ids[2]].locator(":scope > .jp-CkptRow-title").click(button="right")
    menu_item(page, "Delete Older Images of bulk-a.ipynb").click()
    confirm(page, "Delete 2 images")
    wait_until(
        lambda: {i["id"] for i in lab.api("GET", "api/ckpt/images")} & set(a_ids) == {a_ids[2]},
        30,
        "bulk-a's older images to go",
    )

    # images older than a date, of those the list shows
    tomorrow = datetime.date.today() + datetime.timedelta(days=1)
    for day, deletes in ((datetime.date(2000, 1, 1), False), (tomorrow, True)):
        rows[a_ids[2]].locator(":scope > .jp-CkptRow-title").click(button="right")
        menu_item(page, "Delete Images Older Than…").click()
        page.locator(".jp-Dialog input[type='date']").fill(day.isoformat())
        # the confirmation follows at once when there is something to delete
        page.locator(".jp-Dialog").get_by_role("button", name="Continue").click()
        if not deletes:
            expect(toast(page, "No image shown was saved before 2000-01-01")).to_be_visible()
    expect(page.locator(".jp-Dialog-content")).to_contain_text("Delete 1 image")
    confirm(page, "Delete 1 image")
    expect(entries(panel)).to_have_count(0)
    assert a_ids[2] not in {i["id"] for i in lab.api("GET", "api/ckpt/images")}


def test_bulk_delete_keeps_what_a_kernel_needs_and_waits_for_the_store(
    page: Page, lab: Lab
) -> None:
    older, newest = save_images(
        lab, "keep.ipynb", [("k = 1", "keep-1"), ("k = 2", "keep-2")], keep_kernel=True
    )
    kernel_id = lab.kernel_of("keep.ipynb")
    panel = open_lab(page, lab, "panel-list-keep")
    panel.get_by_role("searchbox", name="Filter saved sessions").fill("keep.ipynb")
    rows = {i: image_row(panel, i) for i in (older, newest)}
    rows[newest].locator(":scope > .jp-CkptRow-title").click()
    rows[older].locator(":scope > .jp-CkptRow-facts").click(modifiers=["Control"])
    delete = panel.get_by_role("button", name="Delete selected")

    # a store that cannot be written: no bulk delete, saying why, as for one image
    with read_only(lab.root.parent / "store"):
        run_code(lab, kernel_id, "k = 3")
        try:
            lab.api("POST", f"api/ckpt/kernels/{kernel_id}/checkpoint", {})
            raise AssertionError("a checkpoint on a read-only store succeeded")
        except AssertionError as exc:
            assert ": 503 " in str(exc), exc
        expect(panel.locator(".jp-CkptPanel-store")).to_be_visible(timeout=15_000)
        expect(delete).to_have_attribute("aria-disabled", "true")
        expect(delete).to_have_attribute("title", re.compile("no image can be deleted"))
        rows[older].locator(":scope > .jp-CkptRow-facts").click(button="right")
        expect(menu_item(page, "Delete 2 Selected Images")).to_have_class(
            re.compile(r"\blm-mod-disabled\b")
        )
        expect(menu_item(page, "Delete Older Images of keep.ipynb")).to_have_class(
            re.compile(r"\blm-mod-disabled\b")
        )
        page.keyboard.press("Escape")

    # writable again, and the kernel suspended to its newest image: that one is kept
    suspended = lab.api("POST", f"api/ckpt/kernels/{kernel_id}/suspend", {})["id"]
    expect(panel.locator(".jp-CkptPanel-store")).to_have_count(0, timeout=15_000)
    rows[suspended] = image_row(panel, suspended)
    expect(rows[suspended].locator(".jp-CkptBadge.jp-mod-suspended").first).to_be_visible()
    rows[suspended].locator(":scope > .jp-CkptRow-title").click()
    # its older images are folded again under the new head
    image_row(panel, older).locator(":scope > .jp-CkptRow-facts").click(modifiers=["Control"])
    expect(delete).not_to_have_attribute("aria-disabled", "true")
    delete.click()
    expect(page.locator(".jp-Dialog-content")).to_contain_text(
        "1 image is kept: a kernel needs it."
    )
    confirm(page, "Delete 1 image")
    expect(toast(page, "Deleted 1 image")).to_be_visible()
    images = {i["id"]: i["state"] for i in lab.api("GET", "api/ckpt/images")}
    assert older not in images and images.get(suspended) == "suspended", images
    lab.api("DELETE", f"api/kernels/{kernel_id}")


def test_sort_is_remembered_and_the_filter_knows_variables_labels_triggers(
    page: Page, lab: Lab
) -> None:
    save_images(lab, "sort-a.ipynb", [("big = bytes(3_000_000)", "sort-a-img")])
    save_images(lab, "sort-c.ipynb", [("needle_var = 1", "sort-c-img")])
    save_images(lab, "sort-b.ipynb", [("small = 1", "sort-b-img")])
    panel = open_lab(page, lab, "panel-list-sort")
    search = panel.get_by_role("searchbox", name="Filter saved sessions")
    search.fill("sort-")
    expect(entries(panel)).to_have_count(3)
    assert titles(panel) == ["sort-b.ipynb", "sort-c.ipynb", "sort-a.ipynb"]
    sort = panel.get_by_role("combobox", name="Sort saved sessions")
    try:
        sort.select_option(label="Name")
        expect(panel.get_by_role("list", name="Saved sessions, name")).to_be_visible()
        assert titles(panel) == ["sort-a.ipynb", "sort-b.ipynb", "sort-c.ipynb"]
        sort.select_option(label="Largest first")
        wait_until(lambda: titles(panel)[0] == "sort-a.ipynb", 10, "the largest first")
        wait_until(
            lambda: '"size"' in lab.api("GET", "lab/api/settings/jupyter-ckpt:plugin")["raw"],
            30,
            "the sort order saved in the settings",
        )

        # remembered across a reload (in the extension's settings)
        panel = open_lab(page, lab, "panel-list-sort")
        expect(panel.get_by_role("combobox", name="Sort saved sessions")).to_have_value("size")
        search = panel.get_by_role("searchbox", name="Filter saved sessions")
        search.fill("sort-")
        expect(entries(panel)).to_have_count(3)
        assert titles(panel)[0] == "sort-a.ipynb"

        for query, shown in (
            ("var:needle_var", {"sort-c.ipynb"}),
            ("needle_var", {"sort-c.ipynb"}),
            ("label:sort-b-img", {"sort-b.ipynb"}),
            ("trigger:manual sort-", {"sort-a.ipynb", "sort-b.ipynb", "sort-c.ipynb"}),
            ("notebook:sort-c", {"sort-c.ipynb"}),
        ):
            search.fill(query)
            expect(entries(panel)).to_have_count(len(shown))
            assert set(titles(panel)) == shown, query
        search.fill("trigger:idle sort-")
        expect(panel).to_contain_text("No saved session matches “trigger:idle sort-”")
    finally:
        panel.get_by_role("combobox", name="Sort saved sessions").select_option(
            label="Newest first"
        )
