"""The compliance gates fail synth on an unacknowledged finding and accept scoped, reasoned acknowledgements."""

from __future__ import annotations

import json
from pathlib import Path

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3

from app import build_app
from scripts import template_gates
from stacks.compliance import acknowledge_short_retention, acknowledge_wildcards, add_compliance_gates
from tests.conftest import cdk_context


def _synth(tmp_path: Path, build) -> cdk.cx_api.CloudAssembly:
    app = cdk.App(outdir=str(tmp_path))
    build(cdk.Stack(app, "Throwaway", env=cdk.Environment(region="us-west-2")))
    add_compliance_gates(app)
    return app.synth()


def _violations(tmp_path: Path) -> set[str]:
    report = json.loads((tmp_path / "validation-report.json").read_text())
    return {v["ruleName"] for plugin in report["pluginReports"] for v in plugin["violations"]}


def test_an_insecure_bucket_fails_synth(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="ValidationFailed"):
        _synth(tmp_path, lambda stack: s3.Bucket(stack, "Insecure"))
    assert {"AwsSolutions-S1", "AwsSolutions-S10", "NIST.800.53.R5-S3DefaultEncryptionKMS"} <= _violations(tmp_path)


def _role_with_wildcards(stack: cdk.Stack, *, acknowledged: bool) -> None:
    bucket = s3.Bucket.from_bucket_name(stack, "Data", "data-bucket")
    statement = iam.PolicyStatement(actions=["s3:GetObject"], resources=[bucket.arn_for_objects("models/*")])
    role = iam.Role(stack, "Reader", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"))
    policy = iam.ManagedPolicy(stack, "ReaderPolicy", roles=[role], statements=[statement])
    if acknowledged:
        acknowledge_wildcards(policy, (statement, "Reads any model version under its prefix."))


def test_wildcard_findings_fail_until_acknowledged_with_a_reason(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="ValidationFailed"):
        _synth(tmp_path / "plain", lambda stack: _role_with_wildcards(stack, acknowledged=False))
    assert "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:s3:::data-bucket/models/*]" in _violations(
        tmp_path / "plain"
    )

    assembly = _synth(tmp_path / "acknowledged", lambda stack: _role_with_wildcards(stack, acknowledged=True))
    template = assembly.get_stack_by_name("Throwaway").template
    (policy,) = (r for r in template["Resources"].values() if r["Type"] == "AWS::IAM::ManagedPolicy")
    assert policy["Metadata"]["cdk_nag"]["rules_to_suppress"] == [
        {
            "id": "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:s3:::data-bucket/models/*]",
            "reason": "Reads any model version under its prefix.",
        }
    ]


def test_every_acknowledgement_in_the_platform_carries_a_reason(templates) -> None:
    acknowledgements = [
        rule
        for stacks in templates.values()
        for template in stacks.values()
        for resource in template["Resources"].values()
        for rule in resource.get("Metadata", {}).get("cdk_nag", {}).get("rules_to_suppress", [])
    ]
    assert acknowledgements
    for rule in acknowledgements:
        assert len(rule["reason"].split()) >= 5, rule


def _platform_policy(app: cdk.App, environment: str, path: str) -> iam.ManagedPolicy:
    """A policy of the real platform, found by its construct path inside the environment's stage."""
    policy = app.node.find_child(environment).node.find_child("Foundation")
    for part in path.split("/"):
        policy = policy.node.find_child(part)
    assert isinstance(policy, iam.ManagedPolicy)
    return policy


@pytest.mark.parametrize("action", ["iam:PassRole", "s3:GetObject"])
def test_a_new_wildcard_in_an_acknowledged_policy_fails_synth_in_cdk_nag(tmp_path: Path, action: str) -> None:
    """The endpoint role's policy already has acknowledged `Resource::*` statements (ECR login, metrics, EC2
    Describe): a new grant on `*` raises the same finding id, and must still fail."""
    app = build_app(context=cdk_context(env="dev"), outdir=str(tmp_path))
    policy = _platform_policy(app, "dev", "EndpointExecutionRole/Policy")
    policy.add_statements(iam.PolicyStatement(sid="Injected", actions=[action], resources=["*"]))
    with pytest.raises(RuntimeError, match="ValidationFailed"):
        app.synth()
    report = json.loads((tmp_path / "validation-report.json").read_text())
    violating = {
        (v["ruleName"], r["constructPath"])
        for plugin in report["pluginReports"]
        for v in plugin["violations"]
        for r in v.get("violatingConstructs", v.get("violatingResources", []))
    }
    assert ("AwsSolutions-IAM5[Resource::*]", "dev/Foundation/EndpointExecutionRole/Policy/Resource") in violating


def test_acknowledgements_name_the_statements_they_excuse(templates) -> None:
    (policy,) = (
        r
        for logical_id, r in templates["dev"]["Foundation"]["Resources"].items()
        if logical_id.startswith("EndpointExecutionRolePolicy") and r["Type"] == "AWS::IAM::ManagedPolicy"
    )
    rules = {rule["id"]: rule["reason"] for rule in policy["Metadata"]["cdk_nag"]["rules_to_suppress"]}
    assert "AwsSolutions-IAM5" not in rules  # never the whole rule, only its exact findings
    reason = rules["AwsSolutions-IAM5[Resource::*]"]
    assert reason.startswith("EcrLogin: ecr:GetAuthorizationToken has no resource-level permissions.")
    assert "PublishSageMakerMetrics:" in reason and "DescribeVpc:" in reason


def test_a_reason_for_a_statement_the_policy_lacks_fails_synth(tmp_path: Path) -> None:
    def build(stack: cdk.Stack) -> None:
        policy = iam.ManagedPolicy(
            stack, "Policy", statements=[iam.PolicyStatement(actions=["ec2:DescribeInstances"], resources=["*"])]
        )
        stale = iam.PolicyStatement(sid="Gone", actions=["ec2:DescribeSubnets"], resources=["*"])
        acknowledge_wildcards(policy, (stale, "Describe calls have no resource-level permissions."))

    with pytest.raises(RuntimeError, match="reasoned statement Gone is not in the policy"):
        _synth(tmp_path, build)


def test_every_acknowledgement_excuses_a_real_finding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Synthesize every environment with acknowledgements recorded instead of applied: each one must name a rule
    that really fires on its construct (or below it). A wrong rule id (AwsSolutions-SM2 is the notebook-instance
    rule in cdk-nag 3) or a stale acknowledgement fails here."""
    recorded: list[tuple[str, str]] = []
    real_of = cdk.Validations.of

    class Recording:
        def __init__(self, scope: cdk.IConstruct) -> None:
            self.scope = scope

        def acknowledge(self, *rules: cdk.Acknowledgment) -> None:
            recorded.extend((self.scope.node.path, rule.id) for rule in rules)

        def add_plugins(self, *plugins: cdk.IPolicyValidationPluginBeta1) -> None:
            real_of(self.scope).add_plugins(*plugins)

    monkeypatch.setattr(cdk.Validations, "of", staticmethod(Recording))
    with pytest.raises(RuntimeError, match="ValidationFailed"):
        build_app(context=cdk_context(), outdir=str(tmp_path)).synth()
    report = json.loads((tmp_path / "validation-report.json").read_text())
    fired = {
        (v["ruleName"].split("::")[-1], r["constructPath"])
        for plugin in report["pluginReports"]
        for v in plugin["violations"]
        for r in v.get("violatingConstructs", v.get("violatingResources", []))
    }
    assert recorded
    unused = [
        (path, rule_id)
        for path, rule_id in recorded
        if not any(
            name == rule_id.split("::")[-1] and (where == path or where.startswith(f"{path}/")) for name, where in fired
        )
    ]
    assert unused == [], "\n".join(map(str, unused)) + "\n" + "\n".join(map(str, sorted(fired)))


# --- Control Tower proactive controls (AWS's CfnGuard validator) on every environment stage -----------------------


def _stage_with(tmp_path: Path, build) -> dict[str, tuple[str, set[str]]]:
    """Synthesize one 'dev' stage through the gates; {plugin: (conclusion, violated rule names)}."""
    app = cdk.App(outdir=str(tmp_path))
    stage = cdk.Stage(app, "dev", env=cdk.Environment(account="111111111111", region="us-west-2"))
    build(cdk.Stack(stage, "Workload"))
    add_compliance_gates(app)
    try:
        app.synth()
    except RuntimeError as error:
        assert "ValidationFailed" in str(error)
    report_file = tmp_path / "validation-report.json"
    if not report_file.exists():
        return {}
    report = json.loads(report_file.read_text())
    return {
        plugin["pluginName"]: (plugin["conclusion"], {v["ruleName"] for v in plugin["violations"]})
        for plugin in report["pluginReports"]
    }


def _log_group_and_launch_template(stack: cdk.Stack, *, retention_days: int, hop_limit: int) -> None:
    key = kms.Key(stack, "Key", enable_key_rotation=True)
    group = logs.LogGroup(
        stack,
        "Logs",
        encryption_key=key,
        retention=logs.RetentionDays.ONE_MONTH if retention_days == 30 else logs.RetentionDays.ONE_YEAR,
        removal_policy=cdk.RemovalPolicy.DESTROY,
    )
    acknowledge_short_retention(group, retention_days, "logs.retention_days")
    ec2.CfnLaunchTemplate(
        stack,
        "Template",
        launch_template_data={"metadataOptions": {"httpTokens": "required", "httpPutResponseHopLimit": hop_limit}},
    )


def test_control_tower_controls_fail_synth_of_an_environment_stage(tmp_path: Path) -> None:
    violations = _stage_with(
        tmp_path, lambda stack: _log_group_and_launch_template(stack, retention_days=30, hop_limit=2)
    )
    conclusion, control_tower = violations["cdk-validator-cfnguard"]
    # Fails although another finding of the stage is acknowledged (the gate marks every violation an error).
    assert conclusion == "failure"
    assert "ec2_launch_template_token_hop_limit_check" in control_tower  # CT.EC2.PR.2
    assert "kms_create_grant_aws_service_check" in control_tower  # CT.KMS.PR.3: the key's default policy
    # A retention below a year is acknowledged with the setting that chose it, so it is not among the findings.
    assert "cloudwatch_log_group_retention_period_check" not in control_tower


def test_a_year_of_retention_needs_no_acknowledgement_and_hop_limit_one_passes(tmp_path: Path) -> None:
    violations = _stage_with(
        tmp_path, lambda stack: _log_group_and_launch_template(stack, retention_days=365, hop_limit=1)
    )
    _, control_tower = violations.get("cdk-validator-cfnguard", ("success", set()))
    assert "ec2_launch_template_token_hop_limit_check" not in control_tower
    assert "cloudwatch_log_group_retention_period_check" not in control_tower


def test_the_gate_lists_every_control_tower_acknowledgement_with_its_reason(cloud_assembly) -> None:
    acknowledged = [
        f"{f['stack']} {f['resource']}: {f['rule']}: {f['reason']}"
        for f in template_gates.acknowledged_findings(template_gates.stacks(Path(cloud_assembly.directory)))
        if f["gate"] == "control-tower"
    ]
    by_environment = {env: [line for line in acknowledged if line.startswith(f"{env}/")] for env in ENVIRONMENTS}
    assert all(by_environment.values()), by_environment
    for line in acknowledged:
        _, rule, reason = line.split(": ", 2)
        assert rule.endswith("_check") and len(reason.split()) >= 5, line
    retention = [line for line in acknowledged if "cloudwatch_log_group_retention_period_check" in line]
    # Every retention below a year names the setting that chose it; prod keeps training and flow logs for a year.
    settings = ("logs.retention_days", "vpc.flow_log_retention_days", "endpoint.log_retention_days")
    assert retention and all(any(f"{key} (" in line for key in settings) for line in retention), retention
    assert {line.split("/")[0] for line in retention if "TrainingLogs" in line or "FlowLogs" in line} == {
        "dev",
        "staging",
    }
    assert not [line for line in acknowledged if "hop_limit" in line or "kms_create_grant" in line]


ENVIRONMENTS = ("dev", "staging", "prod")
