"""What of a running IPython kernel belongs in an image besides the variables: the
working directory, environment variables the user changed, execution count and input
history; and which names in the namespace are the user's.
"""

from __future__ import annotations

import ast
import os
import re
import sys
import time
from collections.abc import Iterable
from pathlib import PurePath
from typing import Any

import psutil

from .. import process

# IPython hides its own names (In, _i3, _3, exit, ...) in ``user_ns_hidden``; the names it
# sets without hiding them are these, and dunders (__name__, __session__, __file__).
_IPYTHON_UNHIDDEN = frozenset({"_exit_code"})


def _launch_environment() -> dict[str, str]:
    """The environment the kernel process started with, as the system keeps it (on Linux
    /proc/self/environ); where it cannot be read, the environment now."""
    try:
        env: dict[str, str] = psutil.Process().environ()
    except (psutil.Error, NotImplementedError, OSError):
        return dict(os.environ)
    return env


_LAUNCH_ENV = _launch_environment()

# The option by which the server gives a process it starts ahead its warm-up (see
# jupyter_ckpt_server.standby): its last argument, which a cold start does not have
WARM_UP_OPTION = "--IPKernelApp.code_to_run="

# The id of the kernel's notebook file (jupyter_server_fileid), set by the server at launch
NOTEBOOK_ID_ENV = "JUPYTER_CKPT_NOTEBOOK_ID"


# Environment variables an image restored into this kernel set or unset: they stay the
# user's changes (and go into the next image) even where this kernel's launch environment
# happens to agree with them.
_RESTORED_ENV: set[str] = set()


class Unnameable:
    """Stands for a namespace entry whose key no image can hold as a name (not a string,
    or a string with a lone surrogate, which UTF-8 cannot encode): its pickling fails
    with the reason, so a save reports that entry alone as not saved."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __reduce__(self) -> Any:
        raise TypeError(self.reason)


def _odd_key(key: Any, value: Any) -> tuple[str, Unnameable] | None:
    """(how the key is shown, what stands for its value) for a key that is no name an
    image can hold; None for one that is."""
    if not isinstance(key, str):
        shown, why = repr(key), "its key is not a string"
    else:
        try:
            key.encode("utf-8")
            return None
        except UnicodeEncodeError:
            shown, why = key.encode("utf-8", "backslashreplace").decode(), "its name is not UTF-8"
    return shown, Unnameable(f"{type(value).__name__} not saved: {why}")


def user_variables(shell: Any) -> dict[str, Any]:
    """The user's names: not a dunder, not one IPython set (a name IPython bound and the
    user then rebound, such as ``_`` or ``exit``, is the user's). An entry whose key is
    no name (see :class:`Unnameable`) is there under a name that shows it."""
    hidden = shell.user_ns_hidden
    variables = {}
    for name, value in list(shell.user_ns.items()):
        odd = _odd_key(name, value)
        if odd is not None:
            variables[odd[0]] = odd[1]
        elif not (
            (name.startswith("__") and name.endswith("__"))
            or name in _IPYTHON_UNHIDDEN
            or (name in hidden and hidden[name] is value)
        ):
            variables[name] = value
    return variables


def env_changes() -> dict[str, Any]:
    """The environment variables the user set and unset, against the launch environment
    and any image restored since."""
    changed = {k: v for k, v in os.environ.items() if k in _RESTORED_ENV or _LAUNCH_ENV.get(k) != v}
    removed = sorted(k for k in _LAUNCH_ENV.keys() | _RESTORED_ENV if k not in os.environ)
    return {"set": changed, "unset": removed}


def kernel_facts(shell: Any) -> dict[str, Any]:
    history = shell.history_manager
    return {
        "id": kernel_id(),
        "notebook_path": os.environ.get("JPY_SESSION_NAME"),
        # the notebook file's id (jupyter_server_fileid): it follows renames and moves,
        # where the path above is the one the kernel was started with
        "notebook_id": os.environ.get(NOTEBOOK_ID_ENV),
        "cwd": os.getcwd(),
        "sys_path": list(sys.path),
        "env": env_changes(),
        "execution_count": shell.execution_count,
        "history": compact_history(history.input_hist_raw, history.input_hist_parsed),
    }


def compact_history(raw: list[str], parsed: list[str]) -> dict[str, Any]:
    """The input history stored once: the raw cells, plus the parsed form of only those
    cells whose parsed form differs (magics, shell escapes), by index."""
    changes = {str(i): p for i, p in enumerate(parsed) if i >= len(raw) or raw[i] != p}
    return {"raw": list(raw), "parsed_changes": changes, "parsed_length": len(parsed)}


def expand_history(history: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(raw, parsed) from :func:`compact_history`'s form, or from the older form that
    stored both lists in full."""
    raw = list(history["raw"])
    if "parsed" in history:
        return raw, list(history["parsed"])
    changes = history["parsed_changes"]
    length = history["parsed_length"]
    return raw, [changes.get(str(i), raw[i] if i < len(raw) else "") for i in range(length)]


