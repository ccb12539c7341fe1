"""Library and interpreter options a notebook sets once and relies on afterwards: numpy's
print options and floating-point error handling, pandas options, matplotlib's rcParams and
backend, the decimal context, warnings filters, logging, the recursion limit, the garbage
collector's settings, the locale, torch's threads and determinism flags, scikit-learn's
global config (``set_config(transform_output="pandas")``), the default socket timeout.

Options are captured whole (or, for pandas, where they differ from their defaults) and put
back where they differ from the fresh process's, through each library's own setters, so
that its validation and callbacks run as when the user set them.
"""

from __future__ import annotations

import contextlib
import decimal
import gc
import locale
import logging
import os
import socket
import sys
import warnings
from typing import Any, Literal

from .registry import Provider

# --- numpy -------------------------------------------------------------------------


def _numpy_capture() -> dict[str, Any]:
    np = sys.modules["numpy"]
    return {
        "print": np.get_printoptions(),
        "err": np.geterr(),
        "errcall": np.geterrcall(),
        "bufsize": np.getbufsize(),
    }


def _numpy_apply(state: dict[str, Any]) -> None:
    import numpy as np

    np.set_printoptions(**state["print"])
    np.seterr(**state["err"])
    np.seterrcall(state["errcall"])
    np.setbufsize(state["bufsize"])


# --- pandas ------------------------------------------------------------------------


def _pandas_options() -> Any:
    from pandas._config import config  # the registry pandas' own describe_option reads

    return config


def _pandas_capture() -> dict[str, Any]:
    config = _pandas_options()
    changed = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated options warn when read
        for key, option in config._registered_options.items():
            if key in config._deprecated_options:
                continue
            value = config.get_option(key)
            if value is not option.defval:
                try:
                    same = bool(value == option.defval)
                except Exception:  # an option whose value does not compare
                    same = False
                if not same:
                    changed[key] = value
    return changed


def _pandas_apply(changed: dict[str, Any]) -> None:
    import pandas

    for key, value in changed.items():
        pandas.set_option(key, value)


# --- matplotlib --------------------------------------------------------------------


def _rc_items(rc: Any) -> dict[str, Any]:
    """rcParams as stored: reading ``rcParams['backend']`` would pick a backend (and import
    pyplot) where none was chosen yet."""
    return {key: dict.__getitem__(rc, key) for key in dict.keys(rc)}


def _matplotlib_capture() -> dict[str, Any]:
    mpl = sys.modules["matplotlib"]
    return {"rc": _rc_items(mpl.rcParams), "pyplot": "matplotlib.pyplot" in sys.modules}


def _matplotlib_apply(state: dict[str, Any]) -> None:
    import matplotlib
    from matplotlib import rcsetup

    rc = matplotlib.rcParams
    now = _rc_items(rc)
    saved = dict(state["rc"])
    backend = saved.pop("backend", rcsetup._auto_backend_sentinel)
    for key, value in saved.items():
        if key in now and now[key] != value:
            rc[key] = value
    if backend is not rcsetup._auto_backend_sentinel and backend != now.get("backend"):
        if state["pyplot"]:
            matplotlib.use(backend)  # switches pyplot's backend, as a %matplotlib did
        else:
            rc["backend"] = backend


# --- decimal -----------------------------------------------------------------------

_DECIMAL_FIELDS = ("prec", "rounding", "Emin", "Emax", "capitals", "clamp")


def _decimal_capture() -> dict[str, Any]:
    context = decimal.getcontext()
    return {
        **{f: getattr(context, f) for f in _DECIMAL_FIELDS},
        "traps": [s for s, on in context.traps.items() if on],
        "flags": [s for s, on in context.flags.items() if on],
    }


def _decimal_apply(state: dict[str, Any]) -> None:
    # In place: cells read the context object the kernel's own context holds (setcontext
    # from a restore would not reach a cell run in another context).
    context = decimal.getcontext()
    for field in _DECIMAL_FIELDS:
        setattr(context, field, state[field])
    context.traps = dict.fromkeys(context.traps, False) | dict.fromkeys(state["traps"], True)
    context.flags = dict.fromkeys(context.flags, False) | dict.fromkeys(state["flags"], True)


# --- warnings ----------------------------------------------------------------------


