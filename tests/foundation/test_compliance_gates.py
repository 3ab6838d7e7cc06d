"""The compliance gates fail synth on an unacknowledged finding and accept scoped, reasoned acknowledgements."""

from __future__ import annotations

import json
from pathlib import Path

import aws_cdk as cdk
import pytest
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3

from stacks.compliance import acknowledge_wildcards, add_compliance_gates


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
