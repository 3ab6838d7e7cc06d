"""Issue 41.5 and 41.7: attackers standing in the promotion pipeline's builds. Code in a pipeline asset build holds
the asset-publishing role's credentials; code in a smoke-test build holds its step role's and, after the assume,
the environment's smoke-test role's. Each attack is a request with its full context, evaluated against the identity
policies and the policy of what it targets (the build project, the trust policy of the role it would assume, the ECR
repository, the endpoint role's pull grant) together, and refused; the flow the step exists for is allowed beside
it. Templates: the pipeline synthesized from test settings (tests/stacks/pipeline_assembly.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ops_review.iam_policy import Request, is_allowed, resolve
from proving_ground.iam_requests import logical_id, role_policies
from stacks.image_names import image_parameter_name
from stacks.image_patching import SERVING_IMAGE
from tests.stacks.components.promotion_targets import TOOLING
from tests.stacks.pipeline_assembly import ACCOUNTS, pipeline_assembly
from tests.stacks.security.exports import template_exports

REGION, ENV = "us-west-2", "staging"
ACCOUNT = ACCOUNTS[ENV]
STRANGER = "444444444444"
PROJECTS = f"arn:aws:codebuild:{REGION}:{TOOLING}:project"


def _refs(template: dict[str, Any], account: str) -> dict[str, Any]:
    """Placeholder values of the right shape for the template's intrinsics (ARNs by logical id)."""
    refs: dict[str, Any] = {"AWS::AccountId": account, "AWS::Partition": "aws", "AWS::Region": REGION,
                            "AWS::URLSuffix": "amazonaws.com"}  # fmt: skip
    for name in template["Resources"]:
        refs[name] = name
        refs[f"{name}.Arn"] = f"arn:aws:placeholder:{REGION}:{account}:{name}"
    return refs


@pytest.fixture(scope="module")
def pipeline() -> tuple[dict[str, Any], dict[str, Any]]:
    template = json.loads((pipeline_assembly() / "PromotionPipeline.template.json").read_text())
    return template, _refs(template, TOOLING)


def _stage_template(stack: str) -> dict[str, Any]:
    (path,) = (pipeline_assembly() / f"assembly-PromotionPipeline-{ENV}").glob(f"*{stack}*.template.json")
    return json.loads(Path(path).read_text())


