"""The real-time sentiment endpoint on Graviton: one ``SageMakerEndpoint`` serving the model version that
``graviton_endpoint.model_data_key`` names, on the platform's own serving image.

The image is Ray Serve on Amazon Linux 2023 (inference_assets/image/Dockerfile), built natively on arm64 by the
promotion pipeline, rebuilt weekly on the patched base, and promoted like the code: the stack reads the digest the
pipeline published to this environment's SSM parameter ``/<project>/images/graviton-serving`` when it deploys, and
grants the endpoint's execution role the pull of the repository in the registry the settings name (the pipeline's
tooling account and region; without a pipeline, the environment's own), never of one the parameter names. The
archive holds Ray Serve's ``config.yaml`` + ``deployment.py`` and the ``sentiment_serving`` package
(``pytorch-platform package``); the image holds every dependency, so the model runs network-isolated.

A new model version is a settings change: upload the archive (``pytorch-platform package --upload``), set
``graviton_endpoint.model_data_key`` and deploy. CloudFormation then replaces the model and the endpoint config
(generated names, both immutable) and updates the endpoint in place; ``retain_all_variant_properties`` keeps the
instance count that autoscaling chose instead of resetting it to ``initial_instance_count``.
"""

from __future__ import annotations

from typing import cast

import aws_cdk as cdk
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sagemaker as sagemaker
from constructs import Construct

from inference_assets.tools.endpoint_environment import endpoint_environment
from stacks.components.image_builds import BuiltImage, ImageRegistry
from stacks.components.model_archive_check import ModelArchiveCheck
from stacks.components.sagemaker_endpoint import (
    AlarmSpec,
    Autoscaling,
    PlatformImage,
    Rollout,
    SageMakerEndpoint,
    endpoint_name_for,
    roll_out,
)
from stacks.environment_stack import EnvironmentStack
from stacks.foundation import DATA_CAPTURE_PREFIX, FoundationStack
from stacks.image_patching import SERVING_IMAGE
from stacks.settings import EnvironmentSettings

ALARM_PERIOD = cdk.Duration.minutes(5)
# Alarm thresholds: any sustained server error; a p99 far above a RoBERTa-base forward pass on c7g (tens of ms),
# which means requests queue; CPU near the top while autoscaling is already at its maximum.
FIVE_XX_PER_PERIOD = 5
MODEL_LATENCY_P99_MICROSECONDS = 1_000_000
CPU_UTILIZATION_PERCENT = 80
# The alarms an update rolls back on (SageMaker blue/green with auto-rollback, SageMakerEndpoint.roll_out).
ROLLBACK_ALARMS = ("Invocation5xxAlarm", "ModelLatencyAlarm")


def _window_seconds(alarm: cloudwatch.Alarm) -> int:
    """How long ``alarm`` needs to fire: its evaluation periods times its period."""
    resource = cast(cloudwatch.CfnAlarm, alarm.node.default_child)
    return int(resource.evaluation_periods) * int(resource.period or ALARM_PERIOD.to_seconds())  # type: ignore[arg-type]


def image_source(environment: str, parameter_name: str) -> str:
    """What synth says about the endpoint's image: where its digest comes from, and what to do before a first deploy."""
    return (
        f"{environment}/GravitonEndpoint runs the platform's {SERVING_IMAGE} image by the digest in the SSM parameter "
        f"{parameter_name} of its account and region, pulled from the registry of the pipeline's account and region "
        "(cdk.json pipeline; without one, the environment's own): the promotion pipeline builds the image and writes "
        "the parameter before it deploys the stack; before deploying it with cdk deploy, build and publish the image "
        "and write the parameter (docs/images.md, 'Deploying by hand')."
    )


