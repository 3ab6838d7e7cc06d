"""The real-time sentiment endpoint on Graviton (seed 000): SageMaker model, endpoint config, endpoint, autoscaling
and alarms.

A new model version is a settings change: upload the archive (``inference_assets/package_model.py --upload``), set
``graviton_endpoint.model_data_key`` and deploy. CloudFormation then replaces the model and the endpoint config
(generated names, both immutable) and updates the endpoint in place; ``retain_all_variant_properties`` keeps the
instance count that autoscaling chose instead of resetting it to ``initial_instance_count``.
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cloudwatch_actions
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sagemaker as sagemaker
from aws_cdk import aws_sns as sns
from constructs import Construct

from inference_assets.tools.endpoint_environment import instance_vcpus
from stacks.compliance import acknowledge
from stacks.environment_stack import EnvironmentStack
from stacks.foundation import DATA_CAPTURE_PREFIX, ENDPOINT_MODELS_PREFIX, FoundationStack
from stacks.sagemaker_endpoint import (
    VARIANT_NAME,
    alarm_topic,
    dlc_image_uri,
    model_vpc_config,
    track_invocations,
    variant_metric,
)
from stacks.settings import EnvironmentSettings, has_local_nvme

ALARM_PERIOD = cdk.Duration.minutes(5)
# Alarm thresholds: any sustained server error; a p99 far above a RoBERTa-base forward pass on c7g (tens of ms),
# which means requests queue; CPU near the top while autoscaling is already at its maximum.
FIVE_XX_PER_PERIOD = 5
MODEL_LATENCY_P99_MICROSECONDS = 1_000_000
CPU_UTILIZATION_PERCENT = 80


class GravitonEndpointStack(EnvironmentStack):
    """One SageMaker real-time endpoint serving the sentiment model with the PyTorch inference DLC on Graviton."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: EnvironmentSettings,
        foundation: FoundationStack,
        **kwargs,
    ) -> None:
        super().__init__(
            scope,
            construct_id,
            description=f"PyTorch platform Graviton endpoint ({settings.name}): model, endpoint, autoscaling, alarms",
            settings=settings,
            **kwargs,
        )
        self.foundation = foundation
        endpoint_settings = settings.graviton_endpoint
        if not endpoint_settings.model_data_key.startswith(ENDPOINT_MODELS_PREFIX):
            raise ValueError(
                f"environments.{settings.name}.graviton_endpoint.model_data_key: must start with "
                f"{ENDPOINT_MODELS_PREFIX!r}, the prefix the endpoint execution role may read."
            )
        if (
            endpoint_settings.dependencies == "install_at_startup"
            and not settings.vpc.imported
            and not settings.vpc.nat_gateways
        ):
            raise ValueError(
                f"environments.{settings.name}.graviton_endpoint.dependencies: install_at_startup needs internet "
                "egress (vpc.nat_gateways >= 1) to pip-install code/requirements.txt; use vendored archives instead."
            )

        self.model = self._model()
        self.endpoint_config = self._endpoint_config()
        self.endpoint = sagemaker.CfnEndpoint(
            self,
            "Endpoint",
            endpoint_config_name=self.endpoint_config.attr_endpoint_config_name,
            # A config update (new model version) keeps the instance count autoscaling set; data capture is
            # excluded so that changes to its setting take effect.
            retain_all_variant_properties=True,
            exclude_retained_variant_properties=[
                sagemaker.CfnEndpoint.VariantPropertyProperty(variant_property_type="DataCaptureConfig")
            ],
        )
        self.endpoint_name = self.endpoint.attr_endpoint_name
        # Ref of AWS::SageMaker::Endpoint is its ARN.
        self.endpoint_arn = self.endpoint.ref
        self.scalable_target = track_invocations(self, self.endpoint_name, endpoint_settings.autoscaling)
        self.alarm_topic, self.alarms = self._alarms()

        # The promotion pipeline's smoke test reads this output (stage.graviton_endpoint.endpoint_name_output).
        self.endpoint_name_output = cdk.CfnOutput(
            self, "EndpointName", value=self.endpoint_name, description="Name for invoke_endpoint"
        )
        cdk.CfnOutput(self, "EndpointArn", value=self.endpoint_arn, description="ARN for IAM policies")
        cdk.CfnOutput(
            self, "ModelDataKey", value=settings.graviton_endpoint.model_data_key, description="Archive being served"
        )
        cdk.CfnOutput(self, "AlarmTopicArn", value=self.alarm_topic.topic_arn, description="Endpoint alarms")

    @property
    def _model_data_url(self) -> str:
        return self.foundation.artifacts_bucket.s3_url_for_object(self.settings.graviton_endpoint.model_data_key)

    @property
    def _vcpus(self) -> int:
        return instance_vcpus(self.settings.graviton_endpoint.instance_type)

    def _model(self) -> sagemaker.CfnModel:
        endpoint_settings = self.settings.graviton_endpoint
        vendored = endpoint_settings.dependencies == "vendored"
        environment = endpoint_settings.container_environment()
        model = sagemaker.CfnModel(
            self,
            "Model",
            execution_role_arn=self.foundation.endpoint_role.role_arn,
            primary_container=sagemaker.CfnModel.ContainerDefinitionProperty(
                image=dlc_image_uri(self, f"{endpoint_settings.image_repository}:{endpoint_settings.image_tag}"),
                model_data_url=self._model_data_url,
                mode="SingleModel",
                environment=environment,
            ),
            # With vendored dependencies the container needs no network at all: isolate it. Installing
            # code/requirements.txt at start-up needs egress (the private subnets' NAT) instead.
            enable_network_isolation=vendored,
            vpc_config=model_vpc_config(self.foundation),
        )
        # SageMaker checks the role's permissions (S3 read, image pull, KMS) when it creates the model. The role
        # and its managed policy live in the foundation stack: this makes the whole foundation, policy included,
        # deploy first.
        model.node.add_dependency(self.foundation.endpoint_role)
        return model

    def _endpoint_config(self) -> sagemaker.CfnEndpointConfig:
        endpoint_settings = self.settings.graviton_endpoint
        capture = endpoint_settings.data_capture
        key_arn = self.foundation.key.key_arn
        data_capture = None
        if capture.enabled:
            data_capture = sagemaker.CfnEndpointConfig.DataCaptureConfigProperty(
                enable_capture=True,
                initial_sampling_percentage=capture.sampling_percentage,
                destination_s3_uri=self.foundation.artifacts_bucket.s3_url_for_object(
                    f"{DATA_CAPTURE_PREFIX}graviton-endpoint"
                ),
                kms_key_id=key_arn,
                capture_options=[
                    sagemaker.CfnEndpointConfig.CaptureOptionProperty(capture_mode=mode) for mode in ("Input", "Output")
                ],
                # Store JSON and text payloads as text (readable by Model Monitor), not base64.
                capture_content_type_header=sagemaker.CfnEndpointConfig.CaptureContentTypeHeaderProperty(
                    json_content_types=["application/json"], csv_content_types=["text/plain"]
                ),
            )
        # Instance types with local NVMe (c6gd, m6gd, r6gd) refuse a KMS key: their instance store is encrypted by
        # the hardware instead.
        local_nvme = has_local_nvme(endpoint_settings.instance_type)
        config = sagemaker.CfnEndpointConfig(
            self,
            "EndpointConfig",
            kms_key_id=None if local_nvme else key_arn,
            production_variants=[
                sagemaker.CfnEndpointConfig.ProductionVariantProperty(
                    variant_name=VARIANT_NAME,
                    model_name=self.model.attr_model_name,
                    instance_type=endpoint_settings.instance_type,
                    initial_instance_count=endpoint_settings.initial_instance_count,
                    initial_variant_weight=1.0,
                )
            ],
            data_capture_config=data_capture,
        )
        if local_nvme:
            acknowledge(
                config,
                f"{endpoint_settings.instance_type} has NVMe instance storage, which SageMaker encrypts with a "
                "hardware key; it refuses a KMS key on the endpoint config for such types.",
                "AwsSolutions-SM2",
                "NIST.800.53.R5-SageMakerEndpointConfigurationKMSKeyConfigured",
            )
        return config

    def _metric(self, namespace: str, name: str, statistic: str) -> cloudwatch.Metric:
        return variant_metric(self.endpoint_name, namespace, name, statistic, ALARM_PERIOD)

    def _alarms(self) -> tuple[sns.Topic, list[cloudwatch.Alarm]]:
        topic = alarm_topic(
            self, self.foundation, self.settings.alarm_email, f"Sentiment endpoint alarms ({self.settings.name})"
        )
        missing = cloudwatch.TreatMissingData.NOT_BREACHING
        alarms = [
            cloudwatch.Alarm(
                self,
                "Invocation5xxAlarm",
                alarm_description="The model container answers server errors (5xx)",
                metric=self._metric("AWS/SageMaker", "Invocation5XXErrors", "Sum"),
                threshold=FIVE_XX_PER_PERIOD,
                comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                evaluation_periods=1,
                treat_missing_data=missing,
            ),
            cloudwatch.Alarm(
                self,
                "ModelLatencyAlarm",
                alarm_description="p99 model latency above 1 s for 15 minutes: requests are queueing",
                metric=self._metric("AWS/SageMaker", "ModelLatency", "p99"),
                threshold=MODEL_LATENCY_P99_MICROSECONDS,
                comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
                evaluation_periods=3,
                treat_missing_data=missing,
            ),
            cloudwatch.Alarm(
                self,
                "CpuUtilizationAlarm",
                alarm_description=f"CPU above {CPU_UTILIZATION_PERCENT}% of all cores for 15 minutes",
                # SageMaker reports CPU as the sum over vCPUs (100 per vCPU).
                metric=self._metric("/aws/sagemaker/Endpoints", "CPUUtilization", "Average"),
                threshold=CPU_UTILIZATION_PERCENT * self._vcpus,
                comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
                evaluation_periods=3,
                treat_missing_data=missing,
            ),
        ]
        action = cloudwatch_actions.SnsAction(topic)
        for alarm in alarms:
            alarm.add_alarm_action(action)
            alarm.add_ok_action(action)
        return topic, alarms

    def grant_invoke(self, grantee: iam.IGrantable) -> iam.Grant:
        """Let ``grantee`` call InvokeEndpoint on this endpoint (and nothing else)."""
        return iam.Grant.add_to_principal(
            grantee=grantee, actions=["sagemaker:InvokeEndpoint"], resource_arns=[self.endpoint_arn]
        )
