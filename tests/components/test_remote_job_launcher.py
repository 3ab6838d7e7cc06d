"""RemoteJobLauncherPolicy on a bare stack: callers start, see and stop only their own @remote jobs, pass only the
job role, and stage objects only under their own prefix (the synthesized policy evaluated per request)."""

from __future__ import annotations

import pytest
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3

from ops_review.iam_policy import Request, is_allowed, resolve
from stacks.components.remote_job_launcher import RemoteJobLauncherPolicy
from tests.components.bare_stack import ACCOUNT, REGION, bare_stack, refs, resources, template_of
from training_assets.remote_jobs import OWNER_TAG_KEY

JOB_ROLE = f"arn:aws:iam::{ACCOUNT}:role/remote-jobs"
ME, SOMEONE_ELSE = "AROAEXAMPLE:alice", "AROAEXAMPLE:bob"
JOB = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-job/remote-fn-2026"
PARAMETER = "/platform/dev/sagemaker/remote-function-config"


@pytest.fixture(scope="module")
def policies() -> list[dict]:
    stack = bare_stack()
    RemoteJobLauncherPolicy(
        stack,
        "Launcher",
        job_role=iam.Role.from_role_arn(stack, "JobRole", JOB_ROLE),
        remote_jobs=s3.Bucket.from_bucket_name(stack, "RemoteJobs", "remote-jobs"),
        key=kms.Key.from_key_arn(stack, "Key", f"arn:aws:kms:{REGION}:{ACCOUNT}:key/platform"),
        training_job_log_group="/aws/sagemaker/TrainingJobs",
        config_parameter_name=PARAMETER,
        allowed_tag_keys=["project", "cost_centre"],
    )
    template = template_of(stack)
    ((_, policy),) = resources(template, "AWS::IAM::ManagedPolicy").items()
    return [resolve(policy["Properties"]["PolicyDocument"], refs=refs(template))]


def _allowed(policies: list[dict], action: str, resource: str, **context: object) -> bool:
    return is_allowed(policies, Request(action, resource, {"aws:userid": ME, **context}))  # type: ignore[arg-type]


def _create_context(tags: dict[str, str]) -> dict[str, object]:
    return {**{f"aws:RequestTag/{k}": v for k, v in tags.items()}, "aws:TagKeys": list(tags)}


def test_jobs_are_created_only_with_the_callers_own_owner_tag_and_the_environments_tags(policies: list[dict]) -> None:
    create = "sagemaker:CreateTrainingJob"
    assert _allowed(policies, create, JOB, **_create_context({OWNER_TAG_KEY: ME, "project": "p"}))
    assert not _allowed(policies, create, JOB, **_create_context({OWNER_TAG_KEY: SOMEONE_ELSE}))
    assert not _allowed(policies, create, JOB, **_create_context({"project": "p"}))
    assert not _allowed(policies, create, JOB, **_create_context({OWNER_TAG_KEY: ME, "anything": "x"}))


def test_only_the_owner_describes_stops_or_retags_a_job(policies: list[dict]) -> None:
    owner = f"aws:ResourceTag/{OWNER_TAG_KEY}"
    for action in ("sagemaker:DescribeTrainingJob", "sagemaker:StopTrainingJob"):
        assert _allowed(policies, action, JOB, **{owner: ME})
        assert not _allowed(policies, action, JOB, **{owner: SOMEONE_ELSE})
    retag = _create_context({OWNER_TAG_KEY: ME})
    assert not _allowed(policies, "sagemaker:AddTags", JOB, **retag, **{owner: SOMEONE_ELSE})


def test_only_the_job_role_is_passed_and_only_to_sagemaker(policies: list[dict]) -> None:
    assert _allowed(policies, "iam:PassRole", JOB_ROLE, **{"iam:PassedToService": "sagemaker.amazonaws.com"})
    assert not _allowed(policies, "iam:PassRole", JOB_ROLE, **{"iam:PassedToService": "ec2.amazonaws.com"})
    other = f"arn:aws:iam::{ACCOUNT}:role/admin"
    assert not _allowed(policies, "iam:PassRole", other, **{"iam:PassedToService": "sagemaker.amazonaws.com"})


def test_callers_stage_and_list_only_under_their_own_prefix(policies: list[dict]) -> None:
    assert _allowed(policies, "s3:PutObject", f"arn:aws:s3:::remote-jobs/jobs/{ME}/fn/payload.pkl")
    assert not _allowed(policies, "s3:GetObject", f"arn:aws:s3:::remote-jobs/jobs/{SOMEONE_ELSE}/fn/results.pkl")
    assert _allowed(policies, "s3:ListBucket", "arn:aws:s3:::remote-jobs", **{"s3:prefix": f"jobs/{ME}/"})
    assert not _allowed(policies, "s3:ListBucket", "arn:aws:s3:::remote-jobs", **{"s3:prefix": "jobs/"})


def test_callers_read_the_config_and_follow_training_job_logs(policies: list[dict]) -> None:
    assert _allowed(policies, "ssm:GetParameter", f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter{PARAMETER}")
    assert not _allowed(policies, "ssm:GetParameter", f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter/other")
    group = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/aws/sagemaker/TrainingJobs"
    assert _allowed(policies, "logs:GetLogEvents", f"{group}:log-stream:remote-fn-2026/algo-1-1")
    assert not _allowed(policies, "logs:GetLogEvents", f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/other:log-stream:s")
