"""Every relative link in the README and docs/*.md points to a file that exists, and to a heading of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.markdown import ROOT, anchors, documents, links, slug


def _broken(document: Path, root: Path = ROOT) -> list[str]:
    broken = []
    for target in links(document.read_text(encoding="utf-8")):
        if "://" in target or target.startswith("mailto:"):
            continue
        path_part, _, anchor = target.partition("#")
        path = (document.parent / path_part).resolve() if path_part else document
        relative = path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)
        if not path.is_relative_to(root):
            broken.append(f"{target}: outside the repository")
        elif not path.exists():
            broken.append(f"{target}: no file {relative}")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path.read_text(encoding="utf-8")):
            broken.append(f"{target}: no heading #{anchor} in {relative}")
    return broken


@pytest.mark.parametrize("document", documents(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(document: Path) -> None:
    assert _broken(document) == []


def test_the_docs_link_to_one_another() -> None:
    """The README links to every page under docs/ (a page nobody links to is a page nobody finds)."""
    readme = set(links((ROOT / "README.md").read_text(encoding="utf-8")))
    linked = {target.partition("#")[0] for target in readme}
    assert {f"docs/{page.name}" for page in (ROOT / "docs").glob("*.md")} <= linked


def test_the_checker_finds_broken_links(tmp_path: Path) -> None:
    """The checker itself: a missing file, a missing heading and a link inside code (ignored)."""
    text = "\n".join(
        [
            "# Title `x`",
            "## Deploy, diff: destroy",
            "[ok](#deploy-diff-destroy) [ok](#title-x) [web](https://example.com/missing)",
            "[missing file](nowhere.md) [missing heading](#nope) [another page](sizing.md)",
            "`[in a span](nowhere.md)`",
            "```",
            "[in a block](nowhere.md)",
            "```",
        ]
    )
    assert links(text) == [
        "#deploy-diff-destroy",
        "#title-x",
        "https://example.com/missing",
        "nowhere.md",
        "#nope",
        "sizing.md",
    ]
    assert anchors(text) == {"title-x", "deploy-diff-destroy"}
    assert slug("bf16 and torch.compile") == "bf16-and-torchcompile"
    assert slug("Training with @remote") == "training-with-remote"
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    page.write_text(text, encoding="utf-8")
    assert _broken(page, tmp_path) == [
        "nowhere.md: no file docs/nowhere.md",
        "#nope: no heading #nope in docs/page.md",
        "sizing.md: no file docs/sizing.md",
    ]
