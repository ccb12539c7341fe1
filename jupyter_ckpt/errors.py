"""Errors that name their cause, so users and the server can say what went wrong."""


class CkptError(Exception):
    """Base class for every jupyter-ckpt error."""


class InvalidReference(CkptError, ValueError):
    """A name, id or path that is not allowed (bad characters, path traversal)."""


class ImageNotFound(CkptError, LookupError):
    """No image matches the given name or id."""


class AmbiguousReference(CkptError, LookupError):
    """An id prefix matches more than one image."""


class IntegrityError(CkptError):
    """An image failed verification: altered manifest or chunk, or a foreign signature.

    Raised before anything from the image is unpickled.
    """


class SecretError(CkptError):
    """The signing secret is missing, unreadable or readable by other users."""


class DeviceUnavailable(CkptError):
    """A saved tensor needs a device this node does not have."""


class GpuUnavailable(CkptError):
    """A GPU demand that no suspension of idle kernels could make room for in time."""


class ImageInUse(CkptError):
    """The image is what a suspended kernel will be restored from; it cannot go yet."""


class IncompatibleImage(CkptError):
    """The image cannot be restored on this node (jupyter_ckpt.compat says why)."""


class StoreError(CkptError, OSError):
    """The store itself failed: the message names the store and what to do.

    Also an ``OSError``, so code that already treats an I/O failure as "cannot read this
    object" (gc, listings, retention) keeps doing so, while every ``except CkptError``
    (the server, the CLI, ``%ckpt``) shows the message instead of a traceback.
    """


class StoreUnavailable(StoreError):
    """The store cannot be reached (object store down, network, endpoint, I/O error)."""


class StoreReadOnly(StoreError):
    """The store is mounted read-only: reads work, writes cannot."""


class StorePermission(StoreError):
    """The store refused this user an object or directory (permissions, ownership)."""


class StoreFull(StoreError):
    """The store has no space left."""
