"""CDK's own custom-resource provider handlers log to groups that expire and go with their stack, instead of the
``/aws/lambda/<function>`` group Lambda creates on first use with no retention and outside CloudFormation."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3

from stacks.components.provider_log_groups import expire_provider_logs, provider_handlers
from tests.stacks.components.bare_stack import bare_stack, resources, template_of

# CDK's LogRetention handler (aws-cdk-lib custom-resource-handlers, log-retention) sets a one-day retention on its
# own /aws/lambda group itself; every other function must name its log group.
LOG_RETENTION_HANDLER = "LogRetentionaae0aa3c5b4d4f87b02d85b201efdd8a"


def _stack() -> cdk.Stack:
    stack = bare_stack()
    s3.Bucket(stack, "Bucket", removal_policy=cdk.RemovalPolicy.DESTROY, auto_delete_objects=True)
    ec2.Vpc(stack, "Vpc", max_azs=1, restrict_default_security_group=True)
    return stack


def test_without_it_the_handlers_log_to_lambdas_default_group() -> None:
    stack = _stack()
    assert len(provider_handlers(stack)) == 2
    for function in resources(template_of(stack), "AWS::Lambda::Function").values():
        assert "LoggingConfig" not in function["Properties"]


def test_each_provider_handler_gets_a_group_with_retention_key_and_removal_policy() -> None:
    stack = _stack()
    groups = expire_provider_logs(
        stack,
        key=kms.Key(stack, "Key"),
        retention_days=14,
        removal_policy=cdk.RemovalPolicy.RETAIN,
        retention_setting="logs.retention_days",
    )
    template = template_of(stack)
    log_groups = resources(template, "AWS::Logs::LogGroup")
    assert len(groups) == 2 and len(log_groups) == 2
    for group in log_groups.values():
        assert group["Properties"]["RetentionInDays"] == 14 and "KmsKeyId" in group["Properties"]
        assert group["DeletionPolicy"] == "Retain"
    targets = {f["Properties"]["LoggingConfig"]["LogGroup"]["Ref"]
               for f in resources(template, "AWS::Lambda::Function").values()}  # fmt: skip
    assert targets == set(log_groups)


def test_every_function_of_the_platform_names_a_log_group(templates) -> None:
    checked = 0
    for environment, stacks in templates.items():
        for stack, template in stacks.items():
            for logical_id, function in resources(template, "AWS::Lambda::Function").items():
                if logical_id.startswith(LOG_RETENTION_HANDLER):
                    continue
                group = function["Properties"].get("LoggingConfig", {}).get("LogGroup")
                assert group, f"{environment}/{stack}/{logical_id} logs to a group that never expires"
                retention = template["Resources"][group["Ref"]]["Properties"]["RetentionInDays"]
                assert retention >= 1, (environment, stack, logical_id)
                checked += 1
    assert checked >= 7  # dev: 2 providers + the ENI wait; staging, prod: 1 provider + waits + model checks
