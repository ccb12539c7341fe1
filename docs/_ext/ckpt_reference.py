"""Generate the configuration and REST references from their sources at every build.

The configuration reference is read from the traitlets classes themselves and the REST
reference from ``rest-api.yaml`` (the file a test checks against the server's routes), so
neither can drift from the code. Both are written as MyST Markdown into ``_generated/`` and
pulled into their pages with ``{include}``.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import yaml
from sphinx.application import Sphinx
from traitlets import Enum, TraitType
from traitlets.config import Configurable

CONFIG_CLASSES = (
    "jupyter_ckpt_server.policy:SuspendPolicy",
    "jupyter_ckpt.store.imagestore:ImageStore",
    "jupyter_ckpt_server.manager:CkptManager",
)
METHODS = ("get", "put", "post", "patch", "delete")
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]<>#|~])")


def escape(text: str) -> str:
    """Help strings are plain text: keep Markdown from reading `<user>` as HTML or `*`."""
    return _MARKDOWN_SPECIAL.sub(r"\\\1", " ".join(text.split()))


def load_class(path: str) -> type[Configurable]:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def trait_type(trait: TraitType) -> str:
    if isinstance(trait, Enum):
        return "one of " + ", ".join(f"`{value!r}`" for value in trait.values or ())
    return type(trait).__name__


def trait_default(cls: type[Configurable], name: str, trait: TraitType) -> str:
    # a default computed when the object is made (from the environment, a directory) is
    # described by the trait's help ("Default: ..."), not by the value on this machine
    if name in cls._trait_default_generators:
        return "computed at start, see below"
    return f"`{trait.default_value_repr()}`"


def config_reference(paths: tuple[str, ...] = CONFIG_CLASSES) -> str:
    """Every configurable trait of the classes, with type, default and help."""
    out: list[str] = []
    for path in paths:
        cls = load_class(path)
        out += [f"## {cls.__name__}", "", escape(cls.__doc__ or ""), ""]
        for name, trait in sorted(cls.class_traits(config=True).items()):
            out += [
                f"({cls.__name__}.{name})=",
                f"### `{cls.__name__}.{name}`",
                "",
                f"{trait_type(trait)}; default {trait_default(cls, name, trait)}",
                "",
                escape(trait.help or ""),
                "",
            ]
    return "\n".join(out)


def _resolve(spec: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if ref is None:
        return node
    target: Any = spec
    for part in ref.removeprefix("#/").split("/"):
        target = target[part]
    return target


def _body_fields(spec: dict[str, Any], operation: dict[str, Any]) -> list[str]:
    body = operation.get("requestBody")
    if not body:
        return []
    schema = body["content"]["application/json"]["schema"]
    lines = ["Request body (JSON object, optional):" if not body.get("required") else "Body:", ""]
    for name, prop in schema.get("properties", {}).items():
        example = f" (e.g. `{prop['example']}`)" if "example" in prop else ""
        lines.append(f"- `{name}` ({prop['type']}): {prop.get('description', '')}{example}")
    return [*lines, ""]


def rest_reference(spec: dict[str, Any]) -> str:
    """One section per route and method: what it does, its parameters, its answers."""
    out: list[str] = []
    for path, item in spec["paths"].items():
        shared = item.get("parameters", [])
        for method in METHODS:
            operation = item.get(method)
            if operation is None:
                continue
            out += [f"## `{method.upper()} {path}`", "", operation["summary"] + ".", ""]
            if "description" in operation:
                out += [" ".join(operation["description"].split()), ""]
            params = [_resolve(spec, p) for p in shared + operation.get("parameters", [])]
            if params:
                out += ["Parameters:", ""]
                out += [f"- `{p['name']}` ({p['in']}): {p['description']}" for p in params]
                out.append("")
            out += _body_fields(spec, operation)
            out += ["Answers:", ""]
            for status, response in operation["responses"].items():
                out.append(f"- `{status}`: {_resolve(spec, response)['description']}")
            out.append("")
    return "\n".join(out)


def generate(app: Sphinx) -> None:
    source = Path(app.srcdir)
    target = source / "_generated"
    target.mkdir(exist_ok=True)
    spec = yaml.safe_load((source / "rest-api.yaml").read_text())
    for name, text in (
        ("configuration.md", config_reference()),
        ("rest-api.md", rest_reference(spec)),
    ):
        path = target / name
        # rewrite only on change, so an incremental build does not redo every page
        if not path.exists() or path.read_text() != text:
            path.write_text(text)


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("builder-inited", generate)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
