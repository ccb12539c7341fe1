"""Reopening JupyterLab leaves suspended kernels suspended; resume and idle cycles keep one
kernel and one entry per notebook, with the notebook named in every later image."""

from __future__ import annotations

import psutil
from browser_helpers import (
    STATUS,
    SUSPENDED,
    ckpt_state,
    confirm,
    entries,
    image_row,
    open_console,
    open_notebook,
    open_panel,
    page_problems,
    run_cell,
    saved_image_id,
    screenshot,
    suspend_idle,
    toast,
    wait_for_kernel,
    wait_until,
)
from browser_lab import RESTORE_WAIT, Lab
from playwright.sync_api import Page, expect


def connections(lab: Lab, kernel_id: str) -> int:
    return next(k["connections"] for k in lab.api("GET", "api/kernels") if k["id"] == kernel_id)


def has_process(kernel_id: str) -> bool:
    """A process launched for ``kernel_id`` exists (its connection file names the id)."""
    for process in psutil.process_iter(["cmdline"]):
        if any(f"kernel-{kernel_id}.json" in part for part in process.info["cmdline"] or ()):
            return True
    return False


def runs_in_a_process(lab: Lab, kernel_id: str) -> bool:
    """The kernel has a live kernel process (one launched for it, or one that stood by and
    that its restore took over: its connection file names another id)."""
    pid = lab.api("GET", f"api/idle-clock/{kernel_id}")["pid"]
    try:
        return pid is not None and "ipykernel" in " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return False


def test_reopening_lab_does_not_wake_suspended_kernels(page: Page, lab: Lab) -> None:
    problems = page_problems(page)
    # this test's sessions: other tests' kernels may still run on the shared server
    before = {s["id"] for s in lab.api("GET", "api/sessions")}

    def mine() -> list[dict]:
        return [s for s in lab.api("GET", "api/sessions") if s["id"] not in before]

    first, second = lab.notebook("reopen-a.ipynb"), lab.notebook("reopen-b.ipynb")
    open_notebook(page, lab, second)
    run_cell(page, "b = 2")
    page.goto(f"{lab.url}/lab/workspaces/{second.replace('.', '-')}/tree/{first}")
    current_tab = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.jp-mod-current")
    expect(current_tab).to_contain_text(first, timeout=60_000)
    wait_for_kernel(page, lab, first)
    run_cell(page, "a = 1")
    open_console(page)
    expect(current_tab).to_contain_text("Console")
    wait_until(lambda: len(mine()) >= 3, 60, "three sessions")
    kernels = [s["kernel"]["id"] for s in mine()]
    console = next(s["kernel"]["id"] for s in mine() if s["type"] == "console")
    suspend_idle(lab, *kernels)

    # JupyterLab reconnects to all three and asks for kernel info, comm info and history
    page.reload()
    wait_until(
        lambda: all(connections(lab, k) > 0 for k in kernels),
        90,
        lambda: (
            f"reconnects; connections now {[connections(lab, k) for k in kernels]} "
            f"to {kernels} (the console's: {console}), sessions {lab.api('GET', 'api/sessions')}"
        ),
    )
    tabs = page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab")
    status = page.locator(STATUS)
    # a console's kernel has its status item too
    tabs.filter(has_text="Console").click()
    expect(status).to_have_text(SUSPENDED, timeout=30_000)
    tabs.filter(has_text=first).click()
    # the status follows the server: suspended, not "Restoring…" (defect 3)
    expect(status).to_have_text(SUSPENDED, timeout=30_000)
    assert all(ckpt_state(lab, k) == "suspended" for k in kernels)
    assert not any(has_process(k) for k in kernels)

    # running a cell restores that notebook's kernel only
    expect(run_cell(page, "a + 41")).to_contain_text("42")
    woken = lab.kernel_of(first)
    assert ckpt_state(lab, woken) == "running" and runs_in_a_process(lab, woken)
    asleep = [k for k in kernels if k != woken]
    assert console in asleep
    assert all(ckpt_state(lab, k) == "suspended" and not has_process(k) for k in asleep)
    expect(status).to_contain_text("suspends in")
    assert problems == [], "the page logged errors"


