"""One SageMaker real-time endpoint (single- or multi-model) as one construct: model, endpoint config, endpoint,
autoscaling on invocations, alarms from one table, the alarm topic, ``grant_invoke`` and ``metric_*`` helpers.

Modelled on aws-cdk's ``aws-sagemaker-alpha`` (``endpoint.ts``: ``grantInvoke``, the production variant's
``metric*`` methods; ``container-image.ts``: an image grants its own pull in ``bind()``), on the L1 resources so
that the properties alpha lacks (retained variant properties, data capture, network isolation) stay available.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, cast

import aws_cdk as cdk
from aws_cdk import aws_applicationautoscaling as appscaling
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cloudwatch_actions
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sagemaker as sagemaker
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from aws_cdk import region_info
from constructs import Construct

from platform_facts.instances import has_local_nvme
from stacks.compliance import acknowledge, acknowledge_short_retention
from stacks.components.endpoint_metrics import VariantMetrics
from stacks.components.eni_release_wait import EniReleaseWait
from stacks.components.image_builds import BuiltImage

VARIANT_NAME = "AllTraffic"
# How SageMaker spreads a variant's requests over its instances (API ProductionVariantRoutingConfig).
Routing = Literal["LEAST_OUTSTANDING_REQUESTS", "RANDOM"]
SCALABLE_DIMENSION = "sagemaker:variant:DesiredInstanceCount"
AUTOSCALING_SERVICE_LINKED_ROLE = (
    "sagemaker.application-autoscaling.amazonaws.com/AWSServiceRoleForApplicationAutoScaling_SageMakerEndpoint"
)
_ENDPOINT_NAME_LENGTH = 63


def endpoint_name_for(stack: cdk.Stack) -> str:
    """A fixed endpoint name derived from the stack name (unique per account and region, as stack names are), in
    SageMaker's alphabet (^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}); long names keep a hash of the whole for uniqueness."""
    name = re.sub(r"-+", "-", re.sub(r"[^A-Za-z0-9-]", "-", stack.stack_name)).strip("-")
    if len(name) > _ENDPOINT_NAME_LENGTH:
        digest = hashlib.sha256(name.encode()).hexdigest()[:8]
        name = f"{name[: _ENDPOINT_NAME_LENGTH - 9].rstrip('-')}-{digest}"
    return name


_ECR_PULL_ACTIONS = ["ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"]


@dataclass(frozen=True)
class ImageConfig:
    """What an image's ``bind`` hands the model: the image URI, and the policy that must exist before the model."""

    image_uri: str
    pull_policy: iam.ManagedPolicy


@dataclass(frozen=True)
class DlcImage:
    """An AWS Deep Learning Container image, ``<repository>:<tag>``, in the stack's region.

    The DLC registry account differs per region (CDK's regional fact) and China regions use amazonaws.com.cn.
    Like ``ContainerImage.bind()`` in aws-sagemaker-alpha, binding grants the model's role the pull of exactly this
    repository, so no role carries a hand-kept list of repositories that settings may change.
    ``ecr:GetAuthorizationToken`` has no resource-level permissions and stays with the role itself.
    """

    repository: str
    tag: str

    @classmethod
    def parse(cls, image: str) -> DlcImage:
        """``repository:tag`` as written in settings."""
        repository, _, tag = image.partition(":")
        if not repository or not tag:
            raise ValueError(f"DLC image {image!r} must be written as repository:tag")
        return cls(repository, tag)

    def _registry(self, scope: Construct) -> tuple[str, str, str]:
        stack = cdk.Stack.of(scope)
        account = stack.regional_fact(region_info.FactName.DLC_REPOSITORY_ACCOUNT)
        domain = stack.regional_fact(region_info.FactName.DOMAIN_SUFFIX)
        return account, stack.region, domain

    def image_uri(self, scope: Construct) -> str:
        account, region, domain = self._registry(scope)
        return f"{account}.dkr.ecr.{region}.{domain}/{self.repository}:{self.tag}"

    def repository_arn(self, scope: Construct) -> str:
        account, region, _ = self._registry(scope)
        return f"arn:{cdk.Stack.of(scope).partition}:ecr:{region}:{account}:repository/{self.repository}"

    def bind(self, scope: Construct, role: iam.IRole) -> ImageConfig:
        """Grant ``role`` the pull of this repository (a managed policy in ``scope``'s stack) and return the URI."""
        policy = iam.ManagedPolicy(
            scope,
            "ImagePullPolicy",
            description=f"Pull the {self.repository} Deep Learning Container image",
            roles=[role],
            statements=[
                iam.PolicyStatement(
                    sid="PullModelImage", actions=_ECR_PULL_ACTIONS, resources=[self.repository_arn(scope)]
                )
            ],
        )
        return ImageConfig(self.image_uri(scope), policy)


