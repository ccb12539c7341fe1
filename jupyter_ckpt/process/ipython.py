"""IPython's own state: loaded extensions (with autoreload's mode and ``%aimport`` list) and
the settings of the shell's configurables, which ``%config``, ``%precision``, ``%pprint``,
``%autocall``, ``%colors`` and friends change (the inline backend's figure formats among
them)."""

from __future__ import annotations

from typing import Any

from .registry import Provider

_PLAIN = (bool, int, float, str, type(None))


def _shell() -> Any:
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None:
        raise RuntimeError("not in an IPython kernel")
    return shell


def _plain(value: Any) -> bool:
    """A setting's value that is data (what ``%config`` can set), not a live object."""
    if isinstance(value, _PLAIN):
        return True
    if isinstance(value, (list, tuple, set, frozenset)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(_plain(k) and _plain(v) for k, v in value.items())
    return False


def _configurables(shell: Any) -> dict[str, Any]:
    """The shell's configurables by class name: those ``%config`` reaches, and the display
    formatters (``%precision`` and ``%pprint`` set the plain-text one's traits). Not the
    kernel application among them: its settings are this process's launch (its connection
    file, ports, startup code), read once at its start."""
    from traitlets.config import Application

    found = [shell, *shell.configurables, *shell.display_formatter.formatters.values()]
    return {type(c).__name__: c for c in found if not isinstance(c, Application)}


# where this process keeps its files: the restoring kernel's own, on its node
_PLACES = frozenset({"ipython_dir", "hist_file", "profile", "profile_dir"})


def _config_capture() -> dict[str, dict[str, Any]]:
    return {
        name: {
            k: v for k, v in c.trait_values(config=True).items() if k not in _PLACES and _plain(v)
        }
        for name, c in _configurables(_shell()).items()
    }


def _config_apply(saved: dict[str, dict[str, Any]]) -> None:
    failed = []
    for name, configurable in _configurables(_shell()).items():
        for trait, value in saved.get(name, {}).items():
            if not configurable.has_trait(trait) or getattr(configurable, trait) == value:
                continue
            try:
                setattr(configurable, trait, value)
            except Exception as exc:  # a value this IPython no longer accepts
                failed.append(f"{name}.{trait}: {exc}")
    if failed:
        raise ValueError("; ".join(failed))


_RELOADER_FLAGS = ("enabled", "check_all", "autoload_obj", "hide_errors")


def _reloader(shell: Any) -> Any:
    magics = shell.magics_manager.registry.get("AutoreloadMagics")
    return getattr(magics, "_reloader", None)


def _extensions_capture() -> dict[str, Any] | None:
    shell = _shell()
    loaded = sorted(shell.extension_manager.loaded)
    if not loaded:
        return None
    state: dict[str, Any] = {"loaded": loaded}
    reloader = _reloader(shell)
    if reloader is not None:
        state["autoreload"] = {
            **{f: getattr(reloader, f, None) for f in _RELOADER_FLAGS},
            "aimport": sorted(reloader.modules),
            "skip": sorted(reloader.skip_modules),
            "dedupe": getattr(getattr(reloader, "deduper_reloader", None), "enabled", None),
        }
    return state


def _extensions_apply(state: dict[str, Any]) -> None:
    shell = _shell()
    for name in state["loaded"]:
        if name not in shell.extension_manager.loaded:
            shell.extension_manager.load_extension(name)
    reloader = _reloader(shell)
    saved = state.get("autoreload")
    if reloader is None or saved is None:
        return
    for flag in _RELOADER_FLAGS:
        if saved[flag] is not None:
            setattr(reloader, flag, saved[flag])
    if saved["dedupe"] is not None and hasattr(reloader, "deduper_reloader"):
        reloader.deduper_reloader.enabled = saved["dedupe"]
    reloader.modules.update(dict.fromkeys(saved["aimport"], True))
    reloader.skip_modules.update(dict.fromkeys(saved["skip"], True))


def default_aliases() -> list[tuple[str, str]]:
    from IPython.core.alias import default_aliases as defaults

    return list(defaults())


def _shell_modes_capture() -> dict[str, Any]:
    """What ``%xmode``, ``%pdb`` and ``%alias`` set, outside the shell's traits."""
    shell = _shell()
    return {
        "xmode": shell.InteractiveTB.mode,
        "pdb": bool(shell.call_pdb),
        "aliases": sorted(set(shell.alias_manager.aliases) - set(default_aliases())),
    }


def _shell_modes_apply(state: dict[str, Any]) -> None:
    shell = _shell()
    if shell.InteractiveTB.mode != state["xmode"]:
        shell.InteractiveTB.set_mode(state["xmode"])
    shell.call_pdb = state["pdb"]
    present = set(shell.alias_manager.aliases)
    for name, command in state["aliases"]:
        if (name, command) not in present:
            shell.alias_manager.define_alias(name, command)


PROVIDERS = [
    Provider("ipython.config", ("IPython",), _config_capture, _config_apply),
    Provider("ipython.extensions", ("IPython",), _extensions_capture, _extensions_apply),
    Provider("ipython.modes", ("IPython",), _shell_modes_capture, _shell_modes_apply),
]
