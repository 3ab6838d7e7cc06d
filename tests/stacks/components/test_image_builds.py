"""ImageBuilds on a bare stack (repositories, build roles, native CodeBuild projects, the weekly rebuild), the
BuiltImage plumbing an environment's stack reads a digest with, and both wired into a PromotionPipeline: the
policies are evaluated with the project's own IAM evaluator (ops_review/iam_policy.py), not read by eye."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_codepipeline as codepipeline
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk.assertions import Template
from constructs import Construct

from ops_review.iam_policy import Request, is_allowed
from stacks.components.image_builds import (
    IMAGE_BY_DIGEST,
    PULL_ACTIONS,
    Architecture,
    BaseRegistry,
    BuiltImage,
    ImageBuilds,
    ImageDefinition,
    ImageRegistry,
    built_images,
    image_uri_variable,
    publish_commands,
)
from stacks.components.promotion_pipeline import (
    KEEP_LOGICAL_IDS,
    PromotionPipeline,
    PromotionStage,
    PromotionTarget,
)
from stacks.image_names import image_parameter_name, image_repository_name
from tests.stacks.components.promotion_targets import ACCOUNTS, SOURCE, targets

ROOT = Path(__file__).resolve().parents[3]
TOOLING, ENVIRONMENT, STRANGER, REGION = "999999999999", "111111111111", "444444444444", "us-west-2"
DLC = "763104351884"
PROJECT = "pytorch-platform"
PIPELINE_ARN = f"arn:aws:codepipeline:{REGION}:{TOOLING}:platform-pipeline"
IMAGES = [
    ImageDefinition(
        name="serving",
        context="inference_assets",
        dockerfile="inference_assets/image/Dockerfile",
        architecture=Architecture.ARM64,
    ),
    ImageDefinition(
        name="training",
        context="training_assets",
        dockerfile="training_assets/image/Dockerfile",
        architecture=Architecture.X86_64,
        build_args={"BASE_TAG": "2.10.0-gpu-py313-cu130-ubuntu22.04-ec2"},
        base_registries=[BaseRegistry(account=DLC, repository="pytorch-training")],
    ),
]


def _repository_arn(image: str, account: str = TOOLING) -> str:
    return f"arn:aws:ecr:{REGION}:{account}:repository/{image_repository_name(PROJECT, image)}"


def _resolve(value: Any, refs: dict[str, str]) -> Any:
    """The template's intrinsics as this test stack resolves them (partition aws; GetAtt Arn/Ref of the repos)."""
    if isinstance(value, list):
        return [_resolve(v, refs) for v in value]
    if not isinstance(value, dict):
        return value
    if set(value) == {"Ref"}:
        return refs[value["Ref"]]
    if set(value) == {"Fn::GetAtt"}:
        return refs[".".join(value["Fn::GetAtt"])]
    if set(value) == {"Fn::Join"}:
        separator, parts = value["Fn::Join"]
        return separator.join(str(_resolve(p, refs)) for p in parts)
    if set(value) == {"Fn::Split"}:
        separator, text = value["Fn::Split"]
        return str(_resolve(text, refs)).split(separator)
    if set(value) == {"Fn::Select"}:
        index, items = value["Fn::Select"]
        return _resolve(items, refs)[int(index)]
    return {k: _resolve(v, refs) for k, v in value.items()}


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    stack = cdk.Stack(cdk.App(), "Bare", env=cdk.Environment(account=TOOLING, region=REGION))
    builds = ImageBuilds(
        stack,
        "Images",
        project=PROJECT,
        images=IMAGES,
        source_root=ROOT,
        key=kms.Key(stack, "PlatformKey"),
        pull_accounts=[ENVIRONMENT, TOOLING],
    )
    builds.rebuild_weekly(codepipeline.Pipeline.from_pipeline_arn(stack, "Pipeline", PIPELINE_ARN))
    return Template.from_stack(stack).to_json()


