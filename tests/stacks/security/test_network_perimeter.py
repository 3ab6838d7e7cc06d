"""Issue 41.6: credentials taken from a workload work only inside the platform's VPC. The attacker holds the training
instance role's or a @remote job role's credentials (read from the instance's metadata service or a job's credentials
endpoint) and calls S3 or KMS from elsewhere: each request, with its full context, is evaluated against the role's
identity policies, the bucket's policy and the key's policy together, and refused; the same request from inside the
VPC (through its S3 gateway endpoint, which sets aws:SourceVpc), and the flows of people and AWS services, are
allowed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ops_review.iam_policy import Request, is_allowed, resolve
from proving_ground.iam_requests import logical_id, role_policies
from stacks.components.platform_network import NETWORK_PERIMETER_TAG
from tests.conftest import cdk_context
from tests.stacks.security.conftest import ACCOUNT, BUCKETS, REGION

CALLER = cdk_context()["environments"]["dev"]["training"]["remote_callers"][0]
# What each role writes (a run's checkpoint, in its instance's own folder: its candidate files are written once,
# tests/stacks/security/test_training_container.py).
SESSION = "AROAINSTANCE:i-0run7"  # aws:userid of an instance-profile session: <role id>:<instance id>
HELD = {"TrainingInstanceRole": f"training-output/run-7/nodes/{SESSION}/checkpoints/slot-0/model.safetensors",
        f"RemoteJobRole{CALLER.capitalize()}": ""}  # fmt: skip
OTHER_VPC = "vpc-0attackers0000000"
S3_VIA = f"s3.{REGION}.amazonaws.com"


def _vpc(foundation: tuple[dict[str, Any], dict[str, Any]]) -> str:
    template, refs = foundation
    return refs[logical_id(template, "AWS::EC2::VPC", "Vpc")]


def _bucket_policy(foundation: tuple[dict[str, Any], dict[str, Any]], name: str) -> dict[str, Any]:
    template, refs = foundation
    bucket = {"Ref": logical_id(template, "AWS::S3::Bucket", name)}
    (policy,) = [r for r in template["Resources"].values()
                 if r["Type"] == "AWS::S3::BucketPolicy" and r["Properties"]["Bucket"] == bucket]  # fmt: skip
    return resolve(policy["Properties"]["PolicyDocument"], refs=refs)


def _key_policy(foundation: tuple[dict[str, Any], dict[str, Any]]) -> dict[str, Any]:
    template, refs = foundation
    key = template["Resources"][logical_id(template, "AWS::KMS::Key", "PlatformKey")]
    return resolve(key["Properties"]["KeyPolicy"], refs=refs)


def _tags(template: dict[str, Any], role_id: str) -> dict[str, str]:
    """The role's tags as its sessions carry them (aws:PrincipalTag/<key>)."""
    tags = template["Resources"][role_id]["Properties"].get("Tags", [])
    return {f"aws:PrincipalTag/{tag['Key']}": tag["Value"] for tag in tags}


def _context(role_id: str, template: dict[str, Any], **network: str) -> dict[str, Any]:
    return {"aws:PrincipalArn": f"arn:aws:iam::{ACCOUNT}:role/{role_id}", "aws:PrincipalAccount": ACCOUNT,
            "aws:SecureTransport": "true", "aws:PrincipalIsAWSService": "false", "aws:ViaAWSService": "false",
            "aws:userid": SESSION, **_tags(template, role_id), **network}  # fmt: skip


def _an_object_it_reads(foundation: tuple[dict[str, Any], dict[str, Any]], role_id: str) -> str:
    template, refs = foundation
    policies = role_policies(template, role_id, refs)
    candidates = [f"arn:aws:s3:::{BUCKETS['Datasets']}/imdb/train.parquet",
                  f"arn:aws:s3:::{BUCKETS['RemoteJobs']}/jobs/{CALLER}/job-1/arguments/payload.pkl"]  # fmt: skip
    (readable,) = [arn for arn in candidates if is_allowed(policies, Request("s3:GetObject", arn))][:1]
    return readable


