"""TrainingInstanceRole on a bare stack: EC2 alone assumes it, and its synthesized policy allows what a training run
does (Session Manager, the training image, datasets in, model out) and nothing around it."""

from __future__ import annotations

import aws_cdk as cdk
import pytest
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3

from ops_review.iam_policy import Request, is_allowed, resolve
from proving_ground.iam_requests import logical_id, role_policies
from stacks.components.training_instance_role import TrainingInstanceRole
from tests.stacks.components.bare_stack import (
    ACCOUNT,
    REGION,
    bare_stack,
    refs,
    resources,
    synth_through_the_gates,
    template_of,
)

KEY = f"arn:aws:kms:{REGION}:{ACCOUNT}:key/platform"
OUT = "arn:aws:s3:::artifacts/training-output"
# Instance-profile sessions: aws:userid is <role id>:<instance id> (IAM User Guide, policy variables).
B0 = {"aws:userid": "AROAINSTANCES:i-0b0000000"}  # run B's first instance
B1 = {"aws:userid": "AROAINSTANCES:i-0b1111111"}  # run B launched again (resume): a new instance
A0 = {"aws:userid": "AROAINSTANCES:i-0a0000000"}  # run A's instance, where the attacker's code runs
DLC = f"arn:aws:ecr:{REGION}:763104351884:repository"


def _build(stack: cdk.Stack) -> TrainingInstanceRole:
    return TrainingInstanceRole(
        stack,
        "Instances",
        datasets=s3.Bucket.from_bucket_name(stack, "Datasets", "datasets"),
        artifacts=s3.Bucket.from_bucket_name(stack, "Artifacts", "artifacts"),
        training_output_prefix="training-output/",
        training_repository="pytorch-training",
        key=kms.Key.from_key_arn(stack, "Key", KEY),
    )


@pytest.fixture(scope="module")
def template() -> dict:
    stack = bare_stack()
    _build(stack)
    return template_of(stack)


def test_only_ec2_assumes_the_role_and_the_profile_carries_it(template: dict) -> None:
    role_id = logical_id(template, "AWS::IAM::Role", "Instances")
    trust = template["Resources"][role_id]["Properties"]["AssumeRolePolicyDocument"]
    assert [s["Principal"] for s in trust["Statement"]] == [{"Service": "ec2.amazonaws.com"}]
    ((_, profile),) = resources(template, "AWS::IAM::InstanceProfile").items()
    assert profile["Properties"]["Roles"] == [{"Ref": role_id}]