def moved_cwd(cwd: str, saved_notebook: str | None, notebook: str | None) -> str:
    """The saved working directory, moved as the notebook moved: a server respawned on a
    node that mounts the home elsewhere runs the same notebook under another root, and the
    directory the user was in is the same place relative to it."""
    if not saved_notebook or not notebook or saved_notebook == notebook:
        return cwd
    old, new = PurePath(saved_notebook).parts, PurePath(notebook).parts
    same = 0  # trailing parts both paths share: the notebook's path under its root
    while same < min(len(old), len(new)) and old[-1 - same] == new[-1 - same]:
        same += 1
    if not same:
        return cwd
    old_root, new_root = PurePath(*old[: len(old) - same]), PurePath(*new[: len(new) - same])
    try:
        return str(new_root / PurePath(cwd).relative_to(old_root))
    except ValueError:  # the user had gone outside the notebook's root
        return cwd


def enter_saved_place(facts: dict[str, Any]) -> list[str]:
    """Put back the working directory, the environment and ``sys.path``: first, so that the
    user's own modules import while the image loads. Return warnings."""
    warnings = []
    cwd = facts.get("cwd")
    if cwd:
        cwd = moved_cwd(cwd, facts.get("notebook_path"), os.environ.get("JPY_SESSION_NAME"))
        try:
            os.chdir(cwd)
        except OSError as exc:
            warnings.append(f"working directory {cwd} not restored: {exc.strerror}")
    env = facts.get("env", {})
    zone = os.environ.get("TZ")
    os.environ.update(env.get("set", {}))
    for key in env.get("unset", []):
        os.environ.pop(key, None)
    _RESTORED_ENV.update(env.get("set", {}), env.get("unset", []))
    if os.environ.get("TZ") != zone and hasattr(time, "tzset"):
        time.tzset()  # as a kernel that set TZ and called tzset itself
    process.apply_path(facts.get("sys_path"))
    return warnings


def fresh_kernel() -> process.FreshKernel:
    """How a kernel that restores this one's images starts (see :mod:`..process.paths`)."""
    return process.FreshKernel(list(sys.path), dict(_LAUNCH_ENV), os.getcwd())


def apply_kernel_facts(shell: Any, facts: dict[str, Any]) -> None:
    """Restore the execution count and the input history."""
    history = facts.get("history")
    if (history or facts.get("execution_count")) and shell.execution_count > 1:
        # The saved line numbers may already be taken in this kernel's history database
        # session; IPython would then print an error on the next cell. Continue in a new one
        # (a kernel that stored no cell yet, as one started for a restore, has none taken:
        # a new session would only cost database writes before the first result).
        manager = shell.history_manager
        if manager.session_number:
            manager.end_session()
            manager.new_session()
    if history:
        # In-place: the namespace's `In` is the same list object as input_hist_parsed.
        raw, parsed = expand_history(history)
        shell.history_manager.input_hist_raw[:] = raw
        shell.history_manager.input_hist_parsed[:] = parsed
    if facts.get("execution_count"):
        shell.execution_count = facts["execution_count"]


