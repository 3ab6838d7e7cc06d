"""The promotion pipeline stack (tooling account) and the stack it deploys into each environment for its checks.

The pipeline itself (source, synth, self-mutation, image builds, stages, model check, smoke test, approval) is the
PromotionPipeline construct (stacks/components/promotion_pipeline.py); this module composes it with the platform's
stages and the platform's images (``platform_images``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date
from typing import Any, cast

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk import region_info
from constructs import Construct

from platform_facts.images import ImageFact, PatchStatus, training_images
from stacks.components.image_builds import Architecture, BaseRegistry, ImageDefinition, ImageRegistry
from stacks.components.model_archive_check.handler import DIGEST_SUFFIX
from stacks.components.promotion_pipeline import (
    EXPECTED_LABELS,
    KEEP_LOGICAL_IDS,
    MODEL_CHECK,
    PUBLISH_IMAGES,
    SMOKE_TEST,
    SYNTH_COMMANDS,
    ModelEndpoint,
    PipelineSource,
    PromotionPipeline,
    PromotionStage,
    PromotionTarget,
    cdk_cli_version,
    image_publishing_role_name,
    smoke_test_role_name,
    smoke_tested,
    step_role_arn,
)
from stacks.image_names import image_parameter_name
from stacks.image_patching import SERVING_IMAGE, CheckedImage, ImageUse, record_images
from stacks.platform_stage import PlatformStage
from stacks.settings import EnvironmentSettings, PipelineSettings, SettingsError
from stacks.training import TRAINING_IMAGE

# The pipeline's commands and versions live with the construct; named here too for the stack's readers and tests.
__all__ = [
    "EXPECTED_LABELS",
    "SERVING_IMAGE",
    "SYNTH_COMMANDS",
    "PromotionPipelineStack",
    "SmokeTestAccessStack",
    "cdk_cli_version",
]


def training_base(today: date) -> ImageFact:
    """The training image's base: the EC2 flavour of the PyTorch training DLC with the latest end of patching in
    platform_facts/images.json (the table is the one place a DLC is chosen, with its repository). Past its end, synth
    stops."""
    candidates = [fact for fact in training_images("ec2") if fact.end_of_patching]
    if not candidates:
        raise SettingsError("platform_facts/images.json: no training image of the EC2 flavour.")
    newest = max(candidates, key=lambda fact: cast(date, fact.end_of_patching))
    if newest.status(today) is PatchStatus.ENDED:
        raise SettingsError(
            f"platform_facts/images.json: the newest EC2 training image, {newest.image}, ended patching "
            f"on {newest.end_of_patching}, so the training image would get no security fixes; add its successor "
            f"({newest.replacement})."
        )
    return newest


def platform_images(scope: Construct, today: date) -> list[ImageDefinition]:
    """The images the pipeline builds: the training image every node pulls by digest (x86_64, on the training DLC)
    and the Graviton serving image (arm64, on Amazon Linux 2023). Paths are relative to the repository root."""
    stack = cdk.Stack.of(scope)
    dlc_account = stack.regional_fact(region_info.FactName.DLC_REPOSITORY_ACCOUNT)
    base = training_base(today)
    return [
        ImageDefinition(
            name=TRAINING_IMAGE,
            context="training_assets",
            dockerfile="training_assets/image/Dockerfile",
            architecture=Architecture.X86_64,
            build_args={
                "DLC_REGISTRY": f"{dlc_account}.dkr.ecr.{stack.region}.{stack.url_suffix}",
                "DLC_REPOSITORY": base.repository,
                "BASE_TAG": base.tag,
            },
            base_registries=[BaseRegistry(account=dlc_account, repository=base.repository)],
        ),
        ImageDefinition(
            name=SERVING_IMAGE,
            context="inference_assets",
            dockerfile="inference_assets/image/Dockerfile",
            architecture=Architecture.ARM64,
        ),
    ]


class SmokeTestAccessStack(cdk.Stack):
    """In the environment's account: the roles the pipeline's steps assume there (CodeBuild runs in the tooling
    account; without them it could not reach a cross-account endpoint or bucket), and nothing more. The
    image-publishing role writes the digests of the ``images`` the pipeline built into their parameters and is
    assumed only by the image-publishing step; the smoke-test role looks up the one model archive the endpoint will
    serve (pre-deploy model check, given ``model_bucket`` and ``model_key``) and, given ``endpoint_name``, describes
    and invokes that endpoint (smoke test), assumed only by those two steps. Each trusts exactly the ARNs of the step
    roles (fixed names, ``step_role_name()``), not a name pattern: a pattern admits any role named so (the pipeline's
    self-mutation and asset roles, or a role anyone creates with such a name)."""

    # Long: the two roles and their three optional grants (image digests, model lookup, smoke test), each with the
    # condition that scopes it.
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: EnvironmentSettings,
        tooling_account: str,
        model_bucket: s3.IBucket | None = None,
        model_key: str | None = None,
        model_encryption: kms.IKey | None = None,
        endpoint_name: str | None = None,
        images: Sequence[str] = (),
    ) -> None:
        super().__init__(
            scope,
            construct_id,
            description=f"Lets the promotion pipeline check the model of, and smoke-test, the {settings.name} endpoint",
        )
        target = promotion_target(settings)
        self.role = iam.Role(
            self,
            "SmokeTestRole",
            role_name=smoke_test_role_name(target),
            assumed_by=self._steps(tooling_account, target, MODEL_CHECK, SMOKE_TEST),
            description="Assumed by the promotion pipeline's model-check and smoke-test steps (tooling account)",
            max_session_duration=cdk.Duration.hours(1),
        )
        self.publishing_role: iam.Role | None = None
        if images:
            self.publishing_role = iam.Role(
                self,
                "ImagePublishingRole",
                role_name=image_publishing_role_name(target),
                assumed_by=self._steps(tooling_account, target, PUBLISH_IMAGES),
                description="Assumed by the promotion pipeline's image-publishing step (tooling account) only",
                max_session_duration=cdk.Duration.hours(1),
            )
            publish = iam.ManagedPolicy(
                self,
                "ImagePromotionPolicy",
                description="Write the digests of the images the pipeline promotes to this environment",
                statements=[
                    iam.PolicyStatement(
                        sid="WriteTheImageParameters",
                        actions=["ssm:PutParameter"],
                        resources=[
                            self.format_arn(
                                service="ssm",
                                resource="parameter",
                                resource_name=image_parameter_name(settings.tags.project, image).lstrip("/"),
                            )
                            for image in images
                        ],
                    )
                ],
            )
            publish.attach_to_role(self.publishing_role)
        if model_bucket is None or model_key is None or model_encryption is None:
            return
        # HeadObject needs s3:GetObject; without s3:ListBucket S3 answers a missing key with 403 instead of 404.
        folder = model_key.rsplit("/", 1)[0] + "/"
        model_check = iam.ManagedPolicy(
            self,
            "ModelCheckPolicy",
            description="Read the model archive the endpoint will serve and the digest recorded when it was written",
            statements=[
                iam.PolicyStatement(
                    sid="LookUpTheModelArchive",
                    actions=["s3:GetObject"],
                    resources=[
                        model_bucket.arn_for_objects(model_key),
                        model_bucket.arn_for_objects(model_key + DIGEST_SUFFIX),
                    ],
                ),
                # The archive and its digest are SSE-KMS objects: S3 decrypts them with the caller's kms:Decrypt.
                iam.PolicyStatement(
                    sid="DecryptThemThroughS3",
                    actions=["kms:Decrypt"],
                    resources=[model_encryption.key_arn],
                    conditions={"StringEquals": {"kms:ViaService": f"s3.{self.region}.amazonaws.com"}},
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

    def _steps(self, tooling_account: str, target: PromotionTarget, *steps: str) -> iam.IPrincipal:
        """The tooling account's roles of ``steps`` of ``target``, by exact ARN. aws:PrincipalArn is the role's ARN
        for an assumed-role session (IAM User Guide, "AWS global condition context keys"); with the account as the
        principal, the role need not exist when this trust policy is written (an ARN principal must)."""
        arns = [
            step_role_arn(target, step, tooling_account=tooling_account, partition=self.partition) for step in steps
        ]
        return iam.AccountPrincipal(tooling_account).with_conditions({"ArnEquals": {"aws:PrincipalArn": arns}})


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
        checked_on = today or date.today()
        images = platform_images(self, checked_on)
        self.image_names = [image.name for image in images]
        _check_regions(settings, environments)
        if images:
            _one_project(environments)
        self.environments: dict[str, EnvironmentSettings] = {e.name: e for e in environments}
        self.promotion = PromotionPipeline(
            self,
            KEEP_LOGICAL_IDS,
            source=PipelineSource(
                region=settings.region,
                repository=settings.repository,
                branch=settings.branch,
                connection_arn=settings.connection_arn,
            ),
            targets=[promotion_target(environment) for environment in environments],
            stage_factory=self._stage,
            images=images,
        )
        # The base the platform's training image extends, with its patch window, as the stages record theirs.
        base = training_base(checked_on)
        use = ImageUse(self.node.id, f"images.{TRAINING_IMAGE} (base)", base.image)
        record_images(self, [CheckedImage(use, base, None)], checked_on)
        self.key = self.promotion.key
        self.artifact_bucket = self.promotion.artifact_bucket
        self.build_logs = self.promotion.build_logs
        self.synth_step = self.promotion.synth_step
        self.pipeline = self.promotion.pipeline
        self.stages = self.promotion.stages

    def _stage(self, scope: Construct, target: PromotionTarget) -> PromotionStage:
        """The environment's PlatformStage and the role the pipeline's steps assume there (publishing the images'
        digests; once the stage serves a named model version, also its model check and smoke test)."""
        environment = self.environments[target.name]
        registry = ImageRegistry(self.account, self.region)  # the images' repositories are in this stack's account
        stage = self.stage_class(
            scope, environment, construct_id=environment.name, today=self.today, image_registry=registry
        )
        endpoint = getattr(stage, "graviton_endpoint", None)
        model_key = None if endpoint is None else environment.graviton_endpoint.model_data_key
        foundation = stage.foundation
        access = SmokeTestAccessStack(
            stage,
            "SmokeTestAccess",
            settings=environment,
            tooling_account=self.account,
            model_bucket=None if endpoint is None else foundation.artifacts_bucket,
            model_key=model_key,
            model_encryption=None if endpoint is None else foundation.key,
            endpoint_name=endpoint.sagemaker_endpoint.fixed_name if endpoint and smoke_tested(target) else None,
            images=self.image_names,
        )
        if endpoint is None:
            return PromotionStage(stage, access=access)
        if model_key is None:  # PlatformStage builds the endpoint only once a model version is named
            raise RuntimeError(f"{stage.node.path}: a Graviton endpoint without graviton_endpoint.model_data_key")
        # The endpoint stack's steps (the model check included) run after the stacks it depends on: Foundation
        # (the bucket) and this role.
        endpoint.add_stack_dependency(access)
        return PromotionStage(
            stage,
            access=access,
            endpoint=ModelEndpoint(
                stack=endpoint,
                model_key=model_key,
                bucket_name=cast(cdk.CfnOutput, foundation.node.find_child("ArtifactsBucketName")),
                endpoint_name=endpoint.endpoint_name_output,
            ),
        )


def promotion_target(environment: EnvironmentSettings) -> PromotionTarget:
    return PromotionTarget(
        name=environment.name, region=environment.region, account=environment.account, project=environment.tags.project
    )


def _one_project(environments: Sequence[EnvironmentSettings]) -> str:
    """The project name the image repositories and parameters carry: one for every environment the pipeline
    promotes through (each environment reads the repository the pipeline pushes to)."""
    projects = {environment.tags.project for environment in environments}
    if len(projects) != 1:
        names = ", ".join(f"{e.name}: {e.tags.project}" for e in environments)
        raise SettingsError(
            f"environments.*.tags.project: the promotion pipeline builds one set of images, so every environment "
            f"needs the same project name (now {names})."
        )
    return projects.pop()


def _check_regions(settings: PipelineSettings, environments: Sequence[EnvironmentSettings]) -> None:
    """The pipeline deploys within its own region: other regions need replication buckets (and their own
    compliance) in the tooling account."""
    for environment in environments:
        if environment.region != settings.region:
            raise SettingsError(
                f"environments.{environment.name}.region: the promotion pipeline deploys within its own region "
                f"({settings.region}); set pipeline.region to {environment.region} or deploy {environment.name} "
                "with cdk deploy."
            )
