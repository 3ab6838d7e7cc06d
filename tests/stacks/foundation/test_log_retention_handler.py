"""The calls CDK's LogRetention handler makes when prod's Foundation is created, evaluated against the synthesized
policy of the role it runs as: one refused call fails the custom resource and rolls the stack back.

The handler (aws-cdk packages/@aws-cdk/custom-resource-handlers/lib/aws-logs/log-retention-handler/index.ts), on
Create: CreateLogGroup + PutRetentionPolicy on the target group, then CreateLogGroup + PutRetentionPolicy (1 day) on
``/aws/lambda/<its own function name>``; Lambda's runtime writes its output to the same group."""

from __future__ import annotations

import pytest

from ops_review.iam_policy import Request, is_allowed
from proving_ground.iam_requests import logical_id, role_policies
from stacks.components.training_job_log_retention import LOG_RETENTION_ID
from stacks.foundation import TRAINING_JOB_LOG_GROUP

ACCOUNT = "123456789012"


def _function_name(stack_name: str, function_id: str) -> str:
    """The name CloudFormation generates: ``<stack>-<logical id>`` cut to 50 characters, ``-`` and 12 random ones
    (e.g. ``Cdk05LambdaStack-LogRetentionaae0aa3c5b4d4f87b02d8-8rID6WpQZgda``, seen in public listings)."""
    return f"{stack_name}-{function_id}"[:50] + "-8rID6WpQZgda"


@pytest.fixture(scope="module")
def prod_foundation(cloud_assembly) -> tuple[str, str, dict]:  # type: ignore[no-untyped-def]
    (stack,) = [
        stack
        for stage in cloud_assembly.nested_assemblies
        if stage.directory_name == "assembly-prod"
        for stack in stage.nested_assembly.stacks
        if stack.hierarchical_id.endswith("/Foundation")
    ]
    return stack.stack_name, stack.environment.region, stack.template


def test_the_handler_may_make_every_call_of_its_create(prod_foundation: tuple[str, str, dict]) -> None:
    stack_name, region, template = prod_foundation
    (function_id,) = [
        name
        for name, resource in template["Resources"].items()
        if resource["Type"] == "AWS::Lambda::Function" and name.startswith(f"LogRetention{LOG_RETENTION_ID}")
    ]
    role = template["Resources"][function_id]["Properties"]["Role"]["Fn::GetAtt"][0]
    assert role == logical_id(template, "AWS::IAM::Role", "TrainingJobLogRetentionRole")
    refs = {"AWS::Partition": "aws", "AWS::Region": region, "AWS::AccountId": ACCOUNT, "AWS::StackName": stack_name}
    policies = role_policies(template, role, refs)

    def group(name: str, suffix: str = ":*") -> str:
        # A group-level action is checked against the group's ARN ending in ":*" (CloudWatch Logs API reference,
        # LogGroup.arn: that form for every action but the three tagging ones); a stream's ARN extends the bare one.
        return f"arn:aws:logs:{region}:{ACCOUNT}:log-group:{name}{suffix}"

    own = f"/aws/lambda/{_function_name(stack_name, function_id)}"
    stream = group(own, ":log-stream:2026/12/04/[$LATEST]0123")
    calls = [
        ("logs:CreateLogGroup", group(TRAINING_JOB_LOG_GROUP)),
        ("logs:PutRetentionPolicy", group(TRAINING_JOB_LOG_GROUP)),
        ("logs:CreateLogGroup", group(own)),
        ("logs:PutRetentionPolicy", group(own)),
        ("logs:CreateLogStream", stream),
        ("logs:PutLogEvents", stream),
    ]
    refused = [call for call in calls if not is_allowed(policies, Request(*call))]
    assert refused == []
    # Nothing beyond: not another function's log group.
    assert not is_allowed(policies, Request("logs:PutRetentionPolicy", group("/aws/lambda/prod-other")))