@pytest.fixture(scope="module")
def refs(template: dict[str, Any]) -> dict[str, str]:
    refs = {
        "AWS::Partition": "aws",
        "AWS::Region": REGION,
        "AWS::AccountId": TOOLING,
        "AWS::URLSuffix": "amazonaws.com",
    }
    for logical_id, resource in template["Resources"].items():
        if resource["Type"] == "AWS::ECR::Repository":
            name = resource["Properties"]["RepositoryName"]
            refs[logical_id] = name
            refs[f"{logical_id}.Arn"] = f"arn:aws:ecr:{REGION}:{TOOLING}:repository/{name}"
        elif resource["Type"] == "AWS::KMS::Key":
            refs[f"{logical_id}.Arn"] = f"arn:aws:kms:{REGION}:{TOOLING}:key/{logical_id}"
        elif resource["Type"] in ("AWS::CodeBuild::Project", "AWS::Logs::LogGroup", "AWS::IAM::Role"):
            refs[logical_id] = logical_id
            refs[f"{logical_id}.Arn"] = f"arn:aws:{resource['Type'].split('::')[1].lower()}:{REGION}:{TOOLING}:x"
    return refs


def _of_image(template: dict[str, Any], resource_type: str, image: str) -> dict[str, Any]:
    (found,) = [
        r
        for logical_id, r in template["Resources"].items()
        if r["Type"] == resource_type and logical_id.startswith(f"Images{image}")
    ]
    return found


def _build_policy(template: dict[str, Any], refs: dict[str, str], image: str) -> list[dict[str, Any]]:
    (role_id,) = [
        logical_id
        for logical_id, r in template["Resources"].items()
        if r["Type"] == "AWS::IAM::Role" and logical_id.startswith(f"Images{image}BuildRole")
    ]
    return [
        _resolve(r["Properties"]["PolicyDocument"], refs)
        for r in template["Resources"].values()
        if r["Type"] == "AWS::IAM::Policy" and {"Ref": role_id} in r["Properties"]["Roles"]
    ]


def _repository_policy(template: dict[str, Any], refs: dict[str, str], image: str) -> dict[str, Any]:
    return _resolve(_of_image(template, "AWS::ECR::Repository", image)["Properties"]["RepositoryPolicyText"], refs)


PUSH = ("ecr:InitiateLayerUpload", "ecr:UploadLayerPart", "ecr:CompleteLayerUpload", "ecr:PutImage")


@pytest.mark.parametrize(("image", "other"), [("serving", "training"), ("training", "serving")])
def test_build_role_pushes_to_its_own_repository_and_no_other(
    template: dict[str, Any], refs: dict[str, str], image: str, other: str
) -> None:
    policies = _build_policy(template, refs, image)
    for action in (*PUSH, "ecr:BatchCheckLayerAvailability"):
        assert is_allowed(policies, Request(action, _repository_arn(image))), action
        assert not is_allowed(policies, Request(action, _repository_arn(other))), action
    assert not is_allowed(policies, Request("ecr:PutImage", _repository_arn(image, STRANGER)))
    assert not is_allowed(policies, Request("ecr:DeleteRepository", _repository_arn(image)))
    assert not is_allowed(policies, Request("ecr:BatchDeleteImage", _repository_arn(image)))
    assert not is_allowed(policies, Request("ecr:SetRepositoryPolicy", _repository_arn(image)))
    # Logging in has no resource-level permission (Service Authorization Reference).
    assert is_allowed(policies, Request("ecr:GetAuthorizationToken", "*"))


def test_only_the_training_build_pulls_its_base_from_the_dlc_account(
    template: dict[str, Any], refs: dict[str, str]
) -> None:
    dlc = f"arn:aws:ecr:{REGION}:{DLC}:repository/pytorch-training"
    training, serving = _build_policy(template, refs, "training"), _build_policy(template, refs, "serving")
    for action in PULL_ACTIONS:
        assert is_allowed(training, Request(action, dlc))
        assert not is_allowed(serving, Request(action, dlc))
    assert not is_allowed(training, Request("ecr:BatchGetImage", f"arn:aws:ecr:{REGION}:{DLC}:repository/other"))
    assert not is_allowed(training, Request("ecr:PutImage", dlc))


