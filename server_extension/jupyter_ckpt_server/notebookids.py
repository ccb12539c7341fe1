"""Which notebook an image belongs to: the file ID service's id of the notebook file.

A path names a notebook only until it is renamed or moved, and a new notebook may take
the old name later; ``jupyter_server_fileid`` gives each file an id that follows it
through the renames and moves made through the server (and, with its
``LocalFileIdManager``, those made outside it). A kernel gets the id of its notebook in
its environment when it starts (``NOTEBOOK_ID_ENV``), so each image it writes names the
file, whatever its path is by then; the image list gives the file's current path.

Without the file ID extension (disabled), kernels get no id and images are known by the
path their kernel started with, as before.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Mapping
from typing import Any

from jupyter_ckpt.kernel.state import NOTEBOOK_ID_ENV

__all__ = ["NOTEBOOK_ID_ENV", "NotebookIds"]


class NotebookIds:
    """Notebook file ids from the server's file ID manager, looked up when asked: the
    file ID extension may be loaded after this one."""

    def __init__(self, settings: Mapping[str, Any], root_dir: str) -> None:
        self._settings = settings
        self._root = os.path.realpath(root_dir)

    @property
    def _files(self) -> Any:
        return self._settings.get("file_id_manager")

    def api_path(self, session_name: str) -> str | None:
        """The API path of the notebook a kernel's ``JPY_SESSION_NAME`` names (a path on
        disk), or None: not a notebook, or outside the server's root."""
        if not session_name.endswith(".ipynb"):
            return None
        absolute = os.path.realpath(os.path.join(self._root, session_name))
        if os.path.commonpath([self._root, absolute]) != self._root:
            return None
        return posixpath.join(*os.path.relpath(absolute, self._root).split(os.sep))

    def env_for(self, env: Mapping[str, str]) -> dict[str, str]:
        """The id of the notebook a kernel is started for (``JPY_SESSION_NAME`` in its
        environment ``env``), to add to that environment; empty when there is none."""
        path = self.api_path(env.get("JPY_SESSION_NAME") or "")
        files = self._files
        file_id = files.index(path) if files is not None and path else None
        return {NOTEBOOK_ID_ENV: file_id} if file_id else {}

    def path_of(self, file_id: str | None) -> str | None:
        """The notebook file's API path now, or None (no id, or the file is gone)."""
        files = self._files
        if not file_id or files is None:
            return None
        return files.get_path(file_id)
