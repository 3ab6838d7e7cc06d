"""ModelArchiveCheck: a custom resource that fails the deploy within seconds, with one sentence, when the model archive
an endpoint names is not in S3, or is not the archive whose SHA-256 was recorded beside it when it was written (the
check itself is ``handler.py``; see there for why). Every deploy of the endpoint passes it, the pipeline's included.

Make the SageMaker model depend on it (``guard``): CloudFormation runs the check before the model, endpoint config
and endpoint, so a missing archive rolls the stack back before SageMaker starts anything. Delete does nothing.

A function of its own rather than CDK's ``AwsCustomResource``: for a missing key S3 answers HEAD with a bare 404 or
403 and no message, which ``AwsCustomResource`` passes on as it comes; its singleton function also writes to a
``/aws/lambda/...`` log group that never expires, and its role is written as SDK calls, not as the key's ARN.
"""

from __future__ import annotations

from pathlib import Path

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from constructs import Construct, IConstruct

from stacks.components.model_archive_check import handler
from stacks.components.stack_function import function_logs_and_role, stack_function, write_own_logs

HANDLER_DIR = Path(__file__).resolve().parent
# One HeadObject and the archive read once to hash it (a RoBERTa-base archive is ~500 MB: seconds at S3's speed from
# Lambda). CloudFormation waits no longer than this (plus a minute) for an answer.
TIMEOUT = cdk.Duration.minutes(5)


class ModelArchiveCheck(Construct):
    """Checks, on every Create and Update, that ``s3://<bucket>/<object_key>`` exists; ``setting`` names the setting
    that chose the key, for the sentence a failed deploy shows. ``retention_setting`` names the setting that chose
    ``log_retention_days`` (below a year, Control Tower's retention control is acknowledged with that name)."""

    # Long: one custom resource with its log group, role, policy and Lambda, declared in dependency order, each
    # acknowledgement next to the resource it excuses.
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        bucket: s3.IBucket,
        object_key: str,
        setting: str,
        key: kms.IKey,
        log_retention_days: int = 30,
        retention_setting: str | None = None,
        removal_policy: cdk.RemovalPolicy = cdk.RemovalPolicy.RETAIN,
    ) -> None:
        super().__init__(scope, construct_id)
        stack = cdk.Stack.of(self)
        self.log_group, self.role = function_logs_and_role(
            self,
            key=key,
            log_retention_days=log_retention_days,
            removal_policy=removal_policy,
            role_description="Checks, before the endpoint's model is created, that its model archive is in S3",
            retention_setting=retention_setting,
        )
        self.policy = iam.ManagedPolicy(
            self,
            "Policy",
            description="Least privilege of the model archive check: read the one archive and its digest, logs",
            roles=[self.role],
            statements=[
                # HeadObject is authorized as s3:GetObject; reading the archive and its recorded digest decrypts them
                # through S3.
                iam.PolicyStatement(
                    sid="ReadTheModelArchiveAndItsDigest",
                    actions=["s3:GetObject"],
                    # From the bucket's name, which the endpoint's model already imports: no new export.
                    resources=[
                        f"arn:{stack.partition}:s3:::{bucket.bucket_name}/{object_key}",
                        f"arn:{stack.partition}:s3:::{bucket.bucket_name}/{object_key}{handler.DIGEST_SUFFIX}",
                    ],
                ),
                iam.PolicyStatement(
                    sid="DecryptThroughS3",
                    actions=["kms:Decrypt"],
                    resources=[key.key_arn],
                    conditions={"StringEquals": {"kms:ViaService": f"s3.{stack.region}.{stack.url_suffix}"}},
                ),
                write_own_logs(self.log_group),
            ],
        )
        self.function = stack_function(
            self,
            handler_dir=HANDLER_DIR,
            timeout=TIMEOUT,
            role=self.role,
            policy=self.policy,
            log_group=self.log_group,
            description="Before the endpoint's model: fail the deploy with one sentence when the archive is absent or "
            "changed",
            outside_vpc="Calls only the S3 API, once per deploy that changes the model key: a VPC adds nothing but "
            "network interfaces.",
            outside_vpc_control=(
                "Outside the VPC on purpose (CT.LAMBDA.PR.3): it makes one S3 HeadObject call per deploy that changes "
                "the model key and reads no data; in the VPC it would only add network interfaces."
            ),
        )
        self.resource = cdk.CustomResource(
            self,
            "Resource",
            service_token=self.function.function_arn,
            resource_type="Custom::ModelArchiveCheck",
            properties={"Bucket": bucket.bucket_name, "Key": object_key, "Setting": setting},
            service_timeout=TIMEOUT.plus(cdk.Duration.minutes(1)),
        )
        self.resource.node.add_dependency(self.policy, self.log_group)

    def guard(self, *resources: IConstruct) -> None:
        """Make ``resources`` (the SageMaker model) wait for a passed check."""
        for resource in resources:
            resource.node.add_dependency(self.resource)