@dataclass(frozen=True)
class PlatformImage:
    """An image the platform's pipeline built (``BuiltImage``: the digest the pipeline promoted to this environment).

    Binding grants the model's role the pull of exactly that image's repository, in a managed policy of the
    endpoint's own stack (the repository's ARN comes from the endpoint stack's image parameter: a grant on a role of
    another stack would make that stack read it). The cross-account side is the repository's policy
    (``ImageBuilds(pull_accounts=...)``)."""

    image: BuiltImage

    def bind(self, scope: Construct, role: iam.IRole) -> ImageConfig:
        policy = iam.ManagedPolicy(
            scope,
            "ImagePullPolicy",
            description=f"Pull the platform's {self.image.image} image",
            roles=[role],
            statements=[self.image.pull_statement()],
        )
        return ImageConfig(self.image.image_uri, policy)


@dataclass(frozen=True)
class AlarmSpec:
    """One row of an endpoint's alarm table. Missing data (no traffic) never breaches."""

    id: str
    description: str
    metric: cloudwatch.IMetric
    threshold: float
    comparison: cloudwatch.ComparisonOperator
    periods: int
    datapoints: int | None = None  # of ``periods``; all of them when None


@dataclass(frozen=True)
class Autoscaling:
    """Target tracking on SageMakerVariantInvocationsPerInstance (invocations per instance per minute)."""

    min_capacity: int
    max_capacity: int
    target_invocations_per_instance: int
    scale_in_cooldown_seconds: int
    scale_out_cooldown_seconds: int

    def __post_init__(self) -> None:
        if not 1 <= self.min_capacity <= self.max_capacity:
            raise ValueError(f"autoscaling needs 1 <= min_capacity <= max_capacity, got {self}")


@dataclass(frozen=True)
class Rollout:
    """How an update of the endpoint (a new endpoint config: model, image, instance type) reaches traffic: SageMaker's
    blue/green deployment, all traffic to the new fleet at once, then ``bake_seconds`` watching ``rollback_alarms``
    (construct ids of ``add_alarms`` rows) before the old fleet goes; one of them in alarm rolls the endpoint back
    to the old fleet. The bake must cover each alarm's evaluation window, or an alarm could not fire in time.
    AWS::SageMaker::Endpoint DeploymentConfig (BlueGreenUpdatePolicy, AutoRollbackConfiguration)."""

    rollback_alarms: Sequence[str]
    bake_seconds: int = 900
    max_execution_seconds: int = 3600

    def __post_init__(self) -> None:
        if not 1 <= len(self.rollback_alarms) <= 10:
            raise ValueError("a rollout rolls back on 1 to 10 alarms (AutoRollbackConfig.Alarms)")
        if not 0 <= self.bake_seconds <= 3600 or not 600 <= self.max_execution_seconds <= 28800:
            raise ValueError(f"bake 0-3600 s and execution 600-28800 s, got {self}")


@dataclass(frozen=True)
class ModelNetwork:
    """Where the model's containers join the VPC, and whether they may reach anything but SageMaker's own fetches."""

    subnet_ids: Sequence[str]
    security_group_ids: Sequence[str]
    isolated: bool = True


