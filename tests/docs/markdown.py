"""What the docs tests read from Markdown: the README and docs/*.md, their links, headings and code."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^(```|~~~)")
LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def documents() -> list[Path]:
    """The README and every page under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def split_code(text: str) -> tuple[list[str], list[str]]:
    """The prose lines (outside fenced code blocks) and the code blocks' lines of a Markdown text."""
    prose: list[str] = []
    code: list[str] = []
    inside = False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            inside = not inside
            continue
        (code if inside else prose).append(line)
    return prose, code


def links(text: str) -> list[str]:
    """The targets of the inline links in the prose (not in code blocks or code spans)."""
    prose, _ = split_code(text)
    return [target for line in prose for target in LINK.findall(CODE_SPAN.sub("", line))]


def code(text: str) -> list[str]:
    """Every code span and every line of every code block: where commands, keys and paths are written."""
    prose, blocks = split_code(text)
    return blocks + [span for line in prose for _, span in CODE_SPAN.findall(line)]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = CODE_SPAN.sub(lambda m: m.group(2), heading.strip()).lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading keeps its text
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of a page's headings (repeated headings get -1, -2, ... as on GitHub)."""
    prose, _ = split_code(text)
    seen: dict[str, int] = {}
    found = set()
    for line in prose:
        if match := re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line):
            base = slug(match.group(1))
            count = seen.get(base, 0)
            found.add(base if count == 0 else f"{base}-{count}")
            seen[base] = count + 1
    return found
