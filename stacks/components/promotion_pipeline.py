"""The promotion pipeline: CDK Pipelines in the tooling account deploys one cloud assembly dev -> staging -> prod.

One synth step builds and tests the app and writes ``cdk.out``; every stage deploys the templates of that same
assembly, so what reaches prod is byte for byte what was deployed and smoke-tested in staging. The pipeline updates
itself first (self-mutation) whenever the pipeline definition changes.

The platform's own images (stacks/components/image_builds.py) are built the same way: once per execution, in the
``Images`` wave after self-mutation, each pushed by digest; before a stage's stacks read them, a step in that stage
writes the digests of this execution into the environment's SSM parameters, so prod runs the digest staging ran.
A weekly schedule starts the pipeline, so patched base images are promoted like a commit.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import aws_cdk as cdk
from aws_cdk import aws_codebuild as codebuild
from aws_cdk import aws_codepipeline as codepipeline
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import pipelines
from constructs import Construct

from stacks.compliance import acknowledge, acknowledge_control, acknowledge_wildcards, add_template_aspects
from stacks.components.iam_statements import cloudwatch_logs_may_use_key, deny_grants_except_for_aws_resources
from stacks.components.image_builds import ImageBuilds, ImageDefinition, built_images, publish_commands
from stacks.components.secure_buckets import KEEP_LOGICAL_IDS, SecureBuckets

# What the README tells a contributor to run; the pipeline runs exactly that (both create .venv themselves).
SYNTH_COMMANDS = ("make test", "make synth")
EXPECTED_LABELS = "negative,neutral,positive"
# cdk-assets publishes the stages' file and image assets; pinned like the CLI (npm dist-tag latest in December 2026).
CDK_ASSETS_VERSION = "4.7.3"
SMOKE_TEST_PROFILE = "smoke-test"
_REPO_ROOT = Path(__file__).resolve().parents[2]


def cdk_cli_version() -> str:
    """The CDK CLI pinned in package.json: the pipeline's self-mutation and deploy steps use the same CLI."""
    return json.loads((_REPO_ROOT / "package.json").read_text())["devDependencies"]["aws-cdk"]


@dataclass(frozen=True)
class PipelineSource:
    """Where the pipeline runs and what it builds from: ``repository`` (owner/name) at ``branch``, through the
    CodeConnections connection ``connection_arn``."""

    region: str
    repository: str
    branch: str
    connection_arn: str


@dataclass(frozen=True)
class PromotionTarget:
    """An environment the pipeline promotes to, in promotion order: its name, region, account (None: the
    deploying credentials' account) and project (the prefix of its role and image names)."""

    name: str
    region: str
    account: str | None
    project: str


def smoke_test_role_name(target: PromotionTarget) -> str:
    """The role, in the environment's account, that the model-check and smoke-test steps assume (by name: the
    pipeline stack cannot reference a resource of another account's stack)."""
    return f"{target.project}-{target.name}-pipeline-smoke-test"[:64]


def image_publishing_role_name(target: PromotionTarget) -> str:
    """The role, in the environment's account, that only the image-publishing step assumes: the one principal the
    platform deploys there that may write the image parameters."""
    return f"{target.project}-{target.name}-pipeline-image-publishing"[:64]


# The cross-account steps of each stage, by the id prefix of their CodeBuild step ("<step>-<environment>").
MODEL_CHECK, SMOKE_TEST, PUBLISH_IMAGES = "ModelCheck", "SmokeTest", "PublishImages"


def step_role_name(target: PromotionTarget, step: str) -> str:
    """The fixed name of the tooling-account role a cross-account ``step`` of ``target`` runs as, so the role it
    assumes in the environment's account can trust exactly that role (a generated name is unknown to another
    account's stack, and a name pattern admits every role named so)."""
    return f"{target.project}-{target.name}-pipeline-{step}"[:64]


def step_role_arn(target: PromotionTarget, step: str, *, tooling_account: str, partition: str) -> str:
    return f"arn:{partition}:iam::{tooling_account}:role/{step_role_name(target, step)}"


def smoke_tested(target: PromotionTarget) -> bool:
    """Every environment, prod included: prod runs a weekly image and a model staging smoke-tested, but on its own
    instances, settings and account; a few labelled requests right after its deploy say it serves (issue 38). The
    endpoint's own blue/green rollout rolls a bad release back on its alarms."""
    return True