def _cross_account_allows(identity: list[dict[str, Any]], request: Request, repository: dict[str, Any]) -> bool:
    """A request from another account: the repository policy must grant the principal or its account, and then the
    principal's own account must allow it too. That is the rule the evaluator applies to KMS key policies, so the
    repository policy is passed in that role here."""
    return is_allowed(identity, request, key_policy=repository)


def _caller(account: str, *, service: bool = False) -> dict[str, str]:
    return {
        "aws:PrincipalAccount": account,
        "aws:PrincipalArn": f"arn:aws:iam::{account}:role/caller",
        "aws:PrincipalIsAWSService": str(service).lower(),
    }


ALLOW_EVERYTHING = [{"Statement": [{"Effect": "Allow", "Action": "ecr:*", "Resource": "*"}]}]


@pytest.mark.parametrize("image", ["serving", "training"])
def test_repository_lets_the_environment_accounts_pull_and_refuses_everyone_else(
    template: dict[str, Any], refs: dict[str, str], image: str
) -> None:
    repository = _repository_policy(template, refs, image)
    arn = _repository_arn(image)
    for action in PULL_ACTIONS:
        assert _cross_account_allows(ALLOW_EVERYTHING, Request(action, arn, _caller(ENVIRONMENT)), repository)
    # The environment account pulls, never pushes or rewrites the policy.
    for action in (*PUSH, "ecr:SetRepositoryPolicy", "ecr:BatchDeleteImage"):
        assert not _cross_account_allows(ALLOW_EVERYTHING, Request(action, arn, _caller(ENVIRONMENT)), repository)
    # Any other account, even with an Allow of its own, is refused; and the explicit deny refuses it also where a
    # later statement would allow everyone (a public repository).
    public = {**repository, "Statement": [*repository["Statement"], {"Effect": "Allow", "Principal": "*",
                                                                     "Action": "ecr:*"}]}  # fmt: skip
    for action in (*PULL_ACTIONS, *PUSH):
        request = Request(action, arn, _caller(STRANGER))
        assert not _cross_account_allows(ALLOW_EVERYTHING, request, repository)
        assert not _cross_account_allows(ALLOW_EVERYTHING, request, public)
        assert not is_allowed([], request, resource_policies=[public])
    # Within the tooling account IAM decides; AWS services acting for themselves are not denied.
    assert is_allowed(ALLOW_EVERYTHING, Request("ecr:BatchGetImage", arn, _caller(TOOLING)), resource_policies=[
        repository])  # fmt: skip
    service = {"aws:PrincipalIsAWSService": "true", "aws:PrincipalServiceName": "inspector2.amazonaws.com"}
    assert is_allowed(ALLOW_EVERYTHING, Request("ecr:BatchGetImage", arn, service), resource_policies=[repository])


@pytest.mark.parametrize("image", ["serving", "training"])
def test_repository_scans_on_push_with_immutable_tags_the_platform_key_and_a_lifecycle(
    template: dict[str, Any], image: str
) -> None:
    properties = _of_image(template, "AWS::ECR::Repository", image)["Properties"]
    (key_id,) = [lid for lid, r in template["Resources"].items() if r["Type"] == "AWS::KMS::Key"]
    assert properties["RepositoryName"] == f"{PROJECT}/{image}"
    assert properties["ImageScanningConfiguration"] == {"ScanOnPush": True}
    assert properties["ImageTagMutability"] == "IMMUTABLE"
    assert properties["EncryptionConfiguration"] == {"EncryptionType": "KMS", "KmsKey": {"Fn::GetAtt": [key_id, "Arn"]}}
    (rule,) = json.loads(properties["LifecyclePolicy"]["LifecyclePolicyText"])["rules"]
    assert rule["selection"] == {"tagStatus": "any", "countType": "sinceImagePushed", "countNumber": 365,
                                 "countUnit": "days"}  # fmt: skip
    assert _of_image(template, "AWS::ECR::Repository", image)["DeletionPolicy"] == "Retain"