# the id a server gave this kernel when it took over a process started ahead (see adopt)
_ADOPTED_ID: str | None = None


def adopt(
    shell: Any, kernel_id: str | None, notebook: str | None, notebook_id: str | None = None
) -> None:
    """This process, started ahead by the server as no one's, is now kernel
    ``kernel_id`` of ``notebook`` (whose file id is ``notebook_id``): as if it had been
    launched so (the notebook's name and id in its environment, not counted as the
    user's change, and its name in ``__session__``)."""
    global _ADOPTED_ID
    if kernel_id and kernel_id != kernel_id_of_process():
        _ADOPTED_ID = kernel_id
        _name_connection_file(kernel_id)
    if notebook and os.environ.get("JPY_SESSION_NAME") != notebook:
        os.environ["JPY_SESSION_NAME"] = _LAUNCH_ENV["JPY_SESSION_NAME"] = notebook
        shell.user_ns["__session__"] = notebook
    if notebook_id:
        os.environ[NOTEBOOK_ID_ENV] = _LAUNCH_ENV[NOTEBOOK_ID_ENV] = notebook_id


def _name_connection_file(kernel_id: str) -> None:
    """The server wrote this process's connection file under the kernel's id (see
    ``jupyter_ckpt_server.standby``): ``%connect_info`` and ``get_connection_file()`` say
    so too."""
    from ipykernel.kernelapp import IPKernelApp

    if IPKernelApp.initialized():
        app = IPKernelApp.instance()
        launched = app.abs_connection_file
        app.connection_file = os.path.join(os.path.dirname(launched), f"kernel-{kernel_id}.json")
        sys.argv[:] = _cold_start_argv(sys.argv, launched, app.abs_connection_file)


def _cold_start_argv(argv: list[str], launched: str, named: str) -> list[str]:
    """The command line a cold start of the kernel has: its connection file's name, and
    not the warm-up the server added last to the process it started ahead."""
    if argv and argv[-1].startswith(WARM_UP_OPTION):
        argv = argv[:-1]
    return [named if arg == launched else arg for arg in argv]


def kernel_id() -> str | None:
    return _ADOPTED_ID or kernel_id_of_process()


def kernel_id_of_process() -> str | None:
    """The id in the name of the connection file this process started with."""
    try:
        from ipykernel.connect import get_connection_file

        stem = os.path.basename(get_connection_file())
    except Exception:
        return None
    match = re.match(r"kernel-(.+)\.json$", stem)
    return match.group(1) if match else None


def defining_cells(cells: list[str], names: Iterable[str]) -> dict[str, int]:
    """For each of ``names``, the number of the last cell (``In [n]``: index ``n`` of the
    parsed input history) that binds it at the top level: what to re-run to make it again."""
    wanted = set(names)
    found: dict[str, int] = {}
    for number in range(len(cells) - 1, 0, -1):
        if not wanted - found.keys():
            break
        try:
            tree = ast.parse(cells[number])
        except (SyntaxError, ValueError):
            continue
        for name in _bound(tree) & wanted - found.keys():
            found[name] = number
    return found


_SCOPES = (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _bound(node: ast.AST) -> set[str]:
    """Names a cell binds at the top level (assignments, defs, classes, imports, loops),
    not inside the functions, classes and comprehensions it defines."""
    names: set[str] = set()
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(child.name)
        elif isinstance(child, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).partition(".")[0] for a in child.names}
        elif isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store):
            names.add(child.id)
        elif not isinstance(child, _SCOPES):
            names |= _bound(child)
    return names
