"""The fenced blocks of the documentation's pages, for the tests that run or load them."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"


@dataclass
class Block:
    """One fenced block: the page it is on, its language (what it is) and its text."""

    page: str
    lang: str
    text: str

    def __str__(self) -> str:
        return f"{self.page}: {self.text.splitlines()[0]!r}"


def page_blocks(page: Path) -> Iterator[Block]:
    """The page's fenced blocks in order, less MyST directives (``{toctree}``, ...)."""
    lang: str | None = None
    lines: list[str] = []
    for line in page.read_text().splitlines(keepends=True):
        if lang is None and line.startswith("```"):
            lang, lines = line[3:].strip(), []
        elif lang is not None and line.rstrip() == "```":
            if not lang.startswith("{"):
                yield Block(page.name, lang, "".join(lines))
            lang = None
        elif lang is not None:
            lines.append(line)


def doc_blocks() -> list[Block]:
    """Every page's blocks, and the README's, which sends readers to them."""
    pages = [*sorted(DOCS.glob("*.md")), DOCS.parent / "README.md"]
    return [block for page in pages for block in page_blocks(page)]


def blocks_of(lang: str, page: str | None = None) -> list[Block]:
    """The blocks of one language, of every page or of one."""
    return [b for b in doc_blocks() if b.lang == lang and page in (None, b.page)]


def commands(block: Block) -> Iterator[list[str]]:
    """Each command of a bash block as words: continuation lines joined, comments and
    ``&&`` chains split off."""
    text = block.text.replace("\\\n", " ")
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        while words:
            cut = words.index("&&") if "&&" in words else len(words)
            yield words[:cut]
            words = words[cut + 1 :]