@dataclass(frozen=True)
class ModelEndpoint:
    """What the pipeline checks in a stage that serves a model: ``stack`` deploys the endpoint, ``model_key`` is the
    archive it will serve in the bucket named by ``bucket_name``, ``endpoint_name`` is the endpoint's name output.
    The stage must also deploy, before ``stack``, the role named ``smoke_test_role_name()``: it may look up the
    archive and, where ``smoke_tested()``, describe and invoke the endpoint."""

    stack: cdk.Stack
    model_key: str
    bucket_name: cdk.CfnOutput
    endpoint_name: cdk.CfnOutput


@dataclass(frozen=True)
class PromotionStage:
    """An environment's stage, its model endpoint (None while the stage serves no named model version) and the stack
    that deploys the roles named ``smoke_test_role_name()`` and ``image_publishing_role_name()`` there (the latter
    needed whenever the pipeline builds images: it publishes their digests, after ``access`` deploys and before any
    stack that reads a ``BuiltImage``)."""

    stage: cdk.Stage
    endpoint: ModelEndpoint | None = None
    access: cdk.Stack | None = None


# Builds an environment's stage in the given scope, with the environment's name as its id.
StageFactory = Callable[[Construct, PromotionTarget], PromotionStage]


class PromotionPipeline(Construct):
    """Self-mutating CDK pipeline: source -> synth (tests + gates) -> one stage per environment, in promotion order.

    Prod waits for a manual approval; before a stage's endpoint stack deploys, a model check looks up its archive;
    after every stage but prod, a smoke test invokes the endpoint. ``images`` are built once per execution before
    the first stage and promoted with it (module docstring). Give it the id ``KEEP_LOGICAL_IDS``."""

    # Long: the pipeline's parts in the order CodePipeline runs them (key, buckets, build logs, source, synth, images,
    # one stage per target), each created once and handed to the next.
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        source: PipelineSource,
        targets: Sequence[PromotionTarget],
        stage_factory: StageFactory,
        images: Sequence[ImageDefinition] = (),
    ) -> None:
        """``targets`` share ``source.region`` (cross-region stages need replication buckets in the tooling account)
        and, when the pipeline builds ``images``, one project (one set of repositories serves every stage)."""
        if regions := {target.region for target in targets} - {source.region}:
            raise ValueError(f"the pipeline deploys within {source.region}, not {sorted(regions)}")
        projects = {target.project for target in targets}
        if images and len(projects) != 1:
            raise ValueError(f"the pipeline builds one set of images for one project, not {sorted(projects)}")
        super().__init__(scope, construct_id)
        stack = cdk.Stack.of(self)
        self.key = self._artifacts_key()
        buckets = SecureBuckets(
            self,
            KEEP_LOGICAL_IDS,
            key=self.key,
            removal_policy=cdk.RemovalPolicy.RETAIN,
            access_logs_id="ArtifactAccessLogs",
            access_log_expiration_days=365,
            noncurrent_version_days=30,
            abort_incomplete_upload_days=1,
            no_replication_reason="Pipeline artifacts are rebuilt from the repository on every run; replicating "
            "them adds cost, not recoverability.",
            control_tower=True,
            no_object_lock_reason="No S3 Object Lock (CT.S3.PR.9): artifacts are rebuilt from the repository on "
            "every run and lifecycle rules expire noncurrent versions and logs; a WORM lock would block that.",
        )
        self.artifact_bucket = buckets.add_data_bucket("Artifacts")
        self.build_logs = logs.LogGroup(
            # A year: Control Tower's CT.CLOUDWATCH.PR.2 (build logs are small; three months failed the control).
            self,
            "BuildLogs",
            encryption_key=self.key,
            retention=logs.RetentionDays.ONE_YEAR,
        )
        self.source = pipelines.CodePipelineSource.connection(
            source.repository, source.branch, connection_arn=source.connection_arn
        )
        self.synth_step = self._synth_step()
        self.pipeline = self._code_pipeline()
        self.images: ImageBuilds | None = None
        if images:
            self.images = ImageBuilds(
                self,
                "Images",
                project=projects.pop(),
                images=images,
                source_root=_REPO_ROOT,
                key=self.key,
                log_group=self.build_logs,
                pull_accounts=[target.account for target in targets if target.account],
            )
            self.pipeline.add_wave("Images", pre=self.images.steps(self.source))
            for build in self.images.builds.values():
                acknowledge_control(
                    build.project,
                    "docker build runs the Docker daemon, which needs privileged mode (CT.CODEBUILD.PR.4); the "
                    "project builds only the repository's own Dockerfile and pushes only to its own repository.",
                    "codebuild_project_environment_privileged_check",
                )
        self._named_step_roles: list[tuple[pipelines.CodeBuildStep, str]] = []
        self.stages = [self._add_stage(stack, target, stage_factory) for target in targets]
        self.pipeline.build_pipeline()
        _name_step_roles(self._named_step_roles)
        _asset_builds_start_no_builds(self.pipeline)
        if self.images is not None:
            self.images.rebuild_weekly(self.pipeline.pipeline)
        self._acknowledge_generated()
        self._lint_clean_pipeline()

    def _add_stage(self, stack: cdk.Stack, target: PromotionTarget, stage_factory: StageFactory) -> cdk.Stage:
        # In the stack, beside this construct, not under it: a stage's construct path names its cloud assembly
        # (assembly-<stack>-<env>), which should not change when the pipeline's code is reorganized.
        promotion = stage_factory(stack, target)
        add_template_aspects(promotion.stage)
        pre = [self._approval(target)] if target.name == "prod" else []
        stack_steps, post = self._endpoint_steps(target, promotion.endpoint)
        stack_steps += self._image_steps(target, promotion)
        self.pipeline.add_stage(promotion.stage, pre=pre, post=post, stack_steps=stack_steps)
        return promotion.stage

    def _artifacts_key(self) -> kms.Key:
        """The key of the artifacts, build logs and cross-account deployments; CloudWatch Logs may use it for the
        build log groups of this account and region only."""
        key = kms.Key(
            self,
            "ArtifactsKey",
            description="Encrypts the promotion pipeline's artifacts, build logs and cross-account deployments",
            enable_key_rotation=True,
        )
        key.add_to_resource_policy(cloudwatch_logs_may_use_key(self, "AllowCodeBuildLogGroups"))
        # The pipeline's roles and the environments' deploy roles encrypt and decrypt; none creates a grant.
        key.add_to_resource_policy(deny_grants_except_for_aws_resources())
        return key

    def _synth_step(self) -> pipelines.CodeBuildStep:
        return pipelines.CodeBuildStep(
            "Synth", input=self.source, commands=list(SYNTH_COMMANDS), primary_output_directory="cdk.out"
        )

    def _code_pipeline(self) -> pipelines.CodePipeline:
        return pipelines.CodePipeline(
            self,
            "Pipeline",
            synth=self.synth_step,
            self_mutation=True,
            # Chosen, not defaulted (synth warned): V1 bills per active pipeline per month, V2 per action-minute, and
            # this pipeline's many CodeBuild steps on every commit and weekly rebuild would be minutes; nothing here
            # needs V2's triggers or variables.
            pipeline_type=codepipeline.PipelineType.V1,
            # Deployments into other accounts read the artifacts: the bucket needs a customer-managed key.
            cross_account_keys=True,
            artifact_bucket=self.artifact_bucket,
            cli_version=cdk_cli_version(),
            cdk_assets_cli_version=CDK_ASSETS_VERSION,
            code_build_defaults=pipelines.CodeBuildOptions(
                build_environment=codebuild.BuildEnvironment(
                    build_image=codebuild.LinuxBuildImage.STANDARD_7_0, compute_type=codebuild.ComputeType.MEDIUM
                ),
                partial_build_spec=codebuild.BuildSpec.from_object(
                    {"phases": {"install": {"runtime-versions": {"python": "3.11"}}}}
                ),
                logging=codebuild.LoggingOptions(
                    cloud_watch=codebuild.CloudWatchLoggingOptions(log_group=self.build_logs)
                ),
            ),
        )

    def _approval(self, environment: PromotionTarget) -> pipelines.ManualApprovalStep:
        return pipelines.ManualApprovalStep(
            "PromoteToProd",
            comment=f"Deploy to {environment.name} the templates that were deployed and smoke-tested in staging.",
        )

    def _endpoint_steps(
        self, environment: PromotionTarget, endpoint: ModelEndpoint | None
    ) -> tuple[list[pipelines.StackSteps], list[pipelines.Step]]:
        """Before the endpoint stack deploys: the model check (never deploy an endpoint whose archive is absent);
        after the stage: the smoke test, except in prod. Nothing while a stage has no model endpoint (no model
        version named yet); the multi-model endpoint starts without models and needs no check."""
        if endpoint is None:
            return [], []
        check = self._cross_account_step(
            MODEL_CHECK,
            environment,
            smoke_test_role_name(environment),
            env_from_cfn_outputs={"ARTIFACTS_BUCKET": endpoint.bucket_name},
            command="python -m inference_assets.tools.model_check "
            f'--bucket "$ARTIFACTS_BUCKET" --key {endpoint.model_key} --region {environment.region}',
        )
        post: list[pipelines.Step] = []
        if smoke_tested(environment):
            post.append(
                self._cross_account_step(
                    SMOKE_TEST,
                    environment,
                    smoke_test_role_name(environment),
                    env_from_cfn_outputs={"ENDPOINT_NAME": endpoint.endpoint_name},
                    command="python -m inference_assets.tools.endpoint_client smoke-test "
                    f'--endpoint-name "$ENDPOINT_NAME" --region {environment.region} --expect-labels {EXPECTED_LABELS}',
                )
            )
        return [pipelines.StackSteps(stack=endpoint.stack, pre=[check])], post

    def _image_steps(self, environment: PromotionTarget, promotion: PromotionStage) -> list[pipelines.StackSteps]:
        """Right after the stage's access stack deploys its roles: write this execution's image digests into the
        environment's parameters; every stack of the stage that reads a BuiltImage deploys after that."""
        if self.images is None:
            return []
        access = promotion.access
        if access is None:
            raise ValueError(
                f"{promotion.stage.node.path}: the pipeline builds images, so the stage must deploy the role named "
                "image_publishing_role_name() in a stack given as PromotionStage.access"
            )
        for stack in promotion.stage.node.children:
            if isinstance(stack, cdk.Stack) and stack is not access and built_images(stack):
                stack.add_stack_dependency(access, "reads the image digests the pipeline publishes after this stack")
        gate = scan_gate_step(self.images, environment, self.source)
        publish = self._cross_account_step(
            PUBLISH_IMAGES,
            environment,
            image_publishing_role_name(environment),
            env=self.images.promotion_env(),
            env_from_cfn_outputs={},
            command=publish_commands(self.images.project, list(self.images.builds), environment.region),
        )
        return [pipelines.StackSteps(stack=access, pre=[gate], post=[publish])]

    def _cross_account_step(
        self,
        step: str,
        environment: PromotionTarget,
        target_role_name: str,
        *,
        env_from_cfn_outputs: dict[str, cdk.CfnOutput],
        command: str | Sequence[str],
        env: dict[str, str] | None = None,
    ) -> pipelines.CodeBuildStep:
        """A CodeBuild step ``<step>-<environment>`` that runs ``command`` (or each of several) as the environment
        account's role ``target_role_name``, from a role of its own named ``step_role_name()`` (which that role
        trusts, and nothing else of this account)."""
        stack = cdk.Stack.of(self)
        role_arn = f"arn:{stack.partition}:iam::{environment.account or stack.account}:role/{target_role_name}"
        commands = [command] if isinstance(command, str) else list(command)
        built = pipelines.CodeBuildStep(
            f"{step}-{environment.name}",
            input=self.source,
            env={"SMOKE_TEST_ROLE_ARN": role_arn, **(env or {})},
            env_from_cfn_outputs=env_from_cfn_outputs,
            role_policy_statements=[iam.PolicyStatement(actions=["sts:AssumeRole"], resources=[role_arn])],
            install_commands=["pip install \"$(grep -E '^boto3==' requirements-dev.txt)\""],
            commands=[
                f'aws configure set profile.{SMOKE_TEST_PROFILE}.role_arn "$SMOKE_TEST_ROLE_ARN"',
                f"aws configure set profile.{SMOKE_TEST_PROFILE}.credential_source EcsContainer",
                *(f"AWS_PROFILE={SMOKE_TEST_PROFILE} {line}" for line in commands),
            ],
        )
        self._named_step_roles.append((built, step_role_name(environment, step)))
        return built

    def _acknowledge_generated(self) -> None:
        """CDK Pipelines generates the roles of its actions and CodeBuild projects, each with one inline policy.
        Acknowledge each wildcard statement with the reason that applies to its kind; an unknown kind stops synth,
        so a new wildcard from a CDK upgrade gets reviewed instead of slipping through."""
        stack = cdk.Stack.of(self)
        inline = {
            "CDK Pipelines generates one role per action or CodeBuild project, its grants in one inline policy.": (
                self.pipeline
            ),
            "An image build's role: CDK writes its grants (own repository, the pipeline action's artifact bucket and "
            "key, build logs) into the role's one inline policy.": self.images,
        }
        for reason, scope in inline.items():
            for policy in scope.node.find_all() if scope is not None else []:
                if policy.node.id == "DefaultPolicy" and isinstance(policy, iam.Policy):
                    self._acknowledge_generated_policy(stack, policy, reason)

    def _acknowledge_generated_policy(self, stack: cdk.Stack, policy: iam.Policy, inline_reason: str) -> None:
        acknowledge(policy, inline_reason, "NIST.800.53.R5-IAMNoInlinePolicy")
        document = stack.resolve(policy.document.to_json())
        reasoned: list[tuple[iam.PolicyStatement, str]] = []
        for statement in document["Statement"]:
            if "*" not in json.dumps(statement):
                continue
            reason = _generated_wildcard_reason(statement)
            if reason is None:
                raise ValueError(f"{policy.node.path}: unreviewed wildcard statement {json.dumps(statement)}")
            if statement["Resource"] == "*" and "codebuild:StartBuild" in _as_list(statement["Action"]):
                # checkov reads its exceptions from the template metadata of the resource they excuse.
                policy.node.default_child.add_metadata(
                    "checkov", {"skip": [{"id": "CKV_AWS_111", "comment": _ASSET_BUILDS_REASON}]}
                )
            # Rebuilt from the resolved JSON (intrinsics as tokens) so the finding ids match the synthesized policy.
            rebuilt = iam.PolicyStatement(
                actions=_as_list(statement["Action"]),
                resources=[cdk.Token.as_string(r) for r in _as_list(statement["Resource"])],
            )
            reasoned.append((rebuilt, reason))
        acknowledge_wildcards(policy, *reasoned)

    def _lint_clean_pipeline(self) -> None:
        """cfn-lint (1.58) reports the deploy actions' Fn::Join role ARNs as E3703 and the pipeline's DependsOn on its
        role, which its RoleArn already references, as W3005; write the same ARNs as Fn::Sub and drop the duplicate."""
        stack = cdk.Stack.of(self)
        cfn_pipeline = cast(codepipeline.CfnPipeline, self.pipeline.pipeline.node.default_child)
        for s, stage in enumerate(stack.resolve(cfn_pipeline.stages)):
            for a, action in enumerate(stage["actions"]):
                for key, value in action.get("configuration", {}).items():
                    as_sub = _join_as_sub(value) if key == "RoleArn" and "Fn::Join" in value else None
                    if as_sub:
                        cfn_pipeline.add_property_override(f"Stages.{s}.Actions.{a}.Configuration.RoleArn", as_sub)
        # CDK Pipelines makes the pipeline depend on its role construct (role and policy); keep only the policy.
        role_policy = cast(
            cdk.CfnElement, self.pipeline.pipeline.role.node.find_child("DefaultPolicy").node.default_child
        )
        cfn_pipeline.add_override("DependsOn", [stack.get_logical_id(role_policy)])


