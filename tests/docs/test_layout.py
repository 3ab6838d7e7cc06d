"""docs/architecture.md's repository layout is the repository: every top-level folder is mapped to the product or
to the proving ground, and every path of the layout tree exists."""

from __future__ import annotations

import re
import subprocess

from tests.docs.markdown import ROOT, split_code

ARCHITECTURE = ROOT / "docs" / "architecture.md"
SIDES = {"product", "proving ground"}


def tracked_top_level_folders() -> set[str]:
    """The folders at the repository's root that git tracks files in (build outputs and virtualenvs are not)."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return {line.split("/", 1)[0] for line in files.splitlines() if "/" in line}


def _section(text: str, heading: str) -> str:
    return text.split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]


def folder_sides(text: str) -> dict[str, str]:
    """The folder -> side rows of the layout's table (`| `folder/` | side | what |`)."""
    rows = re.findall(r"^\|\s*`([^`]+)/`\s*\|\s*([^|]+?)\s*\|", _section(text, "## Repository layout"), re.MULTILINE)
    return {folder: side for folder, side in rows}


def tree_paths(text: str) -> list[str]:
    """The paths of the layout's tree: each entry's name under the folders it is indented below."""
    _, code = split_code(_section(text, "## Repository layout"))
    paths: list[str] = []
    parents: list[tuple[int, str]] = []
    for line in code:
        match = re.match(r"^( {0,10})([\w.-]+(?:/[\w.-]+)*/?)(?:\s{2,}|$)", line)
        if not match:
            continue  # a description's next line
        indent, name = len(match.group(1)), match.group(2)
        while parents and parents[-1][0] >= indent:
            parents.pop()
        path = "".join(parent for _, parent in parents) + name
        paths.append(path)
        if name.endswith("/"):
            parents.append((indent, name))
    return paths


def test_every_top_level_folder_is_product_or_proving_ground() -> None:
    sides = folder_sides(ARCHITECTURE.read_text(encoding="utf-8"))
    assert set(sides) == tracked_top_level_folders()
    assert {folder: side for folder, side in sides.items() if side not in SIDES} == {}


def test_every_path_of_the_layout_tree_exists() -> None:
    paths = tree_paths(ARCHITECTURE.read_text(encoding="utf-8"))
    assert len(paths) > 20, "the layout tree was not found"
    assert [path for path in paths if not (ROOT / path).exists()] == []


def test_the_tree_reader_follows_indentation() -> None:
    text = "\n".join(
        [
            "## Repository layout",
            "```",
            "app.py                  builds the app",
            "stacks/                 stacks",
            "  settings.py           the settings,",
            "                        wrapped onto a second line",
            "  components/           constructs",
            "    platform_key.py     the key",
            "scripts/gates.py        gates",
            "```",
            "## Next",
        ]
    )
    assert tree_paths("intro\n" + text) == [
        "app.py",
        "stacks/",
        "stacks/settings.py",
        "stacks/components/",
        "stacks/components/platform_key.py",
        "scripts/gates.py",
    ]
