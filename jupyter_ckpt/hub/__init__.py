"""JupyterHub side of jupyter-ckpt: hooks for the hub and its idle culler.

Light imports only (no server extension): these run in the hub's and the culler's
processes.
"""

from .cull import CullArbiter, cull_arbiter, make_cull_arbiter

__all__ = ["CullArbiter", "cull_arbiter", "make_cull_arbiter"]
