"""`make synth` synthesizes the promotion pipeline too (issue 40, item 2): with placeholder settings while cdk.json has
none, said in the gates' summary line, and through every gate, Control Tower included (CDK validates only stages
that are children of stages, so the pipeline's stages and stack get their own plugin)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest

from app import PLACEHOLDER_PIPELINE, build_app
from ops_review import PLACEHOLDER_METADATA
from scripts import template_gates
from stacks.compliance import _Templates, control_tower_gate
from stacks.settings import SettingsError


def _pipeline_of(app: cdk.App) -> cdk.Stack | None:
    found = app.node.try_find_child("PromotionPipeline")
    return found if isinstance(found, cdk.Stack) else None


def test_placeholder_pipeline_only_when_asked_and_only_without_settings(cdk_context: dict[str, Any]) -> None:
    """`make synth` passes -c placeholder_pipeline=true: the pipeline is built with the placeholder account and
    says so in its metadata (without the flag there is none: test_pipeline's test of the app)."""
    placeholder = _pipeline_of(build_app(context={**cdk_context, "env": "dev", "placeholder_pipeline": "true"}))
    assert placeholder is not None and placeholder.account == PLACEHOLDER_PIPELINE["account"]
    assert PLACEHOLDER_METADATA in placeholder.template_options.metadata


def test_a_bad_placeholder_flag_is_one_sentence(cdk_context: dict[str, Any]) -> None:
    with pytest.raises(SettingsError) as error:
        build_app(context={**cdk_context, "env": "dev", "placeholder_pipeline": "yes"})
    assert str(error.value) == "placeholder_pipeline: 'yes' must be true or false."


def test_the_summary_line_says_the_pipeline_is_a_placeholder(tmp_path: Path) -> None:
    template = {
        "Metadata": {PLACEHOLDER_METADATA: "placeholder pipeline settings"},
        "Resources": {"Key": {"Type": "AWS::KMS::Key", "Properties": {}}},
    }
    (tmp_path / "PromotionPipeline.template.json").write_text(json.dumps(template))
    (line,) = template_gates.stack_lines([("PromotionPipeline", tmp_path / "PromotionPipeline.template.json")])
    assert line.startswith("PromotionPipeline (placeholder pipeline settings): 1 resources")


def test_control_tower_sees_what_no_stage_gate_saw(tmp_path: Path) -> None:
    """The app's Control Tower plugin skips the top-level stages' directories (their own plugins gate them) and
    reports on everything else: an unversioned, unlogged bucket in a pipeline stage's directory is a finding."""
    bucket = {"Resources": {"Bucket": {"Type": "AWS::S3::Bucket", "Properties": {}}}}
    paths = []
    for directory in ("assembly-dev", "assembly-PromotionPipeline-dev"):
        (tmp_path / directory).mkdir()
        path = tmp_path / directory / "Stack.template.json"
        path.write_text(json.dumps(bucket))
        paths.append(str(path))
    gate = control_tower_gate(skip_directories={"assembly-dev"})
    skipped = gate.validate(_Templates(paths[:1]))
    assert skipped.success and not skipped.violations
    report = gate.validate(_Templates(paths))
    assert not report.success
    assert {resource.template_path for v in report.violations for resource in v.violating_resources} == {paths[1]}
    assert "s3_bucket_versioning_enabled_check" in {v.rule_name for v in report.violations}


def test_a_crashed_validation_plugin_fails_the_gates(tmp_path: Path) -> None:
    """The Control Tower validator once crashed on a key policy (no violation, conclusion failure): the gates read
    that as a finding instead of a pass."""
    report = {
        "pluginReports": [
            {
                "pluginName": "cdk-validator-cfnguard",
                "conclusion": "failure",
                "metadata": {"error": "Of property Object.resourceLogicalId: Unable to serialize value as string\n..."},
                "violations": [],
            }
        ]
    }
    (tmp_path / "validation-report.json").write_text(json.dumps(report))
    assert template_gates.nag_violations(tmp_path) == [
        "cdk-validator-cfnguard failed: Of property Object.resourceLogicalId: Unable to serialize value as string"
    ]
