"""Attackers inside @remote workloads (issue 41.1 and 41.7): code in caller A's job, running as A's job role, and A's
own launcher policy, against caller B of the same environment. Each attack is a request with its full context,
evaluated against the identity policies, the bucket's policy and the key's policy together (proving_ground/
iam_policy.py); each is refused while the same request on A's own things is allowed. The SDK flows themselves,
recorded against moto, are in tests/training_assets/test_remote_sdk_moto.py."""

from __future__ import annotations

from typing import Any

import pytest

from ops_review.iam_policy import Request, is_allowed, resolve
from proving_ground.iam_requests import logical_id, role_policies
from tests.conftest import cdk_context
from tests.stacks.security.conftest import ACCOUNT, BUCKETS, REGION

# Two callers of the dev environment (cdk.json declares them: the templates under test have both).
A, B = cdk_context()["environments"]["dev"]["training"]["remote_callers"][:2]
JOBS = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-job"
STREAMS = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/aws/sagemaker/TrainingJobs:log-stream"
REMOTE = BUCKETS["RemoteJobs"]


def _suffix(caller: str) -> str:
    return caller.capitalize()


class Principal:
    """A principal of the Foundation with its identity policies, and the resource policies it meets."""

    def __init__(
        self,
        foundation: tuple[dict[str, Any], dict[str, Any]],
        policies: list[dict[str, Any]],
        arn: str,
        session: dict[str, str] | None = None,
    ):
        """``session``: what every request of the principal carries besides its ARN (a job role's tags, and the
        platform's VPC its requests come from)."""
        template, refs = foundation
        self.policies, self.arn, self.session = policies, arn, session or {}
        self.bucket_policies = {  # bucket name -> its policy
            bucket: resolve(policy["Properties"]["PolicyDocument"], refs=refs)
            for name, bucket in BUCKETS.items()
            for policy in template["Resources"].values()
            if policy["Type"] == "AWS::S3::BucketPolicy"
            and policy["Properties"]["Bucket"] == {"Ref": logical_id(template, "AWS::S3::Bucket", name)}
        }
        key_id = logical_id(template, "AWS::KMS::Key", "PlatformKey")
        self.key_policy = resolve(template["Resources"][key_id]["Properties"]["KeyPolicy"], refs=refs)

    def may(self, action: str, resource: str, **context: Any) -> bool:
        full = {"aws:PrincipalArn": self.arn, "aws:PrincipalAccount": ACCOUNT, "aws:SecureTransport": "true",
                "aws:PrincipalIsAWSService": "false", "aws:ViaAWSService": "false", **self.session,
                **context}  # fmt: skip
        request = Request(action, resource, full)
        if action.startswith("s3:"):
            bucket = resource.removeprefix("arn:aws:s3:::").split("/")[0]
            return is_allowed(self.policies, request, resource_policies=[self.bucket_policies[bucket]])
        if action.startswith("kms:"):
            return is_allowed(self.policies, request, key_policy=self.key_policy)
        return is_allowed(self.policies, request)


@pytest.fixture(scope="module")
def job_a(foundation: Any) -> Principal:
    """Code inside A's @remote job: it holds A's job role's credentials (the container's credentials endpoint)."""
    template, refs = foundation
    role_id = logical_id(template, "AWS::IAM::Role", f"RemoteJobRole{_suffix(A)}")
    # Its requests carry the role's tags (data-perimeter-include) and come from the platform's VPC (issue 41.6).
    tags = template["Resources"][role_id]["Properties"].get("Tags", [])
    session = {f"aws:PrincipalTag/{tag['Key']}": tag["Value"] for tag in tags}
    assert session.get("aws:PrincipalTag/data-perimeter-include") == "true"
    session["aws:SourceVpc"] = refs[logical_id(template, "AWS::EC2::VPC", "Vpc")]
    arn = f"arn:aws:iam::{ACCOUNT}:role/job-{A}"
    return Principal(foundation, role_policies(template, role_id, refs), arn, session)


@pytest.fixture(scope="module")
def launcher_a(foundation: Any) -> Principal:
    """A data scientist of A (their launcher policy attached to whatever role they use)."""
    template, refs = foundation
    policy_id = logical_id(template, "AWS::IAM::ManagedPolicy", f"RemoteJobLauncherPolicy{_suffix(A)}")
    policy = resolve(template["Resources"][policy_id]["Properties"]["PolicyDocument"], refs=refs)
    return Principal(foundation, [policy], f"arn:aws:iam::{ACCOUNT}:role/scientist-{A}")


def _objects(caller: str) -> dict[str, str]:
    job = f"{caller}-run-training-job-2026-12-06-07-00-00-000"
    root = f"arn:aws:s3:::{REMOTE}/jobs/{caller}"
    return {
        "results": f"{root}/{job}/results/payload.pkl",
        "results hash": f"{root}/{job}/results/metadata.json",
        "arguments": f"{root}/{job}/arguments/payload.pkl",
        "model output": f"{root}/{job}/output/model.tar.gz",
        "checkpoint": f"{root}/checkpoints/run-1/checkpoint-100/model.safetensors",
    }


