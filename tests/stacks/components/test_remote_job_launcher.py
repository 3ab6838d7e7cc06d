"""RemoteJobLauncherPolicy on a bare stack: the people of one caller start, see and stop only that caller's @remote
jobs, pass only that caller's job role, tag only when creating, and stage objects only under the caller's prefix (the
synthesized policy evaluated per request)."""

from __future__ import annotations

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3

from ops_review.iam_policy import Request, is_allowed, resolve
from proving_ground.iam_requests import Call, requests_for
from stacks.components.remote_job_launcher import RemoteJobLauncherPolicy, TrainingJobLimits
from stacks.components.sagemaker_roles import VpcAttachment
from tests.stacks.components.bare_stack import (
    ACCOUNT,
    REGION,
    bare_stack,
    refs,
    resources,
    synth_through_the_gates,
    template_of,
)
from tests.stacks.components.statement_requests import allowed_without_context, each_key_matters
from training_assets.remote_jobs import OWNER_TAG_KEY

JOB_ROLE = f"arn:aws:iam::{ACCOUNT}:role/remote-jobs-nlp"
ME, SOMEONE_ELSE = "nlp", "vision"
JOBS = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-job"
JOB, OTHER_JOB = f"{JOBS}/nlp-fn-2026", f"{JOBS}/vision-fn-2026"
PARAMETER = "/platform/dev/sagemaker/remote-function-config/nlp"
KEY = f"arn:aws:kms:{REGION}:{ACCOUNT}:key/platform"
SUBNETS, GROUP = ["subnet-0a", "subnet-0b"], "sg-0workload"
EBS_TYPE, NVME_TYPE = "ml.p3.16xlarge", "ml.p4d.24xlarge"


BOTH_KINDS = TrainingJobLimits(
    instance_types=[EBS_TYPE, NVME_TYPE], nvme_instance_types=[NVME_TYPE], max_runtime_seconds=86400
)


def _build(stack: cdk.Stack, limits: TrainingJobLimits = BOTH_KINDS) -> None:
    RemoteJobLauncherPolicy(
        stack,
        "Launcher",
        caller=ME,
        job_role=iam.Role.from_role_arn(stack, "JobRole", JOB_ROLE),
        remote_jobs=s3.Bucket.from_bucket_name(stack, "RemoteJobs", "remote-jobs"),
        key=kms.Key.from_key_arn(stack, "Key", KEY),
        training_job_log_group="/aws/sagemaker/TrainingJobs",
        config_parameter_name=PARAMETER,
        allowed_tag_keys=["project", "cost_centre"],
        network=VpcAttachment(
            vpc=ec2.Vpc.from_vpc_attributes(stack, "Vpc", vpc_id="vpc-0platform", availability_zones=["a", "b"]),
            subnets=[ec2.Subnet.from_subnet_id(stack, f"Subnet{i}", subnet) for i, subnet in enumerate(SUBNETS)],
            security_group=ec2.SecurityGroup.from_security_group_id(stack, "Group", GROUP),
        ),
        limits=limits,
    )


def _policies(limits: TrainingJobLimits = BOTH_KINDS) -> list[dict]:
    stack = bare_stack()
    _build(stack, limits)
    template = template_of(stack)
    ((_, policy),) = resources(template, "AWS::IAM::ManagedPolicy").items()
    return [resolve(policy["Properties"]["PolicyDocument"], refs=refs(template))]


@pytest.fixture(scope="module")
def policies() -> list[dict]:
    return _policies()


def _allowed(policies: list[dict], action: str, resource: str, **context: object) -> bool:
    return is_allowed(policies, Request(action, resource, context))  # type: ignore[arg-type]


def _tag_context(tags: dict[str, str]) -> dict[str, object]:
    return {**{f"aws:RequestTag/{k}": v for k, v in tags.items()}, "aws:TagKeys": list(tags)}


