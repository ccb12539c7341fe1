"""A second tab follows every change made elsewhere from the server's events, within a
second (scaled to the machine's load), long before any poll: the panel's own runs once a
minute and JupyterLab's session list every ten seconds. No entry says "Running" for a
kernel that is gone or "Saved" for one that is suspended, and the status bar does not
call a kernel busy right after the cell that restored it."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from browser_helpers import (
    PANEL,
    STATUS,
    SUSPENDED,
    entries,
    open_notebook,
    open_panel,
    run_cell,
    screenshot,
)
from browser_lab import OUTPUT, STEADY_KERNEL, Lab
from deadlines import scaled
from harness import read_only
from playwright.sync_api import Page, expect

# how long a change may take to show in the other tab, in ms: a second on an idle machine
LIVE = scaled(1.0) * 1000
ENTRY_STATE = ".jp-CkptBadge:is(.jp-mod-running, .jp-mod-suspended, .jp-mod-saved)"

# every text shown in turn by the first element matching `inner` within the elements
# matching `outer` that contain `needle`, kept in the page as it changes
_RECORD = """([outer, inner, needle]) => {
  const texts = [];
  window.__ckptSeen = window.__ckptSeen || {};
  window.__ckptSeen[outer + inner] = texts;
  const note = () => {
    for (const node of document.querySelectorAll(outer)) {
      const shown = node.textContent.includes(needle) && node.querySelector(inner);
      if (shown && texts[texts.length - 1] !== shown.textContent) texts.push(shown.textContent);
    }
  };
  new MutationObserver(note).observe(document.body, {
    subtree: true, childList: true, characterData: true, attributes: true
  });
  note();
}"""


def record(page: Page, outer: str, inner: str, needle: str = "") -> Callable[[], list[str]]:
    """Start recording what the page shows there; the texts seen so far, when called."""
    page.evaluate(_RECORD, [outer, inner, needle])
    return lambda: page.evaluate("key => window.__ckptSeen[key]", outer + inner)


class Timer:
    """How long each change took to show, in seconds."""

    def __init__(self) -> None:
        self.latencies: dict[str, float] = {}

    def __call__(self, step: str, change: Callable[[], object], shown: Callable[[], None]) -> None:
        change()
        started = time.monotonic()
        shown()
        self.latencies[step] = time.monotonic() - started


def test_a_second_tab_follows_changes_made_elsewhere_within_a_second(page: Page, lab: Lab) -> None:
    notebook = lab.notebook("live.ipynb", STEADY_KERNEL)
    open_notebook(page, lab, notebook)
    kernel_id = lab.kernel_of(notebook)
    run_cell(page, "x = 1")
    kernel_api = f"api/ckpt/kernels/{kernel_id}"
    first = lab.api("POST", f"{kernel_api}/checkpoint", {"name": "first"})

    other = page.context.new_page()
    other.goto(f"{lab.url}/lab/workspaces/live-other?reset&token={lab.token}")
    panel = open_panel(other)
    entry = entries(panel).filter(has_text="live.ipynb")
    state = entry.locator(ENTRY_STATE)
    expect(state).to_have_text("Running")
    states = record(other, f"{PANEL} .jp-CkptPanel-list > .jp-CkptRow", ENTRY_STATE, "live.ipynb")
    statuses = record(page, ".jp-StatusBar-Widget", STATUS)
    timed = Timer()

    timed(
        "image written",
        lambda: lab.api("POST", f"{kernel_api}/checkpoint", {"name": "second"}),
        lambda: expect(entry).to_contain_text("second", timeout=LIVE),
    )
    # a %ckpt command writes from the kernel, past the server: the cell's end tells
    run_cell(page, "%load_ext jupyter_ckpt")
    timed(
        "image saved by %ckpt in a cell",
        lambda: run_cell(page, "%ckpt save by-magic"),
        lambda: expect(entry).to_contain_text("by-magic", timeout=LIVE),
    )
    timed(
        "image deleted",
        lambda: lab.api("DELETE", f"api/ckpt/images/{first['id']}"),
        lambda: expect(panel.locator(f"[data-image-id='{first['id']}']")).to_have_count(
            0, timeout=LIVE
        ),
    )
    timed(
        "kernel suspended",
        lambda: lab.api("POST", f"{kernel_api}/suspend", {}),
        lambda: expect(state).to_have_text("Suspended kernel", timeout=LIVE),
    )
    # the tab whose notebook it is says so too, though it did not ask for the suspend
    expect(page.locator(STATUS)).to_have_text(SUSPENDED, timeout=LIVE)

    # a cell restores the kernel: the other tab says Running, and this tab's status bar
    # goes from "Restoring" to its countdown without a "busy" on the way
    timed(
        "kernel restored",
        lambda: run_cell(page, "x + 1"),
        lambda: expect(state).to_have_text("Running", timeout=LIVE),
    )
    expect(page.locator(STATUS)).to_contain_text("suspends in", timeout=LIVE)
    seen = statuses()
    assert not [text for text in seen if "busy" in text], seen

    banner = panel.locator(".jp-CkptPanel-store")
    with read_only(lab.root.parent / "store"):
        timed(
            "store read-only",
            lambda: refused(lab, f"{kernel_api}/checkpoint"),
            lambda: expect(banner).to_contain_text("read-only", timeout=LIVE),
        )
    timed(
        "store writable",
        lambda: lab.api("POST", f"{kernel_api}/checkpoint", {"name": "third"}),
        lambda: expect(banner).to_have_count(0, timeout=LIVE),
    )
    timed(
        "kernel shut down",
        lambda: lab.api("DELETE", f"api/kernels/{kernel_id}"),
        lambda: expect(state).to_have_text("Saved", timeout=LIVE),
    )
    # from the first save to the shutdown, the entry said what its kernel was doing
    seen = states()
    assert seen[-1] == "Saved" and "Saved" not in seen[:-1], seen
    OUTPUT.mkdir(parents=True, exist_ok=True)
    (OUTPUT / "live-latencies.txt").write_text(
        f"deadline {LIVE / 1000:.2f} s\n"
        + "".join(f"{step}: {seconds:.2f} s\n" for step, seconds in timed.latencies.items())
    )


def refused(lab: Lab, path: str) -> None:
    """POST ``path``, which the server must refuse as the store cannot be written."""
    try:
        lab.api("POST", path, {})
    except AssertionError as exc:
        assert ": 503 " in str(exc), exc
        return
    raise AssertionError(f"POST {path} succeeded on a read-only store")


def test_the_running_panel_marks_a_suspended_kernel(page: Page, lab: Lab) -> None:
    notebook = lab.notebook("marked.ipynb", STEADY_KERNEL)
    open_notebook(page, lab, notebook)
    kernel_id = lab.kernel_of(notebook)
    run_cell(page, "m = 1")
    tab = page.locator(".jp-SideBar [data-id='jp-running-sessions']")
    tab.click()
    item = page.locator(f".jp-RunningSessions-item.jp-mod-kernel[data-context='{kernel_id}']")
    expect(item).to_be_visible()
    expect(item).not_to_have_attribute("data-ckpt-state", "suspended")

    lab.api("POST", f"api/ckpt/kernels/{kernel_id}/suspend", {})
    expect(item).to_have_attribute("data-ckpt-state", "suspended", timeout=LIVE)
    expect(item).to_have_attribute("aria-description", re.compile(r"^Kernel suspended"))
    label = item.locator(":scope > .jp-RunningSessions-itemLabel")
    expect(label).to_have_attribute("data-ckpt-mark", "Suspended")
    assert label.evaluate("n => getComputedStyle(n, '::before').content") == '"Suspended"'
    screenshot(page.locator("#jp-running-sessions"), "running-panel-suspended")

    run_cell(page, "m + 1")  # restores it: the mark goes
    expect(item).not_to_have_attribute("data-ckpt-state", "suspended", timeout=LIVE)
