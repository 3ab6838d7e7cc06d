"""Issue 41.7, the attacker inside the EC2 training container (41.3, 41.4). First, it holds no credentials: the launch
template requires IMDSv2 with a hop limit of 1, so a container on Docker's bridge network gets no token, and the
commands ec2_run.sh runs reject the container uid's packets to IMDS on the host network and start every container
unprivileged as that uid (tests/training_assets/test_ec2_run.py reads those commands through a fake docker and
iptables). Second, should that block ever fail, the attacker holds the training instance role: each attack below is a
request with its full context (principal, encryption headers, the conditional-write header, the path through the
platform's S3 gateway endpoint) evaluated against the role's policies (the Foundation's and the Training stack's),
the artifacts bucket's policy, the platform key's policy and the endpoint's policy together, and must be denied,
while the run's own writes next to them are allowed."""

from __future__ import annotations

from typing import Any

import pytest

from ops_review.iam_policy import Request, is_allowed, resolve
from proving_ground.iam_requests import logical_id, role_policies
from tests.stacks.security.conftest import ACCOUNT, BUCKETS, REGION
from tests.stacks.security.exports import template_exports

ARTIFACTS = BUCKETS["Artifacts"]
# An instance-profile session: aws:userid is <role id>:<instance id>, ec2:SourceInstanceARN the instance (IAM User
# Guide, "AWS global condition context keys"; EC2 User Guide, "ec2:SourceInstanceARN condition key").
INSTANCE = {"aws:PrincipalAccount": ACCOUNT, "aws:PrincipalIsAWSService": "false", "aws:SecureTransport": "true",
            "aws:PrincipalArn": f"arn:aws:iam::{ACCOUNT}:role/TrainingInstanceRole",
            "aws:userid": "AROAINSTANCE:i-0attacker",
            "ec2:SourceInstanceARN": f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/i-0attacker"}  # fmt: skip
ATTACKER = INSTANCE["aws:userid"]  # an instance of run A, where the attacker's code runs
VICTIM = "AROAINSTANCE:i-0victim"  # run B's instance of rank 0: its folder holds B's checkpoints and candidate
RESUMED = "AROAINSTANCE:i-0resumed"  # run B launched again: a new instance of the same run


@pytest.fixture(scope="module")
def attacker(templates: dict[str, dict[str, dict]], foundation: Any) -> dict[str, Any]:
    """The instance role's policies (the Foundation's role with the Training stack's TrainingInstancePolicy), the
    artifacts bucket's policy, the key's policy and ARN, and the S3 gateway endpoint's policy, resolved."""
    template, refs = foundation
    role = role_policies(template, logical_id(template, "AWS::IAM::Role", "TrainingInstanceRole"), refs)
    training = templates["dev"]["Training"]
    training_refs: dict[str, Any] = {**refs}
    for name in training["Resources"]:
        training_refs.setdefault(name, f"{name}-ref")
        training_refs.setdefault(f"{name}.Arn", f"arn:aws:placeholder::{ACCOUNT}:{name}")
    exports = template_exports(template, refs)
    extra = training["Resources"][logical_id(training, "AWS::IAM::Policy", "TrainingInstancePolicy")]
    role.append(resolve(extra["Properties"]["PolicyDocument"], refs=training_refs, exports=exports))
    bucket_id = logical_id(template, "AWS::S3::Bucket", "Artifacts")
    (bucket_policy,) = [r["Properties"]["PolicyDocument"] for r in template["Resources"].values()
                        if r["Type"] == "AWS::S3::BucketPolicy"
                        and r["Properties"]["Bucket"] == {"Ref": bucket_id}]  # fmt: skip
    key_id = logical_id(template, "AWS::KMS::Key", "PlatformKey")
    gateways = [r["Properties"]["PolicyDocument"] for r in template["Resources"].values()
                if r["Type"] == "AWS::EC2::VPCEndpoint" and r["Properties"].get("VpcEndpointType") == "Gateway"
                and "PolicyDocument" in r["Properties"]]  # fmt: skip
    return {
        "role": role,
        "bucket": resolve(bucket_policy, refs=refs),
        "key": resolve(template["Resources"][key_id]["Properties"]["KeyPolicy"], refs=refs),
        "key_arn": refs[f"{key_id}.Arn"],
        "gateways": [resolve(policy, refs=refs) for policy in gateways],
        # The instance's requests reach S3 through the platform's gateway endpoint, in its VPC.
        "network": {
            "aws:SourceVpc": refs[logical_id(template, "AWS::EC2::VPC", "Vpc")],
            "aws:SourceVpce": "vpce-0platforms3gateway",
        },
    }


def _put(attacker: dict[str, Any], key: str, *, once: bool = False, sse: str | None = "aws:kms",
         session: str = ATTACKER) -> bool:  # fmt: skip
    """PutObject of ``key`` in the artifacts bucket from the instance whose session is ``session`` (aws:userid),
    through the platform's S3 gateway endpoint, as ec2_run.sh writes (SSE-KMS with the platform key; ``once``:
    If-None-Match: *), and the GenerateDataKey S3 makes for it on the caller's behalf: both must be allowed."""
    context = {**INSTANCE, "aws:userid": session, **attacker["network"], "aws:ResourceAccount": ACCOUNT}
    if sse:
        context["s3:x-amz-server-side-encryption"] = sse
    if sse == "aws:kms":
        context["s3:x-amz-server-side-encryption-aws-kms-key-id"] = attacker["key_arn"]
    if once:
        context["s3:if-none-match"] = "*"
    put = Request("s3:PutObject", f"arn:aws:s3:::{ARTIFACTS}/{key}", context)
    on_behalf = {**INSTANCE, "aws:ViaAWSService": "true", "kms:ViaService": f"s3.{REGION}.amazonaws.com"}
    data_key = Request("kms:GenerateDataKey", attacker["key_arn"], on_behalf)
    return is_allowed(attacker["role"], put, resource_policies=[attacker["bucket"]],
                      endpoint_policies=attacker["gateways"]) and is_allowed(
        attacker["role"], data_key, key_policy=attacker["key"])  # fmt: skip


def test_the_launch_template_keeps_imds_from_bridged_containers(templates: dict[str, dict[str, dict]]) -> None:
    """Every environment's template: IMDSv2 only (no credentials without a PUT for a token) and a hop limit of 1 (the
    token's response does not survive the bridge's extra hop; EC2 User Guide, "Configure the instance metadata
    options": a container needs a hop limit of 2)."""
    for environment, stacks in templates.items():
        (data,) = [r["Properties"]["LaunchTemplateData"] for r in stacks["Training"]["Resources"].values()
                   if r["Type"] == "AWS::EC2::LaunchTemplate"]  # fmt: skip
        assert data["MetadataOptions"]["HttpTokens"] == "required", environment
        assert data["MetadataOptions"]["HttpPutResponseHopLimit"] == 1, environment
        assert data["MetadataOptions"].get("HttpProtocolIpv6", "disabled") == "disabled", environment


def test_a_run_writes_its_checkpoints_and_its_candidate_once(attacker: dict[str, Any]) -> None:
    """The legitimate flow beside the attacks: run B's instance writes checkpoints into its own folder of the run and
    the candidate files with If-None-Match (S3 refuses the write with 412 when the key exists,
    test_ec2_run_moto.py); B launched again (resume) writes its new instance's folder the same way."""
    for session in (VICTIM, RESUMED):
        folder = f"training-output/run-b/nodes/{session}"
        assert _put(attacker, f"{folder}/checkpoints/slot-0/model.safetensors", session=session), session
        assert _put(attacker, f"{folder}/compile-cache/fxgraph/ab/entry", session=session), session
        for name in ("model.tar.gz", "model.tar.gz.sha256", "metrics.json"):
            assert _put(attacker, f"{folder}/{name}", once=True, session=session), (session, name)


@pytest.mark.parametrize("name", ["model.tar.gz", "model.tar.gz.sha256", "metrics.json"])
def test_the_container_cannot_replace_a_candidate_or_its_digest(attacker: dict[str, Any], name: str) -> None:
    """A write without If-None-Match is what replacing an existing object takes: denied by the role's own Deny, for
    the archive, its recorded digest and its metrics, even in the instance's own folder."""
    assert not _put(attacker, f"training-output/run-a/nodes/{ATTACKER}/{name}")


@pytest.mark.parametrize(
    ("key", "once"),
    [
        (f"run-b/nodes/{VICTIM}/model.tar.gz", True),  # B's candidate, before B writes it
        (f"run-b/nodes/{VICTIM}/model.tar.gz.sha256", True),  # ... and the digest promotion checks
        (f"run-b/nodes/{VICTIM}/model.tar.gz", False),
        (f"run-b/nodes/{VICTIM}/checkpoints/slot-1/model.safetensors", False),  # what B resumes from
        (f"run-b/nodes/{VICTIM}/checkpoints/slot-1/checkpoint-complete.json", False),
        (f"run-b/nodes/{VICTIM}/compile-cache/triton/0/kernel.so", False),  # code B's processes load
        (f"run-b/nodes/{VICTIM}/x/nodes/{ATTACKER}/y", False),  # a key inside B's folder ending in its own
        ("run-b/launches/r-0attacker.json", True),  # a record naming itself one of B's instances
        ("run-b/model.tar.gz", True),  # the run's prefix, outside any instance's folder
    ],
    ids=[
        "candidate",
        "digest",
        "candidate-replaced",
        "checkpoint",
        "checkpoint-marker",
        "compile-cache",
        "nested",
        "launch-record",
        "run-root",
    ],
)
def test_the_container_cannot_write_another_runs_instance_folder(
    attacker: dict[str, Any], key: str, once: bool
) -> None:
    """Issue 41.4: code on run A's instance (the container's escape, or a Session Manager session) cannot plant a
    candidate, a digest, a checkpoint or compiled code for run B, nor name itself one of B's instances. What it may
    write, its own folder under B's prefix, no instance of B reads: B's launch records do not name it
    (training_assets/instance/run_lineage.py, tests/training_assets/test_checkpoint_sync_moto.py)."""
    assert not _put(attacker, f"training-output/{key}", once=once)
    assert _put(attacker, f"training-output/run-b/nodes/{ATTACKER}/checkpoints/slot-0/model.safetensors")


@pytest.mark.parametrize(
    ("key", "sse"),
    [
        ("endpoints/sentiment/model-v2.tar.gz", "aws:kms"),  # what the endpoint serves
        ("endpoints/sentiment/model-v2.tar.gz.sha256", "aws:kms"),
        ("multi-model/sentiment-1.tar.gz", "aws:kms"),
        (f"training-output/run-a/nodes/{ATTACKER}/checkpoints/slot-0/model.safetensors", "AES256"),  # SSE-S3
        (f"training-output/run-a/nodes/{ATTACKER}/checkpoints/slot-0/model.safetensors", None),
    ],
    ids=["endpoint-archive", "endpoint-digest", "multi-model", "sse-s3", "no-sse-header"],
)
def test_the_container_cannot_write_what_endpoints_serve_or_outside_the_key(
    attacker: dict[str, Any], key: str, sse: str | None
) -> None:
    if sse is None:
        # Without a header the bucket's default (the platform key) applies: allowed, and encrypted as required.
        assert _put(attacker, key, sse=None)
        return
    assert not _put(attacker, key, sse=sse)


@pytest.mark.parametrize(
    ("action", "resource", "context"),
    [
        ("ec2:RunInstances", f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/*", {}),
        ("lambda:InvokeFunction", f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:dev-Training-TrainingLauncher", {}),
        (
            "iam:PassRole",
            f"arn:aws:iam::{ACCOUNT}:role/TrainingInstanceRole",
            {"iam:PassedToService": "ec2.amazonaws.com"},
        ),
        ("ec2:CreateTags", f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/i-0victim", {}),
        ("ec2:TerminateInstances", f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/i-0victim", {}),
        ("ssm:SendCommand", f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/i-0victim", {}),
        ("sagemaker:CreateTrainingJob", f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-job/nlp-x", {}),
        ("s3:PutObject", f"arn:aws:s3:::{BUCKETS['RemoteJobs']}/jobs/nlp/x/results/payload.pkl", {}),
        ("s3:DeleteObject", f"arn:aws:s3:::{ARTIFACTS}/training-output/run-b/nodes/{VICTIM}/model.tar.gz", {}),
        ("s3:PutObject", f"arn:aws:s3:::{BUCKETS['Datasets']}/tweets/train.csv", {}),
    ],
    ids=[
        "run-instances",
        "invoke-launcher",
        "pass-role",
        "tag-a-run",
        "terminate-a-run",
        "send-command",
        "training-job",
        "remote-results",
        "delete-candidate",
        "poison-dataset",
    ],
)
def test_the_container_cannot_start_alter_or_reach_other_workloads(
    attacker: dict[str, Any], action: str, resource: str, context: dict[str, str]
) -> None:
    assert not is_allowed(attacker["role"], Request(action, resource, {**INSTANCE, **context}))


def test_the_container_cannot_decrypt_outside_the_platforms_services(attacker: dict[str, Any]) -> None:
    """A data key copied out of an object is of no use directly; the same key through S3 is the run's own read."""
    direct = Request("kms:Decrypt", attacker["key_arn"], {**INSTANCE, **attacker["network"]})
    via_s3 = Request("kms:Decrypt", attacker["key_arn"], {**INSTANCE, "aws:ViaAWSService": "true",
                                                          "kms:ViaService": f"s3.{REGION}.amazonaws.com"})  # fmt: skip
    assert not is_allowed(attacker["role"], direct, key_policy=attacker["key"])
    assert is_allowed(attacker["role"], via_s3, key_policy=attacker["key"])
