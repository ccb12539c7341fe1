"""Capture a namespace to an image and restore it (DESIGN section 3)."""

from .capture import capture
from .identity import same_state, state_of
from .restore import RestoreReport, restore

__all__ = ["RestoreReport", "capture", "restore", "same_state", "state_of"]
