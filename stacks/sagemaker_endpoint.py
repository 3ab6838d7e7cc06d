"""Building blocks both SageMaker endpoint stacks share: image URIs, the VPC placement of models, autoscaling of a
variant on invocations, variant metrics and the encrypted alarm topic."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_applicationautoscaling as appscaling
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sagemaker as sagemaker
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from aws_cdk import region_info
from constructs import Construct

from stacks.foundation import FoundationStack
from stacks.settings import AutoscalingSettings

VARIANT_NAME = "AllTraffic"
SCALABLE_DIMENSION = "sagemaker:variant:DesiredInstanceCount"
AUTOSCALING_SERVICE_LINKED_ROLE = (
    "sagemaker.application-autoscaling.amazonaws.com/AWSServiceRoleForApplicationAutoScaling_SageMakerEndpoint"
)


def dlc_image_uri(scope: Construct, image: str) -> str:
    """A Deep Learning Container image (``repository:tag``) in the stack's region: the DLC account differs per region
    (CDK's regional fact), and China regions use the amazonaws.com.cn domain."""
    stack = cdk.Stack.of(scope)
    account = stack.regional_fact(region_info.FactName.DLC_REPOSITORY_ACCOUNT)
    domain = stack.regional_fact(region_info.FactName.DOMAIN_SUFFIX)
    return f"{account}.dkr.ecr.{stack.region}.{domain}/{image}"


def model_vpc_config(foundation: FoundationStack) -> sagemaker.CfnModel.VpcConfigProperty:
    """Models run in the platform's private subnets, behind the workload security group (no inbound)."""
    return sagemaker.CfnModel.VpcConfigProperty(
        security_group_ids=[foundation.workload_security_group.security_group_id],
        subnets=[subnet.subnet_id for subnet in foundation.private_subnets.subnets],
    )


def track_invocations(scope: Construct, endpoint_name: str, scaling: AutoscalingSettings) -> appscaling.ScalableTarget:
    """Scale the variant on SageMakerVariantInvocationsPerInstance (per instance per minute)."""
    stack = cdk.Stack.of(scope)
    target = appscaling.ScalableTarget(
        scope,
        "ScalableTarget",
        service_namespace=appscaling.ServiceNamespace.SAGEMAKER,
        # Built from the endpoint's name attribute (Fn::GetAtt), so CloudFormation registers the target only after
        # the endpoint exists, and deregisters it before deleting the endpoint; a typed name would not order them.
        resource_id=f"endpoint/{endpoint_name}/variant/{VARIANT_NAME}",
        scalable_dimension=SCALABLE_DIMENSION,
        min_capacity=scaling.min_capacity,
        max_capacity=scaling.max_capacity,
        role=iam.Role.from_role_arn(
            scope,
            "AutoScalingServiceLinkedRole",
            f"arn:{stack.partition}:iam::{stack.account}:role/aws-service-role/{AUTOSCALING_SERVICE_LINKED_ROLE}",
            mutable=False,
        ),
    )
    # Application Auto Scaling acts for SageMaker through its service-linked role, which it creates on first use
    # when RoleARN is left out; the imported ARN above only stops CDK from creating an unused role of its own.
    target.node.default_child.add_property_deletion_override("RoleARN")
    # One target-tracking policy per metric: keep this construct id stable (a renamed policy fails on update).
    target.scale_to_track_metric(
        "InvocationsPerInstance",
        predefined_metric=appscaling.PredefinedMetric.SAGEMAKER_VARIANT_INVOCATIONS_PER_INSTANCE,
        target_value=scaling.target_invocations_per_instance,
        scale_in_cooldown=cdk.Duration.seconds(scaling.scale_in_cooldown_seconds),
        scale_out_cooldown=cdk.Duration.seconds(scaling.scale_out_cooldown_seconds),
    )
    return target


def variant_metric(
    endpoint_name: str, namespace: str, name: str, statistic: str, period: cdk.Duration
) -> cloudwatch.Metric:
    return cloudwatch.Metric(
        namespace=namespace,
        metric_name=name,
        dimensions_map={"EndpointName": endpoint_name, "VariantName": VARIANT_NAME},
        statistic=statistic,
        period=period,
    )


def alarm_topic(
    scope: Construct, foundation: FoundationStack, alarm_email: str | None, display_name: str | None = None
) -> sns.Topic:
    """The KMS-encrypted, TLS-only topic the endpoint's alarms notify; e-mailed when the environment names one."""
    topic = sns.Topic(scope, "AlarmTopic", display_name=display_name, master_key=foundation.key, enforce_ssl=True)
    if alarm_email:
        topic.add_subscription(subscriptions.EmailSubscription(alarm_email))
    return topic
