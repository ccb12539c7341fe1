"""REST API ``/api/ckpt/...`` (DESIGN section 5). Thin: parse, authorize, call the manager.

Authenticated and authorized like the kernels API (resource ``kernels``: GET needs read,
POST and DELETE need write); resuming an image also needs write on ``sessions``, since it
may create a notebook session. Polling the status and image listings does not count as user
activity, so a panel left open does not keep an idle server alive.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from functools import wraps
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web

from jupyter_ckpt.errors import (
    AmbiguousReference,
    CkptError,
    ImageInUse,
    ImageNotFound,
    IncompatibleImage,
    InvalidReference,
    StoreError,
)
from jupyter_ckpt.store import check_ref

from .manager import CkptManager, SuspendFailed
from .rpc import StoreFailed
from .service import CkptService
from .startup import AfterRecords

_KERNEL_ID = r"(?P<kernel_id>\w+-\w+-\w+-\w+-\w+)"
_IMAGE_REF = r"(?P<ref>[A-Za-z0-9][A-Za-z0-9._-]{0,127})"


def _http_errors(
    method: Callable[..., Awaitable[None]],
) -> Callable[..., Awaitable[None]]:
    """Turn the library's errors into clear 4xx answers."""

    @wraps(method)
    async def wrapper(self: CkptAPIHandler, *args: Any, **kwargs: Any) -> None:
        try:
            await method(self, *args, **kwargs)
        except ImageNotFound as exc:
            raise web.HTTPError(404, str(exc)) from exc
        except (InvalidReference, AmbiguousReference) as exc:
            raise web.HTTPError(400, str(exc)) from exc
        except (StoreError, StoreFailed) as exc:  # the store is down, read-only, full or
            raise web.HTTPError(503, str(exc)) from exc  # refuses us: the kernel runs on
        except (ImageInUse, IncompatibleImage, SuspendFailed) as exc:
            raise web.HTTPError(409, str(exc)) from exc
        except CkptError as exc:
            raise web.HTTPError(500, str(exc)) from exc

    return wrapper


class CkptAPIHandler(AfterRecords, APIHandler):
    """Waits for the records of suspended kernels, like the kernels and sessions routes:
    until then listings would show them neither suspended nor pinning their images."""

    auth_resource = "kernels"

    @property
    def service(self) -> CkptService:
        return self.settings["jupyter_ckpt_service"]

    @property
    def manager(self) -> CkptManager:
        return self.settings["jupyter_ckpt_manager"]

    def reply(self, model: Any, status: int = 200) -> None:
        self.set_status(status)
        self.finish(json.dumps(model, default=str))

    def json_body(self) -> dict[str, Any]:
        try:
            body = self.get_json_body() or {}
        except web.HTTPError:
            raise web.HTTPError(400, "the request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise web.HTTPError(400, "the request body must be a JSON object")
        return body

    def check_kernel(self, kernel_id: str) -> None:
        if kernel_id not in self.kernel_manager:
            raise web.HTTPError(404, f"no kernel {kernel_id}")


class _Polled(CkptAPIHandler):
    # GETs here are polled by panels and hubs; they must not keep the server "active"
    _track_activity = False


class ImagesHandler(_Polled):
    @web.authenticated
    @authorized
    @_http_errors
    async def get(self) -> None:
        self.reply(await self.service.list_images())


class ImageHandler(_Polled):
    @web.authenticated
    @authorized
    @_http_errors
    async def get(self, ref: str) -> None:
        self.reply(await self.service.image(ref))

    @web.authenticated
    @authorized
    @_http_errors
    async def delete(self, ref: str) -> None:
        await self.service.delete_image(ref)
        self.set_status(204)
        self.finish()


class ResumeHandler(CkptAPIHandler):
    @web.authenticated
    @authorized
    @authorized(resource="sessions")
    @_http_errors
    async def post(self, ref: str) -> None:
        body = self.json_body()
        path, kernel_name = body.get("path"), body.get("kernel_name")
        for key, value in (("path", path), ("kernel_name", kernel_name)):
            if value is not None and not isinstance(value, str):
                raise web.HTTPError(400, f"{key} must be a string")
        self.reply(await self.service.resume(ref, path=path, kernel_name=kernel_name), 201)


class CheckpointHandler(CkptAPIHandler):
    @web.authenticated
    @authorized
    @_http_errors
    async def post(self, kernel_id: str) -> None:
        self.check_kernel(kernel_id)
        name = self.json_body().get("name")
        if name is not None:
            check_ref(name, "image name")  # a bad name is the client's error, not a 409
        self.reply(await self.manager.checkpoint(kernel_id, name), 201)


class SuspendHandler(CkptAPIHandler):
    @web.authenticated
    @authorized
    @_http_errors
    async def post(self, kernel_id: str) -> None:
        self.check_kernel(kernel_id)
        self.reply(await self.manager.suspend(kernel_id, trigger="api"))


class SuspendAllHandler(CkptAPIHandler):
    @web.authenticated
    @authorized
    @_http_errors
    async def post(self) -> None:
        self.reply(await self.service.suspend_all(trigger="api"))


class StatusHandler(_Polled):
    @web.authenticated
    @authorized
    @_http_errors
    async def get(self) -> None:
        # ?kernel_id=X: that kernel alone, its threads and tasks checked now
        kernel_id = self.get_argument("kernel_id", None)
        if kernel_id is not None:
            self.check_kernel(kernel_id)
        self.reply(await self.service.status(kernel_id))


default_handlers = [
    (r"/api/ckpt/images", ImagesHandler),
    (rf"/api/ckpt/images/{_IMAGE_REF}", ImageHandler),
    (rf"/api/ckpt/images/{_IMAGE_REF}/resume", ResumeHandler),
    (rf"/api/ckpt/kernels/{_KERNEL_ID}/checkpoint", CheckpointHandler),
    (rf"/api/ckpt/kernels/{_KERNEL_ID}/suspend", SuspendHandler),
    (r"/api/ckpt/suspend-all", SuspendAllHandler),
    (r"/api/ckpt/status", StatusHandler),
]
