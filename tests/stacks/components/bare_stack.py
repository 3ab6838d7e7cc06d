"""A bare stack for construct tests (the project's feature flags, a fixed account and region), and the values its
template's references resolve to, so that synthesized policies can be evaluated with ops_review/iam_policy.py."""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk

from stacks.compliance import add_compliance_gates
from tests.conftest import cdk_context

ACCOUNT = "123456789012"
REGION = "us-west-2"


def bare_stack(name: str = "Bare") -> cdk.Stack:
    """A stack in its own app, with cdk.json's feature flags (what the constructs meet in the platform)."""
    return cdk.Stack(cdk.App(context=cdk_context()), name, env=cdk.Environment(account=ACCOUNT, region=REGION))


def synth_through_the_gates(stack: cdk.Stack) -> None:
    """Synthesize ``stack``'s app with the platform's compliance gates: an unacknowledged cdk-nag or Control Tower
    finding fails it."""
    app = stack.node.scope
    assert isinstance(app, cdk.App)
    add_compliance_gates(app)
    app.synth()


def template_of(stack: cdk.Stack) -> dict[str, Any]:
    return cdk.assertions.Template.from_stack(stack).to_json()


def resources(template: dict[str, Any], resource_type: str) -> dict[str, dict[str, Any]]:
    return {name: r for name, r in template["Resources"].items() if r["Type"] == resource_type}


def launch_data(template: dict[str, Any]) -> dict[str, Any]:
    """The LaunchTemplateData of the template's one launch template."""
    (launch,) = resources(template, "AWS::EC2::LaunchTemplate").values()
    return launch["Properties"]["LaunchTemplateData"]


def refs(template: dict[str, Any]) -> dict[str, Any]:
    """Pseudo parameters, and a made-up physical id and ARN for every resource of ``template`` (bucket names, role
    names, key ids, ...: the logical id in lower case)."""
    values: dict[str, Any] = {
        "AWS::Partition": "aws",
        "AWS::Region": REGION,
        "AWS::AccountId": ACCOUNT,
        "AWS::URLSuffix": "amazonaws.com",
        "AWS::StackName": "Bare",
    }
    arns = {
        "AWS::S3::Bucket": "arn:aws:s3:::{}",
        "AWS::IAM::Role": f"arn:aws:iam::{ACCOUNT}:role/{{}}",
        "AWS::KMS::Key": f"arn:aws:kms:{REGION}:{ACCOUNT}:key/{{}}",
        "AWS::IAM::InstanceProfile": f"arn:aws:iam::{ACCOUNT}:instance-profile/{{}}",
    }
    for logical_id, resource in template["Resources"].items():
        physical = logical_id.lower()
        values[logical_id] = physical
        if resource["Type"] in arns:
            values[f"{logical_id}.Arn"] = arns[resource["Type"]].format(physical)
        values[f"{logical_id}.GroupId"] = physical
    return values
