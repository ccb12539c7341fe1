"""No two buttons of the panel share an accessible name: not an entry's head and its
older images, nor two entries of one title (a notebook deleted, and a new one made
under its name)."""

from __future__ import annotations

from browser_helpers import PANEL, entries, open_panel
from browser_lab import STEADY_KERNEL, Lab
from playwright.sync_api import Page, expect


def _saved_and_closed(lab: Lab, path: str) -> None:
    """A notebook with a kernel that saved once, then closed: its session shut down."""
    session = lab.api(
        "POST",
        "api/sessions",
        {"path": path, "type": "notebook", "name": path, "kernel": {"name": STEADY_KERNEL}},
    )
    kernel_id = session["kernel"]["id"]
    lab.api("POST", f"api/ckpt/kernels/{kernel_id}/checkpoint", {})
    lab.api("DELETE", f"api/sessions/{session['id']}")


def test_entries_of_one_title_have_buttons_of_their_own_names(page: Page, lab: Lab) -> None:
    _saved_and_closed(lab, lab.notebook("twice.ipynb"))
    lab.api("DELETE", "api/contents/twice.ipynb")
    _saved_and_closed(lab, lab.notebook("twice.ipynb"))

    page.goto(f"{lab.url}/lab/workspaces/names?reset&token={lab.token}")
    panel = open_panel(page)
    twice = entries(panel).filter(has_text="twice.ipynb")
    expect(twice).to_have_count(2)
    labels = (
        page.locator(PANEL)
        .locator("button")
        .evaluate_all(
            "buttons => buttons.map(b => b.getAttribute('aria-label') || b.textContent.trim())"
        )
    )
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    assert not repeated, repeated
