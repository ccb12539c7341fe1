"""The saved-sessions panel and the commands, in Chromium, against a real server."""

from __future__ import annotations

import re

from browser_helpers import (
    KERNEL_IDLE,
    PANEL,
    STATUS,
    ckpt_state,
    confirm,
    image_row,
    open_notebook,
    open_panel,
    run_cell,
    saved_image_id,
    screenshot,
    toast,
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

    search = panel.get_by_role("searchbox", name="Filter saved sessions by notebook name")
    search.fill("nothing-like")
    expect(row).to_have_count(0)
    expect(panel).to_contain_text("No saved session matches")
    search.fill("DETAILS")
    expect(row).to_have_count(1)

    # keyboard: from the filter, Tab reaches the row's buttons in reading order
    search.press("Tab")
    expect(row.get_by_role("button", name="Resume details.ipynb")).to_be_focused()
    page.keyboard.press("Tab")
    expect(row.get_by_role("button", name="Resume options for details.ipynb")).to_be_focused()
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

    use_theme(page, "JupyterLab Dark")
    screenshot(page.locator(PANEL), "panel-dark")
    use_theme(page, "JupyterLab Light")

    row.get_by_role("button", name="Delete details.ipynb").click()
    # the confirmation and the notification name the image, not the notebook file
    expect(page.locator(".jp-Dialog-content")).to_contain_text(
        f"Delete image with-file ({image_id[:12]}) of details.ipynb?"
    )
    confirm(page, "Delete image")
    expect(toast(page, f"Deleted image with-file ({image_id[:12]})")).to_be_visible()
    expect(row).to_have_count(0)
    assert not any(i["id"].startswith(image_id) for i in lab.api("GET", "api/ckpt/images"))


def run_command(page: Page, label: str) -> None:
    """Run a command from the command palette, as a keyboard user does."""
    page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook").click()
    page.keyboard.press("Control+Shift+C")
    palette = page.locator(".lm-CommandPalette-input")
    expect(palette).to_be_focused()
    palette.fill(label)
    page.locator(".lm-CommandPalette-item.lm-mod-active").filter(has_text=label).click()


def test_commands_checkpoint_and_report_why_a_suspend_failed(page: Page, lab: Lab) -> None:
    notebook = lab.notebook("commands.ipynb", STEADY_KERNEL)
    open_notebook(page, lab, notebook)
    run_cell(page, "fh = open('scratch.txt', 'w'); y = 1")
    expect(page.locator(STATUS)).to_have_text("suspends in 2 h")

    run_command(page, "Save Kernel State Now")
    expect(toast(page, "Checkpoint saved")).to_contain_text("Not saved: fh")
    kernel_id = lab.kernel_of(notebook)
    # a state the user chose to keep, under a name of its own (marked in the panel)
    names = [
        i["name"] for i in lab.api("GET", "api/ckpt/images") if i.get("kernel_id") == kernel_id
    ]
    assert len(names) == 1 and re.fullmatch(r"saved-\d{4}-\d\d-\d\d-\d{4}", names[0]), names

    # on_unsaveable="keep": the kernel stays up and the notification names the variable
    run_command(page, "Suspend Kernel Now")
    expect(toast(page, "Suspend failed: variables cannot be saved")).to_contain_text("fh")
    status = page.locator(STATUS)
    expect(status).to_have_text(
        "Not suspended: fh is an open file (`del fh`, or `%ckpt exclude fh`)"
    )
    screenshot(page.locator(".jp-StatusBar-Widget"), "statusbar-not-suspended")
    # the status follows at once when the cause goes away, not at the next attempt
    run_cell(page, "del fh")
    expect(status).to_have_text("suspends in 2 h")

    run_command(page, "Show Saved Sessions")
    panel = page.locator(PANEL)
    expect(panel).to_be_visible()
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
    row.get_by_role("button", name="Resume resume.ipynb").click()
    expect(toast(page, "Resumed resume.ipynb")).to_be_visible(timeout=RESTORE_WAIT)
    expect(run_cell(page, "y * 6")).to_contain_text("42")
    assert lab.kernel_of(notebook) != old_kernel


def test_resume_without_its_notebook_opens_a_console(page: Page, lab: Lab) -> None:
    notebook = lab.notebook("gone.ipynb", STEADY_KERNEL)
    open_notebook(page, lab, notebook)
    run_cell(page, "%load_ext jupyter_ckpt")
    run_cell(page, "z = 5")
    image_id = saved_image_id(run_cell(page, "%ckpt save before-delete"))
    page.locator(".jp-mod-current .lm-TabBar-tabCloseIcon").click()
    confirm(page, "Discard")
    lab.api("DELETE", f"api/kernels/{lab.kernel_of(notebook)}")
    lab.api("DELETE", f"api/contents/{notebook}")

    row = image_row(open_panel(page), image_id)
    row.get_by_role("button", name="Resume gone.ipynb").click()
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
