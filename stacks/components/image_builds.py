"""Container images the platform builds itself, and how an environment's stack reads one by digest.

``ImageBuilds`` (in the tooling account, beside the promotion pipeline) gives each ``ImageDefinition`` a private ECR
repository (scan on push, KMS, immutable tags, a lifecycle rule, no access outside the named accounts), a CodeBuild
project on a native build environment for the image's architecture (CodeBuild's ARM image for arm64: no emulation),
and a role that may push only to that repository. The project builds from the pipeline's source artifact (the
repository at the commit being promoted), so neither ``cdk synth`` nor the tests need Docker: ``steps()`` gives the
pipeline one action per image, each exporting the pushed image's digest URI as the CodePipeline variable
``#{<variables_namespace>.IMAGE_URI}``. The pipeline writes that URI into each environment's SSM parameter
``image_parameter_name()`` (stacks/image_names.py) as it promotes the stage, and ``rebuild_weekly()`` starts the
pipeline every week, so a rebuild on freshly patched base images is promoted exactly like a commit (dev, staging,
approval, prod).

``BuiltImage`` is the other end: in an environment's stack it reads that parameter (resolved at deploy time) and
grants the pull across accounts, on the repository of the registry the settings name (``ImageRegistry``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, cast

import aws_cdk as cdk
import jsii
from aws_cdk import aws_codebuild as codebuild
from aws_cdk import aws_codepipeline as codepipeline
from aws_cdk import aws_codepipeline_actions as cpactions
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import aws_ssm as ssm
from aws_cdk import pipelines
from constructs import Construct

from stacks.compliance import acknowledge
from stacks.image_names import image_parameter_name, image_repository_name

# The CodePipeline output variable each image build exports (buildspec env.exported-variables).
IMAGE_URI_VARIABLE = "IMAGE_URI"
# What an image parameter may hold: an ECR image by digest, never a tag (SSM enforces it: AllowedPattern).
IMAGE_BY_DIGEST = r"^[0-9]{12}\.dkr\.ecr\.[a-z0-9-]+\.amazonaws\.com(\.cn)?/[a-z0-9._/-]+@sha256:[0-9a-f]{64}$"
# Pulling an image: the three actions of the ECR repository-policy example "Allow another account"
# (https://docs.aws.amazon.com/AmazonECR/latest/userguide/repository-policy-examples.html).
PULL_ACTIONS = ("ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer")
# Weekly: the base images' publishers patch continuously (AL2023 releases, DLC patch releases), so a week is the
# longest a fixed CVE waits before the rebuild promotes it. Monday morning UTC, so a failure meets a working day.
WEEKLY = events.Schedule.cron(week_day="MON", hour="5", minute="0")
_NAME = re.compile(r"^[a-z][a-z0-9-]{0,29}$")


class Architecture(StrEnum):
    ARM64 = "arm64"
    X86_64 = "x86_64"


# CodeBuild's own Amazon Linux 2023 images (Docker and the AWS CLI preinstalled; Docker runs in privileged mode):
# "aws/codebuild/amazonlinux-aarch64-standard:3.0" on ARM_CONTAINER and "aws/codebuild/amazonlinux-x86_64-standard:5.0"
# on LINUX_CONTAINER (https://docs.aws.amazon.com/codebuild/latest/userguide/ec2-compute-images.html; aws-cdk-lib
# 2.275 also names aarch64 4.0 and x86_64 6.0, not yet checked against that page). Compute
# BUILD_GENERAL1_LARGE: up to 16 GiB and 8 vCPUs on either environment type (API ProjectEnvironment.computeType,
# https://docs.aws.amazon.com/codebuild/latest/APIReference/API_ProjectEnvironment.html), room for the GPU
# training DLC (tens of GB unpacked) and for compiling nothing: every dependency comes as a wheel.
BUILD_IMAGES: dict[Architecture, codebuild.IBuildImage] = {
    Architecture.ARM64: codebuild.LinuxArmBuildImage.AMAZON_LINUX_2023_STANDARD_3_0,
    Architecture.X86_64: codebuild.LinuxBuildImage.AMAZON_LINUX_2023_5,
}


@dataclass(frozen=True)
class BaseRegistry:
    """A private ECR repository the image's base comes from (e.g. AWS's Deep Learning Containers account): the build
    logs in to its registry and its role may pull from exactly that repository. Public ECR needs neither."""

    account: str
    repository: str


@dataclass(frozen=True)
class ImageDefinition:
    """One image: ``name`` names its repository (``<project>/<name>``) and parameter; ``context`` and ``dockerfile``
    are paths relative to the repository root (the pipeline's source); ``build_args`` are passed as --build-arg."""

    name: str
    context: str
    dockerfile: str
    architecture: Architecture
    build_args: Mapping[str, str] = field(default_factory=dict)
    base_registries: Sequence[BaseRegistry] = ()
    compute_type: codebuild.ComputeType = codebuild.ComputeType.LARGE


def variables_namespace(image: str) -> str:
    """The CodePipeline variables namespace of ``image``'s build action."""
    return f"Image-{image}"


def image_uri_variable(image: str) -> str:
    """The pipeline variable holding the digest URI that ``image``'s build pushed in the current execution."""
    return f"#{{{variables_namespace(image)}.{IMAGE_URI_VARIABLE}}}"


class ImageBuild(Construct):
    """One image's repository, build role and CodeBuild project (see ImageBuilds)."""

    # Long: one image's repository (with its pull policy), build role and native CodeBuild project, in dependency order,
    # the reason for each setting inline.
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        project: str,
        definition: ImageDefinition,
        key: kms.IKey,
        log_group: logs.ILogGroup,
        pull_accounts: Sequence[str],
        expire_after_days: int,
        removal_policy: cdk.RemovalPolicy,
    ) -> None:
        super().__init__(scope, construct_id)
        stack = cdk.Stack.of(self)
        self.definition = definition
        self.name = definition.name
        repository_name = image_repository_name(project, definition.name)
        # The URI from the fixed name (the repository construct's own URI splits its ARN at deploy time).
        self.repository_uri = f"{stack.account}.dkr.ecr.{stack.region}.{stack.url_suffix}/{repository_name}"
        self.repository = ecr.Repository(
            self,
            "Repository",
            repository_name=repository_name,
            image_scan_on_push=True,
            image_tag_mutability=ecr.TagMutability.IMMUTABLE,
            encryption=ecr.RepositoryEncryption.KMS,
            encryption_key=key,
            # Every build pushes a new tag; environments pin digests. An image a year old has missed fifty weekly
            # patch rounds: no environment should still run it, and its layers stop costing storage.
            lifecycle_rules=[
                ecr.LifecycleRule(
                    description=f"Expire images pushed more than {expire_after_days} days ago",
                    tag_status=ecr.TagStatus.ANY,
                    max_image_age=cdk.Duration.days(expire_after_days),
                )
            ],
            removal_policy=removal_policy,
        )
        self._restrict_repository(stack, pull_accounts)
        self.role = iam.Role(
            self,
            "BuildRole",
            assumed_by=iam.ServicePrincipal("codebuild.amazonaws.com"),
            description=f"Builds the {definition.name} image and pushes it to its own repository only",
        )
        self.repository.grant_pull_push(self.role)
        for base in definition.base_registries:
            self.role.add_to_principal_policy(
                iam.PolicyStatement(
                    sid="PullTheBaseImage",
                    actions=list(PULL_ACTIONS),
                    resources=[
                        stack.format_arn(
                            service="ecr", account=base.account, resource="repository", resource_name=base.repository
                        )
                    ],
                )
            )
        self.project = codebuild.PipelineProject(
            self,
            "Project",
            description=f"Builds the {definition.name} image ({definition.architecture}) and pushes it by digest",
            role=self.role,
            environment=codebuild.BuildEnvironment(
                build_image=BUILD_IMAGES[definition.architecture],
                compute_type=definition.compute_type,
                privileged=True,  # docker build needs the Docker daemon
            ),
            encryption_key=key,
            logging=codebuild.LoggingOptions(cloud_watch=codebuild.CloudWatchLoggingOptions(log_group=log_group)),
            timeout=cdk.Duration.hours(1),
            build_spec=codebuild.BuildSpec.from_object(self._buildspec(stack)),
        )
        cfn_project = cast(cdk.CfnResource, self.project.node.default_child)
        acknowledge(
            cfn_project,
            "docker build runs the Docker daemon, which needs privileged mode; the project builds only the "
            "repository's own Dockerfile from the pipeline's source and pushes only to its own repository.",
            "AwsSolutions-CB3",
        )
        cfn_project.add_metadata(
            "checkov",
            {"skip": [{"id": "CKV_AWS_316", "comment": "docker build needs privileged mode (Docker daemon)."}]},
        )

    def _restrict_repository(self, stack: cdk.Stack, pull_accounts: Sequence[str]) -> None:
        """Pulls for the environment accounts; nothing for any other principal outside this account (an explicit
        deny, so a later Allow cannot make the repository public). AWS services acting on their own (image scanning)
        are not AWS-account principals and stay unaffected."""
        accounts = sorted({account for account in pull_accounts if account != stack.account})
        if accounts:
            self.repository.add_to_resource_policy(
                iam.PolicyStatement(
                    sid="EnvironmentAccountsPull",
                    principals=[iam.AccountPrincipal(account) for account in accounts],
                    actions=list(PULL_ACTIONS),
                )
            )
        cast(cdk.CfnResource, self.repository.node.default_child).add_metadata(
            "checkov",
            {
                "skip": [
                    {
                        "id": "CKV_AWS_32",
                        "comment": "The policy's only '*' principal is in a Deny (every ECR action for principals "
                        "outside the platform's accounts); its only Allow names the environment accounts.",
                    }
                ]
            },
        )
        self.repository.add_to_resource_policy(
            iam.PolicyStatement(
                sid="DenyOutsideThePlatformAccounts",
                effect=iam.Effect.DENY,
                principals=[iam.AnyPrincipal()],
                actions=["ecr:*"],
                conditions={
                    "StringNotEquals": {"aws:PrincipalAccount": [stack.account, *accounts]},
                    "Bool": {"aws:PrincipalIsAWSService": "false"},
                },
            )
        )

    def _buildspec(self, stack: cdk.Stack) -> dict[str, Any]:
        definition = self.definition
        registry = f"{stack.account}.dkr.ecr.{stack.region}.{stack.url_suffix}"
        logins = [registry] + [
            f"{base.account}.dkr.ecr.{stack.region}.{stack.url_suffix}" for base in definition.base_registries
        ]
        build_args = " ".join(f'--build-arg "{name}={value}"' for name, value in definition.build_args.items())
        return {
            "version": "0.2",
            "env": {"exported-variables": [IMAGE_URI_VARIABLE]},
            "phases": {
                "pre_build": {
                    # One ECR token serves every registry the role may read or write.
                    "commands": [
                        f'aws ecr get-login-password --region "$AWS_REGION" | docker login --username AWS '
                        f"--password-stdin {host}"
                        for host in dict.fromkeys(logins)
                    ]
                    + [
                        'REVISION="${CODEBUILD_RESOLVED_SOURCE_VERSION:-unknown}"',
                        # Unique per build (tags are immutable): the build number, then the commit.
                        'TAG="build-${CODEBUILD_BUILD_NUMBER}-${REVISION:0:12}"',
                    ]
                },
                "build": {
                    "commands": [
                        # --pull: the base image as its publisher patches it today, not a cached copy.
                        f"docker build --pull --file {definition.dockerfile} {build_args} "
                        '--label "org.opencontainers.image.revision=$REVISION" '
                        f'--tag "{self.repository_uri}:$TAG" {definition.context}',
                        f'docker push "{self.repository_uri}:$TAG"',
                        # The digest the registry computed for what was pushed: what every environment will run.
                        f"IMAGE_URI=\"$(docker inspect --format '{{{{index .RepoDigests 0}}}}' "
                        f'"{self.repository_uri}:$TAG")"',
                        'echo "pushed $IMAGE_URI"',
                    ]
                },
            },
        }

    def step(self, source: pipelines.IFileSetProducer) -> pipelines.Step:
        """The pipeline action that runs this build on ``source`` (the pipeline's source: the repository)."""
        return _ImageBuildStep(self, source)


