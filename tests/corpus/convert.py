"""Build the corpus notebooks from their sources, as SOURCES.toml describes them.

The corpus is kept as ``.ipynb`` files in ``notebooks/``; this script is how they were made,
so that anyone can check them against their origins or rebuild them from newer versions:

    python tests/corpus/convert.py --source OWNER/NAME=CHECKOUT [--source ...]

Each source format keeps the authors' own cells: MyST notebooks (jupytext) their code cells
and tags, sphinx-gallery scripts their ``# %%`` / ``#####`` cell markers, doctest pages one
cell per example block, plain scripts one cell per top-level block. The ``replace`` entries
of SOURCES.toml (each with its reason) are applied to the source text first; code cells
listed in ``raises`` (numbered from 0) fail as published and are tagged ``raises-exception``
as MyST notebooks tag theirs.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

HERE = Path(__file__).resolve().parent
Cell = tuple[str, str, list[str]]  # (cell_type, source, tags)


def myst(text: str) -> list[Cell]:
    """A MyST markdown notebook: ```{code-cell} blocks with their options, markdown between."""
    text = re.sub(r"\A---\n.*?\n---\n", "", text, flags=re.S)  # jupytext's header
    cells: list[Cell] = []
    pattern = re.compile(r"^```{code-cell}[^\n]*\n(.*?)^```\s*$", re.S | re.M)
    pos = 0
    for match in pattern.finditer(text):
        cells.append(("markdown", text[pos : match.start()], []))
        body, tags = match.group(1), []
        if body.startswith("---\n"):  # YAML options
            options, _, body = body[4:].partition("\n---\n")
            tags = re.findall(r"[\w-]+", options.partition("tags:")[2].split("\n")[0])
        else:
            while body.startswith(":"):
                line, _, body = body.partition("\n")
                if line.startswith(":tags:"):
                    tags = re.findall(r"[\w-]+", line.removeprefix(":tags:"))
        cells.append(("code", body, tags))
        pos = match.end()
    cells.append(("markdown", text[pos:], []))
    return cells


def gallery(text: str) -> list[Cell]:
    """A sphinx-gallery script: the docstring, then cells split at ``# %%`` or a line of
    twenty or more ``#``; a cell's leading comment block is its text."""
    tree = ast.parse(text)
    cells: list[Cell] = []
    first = tree.body[0] if tree.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
        cells.append(("markdown", str(first.value.value), []))
        text = "\n".join(text.splitlines()[first.end_lineno :])
    for block in re.split(r"^(?:# %%[^\n]*|#{20,})\n", text, flags=re.M):
        lines = block.splitlines()
        comment = []
        while lines and lines[0].startswith("#"):
            comment.append(lines.pop(0).lstrip("#").removeprefix(" "))
        cells.append(("markdown", "\n".join(comment), []))
        cells.append(("code", "\n".join(lines), []))
    return cells


def script(text: str) -> list[Cell]:
    """A plain script: one cell per run of top-level statements between blank lines."""
    lines = text.splitlines()
    tree = ast.parse(text)
    cells: list[Cell] = []
    start = 0
    for node in tree.body[1:]:
        first = node.lineno - 1
        # a blank line before the statement (or before its leading comments) cuts a cell
        while first > 0 and lines[first - 1].startswith("#"):
            first -= 1
        if first > 0 and not lines[first - 1].strip():
            cells.append(("code", "\n".join(lines[start:first]), []))
            start = first
    cells.append(("code", "\n".join(lines[start:]), []))
    return cells


def doctest(text: str) -> list[Cell]:
    """A reStructuredText page of doctests: each example block is a cell, without the
    statements whose expected output is a traceback."""
    cells: list[Cell] = []
    prose: list[str] = []
    statement: list[str] = []
    statements: list[str] = []

    def end_statement(raises: bool = False) -> None:
        if statement and not raises:
            statements.append("\n".join(statement))
        statement.clear()

    def end_block() -> None:
        end_statement()
        if statements:
            cells.append(("markdown", "\n".join(prose), []))
            cells.append(("code", "\n".join(statements), []))
            prose.clear()
        statements.clear()

    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith(">>>"):
            end_statement()
            statement.append(stripped[4:])
        elif stripped.startswith("...") and statement:
            statement.append(stripped[4:])
        elif statement and stripped.startswith("Traceback"):
            end_statement(raises=True)
        elif not stripped:
            end_block()
            prose.append(line)
        elif not statement and not statements:
            prose.append(line)
        else:
            end_statement()  # expected output
    end_block()
    return cells


def markdown_python(text: str) -> list[Cell]:
    """Markdown with ```python blocks: each block a code cell."""
    cells: list[Cell] = []
    pos = 0
    for match in re.finditer(r"^```python\n(.*?)^```\s*$", text, re.S | re.M):
        cells.append(("markdown", text[pos : match.start()], []))
        cells.append(("code", match.group(1), []))
        pos = match.end()
    cells.append(("markdown", text[pos:], []))
    return cells


FORMATS = {
    "myst": myst,
    "gallery": gallery,
    "script": script,
    "doctest": doctest,
    "markdown": markdown_python,
}


def notebook(cells: list[Cell], source: dict[str, Any]) -> dict[str, Any]:
    nb_cells = []
    for kind, text, tags in cells:
        text = text.strip("\n")
        if not text.strip():
            continue
        cell: dict[str, Any] = {
            "cell_type": kind,
            "metadata": {"tags": tags} if tags else {},
            "source": text.splitlines(keepends=True),
        }
        if kind == "code":
            cell.update(execution_count=None, outputs=[])
        nb_cells.append(cell)
    origin = {k: source[k] for k in ("url", "commit", "licence")}
    return {
        "cells": nb_cells,
        "metadata": {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python"},
            "corpus_origin": origin,
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def load_sources() -> dict[str, Any]:
    return tomllib.loads((HERE / "SOURCES.toml").read_text())


def build(checkouts: dict[str, Path], only: set[str] | None = None) -> None:
    sources = load_sources()
    for name, entry in sources["notebook"].items():
        if only and name not in only:
            continue
        repo = sources["repo"][entry["repo"]]
        if entry["repo"] not in checkouts:
            continue
        git = ["git", "-C", str(checkouts[entry["repo"]])]
        text = subprocess.run(
            [*git, "show", f"{repo['commit']}:{entry['path']}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        for old, new, _why in entry.get("replace", []):
            if old not in text:
                raise SystemExit(f"{name}: {old!r} is not in {entry['path']}")
            text = text.replace(old, new)
        source = {
            "url": f"{repo['url']}/blob/{repo['commit']}/{entry['path']}",
            "commit": repo["commit"],
            "licence": repo["licence"],
        }
        cells = FORMATS[entry["format"]](text)
        code = [i for i, cell in enumerate(cells) if cell[0] == "code" and cell[1].strip()]
        for n in entry.get("raises", []):  # cells that fail as published: tagged as such
            kind, body, tags = cells[code[n]]
            cells[code[n]] = (kind, body, [*tags, "raises-exception"])
        nb = notebook(cells, source)
        out = HERE / "notebooks" / f"{name}.ipynb"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


def copy_data(checkouts: dict[str, Path]) -> None:
    """The data files the notebooks read, beside them as their sources keep them."""
    sources = load_sources()
    for entry in sources.get("data", []):
        if entry["repo"] not in checkouts:
            continue
        commit = sources["repo"][entry["repo"]]["commit"]
        data = subprocess.run(
            ["git", "-C", str(checkouts[entry["repo"]]), "show", f"{commit}:{entry['path']}"],
            check=True,
            capture_output=True,
        ).stdout
        out = HERE / "notebooks" / entry["to"]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", action="append", default=[], metavar="OWNER/NAME=DIR")
    parser.add_argument("names", nargs="*", help="only these notebooks")
    args = parser.parse_args()
    checkouts = dict((s.split("=", 1)[0], Path(s.split("=", 1)[1])) for s in args.source)
    build(checkouts, set(args.names) or None)
    copy_data(checkouts)


if __name__ == "__main__":
    main()