@pytest.mark.parametrize("role", list(HELD))
def test_a_workload_roles_credentials_are_refused_outside_the_vpc(foundation: Any, role: str) -> None:
    template, refs = foundation
    role_id = logical_id(template, "AWS::IAM::Role", role)
    policies = role_policies(template, role_id, refs)
    readable = _an_object_it_reads(foundation, role_id)
    bucket = next(name for name, b in BUCKETS.items() if readable.startswith(f"arn:aws:s3:::{b}/"))
    bucket_policy = _bucket_policy(foundation, bucket)

    def may(action: str, resource: str, **network: str) -> bool:
        request = Request(action, resource, _context(role_id, template, **network))
        return is_allowed(policies, request, resource_policies=[bucket_policy])

    inside = {"aws:SourceVpc": _vpc(foundation), "aws:SourceVpce": "vpce-0platforms3gateway"}
    assert may("s3:GetObject", readable, **inside)
    assert not may("s3:GetObject", readable), "from the internet or the NAT gateway: no aws:SourceVpc"
    assert not may("s3:GetObject", readable, **{"aws:SourceVpc": OTHER_VPC}), "through another VPC's endpoint"
    # An AWS service calling S3 with the role's forward access session (aws:ViaAWSService) carries no aws:SourceVpc:
    # not refused (network_perimeter_statement: the service was called from inside, or refused there).
    assert may("s3:GetObject", readable, **{"aws:ViaAWSService": "true"}), "an AWS service on the role's behalf"
    if HELD[role]:  # what the role writes, likewise
        output = f"arn:aws:s3:::{BUCKETS['Artifacts']}/{HELD[role]}"
        artifacts = _bucket_policy(foundation, "Artifacts")
        write = Request("s3:PutObject", output, _context(role_id, template, **inside))
        assert is_allowed(policies, write, resource_policies=[artifacts])
        outside = Request("s3:PutObject", output, _context(role_id, template))
        assert not is_allowed(policies, outside, resource_policies=[artifacts])


@pytest.mark.parametrize("role", list(HELD))
def test_the_key_refuses_a_workload_roles_direct_calls_outside_the_vpc_but_not_s3_on_its_behalf(
    foundation: Any, role: str
) -> None:
    """S3 decrypting an SSE-KMS object for the role (aws:ViaAWSService, kms:ViaService) carries no aws:SourceVpc and is
    allowed; the key's own statement refuses any call of the role from outside, even one an identity policy allowed
    (a grant of kms:* is assumed here, so that only the key policy decides)."""
    template, _ = foundation
    role_id = logical_id(template, "AWS::IAM::Role", role)
    key_arn = f"arn:aws:kms:{REGION}:{ACCOUNT}:key/key-id"
    key_policy = _key_policy(foundation)
    everything = [{"Statement": [{"Effect": "Allow", "Action": "kms:*", "Resource": key_arn}]}]
    via_s3 = {"aws:ViaAWSService": "true", "kms:ViaService": S3_VIA}
    assert is_allowed(everything, Request("kms:Decrypt", key_arn, _context(role_id, template) | via_s3),
                      key_policy=key_policy)  # fmt: skip
    # SageMaker creating a job volume's grant with the job role, from its own network (no aws:SourceVpc).
    grant = {"kms:ViaService": f"sagemaker.{REGION}.amazonaws.com", "kms:GrantIsForAWSResource": "true"}
    assert is_allowed(everything, Request("kms:CreateGrant", key_arn, _context(role_id, template) | grant),
                      key_policy=key_policy)  # fmt: skip
    inside = _context(role_id, template, **{"aws:SourceVpc": _vpc(foundation)})
    assert is_allowed(everything, Request("kms:DescribeKey", key_arn, inside), key_policy=key_policy)
    for network in ({}, {"aws:SourceVpc": OTHER_VPC}):
        outside = _context(role_id, template, **network)
        assert not is_allowed(everything, Request("kms:DescribeKey", key_arn, outside), key_policy=key_policy)