@pytest.mark.parametrize(
    ("image", "environment_type", "build_image"),
    [
        ("serving", "ARM_CONTAINER", "aws/codebuild/amazonlinux-aarch64-standard:3.0"),
        ("training", "LINUX_CONTAINER", "aws/codebuild/amazonlinux-x86_64-standard:5.0"),
    ],
)
def test_codebuild_builds_natively_for_the_image_architecture(
    template: dict[str, Any], image: str, environment_type: str, build_image: str
) -> None:
    properties = _of_image(template, "AWS::CodeBuild::Project", image)["Properties"]
    environment = properties["Environment"]
    assert environment["Type"] == environment_type and environment["Image"] == build_image
    assert environment["ComputeType"] == "BUILD_GENERAL1_LARGE"
    assert environment["PrivilegedMode"] is True
    assert properties["Source"]["Type"] == "CODEPIPELINE", "builds the repository at the commit being promoted"
    (key_id,) = [lid for lid, r in template["Resources"].items() if r["Type"] == "AWS::KMS::Key"]
    assert properties["EncryptionKey"] == {"Fn::GetAtt": [key_id, "Arn"]}
    (logs_id,) = [lid for lid, r in template["Resources"].items() if r["Type"] == "AWS::Logs::LogGroup"]
    assert properties["LogsConfig"]["CloudWatchLogs"]["GroupName"] == {"Ref": logs_id}
    logs = template["Resources"][logs_id]["Properties"]
    assert logs["KmsKeyId"] == {"Fn::GetAtt": [key_id, "Arn"]} and logs["RetentionInDays"] == 365


def _buildspec(template: dict[str, Any], refs: dict[str, str], image: str) -> dict[str, Any]:
    source = _of_image(template, "AWS::CodeBuild::Project", image)["Properties"]["Source"]
    return json.loads(_resolve(source["BuildSpec"], refs))


def test_build_pushes_a_unique_tag_and_exports_the_digest(template: dict[str, Any], refs: dict[str, str]) -> None:
    spec = _buildspec(template, refs, "training")
    assert spec["env"]["exported-variables"] == ["IMAGE_URI"]
    registry = f"{TOOLING}.dkr.ecr.{REGION}.amazonaws.com"
    logins = [c for c in spec["phases"]["pre_build"]["commands"] if "docker login" in c]
    assert [c.rsplit(" ", 1)[1] for c in logins] == [registry, f"{DLC}.dkr.ecr.{REGION}.amazonaws.com"]
    build, push, digest, _ = spec["phases"]["build"]["commands"]
    repository = f"{registry}/{PROJECT}/training"
    assert build.startswith("docker build --pull --file training_assets/image/Dockerfile ")
    assert '--build-arg "BASE_TAG=2.10.0-gpu-py313-cu130-ubuntu22.04-ec2"' in build
    assert build.endswith(f'--tag "{repository}:$TAG" training_assets')
    assert push == f'docker push "{repository}:$TAG"'
    assert digest.startswith("IMAGE_URI=") and "RepoDigests" in digest
    assert 'TAG="build-${CODEBUILD_BUILD_NUMBER}-${REVISION:0:12}"' in spec["phases"]["pre_build"]["commands"]
    serving = _buildspec(template, refs, "serving")
    assert len([c for c in serving["phases"]["pre_build"]["commands"] if "docker login" in c]) == 1


