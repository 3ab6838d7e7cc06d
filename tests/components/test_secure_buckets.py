"""SecureBuckets on a bare stack: the access-log target, the KMS data buckets that log into it, and stable ids."""

from __future__ import annotations

import aws_cdk as cdk
import pytest
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk.assertions import Match, Template

from stacks.compliance import add_compliance_gates
from stacks.components.secure_buckets import KEEP_LOGICAL_IDS, SecureBuckets


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
    policies = destroyed.find_resources("AWS::S3::BucketPolicy")
    assert len(policies) == 3
    for policy in policies.values():
        statements = policy["Properties"]["PolicyDocument"]["Statement"]
        assert any(
            s["Effect"] == "Deny" and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}} for s in statements
        )


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
    add_compliance_gates(app)
    app.synth()


def test_the_pair_passes_cdk_nag_once_replication_is_answered() -> None:
    _synth_with_gates(no_replication_reason="Single-region platform; the data can be rebuilt from its sources.")


def test_without_a_replication_reason_cdk_nag_still_asks_for_one() -> None:
    with pytest.raises(Exception, match="S3BucketReplicationEnabled"):
        _synth_with_gates()