@pytest.mark.parametrize("what", list(_objects(A)))
def test_code_in_a_job_reads_and_writes_only_its_callers_objects(job_a: Principal, what: str) -> None:
    """The SDK's results carry only a SHA-256 beside them (sagemaker-core 2.27 serialization.py): a job that could
    write B's prefix could replace what B unpickles. A's job writes A's, never B's."""
    for action in ("s3:GetObject", "s3:PutObject"):
        assert job_a.may(action, _objects(A)[what]), (action, what)
        assert not job_a.may(action, _objects(B)[what]), (action, what)


def test_code_in_a_job_lists_only_its_callers_prefix(job_a: Principal) -> None:
    bucket = f"arn:aws:s3:::{REMOTE}"
    assert job_a.may("s3:ListBucket", bucket, **{"s3:prefix": f"jobs/{A}/"})
    for prefix in ("", "jobs/", f"jobs/{B}/", f"jobs/{A}x/", f"jobs/{B}/checkpoints/"):
        assert not job_a.may("s3:ListBucket", bucket, **{"s3:prefix": prefix}), prefix
    assert not job_a.may("s3:ListBucket", bucket)  # no prefix: the whole bucket


def test_code_in_a_job_writes_no_candidate_and_no_endpoint_model(job_a: Principal) -> None:
    """@remote output stays in the caller's prefix: the artifacts bucket, where EC2 runs leave their candidates and
    endpoints read models, is out of reach."""
    artifacts = f"arn:aws:s3:::{BUCKETS['Artifacts']}"
    for key in ("training-output/r-0abc/model.tar.gz", "endpoints/sentiment/model-v2.tar.gz", "multi-model/m.tar.gz"):
        assert not job_a.may("s3:PutObject", f"{artifacts}/{key}"), key
        assert not job_a.may("s3:GetObject", f"{artifacts}/{key}"), key


def test_code_in_a_job_writes_only_its_callers_log_streams(job_a: Principal) -> None:
    mine, theirs = f"{STREAMS}:{A}-fn-2026/algo-1-1", f"{STREAMS}:{B}-fn-2026/algo-1-1"
    for action in ("logs:CreateLogStream", "logs:PutLogEvents"):
        assert job_a.may(action, mine), action
        assert not job_a.may(action, theirs), action
    assert not job_a.may("logs:GetLogEvents", theirs)


def test_code_in_a_job_can_neither_follow_nor_start_jobs(job_a: Principal) -> None:
    """The job role holds no SageMaker API action: it cannot describe B's job (environment, S3 URIs), stop it, or
    start a job of its own as anyone."""
    for action in ("sagemaker:DescribeTrainingJob", "sagemaker:StopTrainingJob", "sagemaker:AddTags",
                   "sagemaker:CreateTrainingJob"):  # fmt: skip
        assert not job_a.may(action, f"{JOBS}/{B}-fn-2026"), action
        assert not job_a.may(action, f"{JOBS}/{A}-fn-2026"), action
    assert not job_a.may("iam:PassRole", f"arn:aws:iam::{ACCOUNT}:role/anything")


def test_code_in_a_job_uses_the_key_only_through_s3(job_a: Principal, foundation: Any) -> None:
    template, refs = foundation
    key = refs[f"{logical_id(template, 'AWS::KMS::Key', 'PlatformKey')}.Arn"]
    assert job_a.may("kms:Decrypt", key, **{"kms:ViaService": f"s3.{REGION}.amazonaws.com"})
    assert not job_a.may("kms:Decrypt", key)  # a copied ciphertext of B's, decrypted directly


# ------------------------------------------------------------------ A's launcher policy


def _create(caller_of_name: str, tags: dict[str, str], group: str, **changes: Any) -> Request:
    context: dict[str, Any] = {
        **{f"aws:RequestTag/{k}": v for k, v in tags.items()},
        "aws:TagKeys": list(tags),
        "sagemaker:InstanceTypes": ["ml.p4d.24xlarge"],
        "sagemaker:VpcSubnets": ["VpcPrivateSubnet1Subnet-ref"],
        "sagemaker:VpcSecurityGroupIds": [group],
        "sagemaker:OutputKmsKey": f"arn:aws:kms:{REGION}:{ACCOUNT}:key/key-id",
        "sagemaker:MaxRuntimeInSeconds": "3600",
        "sagemaker:InterContainerTrafficEncryption": "true",
        **changes,
    }
    return Request("sagemaker:CreateTrainingJob", f"{JOBS}/{caller_of_name}-fn-2026-12-06", context)


@pytest.fixture(scope="module")
def groups(foundation: Any) -> dict[str, str]:
    template, refs = foundation
    ids = {caller: logical_id(template, "AWS::EC2::SecurityGroup", f"RemoteJobsSecurityGroup{_suffix(caller)}")
           for caller in (A, B)}  # fmt: skip
    return {caller: refs[f"{group_id}.GroupId"] for caller, group_id in ids.items()}