class GravitonEndpointStack(EnvironmentStack):
    """One SageMaker real-time endpoint serving the sentiment model on Graviton, with the platform's Ray Serve image."""

    # Long: the endpoint construct's arguments, one per line, each from a setting or the foundation, then what the
    # stack adds around it (model check, alarms, rollout, outputs)
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: EnvironmentSettings,
        foundation: FoundationStack,
        image_registry: ImageRegistry | None = None,
        **kwargs,
    ) -> None:
        """``image_registry``: where the serving image's repository is (the pipeline's account and region); None: the
        environment's own account and region (images published by hand, docs/images.md)."""
        super().__init__(
            scope,
            construct_id,
            description=f"PyTorch platform Graviton endpoint ({settings.name}): model, endpoint, autoscaling, alarms",
            settings=settings,
            **kwargs,
        )
        self.foundation = foundation
        endpoint_settings = settings.graviton_endpoint
        if endpoint_settings.model_data_key is None:
            raise ValueError(
                f"environments.{settings.name}.graviton_endpoint.model_data_key: the endpoint stack needs a model "
                "version; PlatformStage leaves the stack out until one is named."
            )
        # The digest the pipeline promoted to this environment (resolved when the stack deploys).
        registry = image_registry or ImageRegistry(self.account, self.region)
        self.serving_image = BuiltImage(
            self, "ServingImage", project=settings.tags.project, image=SERVING_IMAGE, registry=registry
        )
        cdk.Annotations.of(self).add_info(image_source(settings.name, self.serving_image.parameter_name))
        # Construct id "Default": CDK leaves it out of logical ids, so Model, EndpointConfig, Endpoint, ... keep the
        # ids they had when this stack built them itself, and deployed endpoints are updated, not replaced.
        self.sagemaker_endpoint = SageMakerEndpoint(
            self,
            "Default",
            role=foundation.endpoint_role,
            image=PlatformImage(self.serving_image),
            model_data_url=foundation.artifacts_bucket.s3_url_for_object(endpoint_settings.model_data_key),
            mode="SingleModel",
            environment=self._container_environment(),
            # Every dependency is in the image and nothing is installed at start-up: the container needs no network.
            network=foundation.model_network(isolated=True),
            instance_type=endpoint_settings.instance_type,
            initial_instance_count=endpoint_settings.initial_instance_count,
            key=foundation.key,
            autoscaling=Autoscaling(**endpoint_settings.autoscaling.model_dump()),
            data_capture=self._data_capture(),
            # Data capture is not retained, so that changes to its setting take effect.
            exclude_retained=["DataCaptureConfig"],
            alarm_subscriptions=settings.alarm_endpoints,
            # A fixed name, so that the endpoint's log group can be created (with retention and key) before it.
            endpoint_name=endpoint_name_for(self),
            log_retention_days=settings.logs.retention_days,
            retention_setting="logs.retention_days",
            removal_policy=self.removal_policy,
            alarm_topic_display_name=f"Sentiment endpoint alarms ({settings.name})",
            startup_timeout_seconds=endpoint_settings.container_startup_timeout_seconds,
            # Several small instances serve more per vCPU than one large one (docs/serving.md, "Several smaller
            # instances"); each request to the one with the fewest in flight, so a busy instance gets no random share.
            routing="LEAST_OUTSTANDING_REQUESTS",
        )
        endpoint = self.sagemaker_endpoint
        self.model_check = self._model_archive_check(endpoint_settings.model_data_key)
        self.model, self.endpoint_config, self.endpoint = endpoint.model, endpoint.endpoint_config, endpoint.endpoint
        self.endpoint_name, self.endpoint_arn = endpoint.endpoint_name, endpoint.endpoint_arn
        self.scalable_target, self.alarm_topic = endpoint.scalable_target, endpoint.alarm_topic
        self.alarms = self._alarms(endpoint_settings.vcpus)
        self._roll_out()
        self._outputs(endpoint_settings.model_data_key)

    def _model_archive_check(self, model_data_key: str) -> ModelArchiveCheck:
        """A missing archive fails the deploy in seconds, before the model exists (not after minutes of
        CreateEndpoint)."""
        settings, foundation = self.settings, self.foundation
        check = ModelArchiveCheck(
            self,
            "ModelArchiveCheck",
            bucket=foundation.artifacts_bucket,
            object_key=model_data_key,
            setting=f"environments.{settings.name}.graviton_endpoint.model_data_key",
            key=foundation.key,
            log_retention_days=settings.logs.retention_days,
            retention_setting="logs.retention_days",
            removal_policy=self.removal_policy,
        )
        check.guard(self.sagemaker_endpoint.model)
        return check

    def _container_environment(self) -> dict[str, str]:
        """The model server's environment: workers, batching, request limits and the Graviton fast paths."""
        endpoint_settings = self.settings.graviton_endpoint
        return endpoint_environment(
            vcpus=endpoint_settings.vcpus,
            workers=endpoint_settings.workers_per_model,
            batch_size=endpoint_settings.server_batch_size,
            max_batch_delay_ms=endpoint_settings.server_max_batch_delay_ms,
            limits=endpoint_settings.limits,
            fast_math=endpoint_settings.fast_math,
            lru_cache_capacity=endpoint_settings.lru_cache_capacity,
            transparent_huge_pages=endpoint_settings.transparent_huge_pages,
            precision=endpoint_settings.precision,
            torch_compile=endpoint_settings.torch_compile,
        )

    def _roll_out(self) -> None:
        """A new model, image or instance type reaches traffic blue/green, and rolls back by itself when the new fleet
        answers server errors or queues while the old one still stands; the bake covers the longest alarm window.
        Not CPU: a busy new fleet is load, not a bad release."""
        rollback = [alarm for alarm in self.alarms if alarm.node.id in ROLLBACK_ALARMS]
        roll_out(self.sagemaker_endpoint, Rollout(ROLLBACK_ALARMS, bake_seconds=max(map(_window_seconds, rollback))))

    def _alarms(self, vcpus: int) -> list[cloudwatch.Alarm]:
        """Server errors, queueing (p99 model latency) and CPU saturation."""
        endpoint = self.sagemaker_endpoint
        above = cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD
        return endpoint.add_alarms(
            [
                AlarmSpec(
                    "Invocation5xxAlarm",
                    "The model container answers server errors (5xx)",
                    endpoint.metric_invocation5xx_errors(period=ALARM_PERIOD),
                    FIVE_XX_PER_PERIOD,
                    cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                    periods=1,
                ),
                AlarmSpec(
                    "ModelLatencyAlarm",
                    "p99 model latency above 1 s for 15 minutes: requests are queueing",
                    endpoint.metric_model_latency(statistic="p99", period=ALARM_PERIOD),
                    MODEL_LATENCY_P99_MICROSECONDS,
                    above,
                    periods=3,
                ),
                AlarmSpec(
                    "CpuUtilizationAlarm",
                    f"CPU above {CPU_UTILIZATION_PERCENT}% of all cores for 15 minutes",
                    # SageMaker reports CPU as the sum over vCPUs (100 per vCPU).
                    endpoint.metric_cpu_utilization(period=ALARM_PERIOD),
                    CPU_UTILIZATION_PERCENT * vcpus,
                    above,
                    periods=3,
                ),
            ]
        )

    def _outputs(self, model_data_key: str) -> None:
        # The promotion pipeline's smoke test reads this output (stage.graviton_endpoint.endpoint_name_output).
        self.endpoint_name_output = cdk.CfnOutput(
            self, "EndpointName", value=self.endpoint_name, description="Name for invoke_endpoint"
        )
        cdk.CfnOutput(self, "EndpointArn", value=self.endpoint_arn, description="ARN for IAM policies")
        cdk.CfnOutput(self, "ModelDataKey", value=model_data_key, description="Archive being served")
        cdk.CfnOutput(self, "AlarmTopicArn", value=self.alarm_topic.topic_arn, description="Endpoint alarms")

    def _data_capture(self) -> sagemaker.CfnEndpointConfig.DataCaptureConfigProperty | None:
        capture = self.settings.graviton_endpoint.data_capture
        if not capture.enabled:
            return None
        return sagemaker.CfnEndpointConfig.DataCaptureConfigProperty(
            enable_capture=True,
            initial_sampling_percentage=capture.sampling_percentage,
            destination_s3_uri=self.foundation.artifacts_bucket.s3_url_for_object(
                f"{DATA_CAPTURE_PREFIX}graviton-endpoint"
            ),
            kms_key_id=self.foundation.key.key_arn,
            capture_options=[
                sagemaker.CfnEndpointConfig.CaptureOptionProperty(capture_mode=mode) for mode in ("Input", "Output")
            ],
            # Store JSON and text payloads as text (readable by Model Monitor), not base64.
            capture_content_type_header=sagemaker.CfnEndpointConfig.CaptureContentTypeHeaderProperty(
                json_content_types=["application/json"], csv_content_types=["text/plain"]
            ),
        )

    def grant_invoke(self, grantee: iam.IGrantable) -> iam.Grant:
        """Let ``grantee`` call InvokeEndpoint on this endpoint (and nothing else)."""
        return self.sagemaker_endpoint.grant_invoke(grantee)
