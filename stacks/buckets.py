"""The platform's two kinds of S3 bucket, secure by default: KMS-encrypted data buckets and their access-log target."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from constructs import Construct

from stacks.compliance import acknowledge

_COMMON = {
    "enforce_ssl": True,
    "versioned": True,
    "block_public_access": s3.BlockPublicAccess.BLOCK_ALL,
    "object_ownership": s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
}


def access_logs_bucket(
    scope: Construct, construct_id: str, *, removal_policy: cdk.RemovalPolicy, expiration_days: int
) -> s3.Bucket:
    """The server-access-log target: SSE-S3, because S3 delivers access logs only to SSE-S3 buckets."""
    destroy = removal_policy == cdk.RemovalPolicy.DESTROY
    bucket = s3.Bucket(
        scope,
        construct_id,
        encryption=s3.BucketEncryption.S3_MANAGED,
        removal_policy=removal_policy,
        auto_delete_objects=destroy,
        lifecycle_rules=[
            s3.LifecycleRule(
                id="ExpireAccessLogs",
                expiration=cdk.Duration.days(expiration_days),
                noncurrent_version_expiration=cdk.Duration.days(7),
                abort_incomplete_multipart_upload_after=cdk.Duration.days(1),
            )
        ],
        **_COMMON,
    )
    # No S1 / S3BucketLoggingEnabled acknowledgement: cdk-nag treats a bucket that receives other buckets' access
    # logs as compliant (rules/s3/S3BucketLoggingEnabled), so none fires here.
    acknowledge(
        bucket,
        "S3 server access logging can only deliver to buckets encrypted with SSE-S3, not SSE-KMS.",
        "NIST.800.53.R5-S3DefaultEncryptionKMS",
    )
    return bucket


def encrypted_bucket(
    scope: Construct,
    construct_id: str,
    *,
    key: kms.IKey,
    access_logs: s3.IBucket,
    removal_policy: cdk.RemovalPolicy,
    noncurrent_version_days: int,
    abort_incomplete_upload_days: int = 7,
) -> s3.Bucket:
    """A data bucket: SSE-KMS with ``key`` (bucket keys on), TLS-only, versioned, private, access-logged."""
    return s3.Bucket(
        scope,
        construct_id,
        encryption=s3.BucketEncryption.KMS,
        encryption_key=key,
        bucket_key_enabled=True,
        server_access_logs_bucket=access_logs,
        server_access_logs_prefix=f"{construct_id.lower()}/",
        removal_policy=removal_policy,
        auto_delete_objects=removal_policy == cdk.RemovalPolicy.DESTROY,
        lifecycle_rules=[
            s3.LifecycleRule(
                id="ExpireNoncurrentVersions",
                noncurrent_version_expiration=cdk.Duration.days(noncurrent_version_days),
                abort_incomplete_multipart_upload_after=cdk.Duration.days(abort_incomplete_upload_days),
            )
        ],
        **_COMMON,
    )
