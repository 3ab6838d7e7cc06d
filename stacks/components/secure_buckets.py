"""The secure bucket pair: one server-access-log target (SSE-S3) and the KMS-encrypted data buckets that log into it.

Every bucket is TLS-only, versioned, private (all public access blocked, ACLs disabled) and emptied on delete only
when its removal policy destroys it.
"""

from __future__ import annotations

from typing import Any, cast

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from constructs import Construct

from stacks.compliance import acknowledge, acknowledge_control
from stacks.components.platform_network import network_perimeter_statement

# Give a stack's one SecureBuckets this id: CDK leaves "Default" out of logical ids, so its buckets keep the ids
# they had as direct children of the stack, and a deployed (retained) bucket is never replaced by an empty twin.
KEEP_LOGICAL_IDS = "Default"


class SecureBuckets(Construct):
    """An access-log bucket plus ``add_data_bucket()`` for each SSE-KMS data bucket that logs into it."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        key: kms.IKey,
        removal_policy: cdk.RemovalPolicy,
        access_log_expiration_days: int,
        noncurrent_version_days: int,
        abort_incomplete_upload_days: int = 7,
        access_logs_id: str = "AccessLogs",
        no_replication_reason: str | None = None,
        control_tower: bool = False,
        no_object_lock_reason: str | None = None,
    ) -> None:
        """``no_replication_reason``: why the buckets need no cross-region replication (NIST 800-53 asks for it);
        None keeps the finding for the caller to answer.

        ``control_tower``: meet AWS Control Tower's proactive S3 controls where a bucket can (data buckets send
        object-level events to EventBridge, CT.S3.PR.4) and acknowledge, with the reason, those the access-log
        bucket cannot. ``no_object_lock_reason``: why the buckets need no S3 Object Lock (CT.S3.PR.9); None keeps
        the finding for the caller to answer."""
        super().__init__(scope, construct_id)
        # ACLs are disabled (BucketOwnerEnforced), so log delivery must be granted by bucket policy: set the feature
        # flag for this subtree, whatever the app's cdk.json says.
        self.node.set_context("@aws-cdk/aws-s3:serverAccessLogsUseBucketPolicy", True)
        self.key = key
        self.removal_policy = removal_policy
        self.noncurrent_version_days = noncurrent_version_days
        self.abort_incomplete_upload_days = abort_incomplete_upload_days
        self.no_replication_reason = no_replication_reason
        self.control_tower = control_tower
        self.no_object_lock_reason = no_object_lock_reason
        self.data_buckets: list[s3.Bucket] = []
        # S3 delivers server access logs only to buckets encrypted with SSE-S3.
        self.access_logs = s3.Bucket(
            self,
            access_logs_id,
            encryption=s3.BucketEncryption.S3_MANAGED,
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="ExpireAccessLogs",
                    expiration=cdk.Duration.days(access_log_expiration_days),
                    noncurrent_version_expiration=cdk.Duration.days(7),
                    abort_incomplete_multipart_upload_after=cdk.Duration.days(1),
                )
            ],
            **self._common(),
        )
        # No S1 / S3BucketLoggingEnabled acknowledgement: cdk-nag treats a bucket that receives other buckets' access
        # logs as compliant (rules/s3/S3BucketLoggingEnabled), so none fires here.
        acknowledge(
            self.access_logs,
            "S3 server access logging can only deliver to buckets encrypted with SSE-S3, not SSE-KMS.",
            "NIST.800.53.R5-S3DefaultEncryptionKMS",
        )
        self._acknowledge_replication(self.access_logs)
        if control_tower:
            self._acknowledge_access_log_controls()
        self._acknowledge_object_lock(self.access_logs)

    def add_data_bucket(self, construct_id: str) -> s3.Bucket:
        """A data bucket: SSE-KMS with the pair's key (bucket keys on), access-logged under ``<id lowercased>/``."""
        bucket = s3.Bucket(
            self,
            construct_id,
            encryption=s3.BucketEncryption.KMS,
            encryption_key=self.key,
            bucket_key_enabled=True,
            server_access_logs_bucket=self.access_logs,
            server_access_logs_prefix=f"{construct_id.lower()}/",
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="ExpireNoncurrentVersions",
                    noncurrent_version_expiration=cdk.Duration.days(self.noncurrent_version_days),
                    abort_incomplete_multipart_upload_after=cdk.Duration.days(self.abort_incomplete_upload_days),
                )
            ],
            **self._common(),
        )
        self._deny_other_encryption(bucket)
        self._acknowledge_replication(bucket)
        if self.control_tower:
            # Object-level events (new datasets, models, captured data) go to EventBridge, where pipelines and audits
            # can subscribe (CT.S3.PR.4). Set on the bucket itself: CDK's event_bridge_enabled adds a
            # custom-resource Lambda for the same setting.
            cast(cdk.CfnResource, bucket.node.default_child).add_property_override(
                "NotificationConfiguration.EventBridgeConfiguration.EventBridgeEnabled", True
            )
        self._acknowledge_object_lock(bucket)
        self.data_buckets.append(bucket)
        return bucket

    def hold_to_network(self, vpc_id: str) -> None:
        """Every data bucket refuses the requests of the roles held to the VPC (``hold_to_the_vpc``) that do not come
        from the VPC ``vpc_id`` (platform_network.network_perimeter_statement). Not the access-log bucket: only S3's
        log delivery writes it."""
        for bucket in self.data_buckets:
            bucket.add_to_resource_policy(
                network_perimeter_statement(
                    vpc_id, actions=["s3:*"], resources=[bucket.bucket_arn, bucket.arn_for_objects("*")]
                )
            )

    def _deny_other_encryption(self, bucket: s3.Bucket) -> None:
        """Objects are written under the pair's key or the bucket default (which is that key), never under another
        KMS key (whose owner could then withhold or read them), SSE-S3 (a key outside the platform key's policy) nor
        SSE-C (a key the platform never sees). Amazon S3
        User Guide, "Requiring server-side encryption" and the condition keys s3:x-amz-server-side-encryption-aws-kms-
        key-id (the SSE-KMS key named in the request; absent when the bucket default applies) and
        s3:x-amz-server-side-encryption-customer-algorithm (present only with SSE-C)."""
        bucket.add_to_resource_policy(
            iam.PolicyStatement(
                sid="DenyOtherKmsKeys",
                effect=iam.Effect.DENY,
                principals=[iam.AnyPrincipal()],
                actions=["s3:PutObject"],
                resources=[bucket.arn_for_objects("*")],
                # Both conditions: the header is present (Null false) and names another key. A negated operator,
                # with or without IfExists, is true without the key and would refuse every default-encrypted write
                # (IAM User Guide, "Condition operators": IfExists and Null).
                conditions={
                    "Null": {"s3:x-amz-server-side-encryption-aws-kms-key-id": "false"},
                    "StringNotEquals": {"s3:x-amz-server-side-encryption-aws-kms-key-id": self.key.key_arn},
                },
            )
        )
        bucket.add_to_resource_policy(
            iam.PolicyStatement(
                # SSE-S3 (AES256) would store the object under an S3-owned key, outside the platform key's policy:
                # a write that asks for any encryption other than SSE-KMS (s3:x-amz-server-side-encryption, present
                # only when the request names one; the bucket default applies otherwise) is refused.
                sid="DenyOtherEncryptionThanKms",
                effect=iam.Effect.DENY,
                principals=[iam.AnyPrincipal()],
                actions=["s3:PutObject"],
                resources=[bucket.arn_for_objects("*")],
                conditions={
                    "Null": {"s3:x-amz-server-side-encryption": "false"},
                    "StringNotEquals": {"s3:x-amz-server-side-encryption": "aws:kms"},
                },
            )
        )
        bucket.add_to_resource_policy(
            iam.PolicyStatement(
                sid="DenyCustomerProvidedKeys",
                effect=iam.Effect.DENY,
                principals=[iam.AnyPrincipal()],
                actions=["s3:PutObject"],
                resources=[bucket.arn_for_objects("*")],
                conditions={"Null": {"s3:x-amz-server-side-encryption-customer-algorithm": "false"}},
            )
        )

    def _common(self) -> dict[str, Any]:
        """The settings every bucket of the pair shares (keyword arguments of s3.Bucket)."""
        return {
            "enforce_ssl": True,
            "versioned": True,
            "block_public_access": s3.BlockPublicAccess.BLOCK_ALL,
            "object_ownership": s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            "removal_policy": self.removal_policy,
            # Only buckets that are deleted with their stack are emptied first (dev); retained ones keep their data.
            "auto_delete_objects": self.removal_policy == cdk.RemovalPolicy.DESTROY,
        }

    def _acknowledge_replication(self, bucket: s3.Bucket) -> None:
        if self.no_replication_reason:
            acknowledge(bucket, self.no_replication_reason, "NIST.800.53.R5-S3BucketReplicationEnabled")

    def _acknowledge_access_log_controls(self) -> None:
        """The Control Tower controls the access-log bucket cannot meet, by its role."""
        acknowledge_control(
            self.access_logs,
            "S3 delivers server access logs only to buckets encrypted with SSE-S3, not SSE-KMS (CT.S3.PR.10).",
            "s3_bucket_default_encryption_kms_check",
        )
        acknowledge_control(
            self.access_logs,
            "This bucket is the server-access-log target of the other buckets; logging it into itself would loop "
            "(CT.S3.PR.2).",
            "s3_bucket_logging_enabled_check",
        )
        acknowledge_control(
            self.access_logs,
            "Only S3's log delivery writes here; notifications of every delivered log object would be noise "
            "(CT.S3.PR.4).",
            "s3_event_notifications_enabled_check",
        )

    def _acknowledge_object_lock(self, bucket: s3.Bucket) -> None:
        if self.no_object_lock_reason:
            acknowledge_control(bucket, self.no_object_lock_reason, "s3_bucket_object_lock_enabled_check")
