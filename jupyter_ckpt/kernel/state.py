"""What of a running IPython kernel belongs in an image besides the variables: the
working directory, environment variables the user changed, execution count and input
history; and which names in the namespace are the user's.
"""

from __future__ import annotations

import os
import re
from typing import Any

# IPython hides its own names (In, _i3, _3, exit, ...) in ``user_ns_hidden``; the names it
# sets without hiding them are these, and dunders (__name__, __session__, __file__).
_IPYTHON_UNHIDDEN = frozenset({"_exit_code"})


def _launch_environment() -> dict[str, str]:
    """The environment the kernel process started with (Linux keeps it in /proc)."""
    try:
        with open("/proc/self/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return dict(os.environ)
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[os.fsdecode(key)] = os.fsdecode(value)
    return env


_LAUNCH_ENV = _launch_environment()


# Environment variables an image restored into this kernel set or unset: they stay the
# user's changes (and go into the next image) even where this kernel's launch environment
# happens to agree with them.
_RESTORED_ENV: set[str] = set()


def user_variables(shell: Any) -> dict[str, Any]:
    """The user's names: not a dunder, not one IPython set (a name IPython bound and the
    user then rebound, such as ``_`` or ``exit``, is the user's)."""
    hidden = shell.user_ns_hidden
    return {
        name: value
        for name, value in shell.user_ns.items()
        if not (name.startswith("__") and name.endswith("__"))
        and name not in _IPYTHON_UNHIDDEN
        and not (name in hidden and hidden[name] is value)
    }


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
        "cwd": os.getcwd(),
        "env": env_changes(),
        "execution_count": shell.execution_count,
        "history": {
            "raw": list(history.input_hist_raw),
            "parsed": list(history.input_hist_parsed),
        },
    }


def apply_kernel_facts(shell: Any, facts: dict[str, Any]) -> list[str]:
    """Restore cwd, environment, execution count and history; return warnings."""
    warnings = []
    cwd = facts.get("cwd")
    if cwd:
        try:
            os.chdir(cwd)
        except OSError as exc:
            warnings.append(f"working directory {cwd} not restored: {exc.strerror}")
    env = facts.get("env", {})
    os.environ.update(env.get("set", {}))
    for key in env.get("unset", []):
        os.environ.pop(key, None)
    _RESTORED_ENV.update(env.get("set", {}), env.get("unset", []))
    history = facts.get("history")
    if history or facts.get("execution_count"):
        # The saved line numbers may already be taken in this kernel's history database
        # session; IPython would then print an error on the next cell. Continue in a new one.
        manager = shell.history_manager
        if manager.session_number:
            manager.end_session()
            manager.new_session()
    if history:
        # In-place: the namespace's `In` is the same list object as input_hist_parsed.
        shell.history_manager.input_hist_raw[:] = history["raw"]
        shell.history_manager.input_hist_parsed[:] = history["parsed"]
    if facts.get("execution_count"):
        shell.execution_count = facts["execution_count"]
    return warnings


def kernel_id() -> str | None:
    try:
        from ipykernel.connect import get_connection_file

        stem = os.path.basename(get_connection_file())
    except Exception:
        return None
    match = re.match(r"kernel-(.+)\.json$", stem)
    return match.group(1) if match else None
