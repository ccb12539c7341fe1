"""The panel's store meter, as jupyter-resource-usage shows memory: the store's use
against its quota over a bar, updated after a save."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from browser_helpers import PANEL, open_notebook, open_panel, run_cell, screenshot
from browser_lab import STEADY_KERNEL
from playwright.sync_api import Page, expect

QUOTA = 20_000_000


def test_the_store_meter_shows_use_against_the_quota(
    page: Page, start_lab: Callable[..., Any]
) -> None:
    with start_lab(settings={"ImageStore": {"quota_bytes": QUOTA}}) as lab:
        notebook = lab.notebook("meter.ipynb", STEADY_KERNEL)
        open_notebook(page, lab, notebook)
        panel = open_panel(page)
        meter = panel.locator(".jp-CkptStoreMeter")
        expect(meter).to_have_text("Store: 0 B / 20.0 MB")
        bar = meter.get_by_role("meter", name="Image store use")
        expect(bar).to_have_attribute("aria-valuemax", str(QUOTA))

        run_cell(page, "data = bytes(range(256)) * 20_000")  # 5.1 MB, which does not compress away
        lab.api("POST", f"api/ckpt/kernels/{lab.kernel_of(notebook)}/checkpoint", {})
        expect(meter).to_have_text(re.compile(r"^Store: 5\.\d MB / 20\.0 MB$"), timeout=15_000)
        expect(meter).to_have_attribute("title", re.compile(r"of the store quota of 20\.0 MB"))
        used = int(bar.get_attribute("aria-valuenow") or 0)
        assert 5_000_000 <= used <= 6_000_000, used
        screenshot(page.locator(PANEL), "panel-store-meter")
