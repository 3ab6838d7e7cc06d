"""The customer-managed KMS key that encrypts one environment's data at rest (buckets, logs, volumes, jobs)."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import Construct

from stacks.components.iam_statements import cloudwatch_logs_may_use_key, deny_grants_except_for_aws_resources
from stacks.components.platform_network import network_perimeter_statement

# The services that use the key on a principal's behalf: S3 (the buckets' SSE-KMS), SageMaker (job and endpoint
# volumes, outputs), EC2 (EBS root volumes), ECR (the private repositories), SNS (alarm topics), CloudWatch Logs.
VIA_SERVICES = ("s3", "sagemaker", "ec2", "ecr", "sns", "logs")


class PlatformKey(kms.Key):
    """A rotating key whose policy lets CloudWatch Logs and CloudWatch alarms use it on the account's behalf, and
    allows grants only for AWS resources or from AWS services.

    A kms.Key itself (not a construct around one): the key keeps its construct path, which other stacks' templates
    quote in acknowledgements of the log groups it encrypts.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        alias: str,
        description: str,
        removal_policy: cdk.RemovalPolicy,
        pending_window_days: int,
    ) -> None:
        super().__init__(
            scope,
            construct_id,
            alias=alias,
            description=description,
            enable_key_rotation=True,
            removal_policy=removal_policy,
            pending_window=cdk.Duration.days(pending_window_days),
        )
        for statement in self._policy_statements():
            self.add_to_resource_policy(statement)

    def hold_to_network(self, vpc_id: str) -> None:
        """The key refuses every request of the roles held to the VPC (``hold_to_the_vpc``) that neither comes from the
        VPC ``vpc_id`` nor through an AWS service on their behalf (S3, SageMaker, EC2 using the key for them): their
        direct calls (DescribeKey, and the cryptographic operations the ViaService deny already refuses) work only
        from inside, through a KMS interface endpoint if the VPC gets one. A request that names the service it came
        through (kms:ViaService, KMS Developer Guide, "kms:ViaService") is left to the ViaService deny: SageMaker
        creates the grants of a job's volume and output with the job role, from SageMaker's own network."""
        statement = network_perimeter_statement(vpc_id, actions=["kms:*"], resources=["*"])
        statement.add_condition("Null", {"kms:ViaService": "true"})
        self.add_to_resource_policy(statement)

    def _policy_statements(self) -> list[iam.PolicyStatement]:
        stack = cdk.Stack.of(self)
        return [
            # Services that encrypt on the platform's behalf: log groups (flow logs, training logs) and alarm topics.
            cloudwatch_logs_may_use_key(self, "AllowCloudWatchLogs"),
            iam.PolicyStatement(
                sid="AllowCloudWatchAlarmsToPublishToEncryptedTopics",
                principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
                actions=["kms:Decrypt", "kms:GenerateDataKey*"],
                resources=["*"],
                conditions={"StringEquals": {"aws:SourceAccount": stack.account}},
            ),
            # Data keys only through the services that encrypt the platform's data (KMS developer guide,
            # "kms:ViaService": the service that made the request on the principal's behalf; absent when a principal
            # calls KMS itself),
            # except for service principals that call KMS themselves (CloudWatch Logs and alarms above:
            # aws:PrincipalIsAWSService, IAM User Guide, "AWS global condition context keys"). A role holding the key
            # can no longer decrypt a copied ciphertext or generate data keys for use outside the platform.
            iam.PolicyStatement(
                sid="DenyUseExceptThroughThePlatformsServices",
                effect=iam.Effect.DENY,
                principals=[iam.AnyPrincipal()],
                actions=["kms:Encrypt", "kms:Decrypt", "kms:ReEncrypt*", "kms:GenerateDataKey*"],
                resources=["*"],
                conditions={
                    "StringNotEquals": {
                        "kms:ViaService": [f"{service}.{stack.region}.{stack.url_suffix}" for service in VIA_SERVICES]
                    },
                    "BoolIfExists": {"aws:PrincipalIsAWSService": "false"},
                },
            ),
            deny_grants_except_for_aws_resources(),
        ]
