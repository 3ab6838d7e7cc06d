"""SecureBuckets on a bare stack: the access-log target, the KMS data buckets that log into it, and stable ids."""

from __future__ import annotations

import json

import aws_cdk as cdk
import pytest
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk.assertions import Match, Template

from ops_review.iam_policy import Request, is_allowed, resolve
from stacks.compliance import add_compliance_gates
from stacks.components.secure_buckets import KEEP_LOGICAL_IDS, SecureBuckets
from tests.stacks.components.bare_stack import refs, resources
from tests.stacks.components.statement_requests import bucket_requests, over_tls_and_plain_http


def _stack(removal_policy: cdk.RemovalPolicy, **props: object) -> tuple[cdk.Stack, SecureBuckets]:
    stack = cdk.Stack(cdk.App(), "Bare")
    key = kms.Key(stack, "Key")
    buckets = SecureBuckets(
        stack,
        KEEP_LOGICAL_IDS,
        key=key,
        removal_policy=removal_policy,
        access_log_expiration_days=90,
        noncurrent_version_days=30,
        **props,  # type: ignore[arg-type]
    )
    buckets.add_data_bucket("Datasets")
    buckets.add_data_bucket("Artifacts")
    return stack, buckets


@pytest.fixture(scope="module")
def destroyed() -> Template:
    return Template.from_stack(_stack(cdk.RemovalPolicy.DESTROY)[0])


@pytest.fixture(scope="module")
def retained() -> Template:
    return Template.from_stack(_stack(cdk.RemovalPolicy.RETAIN)[0])


PRIVATE = {
    "PublicAccessBlockConfiguration": {
        "BlockPublicAcls": True,
        "BlockPublicPolicy": True,
        "IgnorePublicAcls": True,
        "RestrictPublicBuckets": True,
    },
    "OwnershipControls": {"Rules": [{"ObjectOwnership": "BucketOwnerEnforced"}]},
    "VersioningConfiguration": {"Status": "Enabled"},
}