def test_the_instances_may_do_a_training_run_and_nothing_around_it(template: dict) -> None:
    policies = role_policies(template, logical_id(template, "AWS::IAM::Role", "Instances"), refs(template))
    instance = f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/i-0123"
    mine = f"{OUT}/r-1/nodes/{B0['aws:userid']}"
    calls = {
        ("ssmmessages:OpenDataChannel", "*"): True,
        ("ssm:UpdateInstanceInformation", instance): True,
        ("ecr:GetAuthorizationToken", "*"): True,
        ("ecr:BatchGetImage", f"{DLC}/pytorch-training"): True,
        ("ecr:BatchGetImage", f"{DLC}/pytorch-inference"): False,
        ("s3:GetObject", "arn:aws:s3:::datasets/tweets/train.csv"): True,
        ("s3:PutObject", "arn:aws:s3:::datasets/tweets/train.csv"): False,
        ("s3:PutObject", f"{mine}/checkpoints/slot-0/model.safetensors"): True,
        # The run's candidate only as a write-once (If-None-Match: *, below); plain, it would replace one.
        ("s3:PutObject", f"{mine}/model.tar.gz"): False,
        ("s3:PutObject", f"{mine}/model.tar.gz.sha256"): False,
        ("s3:PutObject", "arn:aws:s3:::artifacts/endpoints/sentiment/model-v1.tar.gz"): False,
        ("kms:GenerateDataKey", KEY): True,
        ("kms:CreateGrant", KEY): False,
        # Not AmazonSSMManagedInstanceCore: no parameters, documents or Run Command.
        ("ssm:GetParameter", f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter/secret"): False,
        ("ec2messages:GetMessages", "*"): False,
    }
    assert {call: is_allowed(policies, Request(*call, B0)) for call in calls} == calls
    once = {**B0, "s3:if-none-match": "*"}
    for name in ("model.tar.gz", "model.tar.gz.sha256", "metrics.json"):
        assert is_allowed(policies, Request("s3:PutObject", f"{mine}/{name}", once))


@pytest.mark.parametrize(
    ("writer", "key", "allowed"),
    [
        (B0, "r-b/nodes/AROAINSTANCES:i-0b0000000/checkpoints/slot-0/model.safetensors", True),  # B's own write
        (B1, "r-b/nodes/AROAINSTANCES:i-0b1111111/checkpoints/slot-1/model.safetensors", True),  # B resumed
        (B1, "r-b/nodes/AROAINSTANCES:i-0b0000000/checkpoints/slot-0/model.safetensors", False),  # B's earlier node
        (A0, "r-b/nodes/AROAINSTANCES:i-0b0000000/checkpoints/slot-0/model.safetensors", False),  # A into B's folder
        (A0, "r-b/nodes/AROAINSTANCES:i-0b0000000/compile-cache/x.so", False),
        (A0, "r-b/nodes/AROAINSTANCES:i-0b0000000/x/nodes/AROAINSTANCES:i-0a0000000/y", False),  # nested in B's
        (A0, "r-b/launches/r-0a0000000.json", False),  # naming itself one of B's instances
        (A0, "r-b/launches/nodes/AROAINSTANCES:i-0a0000000/r", False),
        (A0, "r-b/checkpoints/slot-0/model.safetensors", False),  # the run's prefix outside any folder
        (A0, "r-b/nodes/AROAINSTANCES:i-0a0000000/checkpoints/slot-0/model.safetensors", True),  # its own folder:
        # allowed, and no run of B's reads it (B's launch records do not name A's instance: run_lineage.py)
    ],
    ids=[
        "own",
        "resumed-own",
        "resumed-into-earlier",
        "other-run",
        "other-run-cache",
        "nested",
        "launch-record",
        "under-launches",
        "run-root",
        "own-folder-in-other-run",
    ],
)
def test_each_instance_writes_only_its_own_folder(template: dict, writer: dict, key: str, allowed: bool) -> None:
    policies = role_policies(template, logical_id(template, "AWS::IAM::Role", "Instances"), refs(template))
    assert is_allowed(policies, Request("s3:PutObject", f"{OUT}/{key}", writer)) is allowed
    # A resumed run reads its earlier instances' checkpoints: every instance reads every run's output.
    assert is_allowed(policies, Request("s3:GetObject", f"{OUT}/{key}", writer))


# Every call a training run makes with the role: Session Manager's channels (Systems Manager User Guide, "Create a
# custom IAM instance profile for Session Manager"), the image pull (ECR User Guide, "Private registry authentication":
# the layer calls beside BatchGetImage), resuming from and writing its checkpoints (a multipart upload aborted when a
# run stops) in the instance's own folder, listing both buckets, and the platform key for the objects' encryption.
RUN_CALLS = [
    *(("ssmmessages:" + name, "*") for name in ("CreateControlChannel", "CreateDataChannel", "OpenControlChannel",
                                                "OpenDataChannel")),
    ("ssm:UpdateInstanceInformation", f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/i-0123"),
    *((f"ecr:{name}", f"{DLC}/pytorch-training") for name in ("BatchCheckLayerAvailability", "BatchGetImage",
                                                               "GetDownloadUrlForLayer")),
    *((f"s3:{name}", f"{OUT}/r-1/nodes/{B0['aws:userid']}/checkpoints/slot-0/model.safetensors")
      for name in ("GetObject", "PutObject", "AbortMultipartUpload")),
    ("s3:ListBucket", "arn:aws:s3:::datasets"),
    ("s3:ListBucket", "arn:aws:s3:::artifacts"),
    *((f"kms:{name}", KEY) for name in ("Decrypt", "Encrypt", "GenerateDataKey", "DescribeKey")),
]  # fmt: skip


def test_every_call_of_a_training_run_is_allowed(template: dict) -> None:
    policies = role_policies(template, logical_id(template, "AWS::IAM::Role", "Instances"), refs(template))
    assert [call for call in RUN_CALLS if not is_allowed(policies, Request(*call, B0))] == []


def test_the_role_passes_the_compliance_gates_with_every_wildcard_explained() -> None:
    stack = bare_stack()
    _build(stack)
    synth_through_the_gates(stack)


def test_checkov_hears_why_session_manager_needs_a_wildcard(template: dict) -> None:
    """(The launch record policy, the construct's other managed policy, is the launcher's.)"""
    (policy,) = [p for lid, p in resources(template, "AWS::IAM::ManagedPolicy").items() if "LaunchRecord" not in lid]
    assert [skip["id"] for skip in policy["Metadata"]["checkov"]["skip"]] == ["CKV_AWS_111"]
    resolve(policy["Properties"]["PolicyDocument"], refs=refs(template))  # every reference resolves


def test_the_launch_record_policy_writes_only_records_and_only_once(template: dict) -> None:
    """Its holder (the launcher) records launches under a run's launches/, never over an existing record and never
    into an instance's folder; its data key comes through S3."""
    (lid,) = [lid for lid in resources(template, "AWS::IAM::ManagedPolicy") if "LaunchRecord" in lid]
    policy = [resolve(template["Resources"][lid]["Properties"]["PolicyDocument"], refs=refs(template))]
    once = {"s3:if-none-match": "*"}
    assert is_allowed(policy, Request("s3:PutObject", f"{OUT}/run-b/launches/r-0b1.json", once))
    assert not is_allowed(policy, Request("s3:PutObject", f"{OUT}/run-b/launches/r-0b1.json"))  # a replacement
    assert not is_allowed(policy, Request("s3:PutObject", f"{OUT}/run-b/nodes/AROAX:i-0b0/model.tar.gz", once))
    assert is_allowed(policy, Request("kms:GenerateDataKey", KEY))
