"""The size rule of the repository's code: no class over 300 lines, and no function over 60 unless a comment right above
it (``# Long: <why>``) says why. Long constructors hide which resources a construct makes, long classes mix concerns;
the rule makes a long function a decision someone wrote down. The reason may run over several comment lines."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIMITS = {ast.ClassDef: 300, ast.FunctionDef: 60, ast.AsyncFunctionDef: 60}
MARKER = "# Long:"


def too_long(source: str) -> list[tuple[str, int, int]]:
    """(name, first line, length) of every class over its limit, and of every function over its limit without a
    ``# Long:`` comment."""
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        limit = LIMITS.get(type(node))
        if limit is None:
            continue
        assert isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        length = (node.end_lineno or node.lineno) - node.lineno + 1
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        comment = []  # the comment block right above the definition (or its decorators)
        for line in reversed(lines[: first - 1]):
            if not line.strip().startswith("#"):
                break
            comment.insert(0, line.strip())
        reason = " ".join(comment[next((i for i, c in enumerate(comment) if c.startswith(MARKER)), len(comment)) :])
        reasoned = reason.startswith(MARKER) and len(reason) > len(MARKER) + 10 and not isinstance(node, ast.ClassDef)
        if length > limit and not reasoned:
            found.append((node.name, node.lineno, length))
    return found


# Every package of the product and of the proving ground, the tests included.
PACKAGES = ("stacks", "scripts", "inference_assets", "training_assets", "ops_review", "mme_sizing", "platform_facts",
            "proving_ground", "tests")  # fmt: skip
SOURCES = sorted(
    path
    for path in [*ROOT.glob("*.py"), *(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))]
    if "__pycache__" not in path.parts
)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_class_or_function_is_longer_than_the_rule_without_saying_why(path: Path) -> None:
    assert too_long(path.read_text()) == []


def test_the_rule_finds_a_long_function_and_accepts_a_reasoned_one() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(61))
    assert too_long(f"def f():\n{body}\n") == [("f", 1, 62)]
    assert too_long(f"# Long: one table of 61 rows, read top to bottom\ndef f():\n{body}\n") == []
    assert too_long(f"# Long: one table of 61 rows,\n# read top to bottom\ndef f():\n{body}\n") == []
    assert too_long(f"# Long:\ndef f():\n{body}\n") == [("f", 2, 62)], "a marker without a reason is not one"
    methods = "\n".join(f"    def m{i}(self):\n        return {i}\n" for i in range(101))
    assert too_long(f"# Long: a reason that does not count for a class\nclass C:\n{methods}") == [("C", 2, 303)]
