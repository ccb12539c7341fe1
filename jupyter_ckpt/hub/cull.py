"""A cull arbiter for jupyterhub-idle-culler: cull a server only once nothing would be lost.

jupyterhub-idle-culler >= 2.0 asks ``IdleCuller.cull_arbiter_hook`` about every ready
server, every round, whether to cull it. This arbiter keeps the culler's idleness rule and,
for a server idle long enough, first asks it to suspend its kernels
(``POST /api/ckpt/suspend-all`` through the proxy, with the culler's token, which needs the
scope ``access:servers``). The cull goes ahead only when every kernel holding state was
saved; otherwise the server keeps running and the culler asks again in a later round.

Light on purpose: it runs in the culler's process, which has tornado and nothing of the
server extension, and the hub imports this package for its spawner hooks: tornado's HTTP
client is imported only when a server is asked to suspend.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from traitlets.log import get_logger

SUSPEND_ALL = "api/ckpt/suspend-all"

# Where the culler reaches the user servers when make_cull_arbiter is not told: the proxy's
# public URL as seen from the culler (z2jh: http://proxy-public).
PUBLIC_URL_ENV = "JUPYTER_CKPT_CULL_URL"

# What a refusal of the suspend means, for the log line that says why a server is kept.
_STATUS_HINTS = {
    302: "the token was not accepted (redirected to log in)",
    403: "the culler's token needs the scope access:servers",
    404: "the server has no jupyter-ckpt (pip install jupyter-ckpt in its image)",
}


def decide(result: Mapping[str, Any]) -> tuple[bool, list[str]]:
    """Whether a ``suspend-all`` answer allows the cull, and why not.

    Suspended kernels and kernels with nothing to save (their process died or was gone
    already) lose nothing; kernels of ``exclude_kernel_names`` were left out by the
    server's own policy and do not hold the server. Every kernel in ``failed`` still
    holds state: a variable that cannot be saved under ``on_unsaveable = "keep"``, a busy
    cell, a failed write. One of them is enough to keep the server.
    """
    failed = result.get("failed")
    if not isinstance(failed, Mapping) or not isinstance(result.get("suspended"), list):
        return False, [f"unexpected answer: {json.dumps(result)[:200]}"]
    return not failed, [f"kernel {k} keeps running: {why}" for k, why in failed.items()]


class CullArbiter:
    """The culler's hook: ``await arbiter(inactive=..., inactive_limit=..., server=...)``.

    :param public_url: the proxy's URL as the culler reaches it; by default
        ``$JUPYTER_CKPT_CULL_URL``, else the server model's ``full_url`` (set when the hub
        has ``JupyterHub.public_url``).
    :param api_token: the token sent to the server; by default the culler's own
        ``$JUPYTERHUB_API_TOKEN``.
    :param request_timeout: seconds the suspend may take; kernels are saved in parallel,
        each within the server's ``SuspendPolicy.checkpoint_timeout`` (600 s by default).
    """

    def __init__(
        self,
        public_url: str | None = None,
        api_token: str | None = None,
        request_timeout: float = 600.0,
    ) -> None:
        self.public_url = public_url
        self.api_token = api_token
        self.request_timeout = request_timeout

    def suspend_url(self, server: Mapping[str, Any]) -> str | None:
        base = self.public_url or os.environ.get(PUBLIC_URL_ENV)
        if base:
            return base.rstrip("/") + "/" + server["url"].lstrip("/") + SUSPEND_ALL
        if server.get("full_url"):
            return server["full_url"].rstrip("/") + "/" + SUSPEND_ALL
        return None

    async def __call__(
        self,
        *,
        inactive: timedelta | None,
        inactive_limit: float,
        server: Mapping[str, Any],
        **kwargs: Any,
    ) -> bool:
        # the culler asks about every server, idle or not: only idle ones are suspended
        if inactive is None or inactive.total_seconds() < inactive_limit:
            return False
        log = get_logger()
        name = server.get("full_name") or server.get("url")
        url = self.suspend_url(server)
        if url is None:
            log.error(
                "Not culling server %s: no URL to reach it; pass public_url to "
                "make_cull_arbiter, set $%s or JupyterHub.public_url",
                name,
                PUBLIC_URL_ENV,
            )
            return False
        allowed, reasons = await self._suspend(url)
        if not allowed:
            for reason in reasons:
                log.warning("Not culling server %s: %s", name, reason)
            return False
        log.info("Server %s: kernels suspended, culling allowed", name)
        return True

    async def _suspend(self, url: str) -> tuple[bool, list[str]]:
        from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

        token = self.api_token or os.environ.get("JUPYTERHUB_API_TOKEN", "")
        request = HTTPRequest(
            url,
            method="POST",
            body=b"",
            headers={"Authorization": f"token {token}"},
            request_timeout=self.request_timeout,
            # a redirect leads to a login page, never to the answer
            follow_redirects=False,
        )
        try:
            response = await AsyncHTTPClient().fetch(request)
        except HTTPClientError as exc:
            hint = _STATUS_HINTS.get(exc.code, "")
            body = exc.response.body.decode(errors="replace")[:300] if exc.response else ""
            return False, [f"suspend-all answered {exc.code} {hint}: {body}".strip()]
        except OSError as exc:  # refused, reset, DNS
            return False, [f"suspend-all failed: {exc}"]
        try:
            result = json.loads(response.body)
        except ValueError:
            return False, [f"suspend-all answered {response.code} with no JSON"]
        return decide(result)


def make_cull_arbiter(
    public_url: str | None = None,
    api_token: str | None = None,
    request_timeout: float = 600.0,
) -> CullArbiter:
    """An arbiter for ``c.IdleCuller.cull_arbiter_hook`` (see :class:`CullArbiter`)."""
    return CullArbiter(public_url, api_token, request_timeout)


# For ``c.IdleCuller.cull_arbiter_hook = jupyter_ckpt.hub.cull_arbiter``: every option from
# the environment.
cull_arbiter = make_cull_arbiter()
