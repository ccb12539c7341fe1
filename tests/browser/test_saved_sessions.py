"""The saved-sessions panel and the commands, in Chromium, against a real server."""

from __future__ import annotations

import re

from browser_helpers import (
    KERNEL_IDLE,
    PANEL,
    STATUS,
    assert_contrast,
    ckpt_state,
    confirm,
    entries,
    image_row,
    open_notebook,
    open_panel,
    run_cell,
    run_command,
    saved_image_id,
    screenshot,
    toast,
    toast_action,
    wait_until,
)
from browser_lab import RESTORE_WAIT, STEADY_KERNEL, Lab
from playwright.sync_api import Page, expect


def use_theme(page: Page, theme: str) -> None:
    page.locator(".lm-MenuBar-itemLabel:text-is('Settings')").click()
    page.locator(".lm-Menu-itemLabel:text-is('Theme')").click()
    page.locator(f".lm-Menu-itemLabel:text-is('{theme}')").click()
    expect(page.locator("body")).to_have_attribute("data-jp-theme-name", theme)
    expect(page.locator("#jupyterlab-splash")).to_have_count(0)  # shown while switching


def test_panel_lists_an_image_shows_details_and_deletes_it(page: Page, lab: Lab) -> None:
    open_notebook(page, lab, lab.notebook("details.ipynb", STEADY_KERNEL))
    run_cell(page, "%load_ext jupyter_ckpt")
    run_cell(page, "import numpy as np; a = np.zeros((3, 4), 'float32')")
    run_cell(page, "x = 41; fh = open('scratch.txt', 'w')")
    image_id = saved_image_id(run_cell(page, "%ckpt save with-file"))

    panel = open_panel(page)
    row = image_row(panel, image_id)
    expect(row).to_contain_text("details.ipynb")
    expect(row).to_contain_text("with-file")
    expect(row).to_contain_text("Not saved: fh")
    expect(row.locator(".jp-CkptRow-compat")).to_have_count(0)  # restorable: nothing loud
    expect(row.locator("time")).to_have_attribute("title", re.compile(r"2\d\d\d"))  # exact time
    screenshot(page.locator(PANEL), "panel")

    search = panel.get_by_role("searchbox", name="Filter saved sessions")
    shown = entries(panel).count()
    search.fill("nothing-like")
    expect(row).to_have_count(0)
    # it counts what the list shows, entries, not the images folded in them
    see = "the one there is" if shown == 1 else f"all {shown}"
    expect(panel).to_contain_text(
        f"No saved session matches “nothing-like”. Clear the filter to see {see}."
    )
    search.fill("DETAILS")
    expect(row).to_have_count(1)

    # keyboard: the entry is one tab stop; arrows move among its buttons; Esc on the
    # Resume menu gives the keyboard back to the button that opened it
    search.press("Tab")  # the sort order beside it, then the list
    expect(panel.get_by_role("combobox", name="Sort saved sessions")).to_be_focused()
    page.keyboard.press("Tab")
    expect(row).to_be_focused()
    page.keyboard.press("ArrowRight")
    expect(row.get_by_role("button", name="Resume details.ipynb")).to_be_focused()
    page.keyboard.press("ArrowRight")
    options = row.get_by_role("button", name="Resume options for details.ipynb")
    expect(options).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator(".jp-CkptResumeMenu")).to_be_visible()
    page.keyboard.press("Escape")
    expect(page.locator(".jp-CkptResumeMenu")).to_have_count(0)
    expect(options).to_be_focused()
    page.keyboard.press("Tab")
    expect(row.get_by_role("button", name="Details of details.ipynb")).to_be_focused()
    page.keyboard.press("Enter")
    dialog = page.locator(".jp-Dialog")
    expect(dialog.locator("tr[data-variable='fh']")).to_contain_text(
        re.compile(r"not saved: \w+Error")
    )
    expect(dialog.locator("tr[data-variable='x']")).to_contain_text("saved")
    expect(dialog.locator("tr[data-variable='a']")).to_contain_text("float32 3 \u00d7 4")
    screenshot(dialog.locator(".jp-Dialog-content"), "details")
    confirm(page, "Close")

    # readable in both themes, at both widths: Delete and the "Not saved" line
    delete = row.get_by_role("button", name="Delete details.ipynb")
    for theme, suffix in (("JupyterLab Light", ""), ("JupyterLab Dark", "-dark")):
        use_theme(page, theme)
        assert_contrast(delete)
        assert_contrast(row.locator(".jp-CkptRow-problem"))
        for width in (1400, 800):
            page.set_viewport_size({"width": width, "height": 900})
            screenshot(page, f"lab-panel{suffix}-{width}")
        page.set_viewport_size({"width": 1400, "height": 900})
    screenshot(page.locator(PANEL), "panel-dark")
    use_theme(page, "JupyterLab Light")

    row.get_by_role("button", name="Delete details.ipynb").click()
    # the confirmation and the notification name the image, not the notebook file
    expect(page.locator(".jp-Dialog-content")).to_contain_text(
        f"Delete image with-file ({image_id[:8]}) of details.ipynb?"
    )
    confirm(page, "Delete image")
    expect(toast(page, f"Deleted image with-file ({image_id[:8]})")).to_be_visible()
    expect(row).to_have_count(0)
    assert not any(i["id"].startswith(image_id) for i in lab.api("GET", "api/ckpt/images"))

    # Save Now twice with a change between, then once without: two images, each
    # labelled with what wrote it; the notebook's kernel runs from the newest, and
    # Details says what changed since the one before
    kernel_id = lab.kernel_of("details.ipynb")
    run_command(page, "Save Kernel State Now")
    expect(toast(page, "Kernel state saved").first).to_be_visible()
    run_cell(page, "del a; b = 1")
    run_command(page, "Save Kernel State Now")
    run_command(page, "Save Kernel State Now")
    expect(toast(page, "Nothing changed since image details")).to_be_visible()
    mine = [i for i in lab.api("GET", "api/ckpt/images") if i["kernel_id"] == kernel_id]
    assert [i["trigger"] for i in mine] == ["manual", "manual"], mine
    newest = max(mine, key=lambda i: i["created"])
    head = image_row(panel, newest["id"])
    expect(head.locator(".jp-CkptRow-trigger").first).to_have_text("manual")
    expect(head.locator(".jp-CkptRow-inUse")).to_have_text("in use by details.ipynb")
    expect(panel.locator(".jp-CkptRow-inUse")).to_have_count(1)
    screenshot(page.locator(PANEL), "panel-in-use")
    head.get_by_role("button", name="Details of details.ipynb").first.click()
    dialog = page.locator(".jp-Dialog")
    expect(dialog.locator("[data-change='added']")).to_have_text("Added: b")
    expect(dialog.locator("[data-change='removed']")).to_have_text("Removed: a")
    screenshot(dialog.locator(".jp-Dialog-content"), "details-diff")
    confirm(page, "Close")


