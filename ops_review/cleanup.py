"""Clean up what SageMaker and EC2 create outside CloudFormation for one environment, after `cdk destroy`.

CloudFormation deletes what the stacks declare; these stay behind:
- endpoint log groups ``/aws/sagemaker/Endpoints/<endpoint>`` (SageMaker creates them, with no retention), except
  those a template declares and retains (staging and prod keep theirs on purpose; they expire by their retention):
  those are listed as kept, never deleted;
- training-job log streams in ``/aws/sagemaker/TrainingJobs`` (one shared log group, streams ``<job>/algo-...``);
- GPU instances someone launched from the training launch template (billable until terminated; reported, never
  terminated here: a run may still be in progress).
Endpoints are found through the environment's CloudFormation stacks (live or deleted, read from ``cdk.out``);
training jobs and instances through the environment's ``project`` and ``environment`` tags.

    python -m ops_review.cleanup --env dev --dry-run     # list
    python -m ops_review.cleanup --env dev               # delete the log groups and streams
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ops_review.review import load_assembly

ENDPOINT_LOG_PREFIX = "/aws/sagemaker/Endpoints/"
TRAINING_JOB_LOG_GROUP = "/aws/sagemaker/TrainingJobs"
_LIVE_INSTANCE_STATES = ["pending", "running", "stopping", "stopped"]
# DeletionPolicy values that keep a resource when its stack is deleted (CDK writes RETAIN_ON_UPDATE_OR_DELETE as
# RetainExceptOnCreate).
_RETAINED = ("Retain", "RetainExceptOnCreate")


@dataclass
class CleanupPlan:
    log_groups: list[str] = field(default_factory=list)
    log_streams: list[tuple[str, str]] = field(default_factory=list)
    endpoints_in_service: list[str] = field(default_factory=list)
    instances: list[str] = field(default_factory=list)
    kept_log_groups: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [
            *(f"log group {name}" for name in self.log_groups),
            *(
                f"log group {name} is kept: its stack retains it, and it expires by its retention"
                for name in self.kept_log_groups
            ),
            *(f"log stream {group} {stream}" for group, stream in self.log_streams),
            *(f"endpoint {name} is still in service: destroy its stack first" for name in self.endpoints_in_service),
            *(f"instance {instance} still exists: terminate it yourself" for instance in self.instances),
        ]


def _pages(client: Any, operation: str, key: str, **kwargs: Any) -> Iterator[Any]:
    for page in client.get_paginator(operation).paginate(**kwargs):
        yield from page.get(key, [])


def environment_stacks(cdk_out: Path, environment: str) -> tuple[list[str], dict[str, str], str | None]:
    """CloudFormation stack names, tags and region of one environment's top-level stage in the cloud assembly."""
    stacks = [s for s in load_assembly(cdk_out) if s.environment == environment]
    if not stacks:
        raise ValueError(f"{cdk_out} has no stacks of environment {environment!r}; run `make synth` first.")
    return [s.stack_name for s in stacks], stacks[0].tags, stacks[0].region


def retained_log_groups(cdk_out: Path, environment: str) -> set[str]:
    """The fixed-name log groups that ``environment``'s templates keep when their stack is deleted."""
    return {
        resource["Properties"]["LogGroupName"]
        for stack in load_assembly(cdk_out)
        if stack.environment == environment
        for resource in stack.template.get("Resources", {}).values()
        if resource["Type"] == "AWS::Logs::LogGroup"
        and resource.get("DeletionPolicy") in _RETAINED
        and isinstance(resource.get("Properties", {}).get("LogGroupName"), str)
    }