def test_weekly_schedule_starts_the_pipeline_that_builds_and_promotes(template: dict[str, Any]) -> None:
    (rule,) = [r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::Events::Rule"]
    assert rule["ScheduleExpression"] == "cron(0 5 ? * MON *)"
    (target,) = rule["Targets"]
    assert target["Arn"] == PIPELINE_ARN
    role = template["Resources"][target["RoleArn"]["Fn::GetAtt"][0]]
    assert role["Properties"]["AssumeRolePolicyDocument"]["Statement"][0]["Principal"] == {
        "Service": "events.amazonaws.com"
    }
    (policy,) = [
        r["Properties"]["PolicyDocument"]
        for r in template["Resources"].values()
        if r["Type"] == "AWS::IAM::Policy" and {"Ref": target["RoleArn"]["Fn::GetAtt"][0]} in r["Properties"]["Roles"]
    ]
    assert is_allowed([policy], Request("codepipeline:StartPipelineExecution", PIPELINE_ARN))
    assert not is_allowed([policy], Request("codepipeline:StartPipelineExecution", f"{PIPELINE_ARN}-other"))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"name": "Training"}, "image 'Training': the name must be 1-30 lower-case letters, digits or '-'."),
        ({"dockerfile": "training_assets/nope/Dockerfile"}, "image training: no Dockerfile at training_assets/nope"),
        ({"context": "nowhere"}, "image training: no build context folder nowhere in "),
    ],
)
def test_a_bad_definition_stops_synth_with_one_sentence(change: dict[str, Any], message: str) -> None:
    definition = ImageDefinition(**{**IMAGES[1].__dict__, **change})
    stack = cdk.Stack(cdk.App(), "Bad")
    with pytest.raises(ValueError) as error:
        ImageBuilds(stack, "Images", project=PROJECT, images=[definition], source_root=ROOT, key=kms.Key(stack, "K"))
    assert str(error.value).startswith(message) and "\n" not in str(error.value)
    with pytest.raises(ValueError, match="defined twice"):
        ImageBuilds(stack, "Twice", project=PROJECT, images=[IMAGES[0], IMAGES[0]], source_root=ROOT, key=kms.Key(
            stack, "K2"))  # fmt: skip


# ------------------------------------------------------------------------------------ an environment's stack