def test_people_and_aws_services_keep_working_from_outside(foundation: Any) -> None:
    """A data scientist's launcher (their workstation, no aws:SourceVpc) still stages objects under their prefix; an
    AWS service principal (no principal tag) is not held either: the perimeter is for workload credentials only."""
    template, refs = foundation
    policy_id = logical_id(template, "AWS::IAM::ManagedPolicy", f"RemoteJobLauncherPolicy{CALLER.capitalize()}")
    launcher = [resolve(template["Resources"][policy_id]["Properties"]["PolicyDocument"], refs=refs)]
    staged = f"arn:aws:s3:::{BUCKETS['RemoteJobs']}/jobs/{CALLER}/job-1/arguments/payload.pkl"
    person = {"aws:PrincipalArn": f"arn:aws:iam::{ACCOUNT}:role/scientist", "aws:PrincipalAccount": ACCOUNT,
              "aws:SecureTransport": "true", "aws:ViaAWSService": "false"}  # fmt: skip
    assert is_allowed(launcher, Request("s3:PutObject", staged, person),
                      resource_policies=[_bucket_policy(foundation, "RemoteJobs")])  # fmt: skip


def test_every_workload_role_that_reaches_the_data_is_held_to_the_vpc(
    templates: dict[str, Any], foundation: Any
) -> None:
    """Computed from dev's templates, not listed by hand: every role that EC2 or SageMaker assumes (code of the
    platform's users runs with it) and that may read a data bucket carries the perimeter tag, except the endpoints'
    execution role (SageMaker's own data-capture upload has no documented network path: docs/security.md). Such roles
    live in the Foundation (the buckets' and the key's stack); one elsewhere fails here, to be held there too."""
    template, refs = foundation
    workload_roles = {
        (stack, role_id)
        for stack, stack_template in templates["dev"].items()
        for role_id, role in stack_template["Resources"].items()
        if role["Type"] == "AWS::IAM::Role"
        and any(
            f"{service}.amazonaws.com" in json.dumps(role["Properties"]["AssumeRolePolicyDocument"])
            for service in ("ec2", "sagemaker")
        )
    }
    assert {stack for stack, _ in workload_roles} == {"Foundation"}
    reaching = {}
    for _, role_id in workload_roles:
        policies = role_policies(template, role_id, refs)
        if any(is_allowed(policies, Request("s3:GetObject", f"arn:aws:s3:::{bucket}/{key}"))
               for bucket in BUCKETS.values() for key in ("any/key", f"jobs/{CALLER}/j/payload.pkl",
                                                          "training-output/r/m", "endpoints/m.tar.gz")):  # fmt: skip
            reaching[role_id] = _tags(template, role_id).get(f"aws:PrincipalTag/{NETWORK_PERIMETER_TAG}") == "true"
    not_held = [role_id for role_id, held in reaching.items() if not held]
    assert [role_id.startswith("EndpointExecutionRole") for role_id in not_held] == [True]
    assert len(reaching) - len(not_held) >= len(HELD)


def _egress(template: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every egress rule of the template: inline in a group, or a SecurityGroupEgress of its own."""
    rules = []
    for group_id, resource in template["Resources"].items():
        if resource["Type"] == "AWS::EC2::SecurityGroup":
            rules += [(group_id, rule) for rule in resource["Properties"].get("SecurityGroupEgress", [])]
        if resource["Type"] == "AWS::EC2::SecurityGroupEgress":
            rules.append((resource["Properties"]["GroupId"]["Fn::GetAtt"][0], resource["Properties"]))
    return rules


def test_what_leaves_through_the_nat_gateway_is_https_and_nothing_else(templates: dict[str, Any]) -> None:
    """docs/security.md's table of what leaves through the NAT gateway (PyPI, the Hugging Face hub, the EC2 API, the
    DLAMI's own services) is HTTPS: every security group of the environment leaves only by TCP 443, or to its own
    members (a caller's @remote instances, for torchrun and NCCL), or not at all (CDK's placeholder rule). A rule
    for any other port or protocol to any address fails here, and the table must say why."""
    for environment, stacks in templates.items():
        for stack, template in stacks.items():
            for group_id, rule in _egress(template):
                https = rule.get("IpProtocol") == "tcp" and rule.get("FromPort") == rule.get("ToPort") == 443
                own = rule.get("DestinationSecurityGroupId") == {"Fn::GetAtt": [group_id, "GroupId"]}
                nothing = (
                    rule.get("CidrIp") == "255.255.255.255/32" and rule.get("Description") == "Disallow all traffic"
                )
                assert https or own or nothing, f"{environment}/{stack}/{group_id}: {rule}"
