"""Clean destroy: dev's `cdk destroy` takes everything along; staging and prod retain every data-bearing resource.

Every template of every stage is checked, so stacks added to PlatformStage later are covered without edits here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ops_review.review import DATA_BEARING_TYPES, StackTemplate, load_assembly
from stacks.settings import ENVIRONMENT_NAMES, parse_environment


@pytest.fixture(scope="module")
def stages(platform_assembly: Path) -> dict[str, list[StackTemplate]]:
    by_environment: dict[str, list[StackTemplate]] = {}
    for stack in load_assembly(platform_assembly):
        by_environment.setdefault(stack.environment, []).append(stack)
    return by_environment


def _resources(stacks: list[StackTemplate], *types: str) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (stack.stack, logical_id, resource)
        for stack in stacks
        for logical_id, resource in stack.template["Resources"].items()
        if not types or resource["Type"] in types
    ]


def _auto_deleted_buckets(stacks: list[StackTemplate]) -> set[str]:
    return {
        custom["Properties"]["BucketName"]["Ref"] for _, _, custom in _resources(stacks, "Custom::S3AutoDeleteObjects")
    }


def test_every_environment_is_synthesized(stages: dict[str, list[StackTemplate]], cdk_context: dict[str, Any]) -> None:
    assert set(stages) == set(cdk_context["environments"]) <= set(ENVIRONMENT_NAMES)


@pytest.mark.parametrize("environment", ENVIRONMENT_NAMES)
def test_data_bearing_resources_follow_the_environment_removal_policy(
    environment: str, stages: dict[str, list[StackTemplate]], cdk_context: dict[str, Any]
) -> None:
    settings = parse_environment(environment, cdk_context["environments"][environment])
    expected = "Delete" if settings.destroy_on_delete else "Retain"
    data = _resources(stages[environment], *DATA_BEARING_TYPES)
    assert {resource["Type"] for _, _, resource in data} >= {"AWS::S3::Bucket", "AWS::KMS::Key", "AWS::Logs::LogGroup"}
    wrong = [
        (stack, logical_id, resource.get("DeletionPolicy"), resource.get("UpdateReplacePolicy"))
        for stack, logical_id, resource in data
        # CloudFormation deletes a resource that names no policy. RetainExceptOnCreate retains too, except when the
        # stack's first creation rolls back (fixed-name resources, which a retained leftover would block).
        if resource.get("DeletionPolicy", "Delete").replace("RetainExceptOnCreate", "Retain") != expected
        or resource.get("UpdateReplacePolicy", "Delete") != expected
    ]
    assert not wrong, f"{environment}: data-bearing resources not on {expected}: {wrong}"


@pytest.mark.parametrize("environment", ENVIRONMENT_NAMES)
def test_log_groups_created_by_the_stacks_expire(environment: str, stages: dict[str, list[StackTemplate]]) -> None:
    groups = _resources(stages[environment], "AWS::Logs::LogGroup")
    assert groups
    assert not [(s, lid) for s, lid, group in groups if not group["Properties"].get("RetentionInDays")]


def test_dev_destroy_leaves_nothing_retained(stages: dict[str, list[StackTemplate]]) -> None:
    """No resource of any type is retained, every bucket is emptied first, and no stack refuses deletion."""
    dev = stages["dev"]
    retained = [
        (stack, logical_id)
        for stack, logical_id, resource in _resources(dev)
        if resource.get("DeletionPolicy", "Delete") != "Delete"
        or resource.get("UpdateReplacePolicy", "Delete") != "Delete"
    ]
    assert not retained
    buckets = {logical_id for _, logical_id, _ in _resources(dev, "AWS::S3::Bucket")}
    assert buckets and buckets == _auto_deleted_buckets(dev)


@pytest.mark.parametrize("environment", ["staging", "prod"])
def test_retained_environments_never_empty_buckets(environment: str, stages: dict[str, list[StackTemplate]]) -> None:
    assert not _auto_deleted_buckets(stages[environment])


@pytest.mark.parametrize("environment", ENVIRONMENT_NAMES)
def test_termination_protection_matches_the_removal_policy(
    environment: str, platform_assembly: Path, cdk_context: dict[str, Any]
) -> None:
    settings = parse_environment(environment, cdk_context["environments"][environment])
    manifest = json.loads((platform_assembly / f"assembly-{environment}" / "manifest.json").read_text())
    stacks = [a for a in manifest["artifacts"].values() if a["type"] == "aws:cloudformation:stack"]
    assert stacks
    for stack in stacks:
        assert stack["properties"].get("terminationProtection", False) is not settings.destroy_on_delete


def test_dev_access_log_bucket_shuts_out_late_log_deliveries(stages: dict[str, list[StackTemplate]]) -> None:
    """The invariants the access-log race fix rests on (README, 'Deploying'): every data bucket logs into the log
    bucket; the log bucket is emptied by CDK's handler, which first denies s3:PutObject to everyone in the bucket
    policy, and the policy outlives the emptying; the policy's only write grant is the logging service's; with ACLs
    disabled, no write is possible once CloudFormation deletes the policy."""
    dev = stages["dev"]
    buckets = {lid: bucket for _, lid, bucket in _resources(dev, "AWS::S3::Bucket")}
    targets = {
        json.dumps(bucket["Properties"]["LoggingConfiguration"]["DestinationBucketName"])
        for bucket in buckets.values()
        if "LoggingConfiguration" in bucket["Properties"]
    }
    assert len(targets) == 1, "all data buckets log into one access-log bucket"
    log_bucket = json.loads(targets.pop())["Ref"]
    assert all("LoggingConfiguration" in b["Properties"] for lid, b in buckets.items() if lid != log_bucket)
    assert buckets[log_bucket]["Properties"]["OwnershipControls"]["Rules"] == [
        {"ObjectOwnership": "BucketOwnerEnforced"}
    ]

    policies = {
        lid: p
        for _, lid, p in _resources(dev, "AWS::S3::BucketPolicy")
        if p["Properties"]["Bucket"] == {"Ref": log_bucket}
    }
    assert len(policies) == 1
    policy_id, policy = policies.popitem()
    writers = [
        statement["Principal"]
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
        if statement["Effect"] == "Allow" and any(a in ("s3:PutObject", "s3:*") for a in _as_list(statement["Action"]))
    ]
    assert writers and all(writer == {"Service": "logging.s3.amazonaws.com"} for writer in writers)
    emptier_grants = [
        statement
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
        if statement["Effect"] == "Allow" and "s3:PutBucketPolicy" in _as_list(statement["Action"])
    ]
    assert len(emptier_grants) == 1, "the emptying handler may write its deny statement into the bucket policy"
    assert "CustomS3AutoDeleteObjectsCustomResourceProviderRole" in json.dumps(emptier_grants[0]["Principal"])

    (emptier,) = [
        c
        for _, _, c in _resources(dev, "Custom::S3AutoDeleteObjects")
        if c["Properties"]["BucketName"] == {"Ref": log_bucket}
    ]
    assert policy_id in emptier["DependsOn"]


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


@pytest.mark.parametrize("environment", ENVIRONMENT_NAMES)
def test_scalable_targets_are_deregistered_before_their_endpoint_is_deleted(
    environment: str, stages: dict[str, list[StackTemplate]]
) -> None:
    """CloudFormation deletes dependents first: a SageMaker scalable target that references (or depends on) its
    endpoint is deregistered before the endpoint goes, so `cdk destroy` leaves no orphaned target or policy."""
    targets = _resources(stages[environment], "AWS::ApplicationAutoScaling::ScalableTarget")
    targets = [t for t in targets if t[2]["Properties"].get("ServiceNamespace") == "sagemaker"]
    if not targets:
        pytest.skip(f"{environment} has no SageMaker scalable targets yet")
    endpoints = {lid for _, lid, _ in _resources(stages[environment], "AWS::SageMaker::Endpoint")}
    for stack, logical_id, target in targets:
        referenced = json.dumps(target["Properties"]["ResourceId"]) + json.dumps(target.get("DependsOn", []))
        # A reference to another stack's endpoint (Fn::ImportValue) makes CDK destroy this stack first.
        in_order = "Fn::ImportValue" in referenced or any(f'"{endpoint}"' in referenced for endpoint in endpoints)
        assert in_order, f"{stack}/{logical_id} does not reference its endpoint"