def test_a_starts_jobs_only_under_their_own_name_tag_and_security_group(
    launcher_a: Principal, groups: dict[str, str], foundation: Any
) -> None:
    template, _ = foundation
    subnets = [name for name in template["Resources"] if name.startswith("VpcPrivateSubnet") and
               template["Resources"][name]["Type"] == "AWS::EC2::Subnet"]  # fmt: skip
    own = {"remote-job-owner": A, "environment": "dev"}

    def create(name: str, tags: dict[str, str], group: str) -> bool:
        request = _create(name, tags, group, **{"sagemaker:VpcSubnets": [f"{subnets[0]}-ref"]})
        return is_allowed(launcher_a.policies, Request(request.action, request.resource, request.context))

    assert create(A, own, groups[A])
    assert not create(B, own, groups[A])  # a job named as B's: B's log streams, B's job ARN
    assert not create(A, {**own, "remote-job-owner": B}, groups[A])  # tagged as B's
    assert not create(A, own, groups[B])  # inside B's security group, where B's jobs admit all traffic
    assert not create(A, {"environment": "dev"}, groups[A])  # no owner tag


def test_tags_are_set_only_when_a_job_is_created(launcher_a: Principal) -> None:
    """sagemaker:TaggingAction names the create operation a tag comes with; a later AddTags has none (Service
    Authorization Reference, Amazon SageMaker): nobody re-tags a job, not even their own."""
    tags = {"aws:RequestTag/remote-job-owner": A, "aws:TagKeys": ["remote-job-owner"]}
    own = f"{JOBS}/{A}-fn-2026"
    assert launcher_a.may("sagemaker:AddTags", own, **tags, **{"sagemaker:TaggingAction": "CreateTrainingJob"})
    assert not launcher_a.may("sagemaker:AddTags", own, **tags)
    assert not launcher_a.may("sagemaker:AddTags", f"{JOBS}/{B}-fn-2026", **tags)
    assert not launcher_a.may("sagemaker:AddTags", f"{JOBS}/{B}-fn-2026", **tags,
                              **{"sagemaker:TaggingAction": "CreateTrainingJob"})  # fmt: skip


def test_a_follows_stops_and_reads_only_their_own_jobs(launcher_a: Principal) -> None:
    for action in ("sagemaker:DescribeTrainingJob", "sagemaker:StopTrainingJob"):
        assert launcher_a.may(action, f"{JOBS}/{A}-fn-2026"), action
        assert not launcher_a.may(action, f"{JOBS}/{B}-fn-2026"), action
        # whatever tags B's job carries: no grant depends on a tag any more
        assert not launcher_a.may(action, f"{JOBS}/{B}-fn-2026", **{"aws:ResourceTag/remote-job-owner": A}), action
    assert launcher_a.may("logs:GetLogEvents", f"{STREAMS}:{A}-fn-2026/algo-1-1")
    assert not launcher_a.may("logs:GetLogEvents", f"{STREAMS}:{B}-fn-2026/algo-1-1")
    for what, obj in _objects(B).items():
        assert not launcher_a.may("s3:GetObject", obj), what
        assert not launcher_a.may("s3:PutObject", obj), what
        assert launcher_a.may("s3:GetObject", _objects(A)[what]), what


def test_a_passes_only_their_own_job_role_and_reads_only_their_config(launcher_a: Principal, foundation: Any) -> None:
    template, refs = foundation
    roles = {caller: refs[f"{logical_id(template, 'AWS::IAM::Role', f'RemoteJobRole{_suffix(caller)}')}.Arn"]
             for caller in (A, B)}  # fmt: skip
    to_sagemaker = {"iam:PassedToService": "sagemaker.amazonaws.com"}
    assert launcher_a.may("iam:PassRole", roles[A], **to_sagemaker)
    assert not launcher_a.may("iam:PassRole", roles[B], **to_sagemaker)
    parameter = f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter/pytorch-platform/dev/sagemaker/remote-function-config"
    assert launcher_a.may("ssm:GetParameter", f"{parameter}/{A}")
    assert not launcher_a.may("ssm:GetParameter", f"{parameter}/{B}")


def test_callers_jobs_do_not_share_a_security_group_that_admits_them(foundation: Any, groups: dict[str, str]) -> None:
    """torchrun's rendezvous and NCCL authenticate nobody: each caller's group admits only itself."""
    template, refs = foundation
    for caller, group in groups.items():
        group_id = logical_id(template, "AWS::EC2::SecurityGroup", f"RemoteJobsSecurityGroup{_suffix(caller)}")
        ingress = [resolve(r["Properties"], refs=refs) for r in template["Resources"].values()
                   if r["Type"] == "AWS::EC2::SecurityGroupIngress"
                   and r["Properties"]["GroupId"] == {"Fn::GetAtt": [group_id, "GroupId"]}]  # fmt: skip
        inline = template["Resources"][group_id]["Properties"].get("SecurityGroupIngress", [])
        assert ingress and not inline
        assert {rule.get("SourceSecurityGroupId") for rule in ingress} == {group}, caller
