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


class ImageInUse(CkptError):
    """The image is what a suspended kernel will be restored from; it cannot go yet."""


class IncompatibleImage(CkptError):
    """The image cannot be restored on this node (jupyter_ckpt.compat says why)."""