def _endpoint_config(
    endpoint: SageMakerEndpoint,
    instance_type: str,
    initial_instance_count: int,
    key: kms.IKey,
    data_capture: sagemaker.CfnEndpointConfig.DataCaptureConfigProperty | None,
    startup_timeout_seconds: int | None,
    routing: Routing | None,
) -> sagemaker.CfnEndpointConfig:
    """``endpoint``'s config (construct id "EndpointConfig" under it): one variant of its model."""
    local_nvme = has_local_nvme(instance_type)
    config = sagemaker.CfnEndpointConfig(
        endpoint,
        "EndpointConfig",
        kms_key_id=None if local_nvme else key.key_arn,
        production_variants=[
            sagemaker.CfnEndpointConfig.ProductionVariantProperty(
                variant_name=VARIANT_NAME,
                model_name=endpoint.model.attr_model_name,
                instance_type=instance_type,
                initial_instance_count=initial_instance_count,
                initial_variant_weight=1.0,
                # SageMaker's wait for the container's first /ping 200 (60-3600 s; None: SageMaker's default).
                container_startup_health_check_timeout_in_seconds=startup_timeout_seconds,
                # How SageMaker spreads requests over the variant's instances (API ProductionVariantRoutingConfig:
                # LEAST_OUTSTANDING_REQUESTS, to the instances with more capacity; RANDOM, SageMaker's default).
                routing_config=None
                if routing is None
                else sagemaker.CfnEndpointConfig.RoutingConfigProperty(routing_strategy=routing),
            )
        ],
        data_capture_config=data_capture,
    )
    if local_nvme:
        acknowledge(
            config,
            f"{instance_type} has local NVMe instance storage, which SageMaker encrypts with a hardware key; "
            "SageMaker rejects an endpoint-config KMS key for such types.",
            "NIST.800.53.R5-SageMakerEndpointConfigurationKMSKeyConfigured",
        )
    return config