def test_commands_checkpoint_and_report_why_a_suspend_failed(page: Page, lab: Lab) -> None:
    notebook = lab.notebook("commands.ipynb", STEADY_KERNEL)
    open_notebook(page, lab, notebook)
    run_cell(page, "fh = open('scratch.txt', 'w'); y = 1")
    # an autosave may have found fh already: then the status says so up front
    expect(page.locator(STATUS)).to_have_text(
        re.compile(r"^(suspends in 2 h|Won't suspend: fh cannot be saved)$")
    )

    run_command(page, "Save Kernel State Now")
    # the variable that could not be saved, in plain words, with what to do about it
    expect(toast(page, "Kernel state saved")).to_contain_text("fh cannot be saved.")
    expect(toast_action(page, "Kernel state saved", "Show details")).to_be_visible()
    expect(toast_action(page, "Kernel state saved", "Exclude it")).to_be_visible()
    kernel_id = lab.kernel_of(notebook)

    def images() -> list[dict]:
        return [i for i in lab.api("GET", "api/ckpt/images") if i.get("kernel_id") == kernel_id]

    # a state the user chose to keep: labelled so, under the notebook's name
    assert [(i["trigger"], i["name"]) for i in images()] == [("manual", "commands")]

    # on_unsaveable="keep": the kernel stays up and the notification names the variable,
    # whole, with no setting names, and offers the ways out
    run_command(page, "Suspend Kernel Now")
    refused = toast(page, "Not suspended. fh cannot be saved.")
    expect(refused).to_be_visible()
    expect(refused).not_to_contain_text("on_unsaveable")
    for action in ("Show details", "Exclude it", "Suspend anyway, losing fh"):
        expect(toast_action(page, "Not suspended.", action)).to_be_visible()
    status = page.locator(STATUS)
    expect(status).to_have_text("Won't suspend: fh cannot be saved")
    screenshot(page, "notification-unsaveable")
    screenshot(page.locator(".jp-StatusBar-Widget"), "statusbar-not-suspended")
    toast_action(page, "Not suspended.", "Show details").click()
    expect(page.locator(".jp-Dialog-content")).to_contain_text("fh is an open file")
    confirm(page, "Close")
    toast_action(page, "Not suspended.", "Exclude it").click()
    expect(toast(page, "fh will be left out of this kernel's saved state")).to_be_visible()
    # the status follows at once when the cause goes away, not at the next attempt
    run_cell(page, "del fh")
    expect(status).to_have_text("suspends in 2 h")

    # the palette lists the commands beside JupyterLab's kernel commands, and finds them
    # by "resume" and "checkpoint" too
    page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook").click()
    page.keyboard.press("Control+Shift+C")
    palette = page.locator(".lm-CommandPalette-input")
    for query, label in (
        ("resume", "Resume Saved Session…"),
        ("checkpoint", "Save Kernel State Now (Checkpoint)"),
    ):
        palette.fill(query)
        expect(page.locator(".lm-CommandPalette-item").filter(has_text=label)).to_be_visible()
    # the search covers the category: under "Kernel Operations" (not "Kernel")
    palette.fill("operations show saved sessions")
    expect(
        page.locator(".lm-CommandPalette-item").filter(has_text="Show Saved Sessions")
    ).to_be_visible()
    page.keyboard.press("Escape")

    run_command(page, "Show Saved Sessions")
    panel = page.locator(PANEL)
    expect(panel).to_be_visible()
    # the keyboard goes with it: to its first entry
    expect(panel.locator(".jp-CkptPanel-list > .jp-CkptRow").first).to_be_focused()
    expect(panel.locator(".jp-CkptRow").first).to_contain_text("commands.ipynb")

    # a checkpoint made elsewhere reaches the open panel through the server's events,
    # well before the panel's once-a-minute refresh
    expect(panel).to_have_attribute("aria-busy", "false")  # the refresh on show is over
    lab.api("POST", f"api/ckpt/kernels/{kernel_id}/checkpoint", {"name": "from-elsewhere"})
    expect(panel.locator(".jp-CkptRow").filter(has_text="from-elsewhere")).to_be_visible(
        timeout=15_000
    )

    page.locator(".lm-MenuBar-itemLabel:text-is('Kernel')").click()
    for label in ("Save Kernel State Now", "Suspend Kernel Now", "Show Saved Sessions"):
        expect(page.locator(f".lm-Menu-itemLabel:text-is('{label}')")).to_be_visible()
    page.keyboard.press("Escape")

    # the panel is part of the layout JupyterLab saves: open again after a reload
    def left_current() -> str | None:
        data = lab.api("GET", "lab/api/workspaces/commands-ipynb")["data"]
        return data.get("layout-restorer:data", {}).get("left", {}).get("current")

    wait_until(lambda: left_current() == PANEL[1:], 30, "the layout saved with the panel open")
    page.goto(f"{lab.url}/lab/workspaces/commands-ipynb")
    expect(page.locator(PANEL)).to_be_visible(timeout=60_000)


