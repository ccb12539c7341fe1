"""The idle culler's config file: cull only servers whose kernels are all saved.

The proxy's URL comes from $JUPYTER_CKPT_CULL_URL (the hub config sets it for the service)."""

import jupyter_ckpt.hub

c = get_config()  # noqa: F821 (defined by the culler when it loads this file)
c.IdleCuller.cull_arbiter_hook = jupyter_ckpt.hub.cull_arbiter