def _warnings_apply(filters: list[Any]) -> None:
    warnings.filters[:] = filters  # type: ignore[index]  # a list at run time
    warnings._filters_mutated()  # type: ignore[attr-defined]  # drops the "once" caches


# --- logging -----------------------------------------------------------------------


def _handler_state(handler: logging.Handler) -> tuple[Any, ...] | None:
    """A handler a restore can make again: a stream handler to the kernel's stdout or
    stderr (``logging.basicConfig``), or a file handler (reopened to append). Others are
    left out (they hold sockets, queues, threads)."""
    formatter = handler.formatter
    fmt = (formatter._fmt, formatter.datefmt, formatter._style.__class__) if formatter else None
    if type(handler) is logging.FileHandler:
        return ("file", handler.baseFilename, handler.encoding, handler.level, fmt)
    if type(handler) is logging.StreamHandler:
        for name in ("stdout", "stderr"):
            if handler.stream in (getattr(sys, name), getattr(sys, f"__{name}__")):
                return ("stream", name, None, handler.level, fmt)
    return None


_STYLES: dict[type, Literal["%", "{", "$"]] = {
    style: key  # type: ignore[misc]  # the keys are those three
    for key, (style, _) in logging._STYLES.items()
}


def _make_handler(state: tuple[Any, ...]) -> logging.Handler:
    kind, target, encoding, level, fmt = state
    handler: logging.Handler
    if kind == "file":
        handler = logging.FileHandler(target, mode="a", encoding=encoding)
    else:
        handler = logging.StreamHandler(getattr(sys, target))
    handler.setLevel(level)
    if fmt is not None:
        text, datefmt, style = fmt
        handler.setFormatter(logging.Formatter(text, datefmt, _STYLES.get(style, "%")))
    return handler


def _logger_state(logger: logging.Logger) -> dict[str, Any]:
    handlers = [_handler_state(h) for h in logger.handlers]
    return {
        "level": logger.level,
        "propagate": logger.propagate,
        "disabled": logger.disabled,
        "handlers": [h for h in handlers if h is not None],
    }


# Loggers the kernel's completer sets up when a frontend first asks for a completion:
# the kernel's, not the notebook's (a kernel that only completed a name holds the state
# of its last image still).
_KERNEL_LOGGERS = ("parso", "jedi")


def _logging_capture() -> dict[str, Any]:
    manager = logging.root.manager
    loggers = {
        name: _logger_state(logger)
        for name, logger in sorted(manager.loggerDict.items())
        if isinstance(logger, logging.Logger)
        and name.partition(".")[0] not in _KERNEL_LOGGERS
        and (logger.level or not logger.propagate or logger.disabled or logger.handlers)
    }
    return {"root": _logger_state(logging.root), "loggers": loggers, "disable": manager.disable}


def _logging_apply(state: dict[str, Any]) -> None:
    for name, saved in [("", state["root"]), *state["loggers"].items()]:
        logger = logging.getLogger(name or None)
        logger.setLevel(saved["level"])
        logger.propagate, logger.disabled = saved["propagate"], saved["disabled"]
        present = [_handler_state(h) for h in logger.handlers]
        for handler in saved["handlers"]:
            if handler not in present:  # what the kernel's own start made already stays
                logger.addHandler(_make_handler(handler))
    logging.disable(state["disable"])


# --- the interpreter ---------------------------------------------------------------


_LOCALE_CATEGORIES = ("LC_CTYPE", "LC_COLLATE", "LC_TIME", "LC_MONETARY", "LC_NUMERIC")


def _umask() -> int:
    """Read where the kernel lets it be read: setting it to read it leaves a moment in
    which another thread's new file gets the wrong mode."""
    with contextlib.suppress(OSError, StopIteration, ValueError), open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("Umask:")).split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _interpreter_capture() -> dict[str, Any]:
    state = {
        "recursion_limit": sys.getrecursionlimit(),
        "switch_interval": sys.getswitchinterval(),
        "socket_timeout": socket.getdefaulttimeout(),
        "gc": (gc.isenabled(), gc.get_threshold()),
        # a query: setlocale without a locale changes nothing
        "locale": {c: locale.setlocale(getattr(locale, c)) for c in _LOCALE_CATEGORIES},
        "umask": _umask(),
    }
    if hasattr(sys, "get_int_max_str_digits"):  # Python 3.11+
        state["int_max_str_digits"] = sys.get_int_max_str_digits()
    return state