def test_resume_an_image_into_its_notebook(page: Page, lab: Lab) -> None:
    notebook = lab.notebook("resume.ipynb", STEADY_KERNEL)
    open_notebook(page, lab, notebook)
    run_cell(page, "%load_ext jupyter_ckpt")
    run_cell(page, "y = 7")
    image_id = saved_image_id(run_cell(page, "%ckpt save for-resume"))
    old_kernel = lab.kernel_of(notebook)
    # the notebook is closed and its kernel gone: only the image remains
    page.locator(".jp-mod-current .lm-TabBar-tabCloseIcon").click()
    confirm(page, "Discard")
    expect(page.locator(".jp-NotebookPanel")).to_have_count(0)
    lab.api("DELETE", f"api/kernels/{old_kernel}")

    row = image_row(open_panel(page), image_id)
    # a double click runs one resume: the row's buttons are disabled while it runs
    resume = row.get_by_role("button", name="Resume resume.ipynb")
    resume.dblclick()
    expect(resume).to_be_disabled()
    expect(toast(page, "Resumed resume.ipynb")).to_be_visible(timeout=RESTORE_WAIT)
    expect(run_cell(page, "y * 6")).to_contain_text("42")
    expect(toast(page, "Resumed resume.ipynb")).to_have_count(1)
    assert lab.kernel_of(notebook) != old_kernel


