"""Log groups that expire for the handlers of CDK's own custom-resource providers.

CDK's ``CustomResourceProvider`` singletons (``Custom::S3AutoDeleteObjects`` behind ``auto_delete_objects``,
``Custom::VpcRestrictDefaultSG`` behind the VPC's restricted default security group) are plain
``AWS::Lambda::Function`` resources with no ``LoggingConfig``: Lambda writes them to ``/aws/lambda/<function>``,
which it creates itself on the first invocation, with no retention and outside CloudFormation, so the group never
expires and outlives ``cdk destroy``. Here each such handler gets a log group the stack owns, with the environment's
retention, key and removal policy (Lambda user guide, "Configuring CloudWatch log groups": ``LoggingConfig.LogGroup``).
The handlers' roles (AWSLambdaBasicExecutionRole) may write to any log group.
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from constructs import Construct

from stacks.compliance import acknowledge_short_retention

_PROVIDER_SUFFIX = "CustomResourceProvider"


def provider_handlers(stack: cdk.Stack) -> list[cdk.CfnResource]:
    """The handler functions of the stack's CDK custom-resource providers that log to Lambda's default group."""
    found = []
    for construct in stack.node.find_all():
        scope = construct.node.scope
        if (
            isinstance(construct, cdk.CfnResource)
            and construct.cfn_resource_type == "AWS::Lambda::Function"
            and construct.node.id == "Handler"
            and scope is not None
            and scope.node.id.endswith(_PROVIDER_SUFFIX)
        ):
            found.append(construct)
    return found


def expire_provider_logs(
    stack: cdk.Stack,
    *,
    key: kms.IKey,
    retention_days: int,
    removal_policy: cdk.RemovalPolicy,
    retention_setting: str,
) -> list[logs.LogGroup]:
    """Give every provider handler of ``stack`` a log group with ``retention_days`` (call once the stack is built);
    ``retention_setting`` names the setting that chose the days (Control Tower's acknowledgement below a year)."""
    groups = []
    for handler in provider_handlers(stack):
        provider = handler.node.scope
        assert isinstance(provider, Construct)  # provider_handlers found it
        group = logs.LogGroup(provider, "LogGroup", encryption_key=key, removal_policy=removal_policy)
        cfn_group = group.node.default_child
        assert isinstance(cfn_group, logs.CfnLogGroup)
        cfn_group.retention_in_days = retention_days
        acknowledge_short_retention(group, retention_days, retention_setting)
        # The reference also orders them: the group exists before the handler runs and is deleted after it.
        handler.add_property_override("LoggingConfig", {"LogGroup": group.log_group_name})
        groups.append(group)
    return groups
