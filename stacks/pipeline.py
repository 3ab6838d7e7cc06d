"""The promotion pipeline stack (tooling account) and the stack it deploys into each environment for its checks.

The pipeline itself (source, synth, self-mutation, stages, model check, smoke test, approval) is the
PromotionPipeline construct (stacks/components/promotion_pipeline.py); this module composes it with the platform's
stages.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date
from typing import Any, cast

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

from stacks.components.promotion_pipeline import (
    EXPECTED_LABELS,
    KEEP_LOGICAL_IDS,
    SYNTH_COMMANDS,
    ModelEndpoint,
    PromotionPipeline,
    PromotionStage,
    cdk_cli_version,
    smoke_test_role_name,
    smoke_tested,
)
from stacks.platform_stage import PlatformStage
from stacks.settings import EnvironmentSettings, PipelineSettings

# The pipeline's commands and versions live with the construct; named here too for the stack's readers and tests.
__all__ = ["EXPECTED_LABELS", "SYNTH_COMMANDS", "PromotionPipelineStack", "SmokeTestAccessStack", "cdk_cli_version"]


class SmokeTestAccessStack(cdk.Stack):
    """In the environment's account: the role the pipeline's steps assume there (CodeBuild runs in the tooling
    account; without this role it could not reach a cross-account endpoint or bucket), and nothing more:
    look up the one model archive the endpoint will serve (pre-deploy model check) and, given ``endpoint_name``,
    describe and invoke that endpoint (smoke test)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: EnvironmentSettings,
        tooling_account: str,
        model_bucket: s3.IBucket,
        model_key: str,
        endpoint_name: str | None = None,
    ) -> None:
        super().__init__(
            scope,
            construct_id,
            description=f"Lets the promotion pipeline check the model of, and smoke-test, the {settings.name} endpoint",
        )
        self.role = iam.Role(
            self,
            "SmokeTestRole",
            role_name=smoke_test_role_name(settings),
            assumed_by=iam.AccountPrincipal(tooling_account),
            description="Assumed by the promotion pipeline's model-check and smoke-test steps (tooling account)",
            max_session_duration=cdk.Duration.hours(1),
        )
        # HeadObject needs s3:GetObject; without s3:ListBucket S3 answers a missing key with 403 instead of 404.
        folder = model_key.rsplit("/", 1)[0] + "/"
        model_check = iam.ManagedPolicy(
            self,
            "ModelCheckPolicy",
            description="Look up the model archive the endpoint will serve",
            statements=[
                iam.PolicyStatement(
                    sid="LookUpTheModelArchive",
                    actions=["s3:GetObject"],
                    resources=[model_bucket.arn_for_objects(model_key)],
                ),
                iam.PolicyStatement(
                    sid="ListTheModelFolder",
                    actions=["s3:ListBucket"],
                    resources=[model_bucket.bucket_arn],
                    conditions={"StringEquals": {"s3:prefix": folder}},
                ),
            ],
        )
        model_check.attach_to_role(self.role)
        if endpoint_name is None:
            return
        # Endpoint names are fixed (the stack name), so the role names its endpoint; SageMaker lower-cases names in
        # endpoint ARNs.
        policy = iam.ManagedPolicy(
            self,
            "SmokeTestPolicy",
            description="Describe and invoke the endpoint",
            statements=[
                iam.PolicyStatement(
                    sid="DescribeAndInvokeTheEndpoint",
                    actions=["sagemaker:DescribeEndpoint", "sagemaker:InvokeEndpoint"],
                    resources=[
                        f"arn:{self.partition}:sagemaker:{self.region}:{self.account}:endpoint/{endpoint_name.lower()}"
                    ],
                )
            ],
        )
        policy.attach_to_role(self.role)


class PromotionPipelineStack(cdk.Stack):
    """The promotion pipeline in the tooling account, with one PlatformStage per environment, in promotion order."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: PipelineSettings,
        environments: Sequence[EnvironmentSettings],
        stage_class: type[PlatformStage] = PlatformStage,
        today: date | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            scope,
            construct_id,
            env=cdk.Environment(account=settings.account, region=settings.region),
            description="Promotion pipeline of the PyTorch platform: dev -> staging -> prod",
            **kwargs,
        )
        self.settings = settings
        self.stage_class = stage_class
        self.today = today  # the date the stages check their images' patch windows against (None: the clock's)
        self.promotion = PromotionPipeline(
            self, KEEP_LOGICAL_IDS, settings=settings, environments=environments, stage_factory=self._stage
        )
        self.key = self.promotion.key
        self.artifact_bucket = self.promotion.artifact_bucket
        self.build_logs = self.promotion.build_logs
        self.synth_step = self.promotion.synth_step
        self.pipeline = self.promotion.pipeline
        self.stages = self.promotion.stages

    def _stage(self, scope: Construct, environment: EnvironmentSettings) -> PromotionStage:
        """The environment's PlatformStage; once it serves a named model version, also the role the pipeline's model
        check and smoke test assume there."""
        stage = self.stage_class(scope, environment, construct_id=environment.name, today=self.today)
        endpoint = getattr(stage, "graviton_endpoint", None)
        if endpoint is None:
            return PromotionStage(stage)
        model_key = environment.graviton_endpoint.model_data_key
        if model_key is None:  # PlatformStage builds the endpoint only once a model version is named
            raise RuntimeError(f"{stage.node.path}: a Graviton endpoint without graviton_endpoint.model_data_key")
        foundation = stage.foundation
        access = SmokeTestAccessStack(
            stage,
            "SmokeTestAccess",
            settings=environment,
            tooling_account=self.account,
            model_bucket=foundation.artifacts_bucket,
            model_key=model_key,
            endpoint_name=endpoint.sagemaker_endpoint.fixed_name if smoke_tested(environment) else None,
        )
        # The endpoint stack's steps (the model check included) run after the stacks it depends on: Foundation
        # (the bucket) and this role.
        endpoint.add_dependency(access)
        return PromotionStage(
            stage,
            ModelEndpoint(
                stack=endpoint,
                model_key=model_key,
                bucket_name=cast(cdk.CfnOutput, foundation.node.find_child("ArtifactsBucketName")),
                endpoint_name=endpoint.endpoint_name_output,
            ),
        )
