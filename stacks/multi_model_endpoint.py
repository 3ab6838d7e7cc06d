"""The multi-model endpoint: many models behind one SageMaker endpoint, loaded from S3 on first use.

DJL Serving (default) scales each model's workers with its own queue; the PyTorch CPU inference DLC (TorchServe,
multi-model) is the alternative. Instances scale on invocations per instance; alarms watch model loading, the
model cache, server errors, CPU and memory. Publish models with ``pytorch-platform publish`` under the
artifacts bucket's ``ModelsPrefix`` and invoke them with ``TargetModel=<name>``.
"""

from __future__ import annotations

from collections.abc import Sequence

import aws_cdk as cdk
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_iam as iam
from constructs import Construct

from mme_sizing.plan import METADATA_KEY, SizingInputs, hot_set_resident
from platform_facts.instances import instance_type
from stacks.components.sagemaker_endpoint import (
    AlarmSpec,
    Autoscaling,
    DlcImage,
    SageMakerEndpoint,
    endpoint_name_for,
)
from stacks.environment_stack import EnvironmentStack
from stacks.foundation import FoundationStack
from stacks.settings import EnvironmentSettings

# Alarm thresholds: sustained, not momentary, trouble (1-minute metrics, 3 of 5 minutes).
ALARM_PERIOD = cdk.Duration.minutes(1)
MODEL_LOADING_WAIT_MICROSECONDS = 10_000_000  # requests queue > 10 s for a model to load: cache too small
MODEL_CACHE_HIT_RATIO = 0.5  # fewer than half the requests find their model loaded: instances thrash
CPU_UTILIZATION_SHARE = 0.8  # of all vCPUs (SageMaker reports CPUUtilization as 100% per vCPU)
MEMORY_UTILIZATION_PERCENT = 85.0
# Many models share the cores: one intra-op thread per worker. DJL then allows a busy model up to #vCPU workers
# (its maxWorkers default is #CPU / OMP_NUM_THREADS). The request limits reach DJL through each model's
# serving.properties, written when the model is published.
CONTAINER_ENVIRONMENT = {"OMP_NUM_THREADS": "1"}


