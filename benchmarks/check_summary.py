"""The GPU check's summary table (``gpu_check.sh``): every figure the ``gpu_*.py`` scripts
recorded against its baseline from the same run, with its verdict against the goals of
DESIGN.md section 8, and a row for each script that failed, timed out or had no GPU.

    python benchmarks/check_summary.py DIR   # DIR: figures.jsonl and status.txt

``status.txt`` has one line per script run: its name, exit status and seconds. Exits 1
when a script failed or a check did not hold, else 0 (a missed ratio is a finding, shown
in the table, not a failure of the check).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from benchlib import table

NO_GPU = 2  # a script's exit status when it has nothing to measure here
TIMED_OUT = 124  # timeout(1)'s


def figure_row(record: dict[str, Any]) -> list[str]:
    if "ok" in record:
        ok = record["ok"]
        return ["yes" if ok else "NO", "-", "-", "holds", "PASS" if ok else "FAIL"]
    value, base, goal = record["value"], record["baseline_value"], record["goal"]
    ratio = value / base if base else float("inf")
    if goal is None:
        target, verdict = "info", "info"
    else:
        op, bound = goal
        target = f"{op} {bound:g}"
        verdict = "PASS" if (ratio <= bound if op == "<=" else ratio >= bound) else "MISS"
    unit = record["unit"]
    return [
        f"{value:.3f} {unit}",
        f"{base:.3f} {unit} ({record['baseline']})",
        f"{ratio:.2f}",
        target,
        verdict,
    ]


def script_row(name: str, code: int, seconds: float, log: Path) -> list[str] | None:
    """A row for a script that did not end well; None for one that did."""
    if code == 0:
        return None
    lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
    last = lines[-1][:120] if lines else ""
    if code == NO_GPU:
        return [name, f"skipped: {last}", "-", "-", "-", "-", "skipped"]
    how = f"timed out after {seconds:.0f} s" if code == TIMED_OUT else f"exit {code}: {last}"
    return [name, how, "-", "-", "-", "-", "FAIL"]


def main(directory: str) -> int:
    where = Path(directory)
    records = [json.loads(line) for line in (where / "figures.jsonl").read_text().splitlines()]
    rows, failed = [], False
    for line in (where / "status.txt").read_text().splitlines():
        name, code, seconds = line.split()
        row = script_row(name, int(code), float(seconds), where / f"{name}.log")
        if row is not None:
            rows.append(row)
            failed |= row[-1] == "FAIL"
        for record in (r for r in records if r["script"] == name):
            rows.append([name, record["figure"], *figure_row(record)])
            failed |= rows[-1][-1] == "FAIL"
    header = ["script", "figure", "measured", "baseline (same run)", "ratio", "goal", "verdict"]
    print(table(header, rows))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