def test_built_image_reads_the_promoted_digest_and_grants_the_pull_across_accounts() -> None:
    stack = cdk.Stack(cdk.App(), "Consumer", env=cdk.Environment(account=ENVIRONMENT, region=REGION))
    image = BuiltImage(
        stack, "TrainingImage", project=PROJECT, image="training", registry=ImageRegistry(TOOLING, REGION)
    )
    role = iam.Role(stack, "Runner", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"))
    image.grant_pull(role)
    cdk.CfnOutput(stack, "Uri", value=image.image_uri)
    template = Template.from_stack(stack).to_json()
    assert built_images(stack) == [image]
    # The URI is an SSM parameter CloudFormation resolves at deploy time, named by the one function.
    (parameter,) = [p for p in template["Parameters"].values() if "/images/" in p["Default"]]
    assert parameter == {"Type": "AWS::SSM::Parameter::Value<String>", "Default": "/pytorch-platform/images/training"}
    assert image_parameter_name(PROJECT, "training") == image.parameter_name
    (policy,) = [r["Properties"]["PolicyDocument"] for r in template["Resources"].values()
                 if r["Type"] == "AWS::IAM::Policy"]  # fmt: skip
    policy = _resolve(policy, {"AWS::Partition": "aws", "AWS::Region": REGION})
    for action in PULL_ACTIONS:
        assert is_allowed([policy], Request(action, _repository_arn("training")))
        assert not is_allowed([policy], Request(action, _repository_arn("serving")))
    assert is_allowed([policy], Request("ecr:GetAuthorizationToken", "*"))
    assert not is_allowed([policy], Request("ecr:PutImage", _repository_arn("training")))


@pytest.mark.parametrize("written_by", [TOOLING, STRANGER])
def test_the_pull_is_granted_on_the_settings_registry_whatever_the_parameter_holds(written_by: str) -> None:
    """Issue 41.5: the repository's account and region come from the settings (the pipeline's registry), never from
    the parameter's value, which a deployed role writes: a digest of another account's repository (written_by
    STRANGER) gets no pull grant, so the endpoint cannot run it."""
    stack = cdk.Stack(cdk.App(), "Consumer", env=cdk.Environment(account=ENVIRONMENT, region=REGION))
    image = BuiltImage(stack, "ServingImage", project=PROJECT, image="serving", registry=ImageRegistry(TOOLING, REGION))
    policy = iam.ManagedPolicy(stack, "Pull", statements=[image.pull_statement()])
    role = iam.Role(stack, "Runner", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"))
    policy.attach_to_role(role)
    template = Template.from_stack(stack).to_json()
    (name,) = [n for n, p in template["Parameters"].items() if p["Default"] == "/pytorch-platform/images/serving"]
    digest = f"{written_by}.dkr.ecr.{REGION}.amazonaws.com/{PROJECT}/serving@sha256:{'a1' * 32}"
    (document,) = [r["Properties"]["PolicyDocument"] for r in template["Resources"].values()
                   if r["Type"] == "AWS::IAM::ManagedPolicy"]  # fmt: skip
    document = _resolve(document, {name: digest, "AWS::Partition": "aws"})
    for action in PULL_ACTIONS:
        assert is_allowed([document], Request(action, _repository_arn("serving", TOOLING)))
        assert is_allowed([document], Request(action, _repository_arn("serving", written_by))) is (
            written_by == TOOLING
        )
        assert not is_allowed([document], Request(action, _repository_arn("training", TOOLING)))
        assert not is_allowed(
            [document], Request(action, f"arn:aws:ecr:eu-west-1:{TOOLING}:repository/{PROJECT}/serving")
        )


@pytest.mark.parametrize(
    ("value", "by_digest"),
    [
        (f"{TOOLING}.dkr.ecr.{REGION}.amazonaws.com/{PROJECT}/training@sha256:{'a1' * 32}", True),
        (f"{TOOLING}.dkr.ecr.cn-north-1.amazonaws.com.cn/{PROJECT}/training@sha256:{'0f' * 32}", True),
        (f"{TOOLING}.dkr.ecr.{REGION}.amazonaws.com/{PROJECT}/training:build-7-abc", False),
        (f"{TOOLING}.dkr.ecr.{REGION}.amazonaws.com/{PROJECT}/training@sha256:{'a1' * 31}", False),
        (f"docker.io/library/python@sha256:{'a1' * 32}", False),
    ],
)
def test_image_parameters_accept_only_an_ecr_image_by_digest(value: str, by_digest: bool) -> None:
    assert bool(re.match(IMAGE_BY_DIGEST, value)) is by_digest
    (command,) = publish_commands(PROJECT, ["training"], REGION)
    assert f"--allowed-pattern '{IMAGE_BY_DIGEST}'" in command and '--value "$IMAGE_TRAINING"' in command


# --------------------------------------------------------------------------------------- inside the pipeline


def _stage(scope: Construct, environment: PromotionTarget) -> PromotionStage:
    """An access stack (the role), a stack that reads the training image and one that reads none."""
    stage = cdk.Stage(scope, environment.name, env=cdk.Environment(account=environment.account, region=REGION))
    access = cdk.Stack(stage, "Access")
    cdk.CfnWaitConditionHandle(access, "Placeholder")
    reader = cdk.Stack(stage, "Reader")
    image = BuiltImage(reader, "Training", project=PROJECT, image="training", registry=ImageRegistry(TOOLING, REGION))
    cdk.CfnOutput(reader, "Uri", value=image.image_uri)
    other = cdk.Stack(stage, "Other")
    cdk.CfnWaitConditionHandle(other, "Placeholder")
    return PromotionStage(stage, access=access)


@pytest.fixture(scope="module")
def pipeline() -> tuple[PromotionPipeline, dict[str, Any]]:
    stack = cdk.Stack(cdk.App(), "Tooling", env=cdk.Environment(account=TOOLING, region=REGION))
    promotion = PromotionPipeline(
        stack, KEEP_LOGICAL_IDS, source=SOURCE, targets=targets(), stage_factory=_stage, images=IMAGES
    )
    return promotion, Template.from_stack(stack).to_json()


def _stages(template: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    (pipeline,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::CodePipeline::Pipeline"]
    return {stage["Name"]: stage["Actions"] for stage in pipeline["Properties"]["Stages"]}


def test_pipeline_builds_each_image_once_after_self_mutation_and_before_the_stages(
    pipeline: tuple[PromotionPipeline, dict[str, Any]],
) -> None:
    promotion, template = pipeline
    stages = _stages(template)
    names = list(stages)
    assert names.index("UpdatePipeline") < names.index("Images") < names.index("dev") < names.index("prod")
    builds = stages["Images"]
    assert sorted(a["Namespace"] for a in builds) == ["Image-serving", "Image-training"]
    assert promotion.images is not None
    for action in builds:
        image = action["Namespace"].removeprefix("Image-")
        project = promotion.images.builds[image].project
        assert action["Configuration"]["ProjectName"] == {"Ref": cdk.Stack.of(project).get_logical_id(
            project.node.default_child)}  # fmt: skip
        assert [i["Name"] for i in action["InputArtifacts"]] == [stages["Source"][0]["OutputArtifacts"][0]["Name"]]
    # No other action builds an image: every stage deploys what the Images wave built.
    projects = {json.dumps(a["Configuration"].get("ProjectName")) for s in stages.values() for a in s}
    assert sum(1 for p in projects if "Imagesserving" in p or "Imagestraining" in p) == 2


@pytest.mark.parametrize("environment", list(ACCOUNTS))
def test_each_stage_publishes_this_executions_digests_before_a_stack_reads_them(
    pipeline: tuple[PromotionPipeline, dict[str, Any]], environment: str
) -> None:
    _, template = pipeline
    actions = _stages(template)[environment]
    orders = {a["Name"]: a["RunOrder"] for a in actions}
    (publish,) = [a for a in actions if a["Name"].endswith(f"PublishImages-{environment}")]
    assert orders["Access.Deploy"] < publish["RunOrder"] < orders["Reader.Prepare"]
    variables = {v["name"]: v["value"] for v in json.loads(publish["Configuration"]["EnvironmentVariables"])}
    assert variables == {"IMAGE_SERVING": image_uri_variable("serving"), "IMAGE_TRAINING": image_uri_variable(
        "training")}  # fmt: skip
    assert variables["IMAGE_TRAINING"] == "#{Image-training.IMAGE_URI}"
    project = template["Resources"][publish["Configuration"]["ProjectName"]["Ref"]]
    commands = json.loads(project["Properties"]["Source"]["BuildSpec"])["phases"]["build"]["commands"]
    assert commands[2:] == [f"AWS_PROFILE=smoke-test {c}" for c in publish_commands(PROJECT, ["serving", "training"],
                                                                                     REGION)]  # fmt: skip
    # The image-publishing role there, not the smoke-test role: only this step writes the image parameters.
    role_arn = f"arn:aws:iam::{ACCOUNTS[environment]}:role/pytorch-platform-{environment}-pipeline-image-publishing"
    variables = _resolve(project["Properties"]["Environment"]["EnvironmentVariables"], {"AWS::Partition": "aws"})
    assert {"Name": "SMOKE_TEST_ROLE_ARN", "Type": "PLAINTEXT", "Value": role_arn} in variables
    if environment == "prod":
        (approval,) = [a for a in actions if a["ActionTypeId"]["Category"] == "Approval"]
        assert approval["RunOrder"] < publish["RunOrder"], "prod gets the digest only once approved"


def test_pipeline_lets_only_the_environment_accounts_pull(pipeline: tuple[PromotionPipeline, dict[str, Any]]) -> None:
    _, template = pipeline
    repositories = [r for r in template["Resources"].values() if r["Type"] == "AWS::ECR::Repository"]
    assert len(repositories) == 2
    for repository in repositories:
        (allow, _) = repository["Properties"]["RepositoryPolicyText"]["Statement"]
        principals = json.dumps(allow["Principal"])
        assert all(f":iam::{account}:root" in principals for account in ACCOUNTS.values())
        assert TOOLING not in principals


def test_pipeline_without_an_access_stack_cannot_publish() -> None:
    def no_access(scope: Construct, environment: PromotionTarget) -> PromotionStage:
        stage = cdk.Stage(scope, environment.name, env=cdk.Environment(account=environment.account, region=REGION))
        cdk.CfnWaitConditionHandle(cdk.Stack(stage, "Only"), "Placeholder")
        return PromotionStage(stage)

    with pytest.raises(ValueError, match=r"the pipeline builds images, so the stage must deploy the role"):
        PromotionPipeline(
            cdk.Stack(cdk.App(), "Tooling", env=cdk.Environment(account=TOOLING, region=REGION)),
            KEEP_LOGICAL_IDS,
            source=SOURCE,
            targets=targets(),
            stage_factory=no_access,
            images=IMAGES,
        )


def test_the_projects_repositories_get_ecrs_enhanced_scanning(template: dict[str, Any]) -> None:
    """Amazon Inspector through ECR: OS and Python packages, rescanned as findings appear (basic scanning: OS only)."""
    (config,) = [r["Properties"] for r in template["Resources"].values()
                 if r["Type"] == "AWS::ECR::RegistryScanningConfiguration"]  # fmt: skip
    assert config == {
        "ScanType": "ENHANCED",
        "Rules": [
            {
                "ScanFrequency": "CONTINUOUS_SCAN",
                "RepositoryFilters": [{"Filter": f"{PROJECT}/*", "FilterType": "WILDCARD"}],
            }
        ],
    }


@pytest.mark.parametrize("environment", list(ACCOUNTS))
def test_each_stage_gates_this_executions_images_on_their_scan_before_it_gets_them(
    pipeline: tuple[PromotionPipeline, dict[str, Any]], environment: str
) -> None:
    _, template = pipeline
    actions = _stages(template)[environment]
    (gate,) = [a for a in actions if a["Name"].endswith(f"ScanGate-{environment}")]
    (publish,) = [a for a in actions if a["Name"].endswith(f"PublishImages-{environment}")]
    assert gate["RunOrder"] < publish["RunOrder"]
    variables = {v["name"]: v["value"] for v in json.loads(gate["Configuration"]["EnvironmentVariables"])}
    assert variables == {"IMAGE_SERVING": "#{Image-serving.IMAGE_URI}", "IMAGE_TRAINING": "#{Image-training.IMAGE_URI}"}
    project = template["Resources"][gate["Configuration"]["ProjectName"]["Ref"]]
    commands = json.loads(project["Properties"]["Source"]["BuildSpec"])["phases"]["build"]["commands"]
    assert commands == [
        'python -m inference_assets.image.scan_gate --image-uri "$IMAGE_SERVING" --image-uri "$IMAGE_TRAINING"'
    ]
    # Its role reads the findings of exactly the two repositories (in the tooling account: no role to assume).
    role_id = project["Properties"]["ServiceRole"]["Fn::GetAtt"][0]
    policies = [r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::IAM::Policy"]
    statements = [s for p in policies if {"Ref": role_id} in p["Roles"] for s in p["PolicyDocument"]["Statement"]]
    (scan,) = [s for s in statements if s["Action"] == "ecr:DescribeImageScanFindings"]
    assert len(scan["Resource"]) == 2
    assert not [s for s in statements if s["Action"] == "sts:AssumeRole"]
    if environment == "prod":
        (approval,) = [a for a in actions if a["ActionTypeId"]["Category"] == "Approval"]
        assert approval["RunOrder"] < gate["RunOrder"]
