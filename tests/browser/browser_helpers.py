"""Page operations the browser tests share: open a notebook, run a cell, the panel."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from browser_lab import OUTPUT, Lab
from playwright.sync_api import Locator, Page, expect

SUSPENDED = "Suspended · run a cell to resume"
PANEL = "#jupyter-ckpt-sessions"
STATUS = ".jp-CkptStatus-button"
KERNEL_IDLE = re.compile(r"^Python 3.* \| Idle$")


def open_notebook(page: Page, lab: Lab, path: str) -> None:
    """Open ``path`` alone in a fresh workspace and wait until its kernel is idle."""
    page.goto(
        f"{lab.url}/lab/workspaces/{path.replace('.', '-')}/tree/{path}?reset&token={lab.token}"
    )
    # a cold JupyterLab on a loaded machine takes more than expect's default 5 s
    expect(page.locator(".jp-NotebookPanel .jp-Cell").first).to_be_visible(timeout=60_000)
    wait_for_kernel(page, lab, path)


def wait_for_kernel(page: Page, lab: Lab, path: str) -> None:
    """Until the notebook's kernel is started and connected: JupyterLab drops a cell run
    while its session has no kernel yet (the prompt stays ``[ ]``), and the status bar
    may read "Idle" a moment before (another document's kernel, as the tab changes)."""

    def connected() -> bool:
        kernel = next(
            (s["kernel"] for s in lab.api("GET", "api/sessions") if s["path"] == path), None
        )
        if kernel is None:
            return False
        kernels = {k["id"]: k for k in lab.api("GET", "api/kernels")}
        return kernels.get(kernel["id"], {}).get("connections", 0) > 0

    wait_until(connected, 90, f"a connected kernel for {path}")
    # the status bar names the kernel once it is started: "Python 3 (ipykernel) | Idle"
    expect(page.locator(".jp-StatusBar-TextItem").filter(has_text=KERNEL_IDLE)).to_be_visible(
        timeout=90_000
    )


def run_cell(page: Page, code: str) -> Locator:
    """Type ``code`` into the last cell, run it, return its output area once it ran."""
    cells = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell")
    index = cells.count()
    cell = cells.nth(index - 1)  # pinned: `.last` would move to the cell the run adds
    cell.locator(".cm-content").click()
    # keys typed before the editor has focus are notebook shortcuts ("b" adds a cell)
    expect(cell.locator(".cm-editor")).to_have_class(re.compile(r"\bcm-focused\b"))
    page.keyboard.type(code)
    expect(cell.locator(".cm-content")).to_have_text(code)
    page.keyboard.press("Shift+Enter")
    expect(cells).to_have_count(index + 1)  # run-and-advance adds the next cell
    expect(cell.locator(".jp-InputArea-prompt")).to_have_text(
        re.compile(r"\[\d+\]"), timeout=90_000
    )
    return cell.locator(".jp-OutputArea")


def open_console(page: Page) -> None:
    """File > New > Console, on the default kernel (asked for: there are two specs)."""
    page.locator(".lm-MenuBar-itemLabel:text-is('File')").click()
    page.locator(".lm-Menu-itemLabel:text-is('New')").click()
    page.locator(".lm-Menu-itemLabel:text-is('Console')").click()
    confirm(page, "Select")
    expect(page.locator(".jp-CodeConsole:not(.lm-mod-hidden)")).to_be_visible(timeout=30_000)


def run_command(page: Page, label: str) -> None:
    """Run a command from the command palette, as a keyboard user does."""
    page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook").click()
    page.keyboard.press("Control+Shift+C")
    palette = page.locator(".lm-CommandPalette-input")
    expect(palette).to_be_focused()
    palette.fill(label)
    page.locator(".lm-CommandPalette-item.lm-mod-active").filter(has_text=label).click()


def open_panel(page: Page) -> Locator:
    panel = page.locator(PANEL)
    if not panel.is_visible():  # the sidebar tab toggles: a second click would close it
        page.locator(f".jp-SideBar [data-id='{PANEL[1:]}']").click()
    expect(panel).to_be_visible()
    return panel


def image_row(panel: Locator, image_id: str) -> Locator:
    """The row of an image, unfolded when it is one of a notebook's older images."""
    selector = f".jp-CkptRow[data-image-id^='{image_id}']"
    row = panel.locator(selector)
    expect(row).to_be_attached()
    folded = panel.locator("details.jp-CkptRow-older:not([open])").filter(
        has=panel.page.locator(selector)
    )
    if folded.count():
        folded.locator(":scope > summary").click()
    return row


def entries(panel: Locator) -> Locator:
    """The panel's entries: one per notebook, older images folded inside."""
    return panel.locator(":scope > .jp-CkptPanel-list > .jp-CkptRow")


def saved_image_id(output: Locator) -> str:
    """The image id that ``%ckpt save`` printed: "Saved ... as 'name' (3f9a2c51e0b4)"."""
    match = re.search(r"\(([0-9a-f]{8,})\)", output.inner_text())
    assert match, output.inner_text()
    return match.group(1)


def screenshot(target: Page | Locator, name: str) -> None:
    OUTPUT.mkdir(parents=True, exist_ok=True)
    target.screenshot(path=OUTPUT / f"{name}.png")


def confirm(page: Page, button: str) -> None:
    page.locator(".jp-Dialog").get_by_role("button", name=button).click()
    expect(page.locator(".jp-Dialog")).to_have_count(0)


def toast(page: Page, text: str) -> Locator:
    return page.locator(".jp-toast-message").filter(has_text=text)


def toast_action(page: Page, text: str, action: str) -> Locator:
    """A button of the notification that says ``text``."""
    return (
        page.locator(".Toastify__toast")
        .filter(has=toast(page, text))
        .get_by_role("button", name=action)
    )


# WCAG's contrast ratio of an element's text against what it is drawn on: its own
# background, else the first ancestor's that is not transparent (over white)
_CONTRAST = """el => {
  const rgba = c => {
    const p = c.match(/[\\d.]+/g).map(Number);
    return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
  };
  const layers = [];
  for (let n = el; n && n.nodeType === 1; n = n.parentElement) {
    const c = rgba(getComputedStyle(n).backgroundColor);
    if (c[3] > 0) { layers.push(c); if (c[3] >= 1) break; }
  }
  let base = [255, 255, 255];
  for (const c of layers.reverse()) base = base.map((v, i) => c[i] * c[3] + v * (1 - c[3]));
  const f = rgba(getComputedStyle(el).color);
  const fg = base.map((v, i) => f[i] * f[3] + v * (1 - f[3]));
  const lum = rgb => rgb.map(v => {
    v /= 255;
    return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4);
  }).reduce((sum, v, i) => sum + v * [0.2126, 0.7152, 0.0722][i], 0);
  const [hi, lo] = [lum(fg), lum(base)].sort((a, b) => b - a);
  return (hi + 0.05) / (lo + 0.05);
}"""


def assert_contrast(target: Locator, minimum: float = 4.5) -> None:
    """The text of ``target`` meets WCAG AA (4.5:1) against its background."""
    ratio = target.evaluate(_CONTRAST)
    assert ratio >= minimum, f"contrast {ratio:.2f}:1 of {target} is below {minimum}:1"


def assert_inside(inner: Locator, outer: Locator) -> None:
    """``inner`` is drawn within the width of ``outer`` (nothing overflows it)."""
    a, b = inner.bounding_box(), outer.bounding_box()
    assert a and b, (a, b)
    assert b["x"] <= a["x"] and a["x"] + a["width"] <= b["x"] + b["width"] + 0.5, (a, b)


def page_problems(page: Page) -> list[str]:
    """The errors the page logs or throws from now on: a list that fills as they come."""
    problems: list[str] = []
    page.on(
        "console",
        lambda m: problems.append(f"console.{m.type}: {m.text}") if m.type == "error" else None,
    )
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    return problems


def wait_until(
    condition: Callable[[], bool], timeout: float, what: str | Callable[[], str]
) -> None:
    """Poll the server (a few times a second, not to load it) until ``condition`` holds.
    ``what`` may be a callable: then it describes the state at the timeout."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what() if callable(what) else what}")
        time.sleep(0.25)


def ckpt_state(lab: Lab, kernel_id: str) -> str | None:
    kernels = {k["id"]: k for k in lab.api("GET", "api/kernels")}
    return kernels[kernel_id]["ckpt"]["state"] if kernel_id in kernels else None


def suspend_idle(lab: Lab, *kernel_ids: str) -> None:
    """Let the kernels' idle timeout pass and wait until the idle monitor (checking every
    few seconds) has suspended them. The clock moves on again at each poll while a kernel still
    runs: a message it got after the first move restarted its clock."""

    def suspended() -> bool:
        states = {k: ckpt_state(lab, k) for k in kernel_ids}
        for kernel_id, state in states.items():
            if state == "running":
                lab.idle_for(kernel_id)
        return all(state == "suspended" for state in states.values())

    wait_until(suspended, 90, f"kernels {kernel_ids} to be suspended")
