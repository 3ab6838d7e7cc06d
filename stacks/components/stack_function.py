"""The Lambda function behind one of the platform's custom resources: its code from a folder, its own role, policy and
log group, outside the VPC, with the acknowledgements every such function carries."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from stacks.compliance import acknowledge, acknowledge_control, acknowledge_short_retention

# Why neither reserved concurrency nor a dead-letter queue: true of every function a custom resource calls.
ONCE_PER_STACK_OPERATION = (
    "CloudFormation invokes it once per stack operation, so neither reserved concurrency (which can fail in new "
    "accounts with a low concurrency quota) nor a dead-letter queue (CloudFormation gets every answer, failure "
    "included) adds anything."
)


def function_logs_and_role(
    scope: Construct,
    *,
    key: kms.IKey,
    log_retention_days: int,
    removal_policy: cdk.RemovalPolicy,
    role_description: str,
    retention_setting: str | None = None,
) -> tuple[logs.LogGroup, iam.Role]:
    """The function's own log group ("Logs", encrypted with ``key``) and role ("Role", assumed by Lambda), created
    before its policy; ``retention_setting`` names the setting behind a retention shorter than the rules ask for."""
    log_group = logs.LogGroup(scope, "Logs", encryption_key=key, removal_policy=removal_policy)
    cast(logs.CfnLogGroup, log_group.node.default_child).retention_in_days = log_retention_days
    if retention_setting is not None:
        acknowledge_short_retention(log_group, log_retention_days, retention_setting)
    role = iam.Role(
        scope, "Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"), description=role_description
    )
    return log_group, role


def write_own_logs(log_group: logs.ILogGroup) -> iam.PolicyStatement:
    """The statement every such function's policy carries: its log streams and events in its own log group."""
    return iam.PolicyStatement(
        sid="WriteOwnLogs", actions=["logs:CreateLogStream", "logs:PutLogEvents"], resources=[log_group.log_group_arn]
    )


def stack_function(
    scope: Construct,
    *,
    handler_dir: Path,
    timeout: cdk.Duration,
    role: iam.IRole,
    policy: iam.ManagedPolicy,
    log_group: logs.ILogGroup,
    description: str,
    outside_vpc: str,
    outside_vpc_control: str,
) -> lambda_.Function:
    """``handler_dir``'s ``handler.handler`` as ``scope``'s "Function"; ``outside_vpc`` says why it runs outside the
    VPC (cdk-nag's NIST rules), ``outside_vpc_control`` the same for Control Tower's CT.LAMBDA.PR.3."""
    function = lambda_.Function(
        scope,
        "Function",
        runtime=lambda_.Runtime.PYTHON_3_14,
        handler="handler.handler",
        code=lambda_.Code.from_asset(str(handler_dir), exclude=["__init__.py", "__pycache__", "*.pyc"]),
        timeout=timeout,
        memory_size=128,
        role=role,
        log_group=log_group,
        description=description,
    )
    # The function may not run before its permissions exist (nor lose them while it runs). CDK also makes it depend
    # on the role its Role property already references (cfn-lint W3005): name only the policy.
    stack = cdk.Stack.of(scope)
    cast(lambda_.CfnFunction, function.node.default_child).add_override(
        "DependsOn", [stack.get_logical_id(cast(iam.CfnManagedPolicy, policy.node.default_child))]
    )
    acknowledge(
        function,
        f"{outside_vpc} {ONCE_PER_STACK_OPERATION}",
        "NIST.800.53.R5-LambdaInsideVPC",
        "NIST.800.53.R5-LambdaConcurrency",
        "NIST.800.53.R5-LambdaDLQ",
    )
    acknowledge_control(function, outside_vpc_control, "lambda_inside_vpc_check")
    return function
