"""A SageMakerEndpoint alone on a bare stack, with the props every endpoint test starts from (tests override any)."""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms

from stacks.components.sagemaker_endpoint import AlarmSpec, Autoscaling, DlcImage, ModelNetwork, SageMakerEndpoint

ACCOUNT, REGION = "111122223333", "us-west-2"
IMAGE = DlcImage("pytorch-inference-arm64", "2.6.0-cpu-py312-ubuntu22.04-sagemaker")
NETWORK = ModelNetwork(subnet_ids=["subnet-0123456789abcdef0"], security_group_ids=["sg-0123456789abcdef0"])
AUTOSCALING = Autoscaling(
    min_capacity=1,
    max_capacity=3,
    target_invocations_per_instance=500,
    scale_in_cooldown_seconds=300,
    scale_out_cooldown_seconds=60,
)


def endpoint_on_bare_stack(
    instance_type: str = "ml.c7g.xlarge", **overrides: Any
) -> tuple[cdk.Stack, SageMakerEndpoint]:
    """A stack holding one endpoint ("Sentiment") of ``instance_type``, its role and key; ``overrides`` replace or add
    SageMakerEndpoint props."""
    app = cdk.App(context={"@aws-cdk/core:enablePartitionLiterals": True})
    stack = cdk.Stack(app, "Bare", env=cdk.Environment(account=ACCOUNT, region=REGION))
    role = iam.Role(stack, "Role", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"))
    props = {
        "role": role,
        "image": IMAGE,
        "model_data_url": "s3://bucket/endpoints/model.tar.gz",
        "network": NETWORK,
        "instance_type": instance_type,
        "initial_instance_count": 1,
        "key": kms.Key(stack, "Key"),
        "autoscaling": AUTOSCALING,
        **overrides,
    }
    return stack, SageMakerEndpoint(stack, "Sentiment", **props)


def server_errors_alarm(endpoint: SageMakerEndpoint, threshold: int) -> AlarmSpec:
    """An alarm ("Errors") when the endpoint answers ``threshold`` or more 5xx errors in one period."""
    return AlarmSpec(
        "Errors",
        "server errors",
        endpoint.metric_invocation5xx_errors(),
        threshold,
        cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
        periods=1,
    )
