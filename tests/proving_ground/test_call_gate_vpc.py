"""The rehearsal's call gate (proving_ground/rehearsal/aws_calls.py) places a principal: a workload role tagged for the
data perimeter reads a data bucket from inside the platform's VPC (its call passes the S3 gateway endpoint, whose
policy must allow it too, and carries aws:SourceVpc), and is refused the same read from outside, by the bucket's
policy alone; the endpoint's policy decides only the calls of its own service. Policies from the synthesized dev
Foundation, resolved as tests/stacks/security/conftest.py does; the real boto3 client against moto."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from ops_review.iam_policy import resolve
from proving_ground.iam_requests import logical_id
from proving_ground.rehearsal.aws_calls import Gate, Principal, install
from stacks.components.platform_network import NETWORK_PERIMETER_TAG
from tests.stacks.security.conftest import ACCOUNT, BUCKETS, REGION, foundation  # noqa: F401 - the fixture

READER = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject"],
          "Resource": "*"}]}  # fmt: skip


def _workload(name: str, *, in_vpc: bool) -> Principal:
    identity = {
        "aws:PrincipalArn": f"arn:aws:iam::{ACCOUNT}:role/{name}",
        f"aws:PrincipalTag/{NETWORK_PERIMETER_TAG}": "true",
    }
    return Principal(name, f"AKIA{name.upper():0<12}"[:16], [READER], identity, in_vpc=in_vpc)


@pytest.fixture()
def gated(foundation: tuple[dict[str, Any], dict[str, Any]], mocked_aws: str, tmp_path: Path) -> Any:  # noqa: F811
    template, refs = foundation
    vpc = logical_id(template, "AWS::EC2::VPC", "Vpc")
    refs = {**refs, vpc: "vpc-platform"}
    bucket = BUCKETS["Datasets"]
    bucket_id = logical_id(template, "AWS::S3::Bucket", "Datasets")
    resources = [(r["Type"], r["Properties"]) for r in template["Resources"].values() if "Properties" in r]
    (policy,) = [p["PolicyDocument"] for kind, p in resources
                 if kind == "AWS::S3::BucketPolicy" and p["Bucket"] == {"Ref": bucket_id}]  # fmt: skip
    (gateway,) = [p for kind, p in resources
                  if kind == "AWS::EC2::VPCEndpoint" and p.get("VpcEndpointType") == "Gateway"]  # fmt: skip
    inside, outside = _workload("inside", in_vpc=True), _workload("outside", in_vpc=False)
    gate = Gate(ACCOUNT, REGION, tmp_path / "calls.jsonl", [inside, outside],
                bucket_policies={bucket: resolve(policy, refs=refs)},
                endpoint_policies={"s3": {"id": "vpce-s3", "vpc": "vpc-platform",
                                          "policy": resolve(gateway["PolicyDocument"], refs=refs)}})  # fmt: skip
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": REGION})
    s3.put_object(Bucket=bucket, Key="tweets/train.csv", Body=b"text,label\n")
    uninstall = install(gate)

    def client(principal: Principal) -> Any:
        return boto3.client("s3", region_name=REGION, aws_access_key_id=principal.access_key,
                            aws_secret_access_key=principal.secret_key)  # fmt: skip

    yield client(inside), client(outside), bucket, gate
    uninstall()


def test_a_perimeter_role_reads_from_inside_the_vpc_and_is_refused_outside(gated: Any) -> None:
    inside, outside, bucket, gate = gated
    assert inside.get_object(Bucket=bucket, Key="tweets/train.csv")["Body"].read() == b"text,label\n"
    with pytest.raises(ClientError, match="AccessDenied"):
        outside.get_object(Bucket=bucket, Key="tweets/train.csv")
    assert [(r.principal, r.allowed) for r in gate.records()] == [("inside", True), ("outside", False)]


def test_the_gateway_endpoint_policy_refuses_what_the_identity_and_bucket_allow(gated: Any) -> None:
    """An endpoint policy that allows nothing of S3 stops the call inside the VPC (both other policies allow it);
    outside the VPC the endpoint is not on the way (the bucket's perimeter refuses that one, as above)."""
    inside, _, bucket, gate = gated
    gate.endpoint_policies["s3"]["policy"] = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": "*", "Action": "sqs:*", "Resource": "*"}]}  # fmt: skip
    with pytest.raises(ClientError, match="AccessDenied"):
        inside.get_object(Bucket=bucket, Key="tweets/train.csv")
