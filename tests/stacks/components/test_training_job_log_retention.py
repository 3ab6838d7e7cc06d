"""TrainingJobLogRetention on a bare stack: the account's log group gets a retention without the stack owning it, and
the handler's role may touch that group and its own logs only."""

from __future__ import annotations

import pytest
from aws_cdk import aws_logs as logs

from ops_review.iam_policy import Request, is_allowed
from proving_ground.iam_requests import role_policies
from stacks.components.training_job_log_retention import LOG_RETENTION_ID, TrainingJobLogRetention
from tests.stacks.components.bare_stack import ACCOUNT, REGION, bare_stack, refs, resources, template_of

GROUP = "/aws/sagemaker/TrainingJobs"


@pytest.fixture(scope="module")
def template() -> dict:
    stack = bare_stack()
    TrainingJobLogRetention(stack, "Retention", log_group_name=GROUP, retention=logs.RetentionDays.ONE_YEAR)
    return template_of(stack)


def test_the_group_gets_a_retention_and_outlives_the_stack(template: dict) -> None:
    assert resources(template, "AWS::Logs::LogGroup") == {}  # the account's group, never the stack's
    ((_, retention),) = resources(template, "Custom::LogRetention").items()
    props = retention["Properties"]
    assert (props["LogGroupName"], props["RetentionInDays"], props["RemovalPolicy"]) == (GROUP, 365, "retain")
    ((policy_id, _),) = resources(template, "AWS::IAM::ManagedPolicy").items()
    assert policy_id in retention["DependsOn"]  # the handler runs only once its permissions exist


def test_the_handler_may_set_this_groups_retention_and_write_its_own_logs_only(template: dict) -> None:
    (handler,) = [
        r
        for lid, r in resources(template, "AWS::Lambda::Function").items()
        if lid.startswith(f"LogRetention{LOG_RETENTION_ID}")
    ]
    role_id = handler["Properties"]["Role"]["Fn::GetAtt"][0]
    policies = role_policies(template, role_id, refs(template))

    def group(name: str) -> str:
        # The ARN IAM checks a group-level action against ends in ":*" (CloudWatch Logs API reference, LogGroup.arn:
        # that form for every action but TagResource, UntagResource and ListTagsForResource).
        return f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{name}:*"

    own = "/aws/lambda/Bare-LogRetentionaae0aa3c5b4d4f87b02d8-AbCdEf123456"
    calls = {
        ("logs:PutRetentionPolicy", group(GROUP)): True,
        ("logs:DeleteRetentionPolicy", group(GROUP)): True,
        ("logs:CreateLogGroup", group(GROUP)): True,
        ("logs:PutRetentionPolicy", group(own)): True,
        (
            "logs:PutLogEvents",
            f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{own}:log-stream:2026/12/04/[$LATEST]0123",
        ): True,
        ("logs:PutRetentionPolicy", group("/aws/sagemaker/Endpoints/prod")): False,
        ("logs:DeleteLogGroup", group(GROUP)): False,
    }
    assert {call: is_allowed(policies, Request(*call)) for call in calls} == calls
