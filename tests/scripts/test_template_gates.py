"""The post-synth gates over every environment: cfn-lint (no errors, no warnings) and checkov pass, the output is
one line per gate and per stack, a failing gate prints in full, and the report in the assembly holds every
acknowledgement with its reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from ops_review import GATES_REPORT
from scripts import template_gates


@pytest.fixture(scope="module")
def gates_report(cloud_assembly) -> dict:
    """The gates run once over the session's assembly (cfn-lint and checkov take ~20 s each)."""
    return template_gates.run_gates(Path(cloud_assembly.directory))


def test_every_gate_passes_and_the_report_lands_in_the_assembly(cloud_assembly, gates_report: dict) -> None:
    failed = {name: gate for name, gate in gates_report["gates"].items() if not gate["passed"]}
    assert not failed, (failed, gates_report["cfn_lint_output"], gates_report["checkov_output"])
    assert gates_report["cfn_lint_output"] == ""  # no warnings either
    written = json.loads((Path(cloud_assembly.directory) / GATES_REPORT).read_text())
    assert written == gates_report


def test_the_report_holds_every_acknowledgement_of_every_template(cloud_assembly, gates_report: dict) -> None:
    in_metadata = [
        (logical_id, rule["id"])
        for stage in cloud_assembly.nested_assemblies
        for stack in stage.nested_assembly.stacks
        for logical_id, resource in stack.template.get("Resources", {}).items()
        for rule in resource.get("Metadata", {}).get("cdk_nag", {}).get("rules_to_suppress", [])
    ]
    reported = gates_report["acknowledged"]
    assert len(reported) == len(in_metadata) > 50
    assert {f["gate"] for f in reported} == {"cdk-nag", "control-tower"}
    assert all(len(f["reason"].split()) >= 5 for f in reported), [f for f in reported if len(f["reason"]) < 30]


def test_quiet_output_is_one_line_per_gate_and_per_stack(gates_report: dict, tmp_path: Path) -> None:
    text = template_gates.render(gates_report, report_file=tmp_path / "gates-report.json")
    lines = text.splitlines()
    assert len(lines) == len(gates_report["gates"]) + len(gates_report["stacks"]) + len(gates_report["warnings"]) + 1
    assert all(line.startswith("ok   ") for line in lines[: len(gates_report["gates"])])
    assert not any(finding["reason"] in text for finding in gates_report["acknowledged"])
    verbose = template_gates.render(gates_report, verbose=True)
    assert all(finding["reason"] in verbose for finding in gates_report["acknowledged"])


def test_an_unacknowledged_finding_fails_and_prints_in_full(gates_report: dict) -> None:
    finding = "AwsSolutions-S1 at dev/Foundation/Extra/Resource"
    failing = {
        **gates_report,
        "unacknowledged": [finding],
        "gates": {**gates_report["gates"], "cdk-nag (AwsSolutions, NIST 800-53 R5)": {"passed": False, "summary": ""}},
    }
    text = template_gates.render(failing)
    assert finding in text.splitlines()[1] and "FAIL cdk-nag" in text


def test_stacks_are_named_as_cdk_ls_does_in_promotion_order(cloud_assembly, gates_report: dict) -> None:
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
    assert [line.split(":")[0] for line in gates_report["stacks"]] == names


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


def test_the_review_shows_the_gates_report_of_the_assembly(cloud_assembly, gates_report: dict, tmp_path: Path) -> None:
    from ops_review.__main__ import main as review

    assert review([cloud_assembly.directory, "--out", str(tmp_path)]) == 0
    gates_page = (tmp_path / "gates.md").read_text()
    for finding in gates_report["acknowledged"]:
        assert f"| {finding['resource']} | {finding['rule']} |" in gates_page
    assert "[Gates](gates.md)" in (tmp_path / "index.md").read_text()