class MultiModelEndpointStack(EnvironmentStack):
    """A SageMaker multi-model endpoint over ``s3://<artifacts bucket>/<models prefix>`` with autoscaling and alarms."""

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
            description=f"PyTorch platform multi-model endpoint ({settings.name}): "
            f"DJL Serving on {settings.multi_model_endpoint.instance_type}",
            settings=settings,
            **kwargs,
        )
        self.foundation = foundation
        mme = settings.multi_model_endpoint
        self.models_s3_uri = f"s3://{foundation.artifacts_bucket.bucket_name}/{mme.models_prefix}"
        # Construct id "Default": CDK leaves it out of logical ids, so deployed resources keep theirs.
        self.sagemaker_endpoint = SageMakerEndpoint(
            self,
            "Default",
            role=foundation.endpoint_role,
            image=DlcImage.parse(mme.djl_image),
            model_data_url=self.models_s3_uri,  # a prefix (ends in '/'): TargetModel is the key below it
            mode="MultiModel",
            environment=CONTAINER_ENVIRONMENT,
            # Archives are self-contained (dependencies vendored): the container needs no network of its own;
            # SageMaker still fetches the archives from S3 for it.
            network=foundation.model_network(isolated=True),
            instance_type=mme.instance_type,
            initial_instance_count=mme.initial_instance_count,
            key=foundation.key,
            autoscaling=Autoscaling(**mme.autoscaling.model_dump()),
            # A new endpoint config keeps the instance count autoscaling chose (type and weights come from the config).
            exclude_retained=["DesiredWeight", "DataCaptureConfig"],
            alarm_subscriptions=settings.alarm_endpoints,
            # A fixed name, so that the endpoint's log group can be created (with retention and key) before it.
            endpoint_name=endpoint_name_for(self),
            log_retention_days=settings.logs.retention_days,
            retention_setting="logs.retention_days",
            removal_policy=self.removal_policy,
        )
        endpoint = self.sagemaker_endpoint
        self.model, self.endpoint_config, self.endpoint = endpoint.model, endpoint.endpoint_config, endpoint.endpoint
        self.endpoint_name, self.endpoint_arn = endpoint.endpoint_name, endpoint.endpoint_arn
        self.scalable_target, self.alarm_topic = endpoint.scalable_target, endpoint.alarm_topic
        self.alarms = endpoint.add_alarms(self._alarm_table())
        self._sizing()
        self.invoke_policy = self._invoke_policy(mme.invoke_allowed_models)
        self._outputs()

    def _invoke_policy(self, allowed_models: Sequence[str]) -> iam.ManagedPolicy:
        return iam.ManagedPolicy(
            self,
            "InvokePolicy",
            description="Attach to clients of the multi-model endpoint: invoke it"
            + (" for the listed models only" if allowed_models else ""),
            statements=[self.invoke_statement(allowed_models or None)],
        )

    def _alarm_table(self) -> list[AlarmSpec]:
        endpoint, name = self.sagemaker_endpoint, self.settings.name
        vcpus = instance_type(self.settings.multi_model_endpoint.instance_type).vcpus
        cpu_threshold = CPU_UTILIZATION_SHARE * 100 * vcpus
        above = cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD
        below = cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD
        period = {"period": ALARM_PERIOD}
        rows = [
            ("ModelLoadingWaitTimeAlarm", "requests wait more than 10 s for their model to load",
             endpoint.metric_model_loading_wait_time(**period), MODEL_LOADING_WAIT_MICROSECONDS, above),
            ("ModelCacheHitAlarm", "fewer than half the requests find their model loaded",
             endpoint.metric_model_cache_hit(**period), MODEL_CACHE_HIT_RATIO, below),
            ("Invocation5XXErrorsAlarm", "the model server answers with 5xx errors",
             endpoint.metric_invocation5xx_errors(**period), 0, above),
            ("CPUUtilizationAlarm", f"CPU above {CPU_UTILIZATION_SHARE:.0%} of all vCPUs",
             endpoint.metric_cpu_utilization(**period), cpu_threshold, above),
            ("MemoryUtilizationAlarm", f"memory above {MEMORY_UTILIZATION_PERCENT:.0f}%: models are evicted",
             endpoint.metric_mem_utilization(**period), MEMORY_UTILIZATION_PERCENT, above),
        ]  # fmt: skip
        return [
            AlarmSpec(
                alarm_id,
                f"Multi-model endpoint ({name}): {meaning} (3 of 5 minutes).",
                metric,
                threshold,
                comparison,
                periods=5,
                datapoints=3,
            )
            for alarm_id, meaning, metric, threshold, comparison in rows
        ]

    def _sizing(self) -> None:
        """Record what the endpoint is sized for (the ops review predicts it from the template alone) and warn at
        synth when its minimum capacity cannot keep the hot set loaded (`pytorch-platform mme-plan` tells more)."""
        inputs = SizingInputs.from_settings(self.settings.multi_model_endpoint)
        self.endpoint.add_metadata(METADATA_KEY, inputs.as_metadata())
        if warning := hot_set_resident(inputs):
            cdk.Annotations.of(self).add_warning_v2("pytorch-platform:mme-hot-set", f"{self.settings.name}: {warning}")

    # --- access -------------------------------------------------------------------------------------------------

    def invoke_statement(self, models: Sequence[str] | None = None) -> iam.PolicyStatement:
        """``sagemaker:InvokeEndpoint`` on this endpoint; with ``models``, only for those ``TargetModel`` names."""
        return self.sagemaker_endpoint.invoke_statement(models)

    def grant_invoke(self, grantee: iam.IGrantable, models: Sequence[str] | None = None) -> iam.Grant:
        """Let ``grantee`` invoke the endpoint: every model, or only ``models`` (the ``sagemaker:TargetModel`` key)."""
        return self.sagemaker_endpoint.grant_invoke(grantee, models)

    def _outputs(self) -> None:
        mme = self.settings.multi_model_endpoint
        values = {
            "EndpointName": (self.endpoint_name, "Multi-model endpoint: invoke with TargetModel=<model name>"),
            # The bucket and key are the foundation's outputs ArtifactsBucketName and PlatformKeyArn.
            "ModelsPrefix": (mme.models_prefix, "Prefix of the model archives in the artifacts bucket"),
            "InvokePolicyArn": (self.invoke_policy.managed_policy_arn, "Attach to the endpoint's clients"),
            "AlarmTopicArn": (self.alarm_topic.topic_arn, "Alarms of the endpoint"),
        }
        for name, (value, description) in values.items():
            cdk.CfnOutput(self, name, value=value, description=description)
