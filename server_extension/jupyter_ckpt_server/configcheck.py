"""Settings that name nothing: a mistyped setting or class name would leave the default in
force without a word (traitlets only warns of an unknown setting of a class it knows, and
says nothing of a section whose class it does not know)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from traitlets.config import Config, Configurable


def _known_classes() -> set[str]:
    """The names of every configurable class loaded in this process."""
    names, todo = set(), [Configurable]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return names


def unknown_settings(config: Config, classes: Iterable[type[Configurable]]) -> list[str]:
    """What in ``config`` names no setting of ``classes``, nor any class, said for a user
    (with the closest name when there is one)."""
    ours = {cls.__name__: cls for cls in classes}
    known = None
    problems = []
    for section, values in config.items():
        if not isinstance(values, dict):
            continue
        cls = ours.get(section)
        if cls is not None:
            settings = set(cls.class_traits(config=True))
            for key in values:
                if key not in settings:
                    problems.append(_unknown(f"c.{section}.{key}", key, settings, f"{section}."))
            continue
        known = _known_classes() if known is None else known
        if section not in known and difflib.get_close_matches(section, ours, 1, 0.8):
            problems.append(_unknown(f"c.{section}", section, set(ours), ""))
    return problems


def _unknown(what: str, name: str, names: set[str], prefix: str) -> str:
    close = difflib.get_close_matches(name, names, 1, 0.6)
    hint = f" (did you mean c.{prefix}{close[0]}?)" if close else ""
    return f"{what} is no setting of jupyter-ckpt{hint}"
