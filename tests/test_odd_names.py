"""A namespace entry whose key is no name an image can hold fails only itself.

``globals()`` takes any key: a non-string one, or a string with a lone surrogate (which
UTF-8 cannot encode, nor so the manifest). A save reports that entry alone as not saved,
under a name that shows it, and writes every other variable.
"""

from __future__ import annotations

from pathlib import Path

from harness import Paths


def test_an_odd_key_is_reported_alone(tmp_path: Path, kernels) -> None:
    paths = Paths(tmp_path)
    kernel = kernels(paths)
    kernel.run("globals()[3] = 'three'\nglobals()['bad' + chr(0xDC80)] = 1\nkept = 2")
    output = kernel.ckpt("save odd")
    assert output.startswith("Saved "), output
    manifest = paths.open_store().open("odd")
    status = {v["name"]: (v["status"], v.get("reason", "")) for v in manifest["variables"]}
    assert status["kept"] == ("saved", "")
    assert status["3"] == ("lost", "TypeError: str not saved: its key is not a string")
    assert status["bad\\udc80"] == ("lost", "TypeError: int not saved: its name is not UTF-8")
