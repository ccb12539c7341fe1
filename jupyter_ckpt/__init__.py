"""Durable notebook kernel state: checkpoint a kernel's namespace to an image and restore it.

Importing this package stays cheap on purpose: it runs inside user kernels, which may live
in another environment than the server, so nothing heavy (jupyter_server, tornado, torch,
pandas) is imported here.
"""

__version__ = "0.1.0"


def load_ipython_extension(ipython) -> None:
    """`%load_ext jupyter_ckpt` registers the `%ckpt` magics."""
    from .kernel.magics import CkptMagics

    ipython.register_magics(CkptMagics)