def test_synth_warnings_reach_the_output_with_their_stacks(gates_report: dict) -> None:
    """CDK warning annotations of stacks in stages (the image patch-window warnings among them) are printed, since
    the CDK CLI leaves them in the assembly's metadata."""
    from aws_cdk import Annotations, App, Stack, Stage

    app = App()
    stack = Stack(Stage(app, "dev"), "Training")
    Annotations.of(stack).add_warning_v2("test:warning", "training.image_tag: ends patching soon")
    assembly = Path(app.synth().directory)
    warnings = template_gates.synth_warnings(assembly)
    assert warnings == {"training.image_tag: ends patching soon": ["dev/Training"]}
    text = template_gates.render({**gates_report, "warnings": warnings})
    assert "warn training.image_tag: ends patching soon (dev/Training)" in text.splitlines()


def test_each_image_resolved_at_deploy_time_is_one_warning(gates_report: dict) -> None:
    """Issue 40, item 1: synth cannot know whether the serving image's parameter exists; it says so in one line
    per endpoint that resolves one (staging and prod name a model; dev has no Graviton endpoint yet)."""
    lines = [message for message in gates_report["warnings"] if "check-images" in message]
    assert [line.split(" ")[0] for line in lines] == ["staging/GravitonEndpoint", "prod/GravitonEndpoint"]
    assert all("/pytorch-platform/images/graviton-serving" in line and "(arm64 for ml.c7g." in line for line in lines)


def _template_of(cloud_assembly, stage: str, stack: str) -> dict:
    (found,) = [
        s.template
        for nested in cloud_assembly.nested_assemblies
        for s in nested.nested_assembly.stacks
        if s.stack_name == f"{stage}-{stack}"
    ]
    return json.loads(json.dumps(found))


def test_the_deploy_time_rules_pass_the_platform_and_catch_what_aws_refuses(cloud_assembly, gates_report) -> None:
    """Issue 40, item 6: rules from the API references no other gate checks. The platform's templates break none;
    prod's multi-model endpoint (ml.c5d.18xlarge, local NVMe) given a KmsKeyId, a scalable target turned upside
    down, and a launch template with a public address on several cards each break theirs, in one line."""
    from stacks import deploy_rules

    assert gates_report["deploy_rules"] == []
    assert all(gate["passed"] for name, gate in gates_report["gates"].items() if name.startswith("deploy-time"))
    mme = _template_of(cloud_assembly, "prod", "MultiModelEndpoint")
    config_id, config = next(
        (i, r) for i, r in mme["Resources"].items() if r["Type"] == "AWS::SageMaker::EndpointConfig"
    )
    assert deploy_rules.findings(mme) == []
    config["Properties"]["KmsKeyId"] = "arn:aws:kms:us-west-2:111111111111:key/example"
    target = next(r for r in mme["Resources"].values() if r["Type"] == "AWS::ApplicationAutoScaling::ScalableTarget")
    target["Properties"]["MinCapacity"], target["Properties"]["MaxCapacity"] = 0, 0
    found = deploy_rules.findings(mme)
    assert found[0].startswith(f"{config_id}: KmsKeyId with ml.c5d.18xlarge, which has local NVMe storage")
    assert "(sagemaker-endpoint-config-key-on-local-storage; SageMaker API Reference, CreateEndpointConfig" in found[0]
    assert any("MinCapacity 0: a SageMaker variant's scalable target needs at least 1" in line for line in found)
    training = _template_of(cloud_assembly, "prod", "Training")
    launch_id, launch = next(
        (i, r) for i, r in training["Resources"].items() if r["Type"] == "AWS::EC2::LaunchTemplate"
    )
    interfaces = launch["Properties"]["LaunchTemplateData"]["NetworkInterfaces"]
    assert len(interfaces) > 1 and deploy_rules.findings(training) == []  # prod trains on EFA: four cards
    interfaces[0]["AssociatePublicIpAddress"] = True
    assert [line.split(":")[0] for line in deploy_rules.findings(training)] == [launch_id]