def plan_cleanup(
    clients: Callable[[str], Any], stack_names: list[str], tags: dict[str, str], retained: Collection[str] = ()
) -> CleanupPlan:
    """What the environment left behind; log groups in ``retained`` (``retained_log_groups``) are kept."""
    plan = CleanupPlan()
    cloudformation, sagemaker, logs = clients("cloudformation"), clients("sagemaker"), clients("logs")

    stack_ids = [
        summary["StackId"]
        for summary in _pages(cloudformation, "list_stacks", "StackSummaries")
        if summary["StackName"] in stack_names
    ]
    endpoint_names = {
        resource["PhysicalResourceId"].rsplit("/", 1)[-1].lower()
        for stack_id in stack_ids
        # ListStackResources also answers for deleted stacks (by id, for 90 days after the deletion).
        for resource in _pages(cloudformation, "list_stack_resources", "StackResourceSummaries", StackName=stack_id)
        if resource["ResourceType"] == "AWS::SageMaker::Endpoint" and resource.get("PhysicalResourceId")
    }
    live = {e["EndpointName"].lower() for e in _pages(sagemaker, "list_endpoints", "Endpoints")}
    plan.endpoints_in_service = sorted(endpoint_names & live)
    for group in _pages(logs, "describe_log_groups", "logGroups", logGroupNamePrefix=ENDPOINT_LOG_PREFIX):
        name = group["logGroupName"].removeprefix(ENDPOINT_LOG_PREFIX).lower()
        if name in endpoint_names and name not in live:
            kept = group["logGroupName"] in retained
            (plan.kept_log_groups if kept else plan.log_groups).append(group["logGroupName"])

    tag_filters = [{"Key": key, "Values": [tags[key]]} for key in ("project", "environment") if key in tags]
    if len(tag_filters) < 2:
        raise ValueError("the environment's stacks carry no project and environment tags; cannot find its jobs")
    jobs = [
        resource["ResourceARN"].rsplit("/", 1)[-1]
        for resource in _pages(
            clients("resourcegroupstaggingapi"),
            "get_resources",
            "ResourceTagMappingList",
            ResourceTypeFilters=["sagemaker:training-job"],
            TagFilters=tag_filters,
        )
    ]
    for job in jobs:
        plan.log_streams += [(TRAINING_JOB_LOG_GROUP, stream["logStreamName"]) for stream in _log_streams(logs, job)]

    plan.instances = [
        f"{instance['InstanceId']} ({instance['InstanceType']}, {instance['State']['Name']})"
        for reservation in _pages(
            clients("ec2"),
            "describe_instances",
            "Reservations",
            Filters=[{"Name": f"tag:{f['Key']}", "Values": f["Values"]} for f in tag_filters]
            + [{"Name": "instance-state-name", "Values": _LIVE_INSTANCE_STATES}],
        )
        for instance in reservation["Instances"]
    ]
    return plan


def _log_streams(logs: Any, job: str) -> list[dict[str, Any]]:
    try:
        return list(
            _pages(
                logs,
                "describe_log_streams",
                "logStreams",
                logGroupName=TRAINING_JOB_LOG_GROUP,
                logStreamNamePrefix=f"{job}/",
            )
        )
    except logs.exceptions.ResourceNotFoundException:
        return []


def apply_cleanup(clients: Callable[[str], Any], plan: CleanupPlan) -> None:
    logs = clients("logs")
    for name in plan.log_groups:
        logs.delete_log_group(logGroupName=name)
    for group, stream in plan.log_streams:
        logs.delete_log_stream(logGroupName=group, logStreamName=stream)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops_review.cleanup", description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", required=True, help="environment (a stage of the cloud assembly), e.g. dev")
    parser.add_argument("--cdk-out", type=Path, default=Path("cdk.out"), help="cloud assembly (default: cdk.out)")
    parser.add_argument("--region", help="AWS region (default: the environment's region in the cloud assembly)")
    parser.add_argument("--dry-run", action="store_true", help="list what would be deleted, delete nothing")
    args = parser.parse_args(argv)

    import boto3  # imported here so the module (and its tests) work without AWS configuration

    try:
        stack_names, tags, region = environment_stacks(args.cdk_out, args.env)
        session = boto3.Session(region_name=args.region or region)
        plan = plan_cleanup(session.client, stack_names, tags, retained_log_groups(args.cdk_out, args.env))
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print("\n".join(plan.lines()) or f"nothing left behind by {args.env}")
    if not args.dry_run:
        apply_cleanup(session.client, plan)
        print(f"deleted {len(plan.log_groups)} log groups and {len(plan.log_streams)} log streams")
    return 0


if __name__ == "__main__":
    sys.exit(main())