def _create_context(tags: dict[str, str], **job: object) -> dict[str, object]:
    """CreateTrainingJob's keys for a job as the platform's config.yaml requests it (``job``: what a caller
    changes; None drops a key, as a request without the parameter would)."""
    platform: dict[str, object] = {
        "sagemaker:InstanceTypes": [EBS_TYPE],
        "sagemaker:VpcSubnets": SUBNETS,
        "sagemaker:VpcSecurityGroupIds": [GROUP],
        "sagemaker:VolumeKmsKey": KEY,
        "sagemaker:OutputKmsKey": KEY,
        "sagemaker:MaxRuntimeInSeconds": "86400",
        "sagemaker:InterContainerTrafficEncryption": "true",
    }
    changed = {**platform, **{f"sagemaker:{k}": v for k, v in job.items()}}
    return {**_tag_context(tags), **{k: v for k, v in changed.items() if v is not None}}


def test_jobs_are_created_only_with_the_callers_own_owner_tag_and_the_environments_tags(policies: list[dict]) -> None:
    create = "sagemaker:CreateTrainingJob"
    assert _allowed(policies, create, JOB, **_create_context({OWNER_TAG_KEY: ME, "project": "p"}))
    assert not _allowed(policies, create, JOB, **_create_context({OWNER_TAG_KEY: SOMEONE_ELSE}))
    assert not _allowed(policies, create, JOB, **_create_context({"project": "p"}))
    assert not _allowed(policies, create, JOB, **_create_context({OWNER_TAG_KEY: ME, "anything": "x"}))
    # A job named as another caller's (its log streams and ARN would be theirs), even tagged as one's own.
    assert not _allowed(policies, create, OTHER_JOB, **_create_context({OWNER_TAG_KEY: ME}))


def test_only_the_owner_describes_or_stops_a_job_and_nobody_tags_after_creation(policies: list[dict]) -> None:
    for action in ("sagemaker:DescribeTrainingJob", "sagemaker:StopTrainingJob"):
        assert _allowed(policies, action, JOB)
        # The grant is the job's name, which nobody changes: a tag claiming another's job gains nothing.
        assert not _allowed(policies, action, OTHER_JOB, **{f"aws:ResourceTag/{OWNER_TAG_KEY}": ME})
    tags = _tag_context({OWNER_TAG_KEY: ME})
    on_create = {"sagemaker:TaggingAction": "CreateTrainingJob"}
    assert _allowed(policies, "sagemaker:AddTags", JOB, **tags, **on_create)
    assert not _allowed(policies, "sagemaker:AddTags", JOB, **tags)  # a later AddTags: no TaggingAction
    assert not _allowed(policies, "sagemaker:AddTags", OTHER_JOB, **tags, **on_create)
    # The tags added at creation are those CreateTrainingJob allows: the caller's own owner tag, no other key.
    for wrong in ({OWNER_TAG_KEY: SOMEONE_ELSE}, {OWNER_TAG_KEY: ME, "unlisted-key": "x"}):
        assert not _allowed(policies, "sagemaker:AddTags", JOB, **_tag_context(wrong), **on_create), wrong


def test_only_the_job_role_is_passed_and_only_to_sagemaker(policies: list[dict]) -> None:
    assert _allowed(policies, "iam:PassRole", JOB_ROLE, **{"iam:PassedToService": "sagemaker.amazonaws.com"})
    assert not _allowed(policies, "iam:PassRole", JOB_ROLE, **{"iam:PassedToService": "ec2.amazonaws.com"})
    other = f"arn:aws:iam::{ACCOUNT}:role/admin"
    assert not _allowed(policies, "iam:PassRole", other, **{"iam:PassedToService": "sagemaker.amazonaws.com"})


