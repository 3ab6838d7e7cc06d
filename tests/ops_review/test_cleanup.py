"""The cleanup of what SageMaker leaves outside CloudFormation, against stubbed AWS APIs (botocore Stubber)."""

from __future__ import annotations

import datetime
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from ops_review import cleanup
from ops_review.cleanup import ENDPOINT_LOG_PREFIX, TRAINING_JOB_LOG_GROUP, CleanupPlan, apply_cleanup, plan_cleanup

NOW = datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC)
ACCOUNT = "111111111111"
STACK_ID = f"arn:aws:cloudformation:us-west-2:{ACCOUNT}:stack/dev-GravitonEndpoint/0a1b"
TAGS = {"project": "pytorch-platform", "environment": "dev", "cost-centre": "ml-platform-dev"}
SERVICES = ("cloudformation", "sagemaker", "logs", "resourcegroupstaggingapi", "ec2")


@pytest.fixture
def stubs() -> Iterator[dict[str, tuple[Any, Stubber]]]:
    clients = {
        name: boto3.client(name, region_name="us-west-2", aws_access_key_id="test", aws_secret_access_key="test")
        for name in SERVICES
    }
    stubbers = {name: Stubber(client) for name, client in clients.items()}
    for stubber in stubbers.values():
        stubber.activate()
    yield {name: (clients[name], stubbers[name]) for name in SERVICES}
    for stubber in stubbers.values():
        stubber.assert_no_pending_responses()
        stubber.deactivate()


# Long: one stubbed response per AWS call the cleanup's discovery makes, in the order it makes them
def _stub_discovery(
    stubs: dict[str, tuple[Any, Stubber]], *, live_endpoints: list[str], stack_name: str = "dev-GravitonEndpoint"
) -> None:
    cloudformation, sagemaker, logs = stubs["cloudformation"][1], stubs["sagemaker"][1], stubs["logs"][1]
    cloudformation.add_response(
        "list_stacks",
        {
            "StackSummaries": [
                {
                    "StackId": STACK_ID,
                    "StackName": stack_name,
                    "CreationTime": NOW,
                    "StackStatus": "DELETE_COMPLETE",
                },
                {
                    "StackId": "other",
                    "StackName": "someone-else",
                    "CreationTime": NOW,
                    "StackStatus": "CREATE_COMPLETE",
                },
            ]
        },
    )
    cloudformation.add_response(
        "list_stack_resources",
        {
            "StackResourceSummaries": [
                {
                    "LogicalResourceId": "Endpoint",
                    "PhysicalResourceId": f"arn:aws:sagemaker:us-west-2:{ACCOUNT}:endpoint/sentimentendpoint-4f2a",
                    "ResourceType": "AWS::SageMaker::Endpoint",
                    "LastUpdatedTimestamp": NOW,
                    "ResourceStatus": "DELETE_COMPLETE",
                },
                {
                    "LogicalResourceId": "Config",
                    "PhysicalResourceId": f"arn:aws:sagemaker:us-west-2:{ACCOUNT}:endpoint-config/config-1",
                    "ResourceType": "AWS::SageMaker::EndpointConfig",
                    "LastUpdatedTimestamp": NOW,
                    "ResourceStatus": "DELETE_COMPLETE",
                },
            ]
        },
        {"StackName": STACK_ID},
    )
    sagemaker.add_response(
        "list_endpoints",
        {
            "Endpoints": [
                {
                    "EndpointName": name,
                    "EndpointArn": f"arn:aws:sagemaker:us-west-2:{ACCOUNT}:endpoint/{name.lower()}",
                    "CreationTime": NOW,
                    "LastModifiedTime": NOW,
                    "EndpointStatus": "InService",
                }
                for name in live_endpoints
            ]
        },
    )
    logs.add_response(
        "describe_log_groups",
        {
            "logGroups": [
                {"logGroupName": f"{ENDPOINT_LOG_PREFIX}SentimentEndpoint-4F2A"},
                {"logGroupName": f"{ENDPOINT_LOG_PREFIX}another-teams-endpoint"},
            ]
        },
        {"logGroupNamePrefix": ENDPOINT_LOG_PREFIX},
    )
    stubs["resourcegroupstaggingapi"][1].add_response(
        "get_resources",
        {"ResourceTagMappingList": [{"ResourceARN": f"arn:aws:sagemaker:us-west-2:{ACCOUNT}:training-job/remote-7"}]},
        {
            "ResourceTypeFilters": ["sagemaker:training-job"],
            "TagFilters": [
                {"Key": "project", "Values": ["pytorch-platform"]},
                {"Key": "environment", "Values": ["dev"]},
            ],
        },
    )
    logs.add_response(
        "describe_log_streams",
        {"logStreams": [{"logStreamName": "remote-7/algo-1-1733000000"}]},
        {"logGroupName": TRAINING_JOB_LOG_GROUP, "logStreamNamePrefix": "remote-7/"},
    )
    stubs["ec2"][1].add_response(
        "describe_instances",
        {
            "Reservations": [
                {"Instances": [{"InstanceId": "i-0abc", "InstanceType": "p4d.24xlarge", "State": {"Name": "running"}}]}
            ]
        },
        {
            "Filters": [
                {"Name": "tag:project", "Values": ["pytorch-platform"]},
                {"Name": "tag:environment", "Values": ["dev"]},
                {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]},
            ]
        },
    )


def _clients(stubs: dict[str, tuple[Any, Stubber]]) -> Any:
    return lambda name: stubs[name][0]


