"""Every template of every environment passes cfn-lint (no errors, no warnings) and checkov."""

from __future__ import annotations

from pathlib import Path

import yaml

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


def test_summary_names_stacks_as_cdk_ls_does_in_promotion_order(cloud_assembly) -> None:
    named = template_gates.stacks(Path(cloud_assembly.directory))
    # `cdk ls` prints each stack's hierarchical id (its display name), e.g. dev/Foundation.
    expected = {
        stack.hierarchical_id for stage in cloud_assembly.nested_assemblies for stack in stage.nested_assembly.stacks
    } | {stack.hierarchical_id for stack in cloud_assembly.stacks}
    names = [name for name, _ in named]
    assert set(names) == expected and len(names) == len(expected)
    stages = [name.split("/")[0] for name in names if "/" in name]
    assert stages == sorted(stages, key=["dev", "staging", "prod"].index), "promotion order"
    assert stages[0] == "dev" and stages[-1] == "prod"
    text = template_gates.summary(named)
    headings = [line.split(":")[0] for line in text.splitlines() if not line.startswith(" ")]
    assert headings == names
    assert "dev/Foundation" in headings


def test_every_checkov_skip_is_listed_with_its_reason() -> None:
    groups = template_gates.checkov_skips()
    skipped = [check for ids, _ in groups for check in ids]
    config = yaml.safe_load(template_gates.CHECKOV_CONFIG.read_text())
    assert skipped == config["skip-check"]
    assert all(len(reason) > 40 for _, reason in groups), groups
    text = template_gates.skips_summary(groups)
    assert all(check in text for check in skipped) and "NO REASON" not in text


def test_a_skip_without_a_comment_is_flagged(tmp_path: Path) -> None:
    config = tmp_path / "checkov.yaml"
    config.write_text("framework:\n  - cloudformation\nskip-check:\n  - CKV_AWS_1\n  # Why two.\n  - CKV_AWS_2\n")
    groups = template_gates.checkov_skips(config)
    assert groups == [(["CKV_AWS_1"], ""), (["CKV_AWS_2"], "Why two.")]
    assert "CKV_AWS_1: NO REASON GIVEN" in template_gates.skips_summary(groups)