def _asset_builds_start_no_builds(pipeline: pipelines.CodePipeline) -> None:
    """CDK Pipelines' asset-publishing roles (AssetSingletonRole, aws-cdk-lib pipelines/lib/private/
    asset-singleton-role.ts) carry codebuild:StartBuild, StopBuild and BatchGetBuilds on ``*`` from a time the
    role also ran the pipeline's actions; here the pipeline's CodeBuild actions run as their own action role,
    and the asset builds (cdk-assets publish) start nothing. With the grant, code in an asset build could start
    any project of the account with its own buildspec (StartBuild's buildspecOverride), the self-mutation
    project's role included. An explicit Deny on every way to start a build closes it whatever the Allow says."""
    assets = pipeline.node.try_find_child("Assets")
    for role in assets.node.children if assets is not None else []:
        if isinstance(role, iam.Role):
            role.add_to_principal_policy(
                iam.PolicyStatement(
                    sid="AssetBuildsStartNoBuilds",
                    effect=iam.Effect.DENY,
                    actions=list(BUILD_STARTS),
                    resources=["*"],
                )
            )


def _name_step_roles(named: Sequence[tuple[pipelines.CodeBuildStep, str]]) -> None:
    """Give each cross-account step's role (generated with its project when the pipeline is built) its fixed
    name, keeping its logical id: CloudFormation replaces the role, which a name change needs."""
    for step, name in named:
        role = cast(iam.Role, step.project.role)
        cast(iam.CfnRole, role.node.default_child).role_name = name


