"""Bad input is refused with one line that names the cause, and changes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from harness import Paths
from traitlets.config import Config

from jupyter_ckpt.errors import SecretError
from jupyter_ckpt.store import ImageStore


def test_a_mistyped_secret_file_in_a_config_creates_nothing(tmp_path: Path) -> None:
    """``c.ImageStore.secret_file`` naming a directory that does not exist (a typo) is
    refused: no directory and no new secret, which would open none of the images."""
    mistyped = tmp_path / "kyes" / "secret"
    config = Config({"ImageStore": {"url": str(tmp_path / "store"), "secret_file": str(mistyped)}})
    with pytest.raises(SecretError, match="no secret file"):
        ImageStore(config=config)
    assert not mistyped.parent.exists()


def test_an_unclosed_quote_in_a_magic_is_one_line(tmp_path: Path, kernels) -> None:
    kernel = kernels(Paths(tmp_path))
    shown = kernel.ckpt("restore 'unclosed")
    assert shown.strip() == '%ckpt: cannot read "restore \'unclosed": no closing quotation'