def test_renamed_then_deleted_notebook_follows_and_asks_where_to_resume(
    page: Page, lab: Lab
) -> None:
    notebook = lab.notebook("gone.ipynb", STEADY_KERNEL)
    open_notebook(page, lab, notebook)
    run_cell(page, "%load_ext jupyter_ckpt")
    run_cell(page, "z = 5")
    image_id = saved_image_id(run_cell(page, "%ckpt save before-delete"))
    panel = open_panel(page)
    expect(image_row(panel, image_id).locator(".jp-CkptRow-title")).to_contain_text("gone.ipynb")

    # renamed here: the entry follows at once, under the new name
    page.locator(".lm-MenuBar-itemLabel:text-is('File')").click()
    page.locator(".lm-Menu-itemLabel:text-is('Rename Notebook…')").click()
    name = page.locator(".jp-Dialog input")
    name.fill("moved.ipynb")
    confirm(page, "Rename")
    row = image_row(panel, image_id)
    expect(row.locator(".jp-CkptRow-title")).to_contain_text("moved.ipynb")
    expect(row.get_by_role("button", name="Resume moved.ipynb")).to_be_visible()

    page.locator(".jp-mod-current .lm-TabBar-tabCloseIcon").click()
    confirm(page, "Discard")
    expect(page.locator(".jp-NotebookPanel")).to_have_count(0)
    lab.api("DELETE", f"api/kernels/{lab.kernel_of('moved.ipynb')}")
    lab.api("DELETE", "api/contents/moved.ipynb")

    # the file is gone: Resume asks where, rather than guessing
    row.get_by_role("button", name="Resume moved.ipynb").click()
    dialog = page.locator(".jp-Dialog")
    expect(dialog).to_contain_text("moved.ipynb was renamed or deleted")
    for choice in ("Pick a Notebook…", "New Notebook", "Console", "Cancel"):
        expect(dialog.get_by_role("button", name=choice)).to_be_visible()
    screenshot(page, "resume-ask-where")
    consoles_before = {s["id"] for s in lab.api("GET", "api/sessions")}
    confirm(page, "Console")
    console = page.locator(".jp-CodeConsole")
    expect(console).to_be_visible(timeout=RESTORE_WAIT)
    # the console clears its cells when it connects to its kernel: a cell run before
    # that (nothing to run it on) would vanish; the kernel's banner shows it connected
    expect(console.locator(".jp-CodeConsole-banner")).to_contain_text(
        "IPython", timeout=RESTORE_WAIT
    )
    prompt = console.locator(".jp-CodeConsole-promptCell")
    prompt.locator(".cm-content").click()
    expect(prompt.locator(".cm-editor")).to_have_class(re.compile(r"\bcm-focused\b"))
    page.keyboard.type("z * 2")
    expect(prompt.locator(".cm-content")).to_have_text("z * 2")
    page.keyboard.press("Shift+Enter")
    expect(console.locator(".jp-CodeConsole-content .jp-OutputArea-output")).to_have_text(
        "10", timeout=RESTORE_WAIT
    )

    # the console's own images are titled after it and the notebook it came from (an
    # earlier test's console may still be there)
    [console_kernel] = [
        s["kernel"]["id"]
        for s in lab.api("GET", "api/sessions")
        if s["type"] == "console" and s["id"] not in consoles_before
    ]
    later = lab.api("POST", f"api/ckpt/kernels/{console_kernel}/checkpoint", {})
    expect(image_row(open_panel(page), later["id"]).locator(".jp-CkptRow-title")).to_contain_text(
        re.compile(r"^Console \d+ \(from moved\.ipynb\)")
    )


