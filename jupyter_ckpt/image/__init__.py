"""Capture a namespace to an image and restore it (DESIGN section 3)."""

from .capture import capture
from .restore import RestoreReport, restore

__all__ = ["RestoreReport", "capture", "restore"]