def _role(template: dict[str, Any], refs: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    return role_policies(template, logical_id(template, "AWS::IAM::Role", prefix), refs)


def _tooling_request(action: str, resource: str, **context: str) -> Request:
    return Request(action, resource, {"aws:PrincipalAccount": TOOLING, **context})


# ---------------------------------------------------------------------------------------- a pipeline asset build


def test_an_asset_build_cannot_start_any_build(pipeline: Any) -> None:
    """The asset-publishing role's generated StartBuild on every project let code in an asset build start the
    self-mutation project (whose role deploys the pipeline through the bootstrap roles) with its own buildspec. Every
    way to start a build is now refused, with or without an override, on any project, its own included."""
    template, refs = pipeline
    asset_role = _role(template, refs, "PipelineAssetsFileRole")
    self_mutation = f"arn:aws:placeholder:{REGION}:{TOOLING}:PipelineUpdatePipelineSelfMutationDAA41400"
    override = {"codebuild:source.buildspec": "version: 0.2\nphases: {build: {commands: [./steal.sh]}}"}
    for action in ("codebuild:StartBuild", "codebuild:StartBuildBatch", "codebuild:RetryBuild"):
        for project in (self_mutation, f"{PROJECTS}/PipelineAssetsFileAsset1", f"{PROJECTS}/anything"):
            assert not is_allowed(asset_role, _tooling_request(action, project, **override)), (action, project)
            assert not is_allowed(asset_role, _tooling_request(action, project)), (action, project)
    self_mutation_role = f"arn:aws:iam::{TOOLING}:role/PromotionPipeline-PipelineUpdatePipelineSelfMutation-1A2B"
    assert not is_allowed(asset_role, _tooling_request("sts:AssumeRole", self_mutation_role))
    # What an asset build is for: assume the bootstrap file-publishing role and read the pipeline's artifacts.
    publishing = f"arn:aws:iam::{ACCOUNT}:role/cdk-hnb659fds-file-publishing-role-{ACCOUNT}-{REGION}"
    assert is_allowed(asset_role, _tooling_request("sts:AssumeRole", publishing))
    artifacts = refs[f"{logical_id(template, 'AWS::S3::Bucket', 'Artifacts')}.Arn"]
    assert is_allowed(asset_role, _tooling_request("s3:GetObject", f"{artifacts}/assembly/asset.zip"))


def test_the_pipeline_itself_still_starts_the_asset_builds(pipeline: Any) -> None:
    """CodePipeline starts the asset projects through its CodeBuild action role (assumed by the pipeline's role
    only), which the asset builds' Deny does not touch."""
    template, refs = pipeline
    action_role = _role(template, refs, "PipelineCodeBuildActionRole")
    (asset_project,) = [name for name in template["Resources"] if name.startswith("PipelineAssetsFileAsset1")][:1]
    assert is_allowed(action_role, _tooling_request("codebuild:StartBuild", refs[f"{asset_project}.Arn"]))
    assert not is_allowed(action_role, _tooling_request("codebuild:StartBuild", f"{PROJECTS}/anything"))


# ----------------------------------------------------------------------------------------- a smoke-test build


def _trust_allows(role: dict[str, Any], principal_arn: str) -> bool:
    """Cross-account AssumeRole: the role's trust policy must allow on its own (the caller's identity policy is
    evaluated apart). The trust statement is evaluated as the only grant, its principal checked against the caller's
    account root."""
    trust = resolve(role["Properties"]["AssumeRolePolicyDocument"], refs={"AWS::Partition": "aws",
                                                                          "AWS::AccountId": ACCOUNT})  # fmt: skip
    role_arn = f"arn:aws:iam::{ACCOUNT}:role/{role['Properties']['RoleName']}"
    caller = principal_arn.split(":")[4]
    (statement,) = trust["Statement"]
    grant = {k: v for k, v in statement.items() if k != "Principal"} | {"Resource": role_arn}
    context = {"aws:PrincipalArn": principal_arn, "aws:PrincipalAccount": caller}
    return statement["Principal"] == {"AWS": f"arn:aws:iam::{caller}:root"} and is_allowed(
        [{"Statement": [grant]}], Request("sts:AssumeRole", role_arn, context)
    )


def _access() -> dict[str, list[dict[str, Any]]]:
    """The identity policies of the environment's pipeline roles, by kind (smoke-test, image-publishing), with the
    Foundation's exports (the model bucket) resolved to placeholders."""
    template = _stage_template("SmokeTestAccess")
    foundation = _stage_template("Foundation")
    exports = template_exports(foundation, _refs(foundation, ACCOUNT))
    refs = _refs(template, ACCOUNT)
    policies: dict[str, list[dict[str, Any]]] = {}
    for role_id, role in template["Resources"].items():
        if role["Type"] == "AWS::IAM::Role":
            policies[role["Properties"]["RoleName"].rsplit("-pipeline-", 1)[1]] = [
                resolve(p["Properties"]["PolicyDocument"], refs=refs, exports=exports)
                for p in template["Resources"].values()
                if p["Type"] == "AWS::IAM::ManagedPolicy" and {"Ref": role_id} in p["Properties"]["Roles"]
            ]
    return policies


def _trust(kind: str) -> dict[str, Any]:
    template = _stage_template("SmokeTestAccess")
    roles = [r for r in template["Resources"].values() if r["Type"] == "AWS::IAM::Role"]
    (role,) = [r for r in roles if r["Properties"]["RoleName"].endswith(f"-pipeline-{kind}")]
    return role


def test_a_smoke_test_build_cannot_become_the_image_publisher(pipeline: Any) -> None:
    """The smoke-test step's role may assume only the smoke-test role; the image-publishing role trusts only the
    image-publishing step's role (exact ARN), so neither the smoke-test step nor any role named like the pipeline
    stack gets there."""
    template, refs = pipeline
    roles = {kind: _trust(kind) for kind in ("smoke-test", "image-publishing")}
    smoke_step = f"arn:aws:iam::{TOOLING}:role/pytorch-platform-{ENV}-pipeline-SmokeTest"
    step_policies = [resolve(r["Properties"]["PolicyDocument"], refs=refs) for r in template["Resources"].values()
                     if r["Type"] == "AWS::IAM::Policy" and r["Properties"]["Roles"][0]["Ref"].startswith(
                         f"Pipeline{ENV}SmokeTest{ENV}Role")]  # fmt: skip
    publisher = f"arn:aws:iam::{ACCOUNT}:role/pytorch-platform-{ENV}-pipeline-image-publishing"
    smoke = f"arn:aws:iam::{ACCOUNT}:role/pytorch-platform-{ENV}-pipeline-smoke-test"
    assert not is_allowed(step_policies, _tooling_request("sts:AssumeRole", publisher))
    assert not _trust_allows(roles["image-publishing"], smoke_step)
    assert not _trust_allows(roles["image-publishing"], f"arn:aws:iam::{TOOLING}:role/PromotionPipeline-Anything")
    assert is_allowed(step_policies, _tooling_request("sts:AssumeRole", smoke))
    assert _trust_allows(roles["smoke-test"], smoke_step)
    assert _trust_allows(roles["image-publishing"], f"arn:aws:iam::{TOOLING}:role/pytorch-platform-{ENV}-pipeline-"
                                                    "PublishImages")  # fmt: skip


def test_a_smoke_test_build_cannot_change_which_image_the_endpoint_runs() -> None:
    """Inside the environment, as the smoke-test role: it invokes and describes its endpoint and reads the model
    archive (its job), but cannot write the image parameters (only the image-publishing role does), invoke another
    endpoint or push an image (its model-archive read is tests/stacks/test_pipeline.py's). And were a parameter to
    name another account's image, the endpoint role's pull grant names the pipeline's registry from the settings, so
    the pull of that image is refused."""
    roles = _access()
    smoke, publisher = roles["smoke-test"], roles["image-publishing"]
    context = {"aws:PrincipalAccount": ACCOUNT}
    endpoint = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:endpoint/{ENV}-gravitonendpoint"
    assert is_allowed(smoke, Request("sagemaker:InvokeEndpoint", endpoint, context))
    assert not is_allowed(smoke, Request("sagemaker:InvokeEndpoint", f"{endpoint[: -len('graviton')]}x", context))
    for image in (SERVING_IMAGE, "training"):
        parameter = f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter{image_parameter_name('pytorch-platform', image)}"
        assert not is_allowed(smoke, Request("ssm:PutParameter", parameter, context)), image
        assert is_allowed(publisher, Request("ssm:PutParameter", parameter, context)), image
    repository = f"arn:aws:ecr:{REGION}:{TOOLING}:repository/pytorch-platform/{SERVING_IMAGE}"
    assert not is_allowed(smoke, Request("ecr:PutImage", repository, context))

    endpoint_stack = _stage_template("GravitonEndpoint")
    (pull,) = [r["Properties"]["PolicyDocument"] for lid, r in endpoint_stack["Resources"].items()
               if lid.startswith("ImagePullPolicy")]  # fmt: skip
    pull = resolve(pull, refs={"AWS::Partition": "aws", "AWS::Region": REGION, "AWS::AccountId": ACCOUNT})
    for account, allowed in ((TOOLING, True), (STRANGER, False), (ACCOUNT, False)):
        theirs = f"arn:aws:ecr:{REGION}:{account}:repository/pytorch-platform/{SERVING_IMAGE}"
        assert is_allowed([pull], Request("ecr:BatchGetImage", theirs, context)) is allowed, account