def test_access_log_target_is_sse_s3_and_expires_logs(destroyed: Template) -> None:
    destroyed.has_resource_properties(
        "AWS::S3::Bucket",
        {
            **PRIVATE,
            "BucketEncryption": {
                "ServerSideEncryptionConfiguration": [{"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]
            },
            "LifecycleConfiguration": {
                "Rules": Match.array_with([Match.object_like({"Id": "ExpireAccessLogs", "ExpirationInDays": 90})])
            },
            "LoggingConfiguration": Match.absent(),
        },
    )


@pytest.mark.parametrize("name", ["Datasets", "Artifacts"])
def test_data_buckets_use_the_key_and_log_into_the_target(destroyed: Template, name: str) -> None:
    (target,) = destroyed.find_resources(
        "AWS::S3::Bucket", {"Properties": {"LoggingConfiguration": Match.absent()}}
    ).keys()
    destroyed.has_resource_properties(
        "AWS::S3::Bucket",
        {
            **PRIVATE,
            "BucketEncryption": {
                "ServerSideEncryptionConfiguration": [
                    {
                        "BucketKeyEnabled": True,
                        "ServerSideEncryptionByDefault": {
                            "SSEAlgorithm": "aws:kms",
                            "KMSMasterKeyID": {"Fn::GetAtt": [Match.string_like_regexp("^Key"), "Arn"]},
                        },
                    }
                ]
            },
            "LoggingConfiguration": {
                "DestinationBucketName": {"Ref": target},
                "LogFilePrefix": f"{name.lower()}/",
            },
        },
    )


def test_every_bucket_is_tls_only(destroyed: Template) -> None:
    """Each bucket's policy, evaluated: every kind of request allowed over TLS is refused over plain HTTP."""
    template = destroyed.to_json()
    values = refs(template)
    policies = resources(template, "AWS::S3::BucketPolicy").values()
    assert {policy["Properties"]["Bucket"]["Ref"] for policy in policies} == set(resources(template, "AWS::S3::Bucket"))
    for policy in policies:
        bucket = f"arn:aws:s3:::{resolve(policy['Properties']['Bucket'], refs=values)}"
        document = resolve(policy["Properties"]["PolicyDocument"], refs=values)
        decisions = over_tls_and_plain_http(document, bucket_requests(bucket))
        assert decisions == dict.fromkeys(bucket_requests(bucket), (True, False)), bucket


def test_destroyed_buckets_are_emptied_and_retained_ones_are_not(destroyed: Template, retained: Template) -> None:
    destroyed.resource_count_is("Custom::S3AutoDeleteObjects", 3)
    destroyed.all_resources("AWS::S3::Bucket", {"DeletionPolicy": "Delete", "UpdateReplacePolicy": "Delete"})
    retained.resource_count_is("Custom::S3AutoDeleteObjects", 0)
    retained.all_resources("AWS::S3::Bucket", {"DeletionPolicy": "Retain", "UpdateReplacePolicy": "Retain"})


def test_default_id_keeps_the_logical_ids_of_buckets_made_directly_in_the_stack() -> None:
    stack, buckets = _stack(cdk.RemovalPolicy.RETAIN)
    plain = cdk.Stack(cdk.App(), "Plain")
    expected = {
        plain.get_logical_id(s3.Bucket(plain, name).node.default_child)
        for name in ("AccessLogs", "Datasets", "Artifacts")
    }  # type: ignore[arg-type]
    actual = {stack.get_logical_id(b.node.default_child) for b in (buckets.access_logs, *buckets.data_buckets)}  # type: ignore[arg-type]
    assert actual == expected


def _synth_with_gates(**props: object) -> None:
    app = cdk.App()
    stack = cdk.Stack(app, "Bare")
    buckets = SecureBuckets(
        stack,
        KEEP_LOGICAL_IDS,
        key=kms.Key(stack, "Key", enable_key_rotation=True),
        removal_policy=cdk.RemovalPolicy.RETAIN,
        access_log_expiration_days=365,
        noncurrent_version_days=90,
        **props,  # type: ignore[arg-type]
    )
    buckets.add_data_bucket("Datasets")
    # cdk-nag is the subject here; the pair's Control Tower controls: test_secure_buckets_control_tower.
    add_compliance_gates(app, control_tower_outside_stages=False)
    app.synth()


def test_the_pair_passes_cdk_nag_once_replication_is_answered() -> None:
    _synth_with_gates(no_replication_reason="Single-region platform; the data can be rebuilt from its sources.")


def test_without_a_replication_reason_cdk_nag_still_asks_for_one() -> None:
    with pytest.raises(Exception, match="S3BucketReplicationEnabled"):
        _synth_with_gates()


def test_data_buckets_refuse_writes_under_another_kms_key_or_sse_c(destroyed: Template) -> None:
    """Issue 22.4: the bucket policy, evaluated, refuses another SSE-KMS key and SSE-C next to the default and the
    pair's own key (an identity policy that allows every write stands for any writer)."""
    template = destroyed.to_json()
    values = refs(template)
    (key_id,) = resources(template, "AWS::KMS::Key")
    key_arn = values[f"{key_id}.Arn"]
    writer = [{"Statement": [{"Effect": "Allow", "Action": "s3:PutObject", "Resource": "*"}]}]
    data_policies = [p for p in resources(template, "AWS::S3::BucketPolicy").values()
                     if "DenyOtherKmsKeys" in json.dumps(p)]  # fmt: skip
    assert len(data_policies) == 2
    for policy in data_policies:
        document = resolve(policy["Properties"]["PolicyDocument"], refs=values)
        bucket_arn = resolve(policy["Properties"]["Bucket"], refs=values)
        obj = f"arn:aws:s3:::{bucket_arn}/training-output/model.tar.gz"

        def put(document: dict = document, obj: str = obj, **context: str) -> bool:
            request = Request("s3:PutObject", obj, {"aws:SecureTransport": "true", **context})
            return is_allowed(writer, request, resource_policies=[document])

        assert put()
        assert put(**{"s3:x-amz-server-side-encryption-aws-kms-key-id": key_arn})
        other = "arn:aws:kms:us-east-1:999999999999:key/attacker"
        assert not put(**{"s3:x-amz-server-side-encryption-aws-kms-key-id": other})
        assert not put(**{"s3:x-amz-server-side-encryption-customer-algorithm": "AES256"})
