"""The multi-model endpoint of seed 002: many models behind one SageMaker endpoint, loaded from S3 on first use.

DJL Serving (default) scales each model's workers with its own queue; the PyTorch CPU inference DLC (TorchServe,
multi-model) is the alternative. Instances scale on invocations per instance; alarms watch model loading, the
model cache, server errors, CPU and memory. Publish models with ``inference_assets/publish_models.py`` under the
artifacts bucket's ``ModelsPrefix`` and invoke them with ``TargetModel=<name>``.
"""

from __future__ import annotations

from collections.abc import Sequence

import aws_cdk as cdk
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cloudwatch_actions
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sagemaker as sagemaker
from aws_cdk import aws_sns as sns
from constructs import Construct

from inference_assets.tools.endpoint_environment import instance_vcpus
from inference_assets.tools.model_names import validate_model_name
from stacks.compliance import acknowledge
from stacks.environment_stack import EnvironmentStack
from stacks.foundation import FoundationStack
from stacks.sagemaker_endpoint import (
    VARIANT_NAME,
    alarm_topic,
    dlc_image_uri,
    model_vpc_config,
    track_invocations,
    variant_metric,
)
from stacks.settings import EnvironmentSettings

# Alarm thresholds: sustained, not momentary, trouble (1-minute metrics).
MODEL_LOADING_WAIT_MICROSECONDS = 10_000_000  # requests queue > 10 s for a model to load: cache too small
MODEL_CACHE_HIT_RATIO = 0.5  # fewer than half the requests find their model loaded: instances thrash
CPU_UTILIZATION_SHARE = 0.8  # of all vCPUs (SageMaker reports CPUUtilization as 100% per vCPU)
MEMORY_UTILIZATION_PERCENT = 85.0
# Many models share the cores: one intra-op thread per worker. DJL then allows a busy model up to #vCPU workers
# (its maxWorkers default is #CPU / OMP_NUM_THREADS); TorchServe starts one worker per loaded model.
CONTAINER_ENVIRONMENT = {
    "djl": {"OMP_NUM_THREADS": "1"},
    "torchserve": {
        "SAGEMAKER_MULTI_MODEL": "true",
        "SAGEMAKER_MODEL_SERVER_WORKERS": "1",
        "OMP_NUM_THREADS": "1",
        "SENTIMENT_MAX_REQUEST_BATCH": "32",  # code/inference.py (DJL reads option.max_request_batch instead)
    },
}


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
            f"{settings.multi_model_endpoint.model_server} on {settings.multi_model_endpoint.instance_type}",
            settings=settings,
            **kwargs,
        )
        self.foundation = foundation
        mme = settings.multi_model_endpoint
        self.models_s3_uri = f"s3://{foundation.artifacts_bucket.bucket_name}/{mme.models_prefix}"

        self.model = self._model()
        self.endpoint_config = self._endpoint_config()
        self.endpoint = sagemaker.CfnEndpoint(
            self,
            "Endpoint",
            endpoint_config_name=self.endpoint_config.attr_endpoint_config_name,
            # A new endpoint config keeps the instance count autoscaling chose (type and weights come from the config).
            retain_all_variant_properties=True,
            exclude_retained_variant_properties=[
                sagemaker.CfnEndpoint.VariantPropertyProperty(variant_property_type="DesiredWeight"),
                sagemaker.CfnEndpoint.VariantPropertyProperty(variant_property_type="DataCaptureConfig"),
            ],
        )
        self.endpoint_name = self.endpoint.attr_endpoint_name
        # Target tracking on invocations per instance per minute, all models together.
        self.scalable_target = track_invocations(self, self.endpoint_name, mme.autoscaling)
        self.alarm_topic, self.alarms = self._alarms()
        self.invoke_policy = iam.ManagedPolicy(
            self,
            "InvokePolicy",
            description="Attach to clients of the multi-model endpoint: invoke it"
            + (" for the listed models only" if mme.invoke_allowed_models else ""),
            statements=[self.invoke_statement(mme.invoke_allowed_models or None)],
        )
        self._outputs()

    # --- model, config, endpoint --------------------------------------------------------------------------------

    def _image_uri(self) -> str:
        mme = self.settings.multi_model_endpoint
        return dlc_image_uri(self, mme.djl_image if mme.model_server == "djl" else mme.torchserve_image)

    def _model(self) -> sagemaker.CfnModel:
        mme = self.settings.multi_model_endpoint
        model = sagemaker.CfnModel(
            self,
            "Model",
            execution_role_arn=self.foundation.endpoint_role.role_arn,
            primary_container=sagemaker.CfnModel.ContainerDefinitionProperty(
                image=self._image_uri(),
                mode="MultiModel",
                model_data_url=self.models_s3_uri,  # a prefix (ends in '/'): TargetModel is the key below it
                environment=CONTAINER_ENVIRONMENT[mme.model_server],
            ),
            # Archives are self-contained (dependencies vendored): the container needs no network of its own;
            # SageMaker still fetches the archives from S3 for it.
            enable_network_isolation=True,
            vpc_config=model_vpc_config(self.foundation),
        )
        # SageMaker checks the role's permissions when it creates the model: role and policy must exist first.
        model.node.add_dependency(self.foundation.endpoint_role)
        return model

    def _endpoint_config(self) -> sagemaker.CfnEndpointConfig:
        mme = self.settings.multi_model_endpoint
        config = sagemaker.CfnEndpointConfig(
            self,
            "EndpointConfig",
            production_variants=[
                sagemaker.CfnEndpointConfig.ProductionVariantProperty(
                    variant_name=VARIANT_NAME,
                    model_name=self.model.attr_model_name,
                    instance_type=mme.instance_type,
                    initial_instance_count=mme.initial_instance_count,
                    initial_variant_weight=1.0,
                )
            ],
            # Types with local NVMe (ml.c5d, ...) encrypt their instance storage themselves and refuse a key.
            kms_key_id=None if mme.has_local_nvme else self.foundation.key.key_arn,
        )
        if mme.has_local_nvme:
            acknowledge(
                config,
                f"{mme.instance_type} has local NVMe instance storage, which SageMaker encrypts with a hardware key; "
                "SageMaker rejects an endpoint-config KMS key for such types.",
                "NIST.800.53.R5-SageMakerEndpointConfigurationKMSKeyConfigured",
            )
        return config

    # --- scaling and alarms -------------------------------------------------------------------------------------

    def _metric(self, name: str, statistic: str, *, namespace: str = "AWS/SageMaker") -> cloudwatch.Metric:
        return variant_metric(self.endpoint_name, namespace, name, statistic, cdk.Duration.minutes(1))

    def _alarms(self) -> tuple[sns.Topic, list[cloudwatch.Alarm]]:
        topic = alarm_topic(self, self.foundation, self.settings.alarm_email)
        instance_metrics = "/aws/sagemaker/Endpoints"
        cpu_threshold = CPU_UTILIZATION_SHARE * 100 * instance_vcpus(self.settings.multi_model_endpoint.instance_type)
        above = cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD
        below = cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD
        definitions = [
            ("ModelLoadingWaitTime", "Average", "AWS/SageMaker", above, MODEL_LOADING_WAIT_MICROSECONDS,
             "requests wait more than 10 s for their model to load"),
            ("ModelCacheHit", "Average", "AWS/SageMaker", below, MODEL_CACHE_HIT_RATIO,
             "fewer than half the requests find their model loaded"),
            ("Invocation5XXErrors", "Sum", "AWS/SageMaker", above, 0, "the model server answers with 5xx errors"),
            ("CPUUtilization", "Average", instance_metrics, above, cpu_threshold,
             f"CPU above {CPU_UTILIZATION_SHARE:.0%} of all vCPUs"),
            ("MemoryUtilization", "Average", instance_metrics, above, MEMORY_UTILIZATION_PERCENT,
             f"memory above {MEMORY_UTILIZATION_PERCENT:.0f}%: models are evicted, loads slow down"),
        ]  # fmt: skip
        alarms = []
        for name, statistic, namespace, comparison, threshold, meaning in definitions:
            metric = self._metric(name, statistic, namespace=namespace)
            alarm = cloudwatch.Alarm(
                self,
                f"{name}Alarm",
                metric=metric,
                threshold=threshold,
                comparison_operator=comparison,
                evaluation_periods=5,
                datapoints_to_alarm=3,
                # No traffic means no model metrics: silence is not a fault.
                treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
                alarm_description=f"Multi-model endpoint ({self.settings.name}): {meaning} (3 of 5 minutes).",
            )
            alarm.add_alarm_action(cloudwatch_actions.SnsAction(topic))
            alarms.append(alarm)
        return topic, alarms

    # --- access -------------------------------------------------------------------------------------------------

    def invoke_statement(self, models: Sequence[str] | None = None) -> iam.PolicyStatement:
        """``sagemaker:InvokeEndpoint`` on this endpoint; with ``models``, only for those ``TargetModel`` names."""
        conditions = None
        if models is not None:
            if not models:
                raise ValueError("models must list at least one model name, or be None for every model")
            names = [validate_model_name(name) for name in models]
            # A request without TargetModel (or with another name) does not match and is denied.
            conditions = {"StringEquals": {"sagemaker:TargetModel": names}}
        return iam.PolicyStatement(
            actions=["sagemaker:InvokeEndpoint"], resources=[self.endpoint.attr_endpoint_arn], conditions=conditions
        )

    def grant_invoke(self, grantee: iam.IGrantable, models: Sequence[str] | None = None) -> iam.Grant:
        """Let ``grantee`` invoke the endpoint: every model, or only ``models`` (the ``sagemaker:TargetModel`` key)."""
        statement = self.invoke_statement(models)
        return iam.Grant.add_to_principal(
            grantee=grantee,
            actions=statement.actions,
            resource_arns=statement.resources,
            conditions=statement.conditions or None,
        )

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