@jsii.implements(pipelines.ICodePipelineActionFactory)
class _ImageBuildStep(pipelines.Step):
    """A CDK Pipelines step that runs an ImageBuild's own project (a CodeBuildStep would generate a second project
    with CDK's default role), in the variables namespace the promotion steps read."""

    def __init__(self, build: ImageBuild, source: pipelines.IFileSetProducer) -> None:
        super().__init__(variables_namespace(build.name))
        self._build = build
        self._source = source
        if source.primary_output is None:
            raise ValueError(f"{build.node.path}: the image build's source step has no output")
        self._add_dependency_file_set(source.primary_output)

    def produce_action(
        self,
        stage: codepipeline.IStage,
        *,
        action_name: str,
        artifacts: pipelines.ArtifactMap,
        run_order: int | float,
        **_: Any,
    ) -> pipelines.CodePipelineActionFactoryResult:
        primary = cast(pipelines.FileSet, self._source.primary_output)
        stage.add_action(
            cpactions.CodeBuildAction(
                action_name=action_name,
                run_order=run_order,
                project=self._build.project,
                input=artifacts.to_code_pipeline(primary),
                variables_namespace=variables_namespace(self._build.name),
            )
        )
        return pipelines.CodePipelineActionFactoryResult(run_orders_consumed=1, project=self._build.project)


