"""Restore and import hold a bounded part of an image in memory, not all of it: measured
as the growth of peak RSS in fresh processes (``store_memory.py``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).parent
MIB = 1 << 20
STATE = 256  # MiB, in 8 bytes objects: each unpickles into a copy of its segment


def measure(*args: str) -> int:
    done = subprocess.run(
        [sys.executable, str(TESTS / "store_memory.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout or 0)


def test_restore_and_import_do_not_hold_the_whole_image(tmp_path: Path) -> None:
    store, secret = str(tmp_path / "store"), str(tmp_path / "secret")
    measure("write", store, secret, str(STATE))

    # The restored values need STATE; all segments held at once would need STATE more.
    restore = measure("restore", store, secret)
    assert restore < 1.5 * STATE * MIB, f"restore grew the peak RSS by {restore / MIB:.0f} MiB"

    tar = str(tmp_path / "image.tar")
    measure("export", store, secret, tar)
    imported = measure("import", str(tmp_path / "second"), secret, tar)
    assert imported < STATE * MIB / 4, f"import grew the peak RSS by {imported / MIB:.0f} MiB"