def _interpreter_apply(state: dict[str, Any]) -> None:
    """What the image holds of it: an image written by an earlier version lacks the
    settings added since, which then stay as this process has them."""
    sys.setrecursionlimit(state["recursion_limit"])
    socket.setdefaulttimeout(state["socket_timeout"])
    if "switch_interval" in state:
        sys.setswitchinterval(state["switch_interval"])
    enabled, threshold = state.get("gc", (gc.isenabled(), gc.get_threshold()))
    gc.set_threshold(*threshold)
    if enabled != gc.isenabled():
        (gc.enable if enabled else gc.disable)()
    for category, value in state.get("locale", {}).items():
        if locale.setlocale(getattr(locale, category)) != value:
            locale.setlocale(getattr(locale, category), value)
    if "umask" in state:
        os.umask(state["umask"])
    if "int_max_str_digits" in state and hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(state["int_max_str_digits"])


# --- torch -------------------------------------------------------------------------


def _torch_capture() -> dict[str, Any]:
    torch = sys.modules["torch"]
    from torch._tensor_str import PRINT_OPTS

    state = {
        "num_threads": torch.get_num_threads(),
        "num_interop_threads": torch.get_num_interop_threads(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "default_dtype": torch.get_default_dtype(),
        "grad_enabled": torch.is_grad_enabled(),
        "anomaly": (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()),
        "print": dict(vars(PRINT_OPTS)),
        "cudnn": {
            flag: getattr(torch.backends.cudnn, flag)
            for flag in ("enabled", "benchmark", "deterministic", "allow_tf32")
        },
        "cuda_matmul_tf32": torch.backends.cuda.matmul.allow_tf32,
    }
    if hasattr(torch, "get_default_device"):
        state["default_device"] = str(torch.get_default_device())
    return state


def _torch_apply(state: dict[str, Any]) -> None:
    import torch

    if torch.get_num_threads() != state["num_threads"]:
        torch.set_num_threads(state["num_threads"])
    if torch.get_num_interop_threads() != state["num_interop_threads"]:
        torch.set_num_interop_threads(state["num_interop_threads"])
    torch.use_deterministic_algorithms(
        state["deterministic"], warn_only=state["deterministic_warn_only"]
    )
    torch.set_float32_matmul_precision(state["float32_matmul_precision"])
    torch.set_default_dtype(state["default_dtype"])
    torch.set_grad_enabled(state["grad_enabled"])
    torch.set_anomaly_enabled(*state["anomaly"])
    torch.set_printoptions(**state["print"])
    for flag, value in state["cudnn"].items():
        setattr(torch.backends.cudnn, flag, value)
    torch.backends.cuda.matmul.allow_tf32 = state["cuda_matmul_tf32"]
    if "default_device" in state and str(torch.get_default_device()) != state["default_device"]:
        torch.set_default_device(state["default_device"])


# --- scikit-learn ------------------------------------------------------------------


def _sklearn_capture() -> dict[str, Any]:
    return dict(sys.modules["sklearn"].get_config())


def _sklearn_apply(config: dict[str, Any]) -> None:
    import sklearn

    known = sklearn.get_config()
    sklearn.set_config(**{k: v for k, v in config.items() if k in known})


PROVIDERS = [
    Provider("interpreter", (), _interpreter_capture, _interpreter_apply),
    Provider("warnings", (), lambda: list(warnings.filters), _warnings_apply),
    Provider("decimal", ("decimal",), _decimal_capture, _decimal_apply),
    Provider("logging", ("logging",), _logging_capture, _logging_apply),
    Provider("numpy", ("numpy",), _numpy_capture, _numpy_apply),
    Provider("pandas", ("pandas",), _pandas_capture, _pandas_apply),
    Provider("matplotlib", ("matplotlib",), _matplotlib_capture, _matplotlib_apply),
    Provider("torch", ("torch",), _torch_capture, _torch_apply),
    Provider("sklearn", ("sklearn",), _sklearn_capture, _sklearn_apply),
]