class SageMakerEndpoint(Construct, VariantMetrics):
    """A SageMaker endpoint with one production variant (``AllTraffic``).

    * The model runs ``image`` (a DLC or the platform's own) with ``role`` (which must exist, policies included,
      before the model: SageMaker checks its permissions on CreateModel), in ``network``; ``mode="MultiModel"``
      with ``model_data_url`` an S3 prefix.
    * The endpoint config takes ``key``, except on instance types with local NVMe storage, which SageMaker refuses a
      key for (it encrypts their instance store with a hardware key).
    * Config and model have generated names: both are immutable and CloudFormation replaces them on change. The
      endpoint keeps the instance count autoscaling chose across config updates (``retain_all_variant_properties``),
      except for the properties in ``exclude_retained``.
    * Autoscaling tracks ``SageMakerVariantInvocationsPerInstance`` (per instance per minute).
    * ``add_alarms`` builds the alarms from one table; each notifies the KMS-encrypted, TLS-only ``alarm_topic`` on
      alarm and on recovery; the topic policy lets this account's CloudWatch alarms publish. ``alarm_email`` and
      ``alarm_subscriptions`` (e-mail addresses, https:// URLs) subscribe to it.
    * With ``endpoint_name`` (fixed), the endpoint's log group ``/aws/sagemaker/Endpoints/<name>`` is created first,
      with ``log_retention_days`` and ``key``. ``retention_setting`` names the setting that chose the days: below a
      year, the construct acknowledges Control Tower's retention control for its log groups with that name.
    * ``routing``: the variant's routing strategy over its instances (None: SageMaker's default, RANDOM).
    * ``eni_release_wait`` holds the stack's deletion until SageMaker has released the model's network interfaces;
      ``shares_network_with`` names other endpoints in the same security group.
    """

    variant_name = VARIANT_NAME

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        role: iam.IRole,
        image: DlcImage | PlatformImage,
        model_data_url: str,
        mode: Literal["SingleModel", "MultiModel"] = "SingleModel",
        environment: dict[str, str] | None = None,
        network: ModelNetwork,
        instance_type: str,
        initial_instance_count: int,
        key: kms.IKey,
        autoscaling: Autoscaling,
        data_capture: sagemaker.CfnEndpointConfig.DataCaptureConfigProperty | None = None,
        exclude_retained: Sequence[str] = ("DataCaptureConfig",),
        alarm_email: str | None = None,
        alarm_subscriptions: Sequence[str] = (),
        alarm_topic_display_name: str | None = None,
        endpoint_name: str | None = None,
        log_retention_days: int = 30,
        retention_setting: str | None = None,
        removal_policy: cdk.RemovalPolicy = cdk.RemovalPolicy.RETAIN,
        startup_timeout_seconds: int | None = None,
        routing: Routing | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        self.role = role
        self.instance_type = instance_type
        self.fixed_name = endpoint_name
        self.image = image.bind(self, role)
        # On delete, CloudFormation removes the endpoint, its config and its model (which depends on the wait)
        # first; the wait then holds the stack until SageMaker has released the model's network interfaces.
        self.eni_release_wait = EniReleaseWait(
            self,
            "EniReleaseWait",
            security_group_ids=network.security_group_ids,
            key=key,
            log_retention_days=log_retention_days,
            removal_policy=removal_policy,
        )
        self.model = self._model(role, model_data_url, mode, environment or {}, network)
        self.model.node.add_dependency(self.eni_release_wait.resource)
        self.endpoint_config = _endpoint_config(
            self, instance_type, initial_instance_count, key, data_capture, startup_timeout_seconds, routing
        )
        self.endpoint = self._endpoint(endpoint_name, exclude_retained)
        self.endpoint_name = self.endpoint.attr_endpoint_name
        self.endpoint_arn = self.endpoint.attr_endpoint_arn
        self.log_group = None
        if endpoint_name is not None:
            self.log_group = self._log_group(endpoint_name, key, log_retention_days, removal_policy)
        if retention_setting is not None:
            for group in self.log_groups:
                acknowledge_short_retention(group, log_retention_days, retention_setting)
        self.scalable_target = self._track_invocations(autoscaling)
        subscribers = list(dict.fromkeys([*([alarm_email] if alarm_email else []), *alarm_subscriptions]))
        self.alarm_topic = _alarm_topic(self, alarm_topic_display_name, key, subscribers)
        self.alarms: list[cloudwatch.Alarm] = []

    def _endpoint(self, endpoint_name: str | None, exclude_retained: Sequence[str]) -> sagemaker.CfnEndpoint:
        return sagemaker.CfnEndpoint(
            self,
            "Endpoint",
            endpoint_name=endpoint_name,
            endpoint_config_name=self.endpoint_config.attr_endpoint_config_name,
            retain_all_variant_properties=True,
            exclude_retained_variant_properties=[
                sagemaker.CfnEndpoint.VariantPropertyProperty(variant_property_type=kind) for kind in exclude_retained
            ]
            or None,
        )

    def _log_group(
        self, endpoint_name: str, key: kms.IKey, retention_days: int, removal_policy: cdk.RemovalPolicy
    ) -> logs.LogGroup:
        """The group SageMaker writes the containers' logs to, created by CloudFormation before the endpoint, so that
        it expires and is encrypted with the platform key (SageMaker's own would never expire, under no key). Needs
        the fixed endpoint name: SageMaker names the group after the endpoint and creates it itself while the endpoint
        starts, before CloudFormation could create a group named after a generated name. Only EndpointName replaces
        an endpoint (config changes update it in place), so a fixed name costs nothing on updates."""
        group = logs.LogGroup(
            self,
            "LogGroup",
            log_group_name=f"/aws/sagemaker/Endpoints/{endpoint_name}",
            encryption_key=key,
            # A fixed-name resource kept when the stack's first creation rolls back would block every retry
            # ("already exists"): retained environments keep it on update and delete, not on a failed create.
            removal_policy=cdk.RemovalPolicy.RETAIN_ON_UPDATE_OR_DELETE
            if removal_policy == cdk.RemovalPolicy.RETAIN
            else removal_policy,
        )
        cast(
            logs.CfnLogGroup, group.node.default_child
        ).retention_in_days = retention_days  # any value CloudWatch Logs offers
        self.endpoint.node.add_dependency(group)
        # Deleted only after the ENI wait: once the endpoint's interfaces are gone its instances are too, and no late
        # log write can recreate the group (which would block the next deploy with "already exists").
        self.eni_release_wait.resource.node.add_dependency(group)
        return group

    @property
    def log_groups(self) -> list[logs.LogGroup]:
        """The log groups this construct creates: the endpoint's (when named) and the ENI wait's."""
        return [group for group in (self.log_group, self.eni_release_wait.log_group) if group is not None]

    # --- model --------------------------------------------------------------------------------------------------

    def _model(
        self,
        role: iam.IRole,
        model_data_url: str,
        mode: str,
        environment: dict[str, str],
        network: ModelNetwork,
    ) -> sagemaker.CfnModel:
        model = sagemaker.CfnModel(
            self,
            "Model",
            execution_role_arn=role.role_arn,
            primary_container=sagemaker.CfnModel.ContainerDefinitionProperty(
                image=self.image.image_uri,
                model_data_url=model_data_url,
                mode=mode,
                environment=environment or None,
            ),
            enable_network_isolation=network.isolated,
            vpc_config=sagemaker.CfnModel.VpcConfigProperty(
                security_group_ids=list(network.security_group_ids), subnets=list(network.subnet_ids)
            ),
        )
        # SageMaker checks the role's permissions (S3 read, image pull, KMS) when it creates the model: the role, its
        # policies (for a role of another stack: that whole stack) and the image's pull policy go first.
        model.node.add_dependency(role)
        model.node.add_dependency(self.image.pull_policy)
        return model

    # --- autoscaling --------------------------------------------------------------------------------------------

    def _track_invocations(self, scaling: Autoscaling) -> appscaling.ScalableTarget:
        stack = cdk.Stack.of(self)
        target = appscaling.ScalableTarget(
            self,
            "ScalableTarget",
            service_namespace=appscaling.ServiceNamespace.SAGEMAKER,
            # Built from the endpoint's name attribute (Fn::GetAtt), so CloudFormation registers the target only after
            # the endpoint exists, and deregisters it before deleting the endpoint; a typed name would not order them.
            resource_id=f"endpoint/{self.endpoint_name}/variant/{VARIANT_NAME}",
            scalable_dimension=SCALABLE_DIMENSION,
            min_capacity=scaling.min_capacity,
            max_capacity=scaling.max_capacity,
            role=iam.Role.from_role_arn(
                self,
                "AutoScalingServiceLinkedRole",
                f"arn:{stack.partition}:iam::{stack.account}:role/aws-service-role/{AUTOSCALING_SERVICE_LINKED_ROLE}",
                mutable=False,
            ),
        )
        # Application Auto Scaling acts for SageMaker through its service-linked role, which it creates on first use
        # when RoleARN is left out; the imported ARN above only stops CDK from creating an unused role of its own.
        cast(appscaling.CfnScalableTarget, target.node.default_child).add_property_deletion_override("RoleARN")
        # One target-tracking policy per metric: keep this construct id stable (a renamed policy fails on update).
        target.scale_to_track_metric(
            "InvocationsPerInstance",
            predefined_metric=appscaling.PredefinedMetric.SAGEMAKER_VARIANT_INVOCATIONS_PER_INSTANCE,
            target_value=scaling.target_invocations_per_instance,
            scale_in_cooldown=cdk.Duration.seconds(scaling.scale_in_cooldown_seconds),
            scale_out_cooldown=cdk.Duration.seconds(scaling.scale_out_cooldown_seconds),
        )
        return target

    # --- alarms -------------------------------------------------------------------------------------------------

    def add_alarms(self, table: Sequence[AlarmSpec]) -> list[cloudwatch.Alarm]:
        """One CloudWatch alarm per row, each notifying the alarm topic when it fires and when it recovers."""
        action = cloudwatch_actions.SnsAction(self.alarm_topic)
        created = []
        for row in table:
            alarm = cloudwatch.Alarm(
                self,
                row.id,
                alarm_description=row.description,
                metric=row.metric,
                threshold=row.threshold,
                comparison_operator=row.comparison,
                evaluation_periods=row.periods,
                datapoints_to_alarm=row.datapoints,
                # No traffic means no invocation metrics: silence is not a fault.
                treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            )
            alarm.add_alarm_action(action)
            alarm.add_ok_action(action)
            created.append(alarm)
        self.alarms.extend(created)
        return created

    def metric(self, namespace: str, metric_name: str, *, statistic: str = "Average",
               period: cdk.Duration | None = None) -> cloudwatch.Metric:  # fmt: skip
        """As VariantMetrics', but with a fixed endpoint name the dimension is that name, not the endpoint's
        attribute: an alarm on it then does not depend on the endpoint, so the endpoint's rollout can name it."""
        metric = super().metric(namespace, metric_name, statistic=statistic, period=period)
        if self.fixed_name is None:
            return metric
        return metric.with_(dimensions_map={"EndpointName": self.fixed_name, "VariantName": self.variant_name})

    def shares_network_with(self, *others: SageMakerEndpoint) -> None:
        """Other endpoints whose models join the same security group: this endpoint's ENI wait does not wait while
        one of them lives (their interfaces stay); theirs covers the group. Needs their fixed names."""
        names = [other.fixed_name for other in others if other.fixed_name is not None]
        if len(names) != len(others):
            raise ValueError("endpoints that share a network need fixed names (endpoint_name)")
        self.eni_release_wait.also_used_by(*names)

    # --- access -------------------------------------------------------------------------------------------------

    def invoke_statement(self, target_models: Sequence[str] | None = None) -> iam.PolicyStatement:
        """``sagemaker:InvokeEndpoint`` on this endpoint; with ``target_models`` (a multi-model endpoint), only for
        those ``TargetModel`` names: a request without TargetModel, or with another name, does not match."""
        conditions = None
        if target_models is not None:
            if not target_models:
                raise ValueError("target_models must list at least one model name, or be None for every model")
            from inference_assets.container.contract import validate_model_name

            names = [validate_model_name(name) for name in target_models]
            conditions = {"StringEquals": {"sagemaker:TargetModel": names}}
        return iam.PolicyStatement(
            actions=["sagemaker:InvokeEndpoint"], resources=[self.endpoint_arn], conditions=conditions
        )

    def grant_invoke(self, grantee: iam.IGrantable, target_models: Sequence[str] | None = None) -> iam.Grant:
        """Let ``grantee`` call InvokeEndpoint on this endpoint (and nothing else); see ``invoke_statement``."""
        statement = self.invoke_statement(target_models)
        return iam.Grant.add_to_principal(
            grantee=grantee,
            actions=statement.actions,
            resource_arns=statement.resources,
            conditions=statement.conditions or None,
        )