def test_callers_stage_and_list_only_under_their_own_prefix(policies: list[dict]) -> None:
    assert _allowed(policies, "s3:PutObject", f"arn:aws:s3:::remote-jobs/jobs/{ME}/fn/payload.pkl")
    assert not _allowed(policies, "s3:GetObject", f"arn:aws:s3:::remote-jobs/jobs/{SOMEONE_ELSE}/fn/results.pkl")
    assert not _allowed(policies, "s3:PutObject", f"arn:aws:s3:::remote-jobs/jobs/{ME}x/fn/payload.pkl")
    assert _allowed(policies, "s3:ListBucket", "arn:aws:s3:::remote-jobs", **{"s3:prefix": f"jobs/{ME}/"})
    assert not _allowed(policies, "s3:ListBucket", "arn:aws:s3:::remote-jobs", **{"s3:prefix": "jobs/"})
    assert not _allowed(policies, "s3:ListBucket", "arn:aws:s3:::remote-jobs", **{"s3:prefix": f"jobs/{ME}x/"})


def test_callers_read_the_config_and_follow_training_job_logs(policies: list[dict]) -> None:
    assert _allowed(policies, "ssm:GetParameter", f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter{PARAMETER}")
    assert not _allowed(policies, "ssm:GetParameter", f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter/other")
    other_config = f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter{PARAMETER.replace(ME, SOMEONE_ELSE)}"
    assert not _allowed(policies, "ssm:GetParameter", other_config)
    group = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/aws/sagemaker/TrainingJobs"
    # DescribeLogStreams as the SDK calls it (sagemaker-core 2.27 remote_function/job.py _flush_log_streams: the group
    # by name, the job's streams by prefix), turned into IAM requests by the proving ground's one table: the group's
    # ARN ending in ":*", which the CloudWatch Logs user guide documents for it ("Overview of managing access
    # permissions to your CloudWatch Logs resources": the ARN without ":*" is for the tagging actions), and, as a
    # hedge, the bare ARN. Another group's streams stay unlisted.
    for name, allowed in (("/aws/sagemaker/TrainingJobs", True), ("/other", False)):
        call = Call("logs", "DescribeLogStreams", {"logGroupName": name, "logStreamNamePrefix": f"{ME}-fn-2026/",
                    "orderBy": "LogStreamName", "limit": 1}, REGION, ACCOUNT)  # fmt: skip
        requests = requests_for(call, kms_encrypted_buckets={})
        assert f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{name}:*" in [r.resource for r in requests]
        assert [is_allowed(policies, r) for r in requests] == [allowed] * len(requests), name
    assert _allowed(policies, "logs:GetLogEvents", f"{group}:log-stream:{ME}-fn-2026/algo-1-1")
    assert not _allowed(policies, "logs:GetLogEvents", f"{group}:log-stream:{SOMEONE_ELSE}-fn-2026/algo-1-1")
    assert not _allowed(policies, "logs:GetLogEvents", f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/other:log-stream:s")


def test_jobs_run_only_in_the_platforms_network_under_its_key_on_allowed_types_for_bounded_time(
    policies: list[dict],
) -> None:
    """Issue 22.3: each CreateTrainingJob condition refuses the job that leaves it, next to the job that keeps it."""
    create, mine = "sagemaker:CreateTrainingJob", {OWNER_TAG_KEY: ME}
    assert _allowed(policies, create, JOB, **_create_context(mine))
    # NVMe types: SageMaker refuses a volume key, so none is allowed; a given one must be the platform key.
    assert _allowed(policies, create, JOB, **_create_context(mine, InstanceTypes=[NVME_TYPE], VolumeKmsKey=None))
    other_key = f"arn:aws:kms:{REGION}:{ACCOUNT}:key/attacker"
    attacks = {
        "no VPC": {"VpcSubnets": None, "VpcSecurityGroupIds": None},
        "another subnet": {"VpcSubnets": ["subnet-0public"]},
        "another group": {"VpcSecurityGroupIds": [GROUP, "sg-0open"]},
        "no volume key on an EBS type": {"VolumeKmsKey": None},
        "another volume key": {"VolumeKmsKey": other_key},
        "another volume key on NVMe": {"InstanceTypes": [NVME_TYPE], "VolumeKmsKey": other_key},
        "another output key": {"OutputKmsKey": other_key},
        "no output key": {"OutputKmsKey": None},
        "a type outside the list": {"InstanceTypes": ["ml.p5e.48xlarge"]},
        "a week": {"MaxRuntimeInSeconds": str(7 * 86400)},
        "one second over the limit": {"MaxRuntimeInSeconds": "86401"},
        "no inter-container encryption": {"InterContainerTrafficEncryption": "false"},
        "inter-container encryption unset": {"InterContainerTrafficEncryption": None},
    }
    for name, change in attacks.items():
        assert not _allowed(policies, create, JOB, **_create_context(mine, **change)), name


def test_an_environment_that_allows_only_nvme_types_still_creates_jobs_on_them() -> None:
    """With no EBS-backed type allowed, the NVMe types keep their own statement: their jobs start, with or without
    the platform volume key, and a type outside the list is still refused."""
    nvme_only = _policies(TrainingJobLimits([NVME_TYPE], nvme_instance_types=[NVME_TYPE], max_runtime_seconds=86400))
    create, mine = "sagemaker:CreateTrainingJob", {OWNER_TAG_KEY: ME}
    assert _allowed(nvme_only, create, JOB, **_create_context(mine, InstanceTypes=[NVME_TYPE], VolumeKmsKey=None))
    assert _allowed(nvme_only, create, JOB, **_create_context(mine, InstanceTypes=[NVME_TYPE]))
    assert not _allowed(nvme_only, create, JOB, **_create_context(mine, InstanceTypes=[EBS_TYPE]))


@pytest.mark.parametrize("instance_type", [EBS_TYPE, NVME_TYPE])
def test_each_create_training_job_key_left_out_alone_is_refused(policies: list[dict], instance_type: str) -> None:
    """With and without each condition: a job that leaves out any one key of the platform's config (no security
    groups while the subnets are given, no subnets, no instance type, ...) is refused; ForAllValues alone would
    let an absent multivalued key pass, so each of those needs its Null check. On NVMe types alone the volume key may
    be left out (SageMaker refuses one there)."""
    context = _create_context({OWNER_TAG_KEY: ME}, InstanceTypes=[instance_type])
    context["aws:RequestTag/project"] = "p"
    context["aws:TagKeys"] = [OWNER_TAG_KEY, "project"]
    allowed_without = each_key_matters(policies, "sagemaker:CreateTrainingJob", JOB, context)
    # Optional: the environment's tag, and aws:TagKeys on its own (AWS sends it whenever the request carries tags, and
    # the owner tag is required by a condition of its own; without the tags the request fails on that one).
    optional = {"aws:RequestTag/project", "aws:TagKeys"}
    optional |= {"sagemaker:VolumeKmsKey"} if instance_type == NVME_TYPE else set()
    assert {key for key, allowed in allowed_without.items() if allowed} == optional


def test_without_any_context_only_the_callers_own_resources_are_reachable(policies: list[dict]) -> None:
    """Evaluated for every action of every statement with no context at all (no tags, no keys): a caller's ownership
    is the resource's name, so the calls allowed are those on resources named after the caller (its jobs, prefix,
    log streams and config) and on the platform key and the log group's stream list; every other grant (creating a
    job, tagging, passing the role, listing the prefix) needs its condition."""
    allowed = allowed_without_context(policies)
    assert {action for action, _ in allowed} == {
        "kms:Decrypt",
        "kms:DescribeKey",
        "kms:GenerateDataKey",
        "ssm:GetParameter",
        "logs:GetLogEvents",
        "logs:DescribeLogStreams",
        "s3:GetObject",
        "s3:PutObject",
        "sagemaker:DescribeTrainingJob",
        "sagemaker:StopTrainingJob",
    }
    for action, resource in allowed:
        assert ME in resource or action.startswith("kms:") or action == "logs:DescribeLogStreams", (action, resource)


def test_the_policy_passes_the_compliance_gates_with_every_wildcard_explained() -> None:
    """cdk-nag (AwsSolutions, NIST 800-53) refuses a wildcard that no acknowledgement explains: the generated job
    names after the caller's prefix."""
    stack = bare_stack()
    _build(stack)
    synth_through_the_gates(stack)
