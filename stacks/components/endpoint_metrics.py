"""The CloudWatch metrics of a SageMaker endpoint's production variant, by the names aws-sagemaker-alpha gives them."""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
from aws_cdk import aws_cloudwatch as cloudwatch

# The namespaces of a variant's metrics: invocation metrics, and the instance metrics the host agent publishes.
INVOCATION_METRICS = "AWS/SageMaker"
INSTANCE_METRICS = "/aws/sagemaker/Endpoints"


class VariantMetrics:
    """Metric helpers for a construct with an ``endpoint_name`` and one variant named ``variant_name``: the ones the
    stacks' alarms use (any other metric of the variant: ``metric(namespace, name)``)."""

    endpoint_name: str
    variant_name: str

    def metric(
        self,
        namespace: str,
        metric_name: str,
        *,
        statistic: str = "Average",
        period: cdk.Duration | None = None,
    ) -> cloudwatch.Metric:
        """A metric of this endpoint's variant (dimensions EndpointName and VariantName)."""
        return cloudwatch.Metric(
            namespace=namespace,
            metric_name=metric_name,
            dimensions_map={"EndpointName": self.endpoint_name, "VariantName": self.variant_name},
            statistic=statistic,
            period=period or cdk.Duration.minutes(5),
        )

    def metric_invocation5xx_errors(self, **props: Any) -> cloudwatch.Metric:
        return self.metric(INVOCATION_METRICS, "Invocation5XXErrors", **{"statistic": "Sum", **props})

    def metric_model_latency(self, **props: Any) -> cloudwatch.Metric:
        """Microseconds the model container took to answer."""
        return self.metric(INVOCATION_METRICS, "ModelLatency", **props)

    def metric_cpu_utilization(self, **props: Any) -> cloudwatch.Metric:
        """Percent summed over vCPUs (100 per vCPU)."""
        return self.metric(INSTANCE_METRICS, "CPUUtilization", **props)

    def metric_mem_utilization(self, **props: Any) -> cloudwatch.Metric:
        return self.metric(INSTANCE_METRICS, "MemoryUtilization", **props)

    # Multi-model endpoints only (SageMaker publishes them per variant for MMEs).
    def metric_model_loading_wait_time(self, **props: Any) -> cloudwatch.Metric:
        return self.metric(INVOCATION_METRICS, "ModelLoadingWaitTime", **props)

    def metric_model_cache_hit(self, **props: Any) -> cloudwatch.Metric:
        return self.metric(INVOCATION_METRICS, "ModelCacheHit", **props)