# --- the alarm topic ---------------------------------------------------------------------------------------------


def _alarm_topic(
    endpoint: SageMakerEndpoint, display_name: str | None, key: kms.IKey, subscribers: Sequence[str]
) -> sns.Topic:
    """The endpoint's alarm topic, and a subscription per e-mail address or https:// URL (SNS asks each to confirm)."""
    topic = sns.Topic(endpoint, "AlarmTopic", display_name=display_name, master_key=key, enforce_ssl=True)
    _allow_alarms_to_publish(topic)
    for subscriber in subscribers:
        if subscriber.startswith("https://"):
            topic.add_subscription(subscriptions.UrlSubscription(subscriber, protocol=sns.SubscriptionProtocol.HTTPS))
        else:
            topic.add_subscription(subscriptions.EmailSubscription(subscriber))
    return topic


def _allow_alarms_to_publish(topic: sns.Topic) -> None:
    """``enforce_ssl`` gives the topic an AWS::SNS::TopicPolicy, which replaces SNS's default policy: without this
    statement it holds only the TLS Deny and CloudWatch's SNS:Publish is refused. Limited to this account's alarms
    (confused deputy: aws:SourceAccount and aws:SourceArn). The KMS side is the platform key's policy."""
    stack = cdk.Stack.of(topic)
    topic.add_to_resource_policy(
        iam.PolicyStatement(
            sid="AllowCloudWatchAlarmsToPublish",
            principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
            actions=["sns:Publish"],
            resources=[topic.topic_arn],
            conditions={
                "StringEquals": {"aws:SourceAccount": stack.account},
                "ArnLike": {
                    "aws:SourceArn": f"arn:{stack.partition}:cloudwatch:{stack.region}:{stack.account}:alarm:*"
                },
            },
        )
    )