def test_plan_finds_the_environment_leftovers_and_nothing_else(stubs: dict[str, tuple[Any, Stubber]]) -> None:
    _stub_discovery(stubs, live_endpoints=[])
    plan = plan_cleanup(_clients(stubs), ["dev-Foundation", "dev-GravitonEndpoint"], TAGS)
    assert plan == CleanupPlan(
        log_groups=[f"{ENDPOINT_LOG_PREFIX}SentimentEndpoint-4F2A"],
        log_streams=[(TRAINING_JOB_LOG_GROUP, "remote-7/algo-1-1733000000")],
        endpoints_in_service=[],
        instances=["i-0abc (p4d.24xlarge, running)"],
    )


def test_plan_keeps_the_log_group_of_an_endpoint_still_in_service(stubs: dict[str, tuple[Any, Stubber]]) -> None:
    _stub_discovery(stubs, live_endpoints=["SentimentEndpoint-4F2A"])
    plan = plan_cleanup(_clients(stubs), ["dev-GravitonEndpoint"], TAGS)
    assert plan.log_groups == []
    assert plan.endpoints_in_service == ["sentimentendpoint-4f2a"]
    assert "endpoint sentimentendpoint-4f2a is still in service: destroy its stack first" in plan.lines()


def test_apply_deletes_exactly_the_planned_log_groups_and_streams(stubs: dict[str, tuple[Any, Stubber]]) -> None:
    logs = stubs["logs"][1]
    logs.add_response("delete_log_group", {}, {"logGroupName": "/aws/sagemaker/Endpoints/e-1"})
    logs.add_response("delete_log_stream", {}, {"logGroupName": TRAINING_JOB_LOG_GROUP, "logStreamName": "j/algo-1"})
    apply_cleanup(
        _clients(stubs),
        CleanupPlan(log_groups=["/aws/sagemaker/Endpoints/e-1"], log_streams=[(TRAINING_JOB_LOG_GROUP, "j/algo-1")]),
    )


def test_plan_refuses_stacks_without_environment_tags(stubs: dict[str, tuple[Any, Stubber]]) -> None:
    stubs["cloudformation"][1].add_response("list_stacks", {"StackSummaries": []})
    stubs["sagemaker"][1].add_response("list_endpoints", {"Endpoints": []})
    stubs["logs"][1].add_response("describe_log_groups", {"logGroups": []}, {"logGroupNamePrefix": ENDPOINT_LOG_PREFIX})
    with pytest.raises(ValueError, match="no project and environment tags"):
        plan_cleanup(_clients(stubs), ["dev-Foundation"], {})


def test_cli_dry_run_reads_the_environment_from_cdk_out_and_deletes_nothing(
    stubs: dict[str, tuple[Any, Stubber]],
    platform_assembly: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    stack_names, tags, region = cleanup.environment_stacks(platform_assembly, "dev")
    assert "dev-Foundation" in stack_names
    assert (tags["environment"], region) == ("dev", "us-west-2")
    _stub_discovery(stubs, live_endpoints=[], stack_name="dev-Foundation")
    regions = []

    def session(region_name: str) -> Any:
        regions.append(region_name)
        return types.SimpleNamespace(client=_clients(stubs))

    monkeypatch.setattr(boto3, "Session", session)
    assert cleanup.main(["--env", "dev", "--cdk-out", str(platform_assembly), "--dry-run"]) == 0
    assert regions == ["us-west-2"]
    output = capsys.readouterr().out
    assert f"log group {ENDPOINT_LOG_PREFIX}SentimentEndpoint-4F2A" in output
    assert "instance i-0abc (p4d.24xlarge, running) still exists: terminate it yourself" in output
    assert "deleted" not in output  # no delete call was stubbed: the Stubber would have failed on one


def test_cli_names_an_unknown_environment(platform_assembly: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cleanup.main(["--env", "qa", "--cdk-out", str(platform_assembly), "--dry-run"]) == 2
    assert "has no stacks of environment 'qa'" in capsys.readouterr().err


def test_plan_keeps_the_log_groups_the_templates_retain(stubs: dict[str, tuple[Any, Stubber]]) -> None:
    """Staging and prod retain their endpoint log groups on `cdk destroy` (they expire by retention): the cleanup
    lists them as kept and deletes nothing of them."""
    _stub_discovery(stubs, live_endpoints=[])
    retained = {f"{ENDPOINT_LOG_PREFIX}SentimentEndpoint-4F2A"}
    plan = plan_cleanup(_clients(stubs), ["dev-GravitonEndpoint"], TAGS, retained)
    assert plan.log_groups == []
    assert plan.kept_log_groups == [f"{ENDPOINT_LOG_PREFIX}SentimentEndpoint-4F2A"]
    assert (
        f"log group {ENDPOINT_LOG_PREFIX}SentimentEndpoint-4F2A is kept: its stack retains it, and it expires by its "
        "retention" in plan.lines()
    )
    # apply_cleanup deletes only plan.log_groups: a delete call would find no stubbed answer and fail.
    apply_cleanup(_clients(stubs), CleanupPlan(kept_log_groups=plan.kept_log_groups))


def test_retained_log_groups_are_read_from_the_templates(platform_assembly: Path) -> None:
    assert cleanup.retained_log_groups(platform_assembly, "dev") == set()  # dev deletes its log groups
    staging = cleanup.retained_log_groups(platform_assembly, "staging")
    assert f"{ENDPOINT_LOG_PREFIX}staging-GravitonEndpoint" in staging
    assert f"{ENDPOINT_LOG_PREFIX}staging-MultiModelEndpoint" in staging
