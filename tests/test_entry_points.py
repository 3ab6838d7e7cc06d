"""The two single-module entry points stay out of the proving ground: import-linter names packages only, so this
reads app.py's and platform_cli.py's imports, and the modules platform_cli imports by name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import platform_cli

ROOT = Path(__file__).resolve().parents[1]


def _imported_modules(path: Path) -> set[str]:
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules.add(node.module)
    return modules


def _in_proving_ground(module: str) -> bool:
    return module.split(".")[0] == "proving_ground"


@pytest.mark.parametrize("entry_point", ["app.py", "platform_cli.py"])
def test_entry_point_imports_no_proving_ground(entry_point: str) -> None:
    imported = _imported_modules(ROOT / entry_point)
    assert imported, f"{entry_point} imports nothing: the check would pass vacuously"
    assert {module for module in imported if _in_proving_ground(module)} == set()


def test_operator_subcommands_run_product_modules_only() -> None:
    modules = {command.module for command in platform_cli.SUBCOMMANDS.values()}
    assert {module for module in modules if _in_proving_ground(module)} == set()


def test_the_check_sees_a_proving_ground_import(tmp_path: Path) -> None:
    """The reader finds such an import where one is written (absolute and from-imports alike)."""
    module = tmp_path / "entry.py"
    module.write_text("import os\nfrom proving_ground.rehearsal import rehearse\n", encoding="utf-8")
    assert {name for name in _imported_modules(module) if _in_proving_ground(name)} == {"proving_ground.rehearsal"}