def roll_out(endpoint: SageMakerEndpoint, rollout: Rollout) -> None:
    """Deploy ``endpoint``'s updates blue/green with automatic rollback on ``rollout``'s alarms (see Rollout). Needs
    the fixed endpoint name (the alarms' dimension; see ``SageMakerEndpoint.metric``)."""
    by_id = {alarm.node.id: alarm for alarm in endpoint.alarms}
    if endpoint.fixed_name is None or any(alarm_id not in by_id for alarm_id in rollout.rollback_alarms):
        raise ValueError(f"a rollout needs a fixed endpoint name and alarms among {sorted(by_id)}")
    endpoint.endpoint.deployment_config = sagemaker.CfnEndpoint.DeploymentConfigProperty(
        blue_green_update_policy=sagemaker.CfnEndpoint.BlueGreenUpdatePolicyProperty(
            traffic_routing_configuration=sagemaker.CfnEndpoint.TrafficRoutingConfigProperty(
                type="ALL_AT_ONCE", wait_interval_in_seconds=rollout.bake_seconds
            ),
            termination_wait_in_seconds=0,
            maximum_execution_timeout_in_seconds=rollout.max_execution_seconds,
        ),
        auto_rollback_configuration=sagemaker.CfnEndpoint.AutoRollbackConfigProperty(
            alarms=[
                sagemaker.CfnEndpoint.AlarmProperty(alarm_name=by_id[alarm_id].alarm_name)
                for alarm_id in rollout.rollback_alarms
            ]
        ),
    )