def test_resume_of_a_closed_notebook_replaces_its_suspended_kernel(page: Page, lab: Lab) -> None:
    notebook = lab.notebook("replace.ipynb")
    open_notebook(page, lab, notebook)
    run_cell(page, "%load_ext jupyter_ckpt")
    run_cell(page, "y = 7")
    image_id = saved_image_id(run_cell(page, "%ckpt save seven"))
    run_cell(page, "y = 8")
    old_kernel = lab.kernel_of(notebook)
    suspend_idle(lab, old_kernel)
    page.locator(".jp-mod-current .lm-TabBar-tabCloseIcon").click()
    confirm(page, "Discard")
    expect(page.locator(".jp-NotebookPanel")).to_have_count(0)

    # the notebook is closed; its session still holds the suspended kernel (y = 8)
    panel = open_panel(page)
    entry = entries(panel).filter(has_text="replace.ipynb")
    expect(entry).to_have_count(1)  # one entry per notebook: "seven" is folded in it
    expect(entry.locator(".jp-CkptBadge.jp-mod-suspended")).to_have_count(1)
    row = image_row(panel, image_id)
    # the image saved by name is marked so; each image says what changed before it
    expect(row.locator(".jp-CkptRow-name")).to_have_text("seven")
    expect(entry.locator(".jp-CkptRow-change").first).to_contain_text("the one before")
    screenshot(panel, "panel-entry-unfolded")
    row.get_by_role("button", name="Resume replace.ipynb").click()
    expect(toast(page, "Resumed replace.ipynb")).to_be_visible(timeout=RESTORE_WAIT)
    expect(run_cell(page, "y")).to_contain_text("7")

    sessions = [s for s in lab.api("GET", "api/sessions") if s["path"] == notebook]
    assert len(sessions) == 1
    new_kernel = sessions[0]["kernel"]["id"]
    kernel_ids = {k["id"] for k in lab.api("GET", "api/kernels")}
    assert new_kernel != old_kernel and old_kernel not in kernel_ids
    # every kernel belongs to a session: none was left running without its notebook
    assert kernel_ids <= {s["kernel"]["id"] for s in lab.api("GET", "api/sessions")}

    # the resumed kernel's images still name the notebook (defect 4)
    later = lab.api("POST", f"api/ckpt/kernels/{new_kernel}/checkpoint", {})
    image = next(i for i in lab.api("GET", "api/ckpt/images") if i["id"] == later["id"])
    assert image["notebook_path"].endswith("replace.ipynb")
    expect(image_row(open_panel(page), later["id"])).to_contain_text("replace.ipynb")


def test_suspending_an_unchanged_kernel_adds_no_entry(page: Page, lab: Lab) -> None:
    notebook = lab.notebook("cycles.ipynb")
    open_notebook(page, lab, notebook)
    kernel_id = lab.kernel_of(notebook)
    run_cell(page, "zeta = 1")
    suspend_idle(lab, kernel_id)

    def images() -> list[str]:
        return [i["id"] for i in lab.api("GET", "api/ckpt/images") if i["kernel_id"] == kernel_id]

    before = images()
    assert len(before) == 1
    # asking for completions wakes the kernel without changing it
    cell = page.locator(".jp-NotebookPanel .jp-CodeCell").last
    cell.locator(".cm-content").click()
    page.keyboard.type("zet")
    page.keyboard.press("Tab")
    wait_until(lambda: ckpt_state(lab, kernel_id) == "running", 60, "the restore")
    suspend_idle(lab, kernel_id)
    assert images() == before
    panel = open_panel(page)
    expect(panel.locator(".jp-CkptRow").filter(has_text="cycles.ipynb")).to_have_count(1)
    expect(entries(panel).filter(has_text="cycles.ipynb")).to_have_count(1)