class ImageBuilds(Construct):
    """The platform's own images: repository, role and native CodeBuild project per ``ImageDefinition``.

    ``source_root`` is the repository root the definitions' paths are relative to (checked at synth: a missing
    Dockerfile stops synth with one sentence). ``key`` encrypts the repositories, the projects' artifacts and, unless
    ``log_group`` is given, the build logs. ``pull_accounts`` may pull every image (the environments' accounts)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        project: str,
        images: Sequence[ImageDefinition],
        source_root: Path,
        key: kms.IKey,
        log_group: logs.ILogGroup | None = None,
        pull_accounts: Sequence[str] = (),
        expire_after_days: int = 365,
        removal_policy: cdk.RemovalPolicy = cdk.RemovalPolicy.RETAIN,
    ) -> None:
        _check(images, source_root)
        super().__init__(scope, construct_id)
        self.project = project
        self.log_group = log_group or logs.LogGroup(
            self, "BuildLogs", encryption_key=key, retention=logs.RetentionDays.ONE_YEAR, removal_policy=removal_policy
        )
        # ECR's enhanced scanning (Amazon Inspector) for the project's repositories: the operating system's packages
        # and the programming-language packages (the image's Python wheels), rescanned as new findings are published;
        # basic scanning covers OS packages only. A registry-wide setting of this account and region, one rule for
        # this project's repositories; the promotion's gate reads the findings (inference_assets/image/scan_gate.py).
        self.scanning = ecr.CfnRegistryScanningConfiguration(
            self,
            "EnhancedScanning",
            scan_type="ENHANCED",
            rules=[
                ecr.CfnRegistryScanningConfiguration.ScanningRuleProperty(
                    scan_frequency="CONTINUOUS_SCAN",
                    repository_filters=[
                        ecr.CfnRegistryScanningConfiguration.RepositoryFilterProperty(
                            filter=f"{project}/*", filter_type="WILDCARD"
                        )
                    ],
                )
            ],
        )
        self.builds = {
            definition.name: ImageBuild(
                self,
                definition.name,
                project=project,
                definition=definition,
                key=key,
                log_group=self.log_group,
                pull_accounts=pull_accounts,
                expire_after_days=expire_after_days,
                removal_policy=removal_policy,
            )
            for definition in images
        }

    def steps(self, source: pipelines.IFileSetProducer) -> list[pipelines.Step]:
        """One pipeline action per image, building ``source`` (the pipeline's source) once per execution."""
        return [build.step(source) for build in self.builds.values()]

    def scan_findings_statement(self) -> iam.PolicyStatement:
        """Reading the scan findings of exactly these images' repositories (the promotion's gate)."""
        return iam.PolicyStatement(
            actions=["ecr:DescribeImageScanFindings"],
            resources=[build.repository.repository_arn for build in self.builds.values()],
        )

    def promotion_env(self) -> dict[str, str]:
        """Environment variables carrying each image's digest URI from this execution's builds to a later step:
        ``IMAGE_<NAME>`` (upper case, ``-`` as ``_``)."""
        return {environment_variable(name): image_uri_variable(name) for name in self.builds}

    def rebuild_weekly(self, pipeline: codepipeline.IPipeline, schedule: events.Schedule = WEEKLY) -> events.Rule:
        """Start ``pipeline`` (whose first wave runs ``steps()``) on ``schedule``: every image is rebuilt on its
        patched base and promoted through the stages like a commit. Building outside the pipeline would push a
        digest that no stage promotes."""
        return events.Rule(
            self,
            "WeeklyRebuild",
            description="Rebuild the platform's images on patched bases and promote them through the pipeline",
            schedule=schedule,
            targets=[targets.CodePipeline(pipeline)],
        )


def environment_variable(image: str) -> str:
    return f"IMAGE_{image.upper().replace('-', '_')}"


def publish_commands(project: str, images: Sequence[str], region: str) -> list[str]:
    """Shell commands that write each image's digest URI (from ``environment_variable(image)``) into the current
    account's parameter; SSM refuses a value that is not an image by digest."""
    return [
        f"aws ssm put-parameter --region {region} --name {image_parameter_name(project, image)} --type String "
        f"--overwrite --allowed-pattern '{IMAGE_BY_DIGEST}' --value \"${environment_variable(image)}\""
        for image in images
    ]


def _check(images: Sequence[ImageDefinition], source_root: Path) -> None:
    names = [image.name for image in images]
    for image in images:
        if not _NAME.match(image.name):
            raise ValueError(f"image {image.name!r}: the name must be 1-30 lower-case letters, digits or '-'.")
        if names.count(image.name) > 1:
            raise ValueError(f"image {image.name!r}: defined twice; each image needs its own name.")
        if not (source_root / image.dockerfile).is_file():
            raise ValueError(f"image {image.name}: no Dockerfile at {image.dockerfile} in {source_root}.")
        if not (source_root / image.context).is_dir():
            raise ValueError(f"image {image.name}: no build context folder {image.context} in {source_root}.")


@dataclass(frozen=True)
class ImageRegistry:
    """Where the platform's built images live: the account and region of their ECR repositories (the promotion
    pipeline's tooling account and region; without a pipeline, the environment's own)."""

    account: str
    region: str


class BuiltImage(Construct):
    """An image the platform's pipeline built, as an environment's stack uses it: ``image_uri`` is the digest URI
    the pipeline promoted to this environment (an SSM parameter resolved when the stack deploys), ``grant_pull``
    lets a role pull it from the repository of ``registry``.

    The pull is granted on the repository the settings name, never on one the parameter's value names: whoever may
    write the parameter (a deployed role) could otherwise point the puller at a repository of their choosing in any
    account, and the grant would follow. A digest URI of another registry then fails the pull instead.

    Across accounts both sides must allow the pull: the repository's policy names the environment's account
    (``ImageBuilds(pull_accounts=...)``) and the pulling role's own policy allows the pull actions plus
    ``ecr:GetAuthorizationToken`` (https://docs.aws.amazon.com/AmazonECR/latest/userguide/repository-policies.html:
    "If a user or role is allowed to perform an action through a repository policy but is denied permission through
    an IAM policy (or vice versa) then the action will be denied"). SageMaker and EC2 pull with the role they run as
    (the model's execution role, the instance profile's role), so that is the role to grant. The repository's KMS
    key needs no grant for the puller: ECR decrypts through the grant it holds on the key
    (https://docs.aws.amazon.com/AmazonECR/latest/userguide/encryption-at-rest.html)."""

    def __init__(
        self, scope: Construct, construct_id: str, *, project: str, image: str, registry: ImageRegistry
    ) -> None:
        super().__init__(scope, construct_id)
        stack = cdk.Stack.of(self)
        self.image = image
        self.registry = registry
        self.parameter_name = image_parameter_name(project, image)
        self.image_uri = ssm.StringParameter.value_for_string_parameter(self, self.parameter_name)
        name = image_repository_name(project, image)
        self.repository_arn = stack.format_arn(
            service="ecr", account=registry.account, region=registry.region, resource="repository", resource_name=name
        )
        self.repository = ecr.Repository.from_repository_attributes(
            self, "Repository", repository_name=name, repository_arn=self.repository_arn
        )

    def grant_pull(self, grantee: iam.IGrantable) -> iam.Grant:
        return self.repository.grant_pull(grantee)

    def pull_statement(self) -> iam.PolicyStatement:
        """The pull of this image's repository, for a policy of the puller's (``ecr:GetAuthorizationToken`` has no
        resource-level permissions and stays with the puller's role)."""
        return iam.PolicyStatement(sid="PullModelImage", actions=list(PULL_ACTIONS), resources=[self.repository_arn])


def built_images(stack: cdk.Stack) -> list[BuiltImage]:
    """The built images ``stack`` reads (the pipeline deploys such a stack only after it published their digests)."""
    return [node for node in stack.node.find_all() if isinstance(node, BuiltImage)]