def _join_as_sub(value: dict[str, Any]) -> dict[str, str] | None:
    """An Fn::Join of strings and Refs as the equivalent Fn::Sub (None for anything else)."""
    delimiter, parts = value["Fn::Join"]
    if not all(isinstance(part, str) or set(part) == {"Ref"} for part in parts):
        return None
    return {"Fn::Sub": delimiter.join(part if isinstance(part, str) else "${" + part["Ref"] + "}" for part in parts)}


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


_ASSET_BUILDS_REASON = (
    "CDK Pipelines' asset-publishing role (AssetSingletonRole) is generated with StartBuild, StopBuild and "
    "BatchGetBuilds on every project; the role's explicit Deny (AssetBuildsStartNoBuilds) refuses every start, so "
    "what is left is watching and stopping builds. Only CodeBuild can assume the role."
)
# Every CodeBuild action that runs a build (Service Authorization Reference, AWS CodeBuild): the asset builds may
# call none of them.
BUILD_STARTS = (
    "codebuild:StartBuild",
    "codebuild:StartBuildBatch",
    "codebuild:RetryBuild",
    "codebuild:RetryBuildBatch",
)
# Why each kind of wildcard statement that CDK Pipelines generates is needed (keyed by the services it names).
_GENERATED_WILDCARD_REASONS = {
    frozenset({"s3"}): "CDK's grant on the pipeline's own artifact bucket: every execution writes and reads artifacts "
    "under generated keys; s3:GetObject*/List*/DeleteObject* are the read/write grant's action groups.",
    frozenset({"kms"}): "CDK's grant on the pipeline's own artifact key; GenerateDataKey* and ReEncrypt* are the "
    "variants S3 uses to encrypt artifacts with it.",
    frozenset({"logs"}): "CodeBuild writes one log stream per build, named by the build id, in its project's log "
    "group.",
    frozenset({"codebuild"}): "CodeBuild creates test-report groups and reports per build under generated names; "
    + _ASSET_BUILDS_REASON,
    frozenset({"ecr"}): "ecr:GetAuthorizationToken has no resource-level permissions (Service Authorization "
    "Reference); an image build logs in to ECR with it, and may push only to its own repository.",
    frozenset({"sts"}): "Self-mutation assumes only CDK bootstrap roles (condition on the aws-cdk:bootstrap-role tag); "
    "their names end in the bootstrap qualifier, account and region.",
}
_BOOTSTRAP_LOOKUP_REASON = (
    "cdk deploy looks up the bootstrap stack (cloudformation:DescribeStacks) and its staging bucket (s3:ListBucket) "
    "by name before it knows their ARNs."
)


def _generated_wildcard_reason(statement: dict[str, Any]) -> str | None:
    services = frozenset(action.split(":")[0] for action in _as_list(statement["Action"]))
    if statement["Resource"] == "*" and services <= {"cloudformation", "s3"}:
        return _BOOTSTRAP_LOOKUP_REASON
    return _GENERATED_WILDCARD_REASONS.get(services)


def scan_gate_step(
    images: ImageBuilds, environment: PromotionTarget, source: pipelines.IFileSetProducer
) -> pipelines.CodeBuildStep:
    """Before a stage gets this execution's images: ECR's enhanced scan of each (OS and Python packages) has no
    CRITICAL or HIGH finding, or the promotion stops with one line per finding (inference_assets/image/scan_gate.py).
    In the tooling account, where the repositories are."""
    return pipelines.CodeBuildStep(
        f"ScanGate-{environment.name}",
        input=source,
        env=images.promotion_env(),
        role_policy_statements=[images.scan_findings_statement()],
        install_commands=["pip install \"$(grep -E '^boto3==' requirements-dev.txt)\""],
        commands=[
            "python -m inference_assets.image.scan_gate "
            + " ".join(f'--image-uri "${variable}"' for variable in images.promotion_env())
        ],
    )
