"""Durable notebook kernel state: checkpoint a kernel's namespace to an image and restore it.

Importing this package stays cheap on purpose: it runs inside user kernels, which may live
in another environment than the server, so nothing heavy (jupyter_server, tornado, torch,
pandas) is imported here.
"""

from pathlib import Path
from typing import TYPE_CHECKING

from ._version import __version__

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

__all__ = ["__version__"]


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """Where a checkout builds the JupyterLab extension, for `jupyter labextension develop .`
    (which looks in the package named after the project). A wheel ships the built extension
    in share/jupyter/labextensions/ instead."""
    build = Path(__file__).parent.parent / "server_extension" / "jupyter_ckpt_server"
    return [{"src": str(build / "labextension"), "dest": "jupyter-ckpt"}]


def load_ipython_extension(ipython: "InteractiveShell") -> None:
    """`%load_ext jupyter_ckpt` registers the `%ckpt` magics."""
    from .kernel.magics import CkptMagics

    ipython.register_magics(CkptMagics)
