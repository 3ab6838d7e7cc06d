"""Every template of every environment passes cfn-lint (no errors, no warnings) and checkov."""

from __future__ import annotations

from pathlib import Path

from scripts import template_gates


def test_cfn_lint_is_clean_on_every_template(cloud_assembly) -> None:
    paths = template_gates.templates(Path(cloud_assembly.directory))
    assert len(paths) >= 3
    result = template_gates.cfn_lint(paths)
    assert result.returncode == 0, result.stdout


def test_checkov_passes_with_only_the_reasoned_skips(cloud_assembly) -> None:
    result = template_gates.checkov(Path(cloud_assembly.directory))
    assert result.returncode == 0, result.stdout[-5000:]
    assert "Failed checks: 0" in result.stdout


def test_summary_lists_every_stack(cloud_assembly) -> None:
    paths = template_gates.templates(Path(cloud_assembly.directory))
    text = template_gates.summary(paths)
    assert [line for line in text.splitlines() if not line.startswith(" ")] == [
        line for line in text.splitlines() if "resources," in line
    ]
    assert {line.split("/")[0] for line in text.splitlines() if "resources," in line} == {"dev", "staging", "prod"}