def test_resume_into_a_new_notebook_leaves_the_source_notebook_alone(page: Page, lab: Lab) -> None:
    notebook = lab.notebook("source.ipynb", STEADY_KERNEL)
    open_notebook(page, lab, notebook)
    run_cell(page, "%load_ext jupyter_ckpt")
    run_cell(page, "w = 11")
    image_id = saved_image_id(run_cell(page, "%ckpt save for-copy"))
    source = next(s for s in lab.api("GET", "api/sessions") if s["path"] == notebook)

    row = image_row(open_panel(page), image_id)
    # the entry says its state: its notebook's kernel runs
    expect(row.locator(".jp-CkptBadge")).to_have_text("Running")
    row.get_by_role("button", name="Resume options for source.ipynb").click()
    menu = page.locator(".jp-CkptResumeMenu")
    for label in ("Resume in Its Notebook", "Resume in New Notebook", "Resume in Console"):
        expect(menu.locator(f".lm-Menu-itemLabel:text-is('{label}')")).to_be_visible()
    screenshot(page, "resume-menu")
    menu.locator(".lm-Menu-itemLabel:text-is('Resume in New Notebook')").click()
    expect(toast(page, "Resumed source.ipynb in Untitled")).to_be_visible(timeout=RESTORE_WAIT)

    # the new notebook is in front, on the restored kernel, with the image's variables
    expect(page.locator(".jp-mod-current .lm-TabBar-tabLabel")).to_have_text(
        re.compile(r"^Untitled\d*\.ipynb$")
    )
    expect(page.locator(".jp-StatusBar-TextItem").filter(has_text=KERNEL_IDLE)).to_be_visible(
        timeout=RESTORE_WAIT
    )
    expect(run_cell(page, "w * 3")).to_contain_text("33")
    sessions = lab.api("GET", "api/sessions")
    copies = [s for s in sessions if re.fullmatch(r"Untitled\d*\.ipynb", s["path"])]
    assert len(copies) == 1, sessions
    # the source notebook keeps its session and its kernel, still running (its activity
    # may have moved on: an autosave of it may have run meanwhile)
    kept = [(s["id"], s["kernel"]["id"]) for s in sessions if s["path"] == notebook]
    assert kept == [(source["id"], source["kernel"]["id"])]
    assert copies[0]["kernel"]["id"] != source["kernel"]["id"]
    assert ckpt_state(lab, source["kernel"]["id"]) == "running"
