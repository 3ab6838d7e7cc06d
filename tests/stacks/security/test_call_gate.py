"""The rehearsal's call gate (proving_ground/rehearsal/aws_calls.py) decides with the resource's own policy too: a
request the identity policy allows is still refused when the bucket's or the key's policy (the synthesized dev
Foundation's, resolved as tests/stacks/security/conftest.py does) refuses it, through the real boto3 client against
moto."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from ops_review.iam_policy import resolve
from proving_ground.iam_requests import logical_id
from proving_ground.rehearsal.aws_calls import Gate, Principal, install
from tests.stacks.security.conftest import ACCOUNT, BUCKETS, REGION

# Whoever holds this may write and read any object and use any key: only resource policies can refuse it.
WRITER = Principal(
    "writer",
    "AKIAWRITER000000",
    [{"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": ["s3:PutObject", "s3:GetObject", "kms:*"], "Resource": "*"}]}],
    {"aws:PrincipalArn": f"arn:aws:iam::{ACCOUNT}:role/writer"},
)  # fmt: skip


@pytest.fixture()
def gated(foundation: tuple[dict[str, Any], dict[str, Any]], mocked_aws: str, tmp_path: Path) -> Any:
    template, refs = foundation
    bucket = BUCKETS["RemoteJobs"]
    bucket_id = logical_id(template, "AWS::S3::Bucket", "RemoteJobs")
    (policy,) = [r["Properties"]["PolicyDocument"] for r in template["Resources"].values()
                 if r["Type"] == "AWS::S3::BucketPolicy"
                 and r["Properties"]["Bucket"] == {"Ref": bucket_id}]  # fmt: skip
    key_id = logical_id(template, "AWS::KMS::Key", "PlatformKey")
    key_arn, key_policy = refs[f"{key_id}.Arn"], template["Resources"][key_id]["Properties"]["KeyPolicy"]
    gate = Gate(ACCOUNT, REGION, tmp_path / "calls.jsonl", [WRITER], kms_encrypted_buckets={bucket: key_arn},
                bucket_policies={bucket: resolve(policy, refs=refs)},
                key_policies={key_arn: resolve(key_policy, refs=refs)})  # fmt: skip
    boto3.client("s3", region_name=REGION).create_bucket(
        Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": REGION}
    )
    uninstall = install(gate)
    client = boto3.client("s3", region_name=REGION, aws_access_key_id=WRITER.access_key,
                          aws_secret_access_key=WRITER.secret_key)  # fmt: skip
    yield client, bucket, key_arn, gate
    uninstall()


def test_the_gate_refuses_what_only_the_bucket_policy_refuses(gated: Any) -> None:
    s3, bucket, key_arn, gate = gated
    s3.put_object(Bucket=bucket, Key="jobs/nlp/a", Body=b"x")  # the bucket's default key
    s3.put_object(Bucket=bucket, Key="jobs/nlp/b", Body=b"x", ServerSideEncryption="aws:kms", SSEKMSKeyId=key_arn)
    for attack in (
        {"ServerSideEncryption": "AES256"},  # SSE-S3
        {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": f"arn:aws:kms:{REGION}:999999999999:key/x"},
    ):
        with pytest.raises(ClientError, match="AccessDenied"):
            s3.put_object(Bucket=bucket, Key="jobs/nlp/c", Body=b"x", **attack)
    refused = [r for r in gate.records() if r.allowed is False]
    assert len(refused) == 2 and all(r.operation == "PutObject" for r in refused)


def test_the_gate_refuses_what_only_the_key_policy_refuses(gated: Any) -> None:
    """The key's policy allows its cryptographic operations only through the platform's services: a direct Decrypt
    by a principal whose identity policy allows kms:* is refused; the same key through S3 is not."""
    s3, bucket, key_arn, _ = gated
    s3.put_object(Bucket=bucket, Key="jobs/nlp/a", Body=b"x")
    assert s3.get_object(Bucket=bucket, Key="jobs/nlp/a")["Body"].read() == b"x"
    kms = boto3.client("kms", region_name=REGION, aws_access_key_id=WRITER.access_key,
                       aws_secret_access_key=WRITER.secret_key)  # fmt: skip
    with pytest.raises(ClientError, match="AccessDenied"):
        kms.decrypt(CiphertextBlob=b"0" * 32, KeyId=key_arn)
