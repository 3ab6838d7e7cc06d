"""The promotion pipeline: synthesized once per module from test settings (three accounts and a tooling account)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from cfnlint.api import lint_file

from app import build_app
from ops_review.iam_policy import Request, is_allowed, resolve
from scripts import iam_analysers, template_gates
from stacks.pipeline import EXPECTED_LABELS, SYNTH_COMMANDS, PromotionPipelineStack, cdk_cli_version
from stacks.platform_stage import PlatformStage
from stacks.settings import SettingsError, load_environments, load_pipeline
from tests.conftest import WITHOUT_BUILTIN_VALIDATION
from tests.stacks.components.promotion_targets import PIPELINE, TOOLING
from tests.stacks.pipeline_assembly import ACCOUNTS, MODEL_KEY, pipeline_assembly


@pytest.fixture(scope="module")
def assembly() -> Path:
    return pipeline_assembly()


@pytest.fixture(scope="module")
def template(assembly: Path) -> dict[str, Any]:
    return json.loads((assembly / "PromotionPipeline.template.json").read_text())


@pytest.fixture(scope="module")
def stages(template: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    (pipeline,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::CodePipeline::Pipeline"]
    return {stage["Name"]: stage["Actions"] for stage in pipeline["Properties"]["Stages"]}


def _buildspec(template: dict[str, Any], action: dict[str, Any]) -> dict[str, Any]:
    project = template["Resources"][action["Configuration"]["ProjectName"]["Ref"]]
    return json.loads(project["Properties"]["Source"]["BuildSpec"])


def _deploys(actions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [a for a in actions if a["ActionTypeId"]["Provider"] == "CloudFormation"]


def test_environments_are_promoted_in_order_after_synth_and_self_mutation(stages: dict[str, Any]) -> None:
    names = list(stages)
    assert names[:3] == ["Source", "Build", "UpdatePipeline"]
    assert [n for n in names if n in ACCOUNTS] == ["dev", "staging", "prod"]
    assert names.index("UpdatePipeline") < names.index("dev")


def test_source_is_the_configured_connection(stages: dict[str, Any]) -> None:
    (source,) = stages["Source"]
    assert source["ActionTypeId"]["Provider"] == "CodeStarSourceConnection"
    assert source["Configuration"] == {
        "ConnectionArn": PIPELINE["connection_arn"],
        "FullRepositoryId": PIPELINE["repository"],
        "BranchName": PIPELINE["branch"],
    }


def test_synth_step_runs_the_readme_commands_on_python_311(template: dict[str, Any], stages: dict[str, Any]) -> None:
    (synth,) = stages["Build"]
    buildspec = _buildspec(template, synth)
    assert buildspec["phases"]["build"]["commands"] == list(SYNTH_COMMANDS) == ["make test", "make synth"]
    assert buildspec["phases"]["install"]["runtime-versions"] == {"python": "3.11"}
    assert buildspec["artifacts"]["base-directory"] == "cdk.out"


def test_every_stage_deploys_the_one_synthesized_assembly(stages: dict[str, Any]) -> None:
    """What reaches prod is what was deployed and smoke-tested in staging: one synth output feeds every deployment."""
    (synth,) = stages["Build"]
    (synth_output,) = [o["Name"] for o in synth["OutputArtifacts"]]
    builds = [a for actions in stages.values() for a in actions if a.get("OutputArtifacts") and a is not synth]
    assert [a["Name"] for a in builds] == [stages["Source"][0]["Name"]], "no other step produces templates"
    for environment in ACCOUNTS:
        inputs = {i["Name"] for a in _deploys(stages[environment]) for i in a.get("InputArtifacts", [])}
        assert inputs == {synth_output}


def test_pipeline_mutates_itself_with_the_pinned_cli(template: dict[str, Any], stages: dict[str, Any]) -> None:
    (mutate,) = stages["UpdatePipeline"]
    buildspec = _buildspec(template, mutate)
    assert f"npm install -g aws-cdk@{cdk_cli_version()}" in buildspec["phases"]["install"]["commands"]
    assert buildspec["phases"]["build"]["commands"][0].startswith("cdk -a . deploy PromotionPipeline ")


def test_manual_approval_gates_prod_only(stages: dict[str, Any]) -> None:
    approvals = [
        (stage, a) for stage, actions in stages.items() for a in actions if a["ActionTypeId"]["Category"] == "Approval"
    ]
    assert [stage for stage, _ in approvals] == ["prod"]
    approval = approvals[0][1]
    assert approval["RunOrder"] < min(a["RunOrder"] for a in _deploys(stages["prod"]))


@pytest.mark.parametrize("environment", list(ACCOUNTS))
def test_smoke_test_calls_the_endpoint_client_after_the_deployment(
    environment: str, template: dict[str, Any], stages: dict[str, Any]
) -> None:
    (smoke,) = _builds(stages[environment], "SmokeTest")
    assert smoke["RunOrder"] > max(a["RunOrder"] for a in _deploys(stages[environment]))
    variables = {v["name"]: v["value"] for v in json.loads(smoke["Configuration"]["EnvironmentVariables"])}
    assert variables["ENDPOINT_NAME"].startswith(f"#{{PromotionPipeline{environment}GravitonEndpoint")
    assert variables["ENDPOINT_NAME"].endswith(".EndpointName}")
    commands = _buildspec(template, smoke)["phases"]["build"]["commands"]
    assert commands[-1] == (
        "AWS_PROFILE=smoke-test python -m inference_assets.tools.endpoint_client smoke-test "
        f'--endpoint-name "$ENDPOINT_NAME" --region us-west-2 --expect-labels {EXPECTED_LABELS}'
    )
    project = template["Resources"][smoke["Configuration"]["ProjectName"]["Ref"]]
    role_arn = f"arn:aws:iam::{ACCOUNTS[environment]}:role/pytorch-platform-{environment}-pipeline-smoke-test"
    assert {"Name": "SMOKE_TEST_ROLE_ARN", "Type": "PLAINTEXT", "Value": role_arn} in project["Properties"][
        "Environment"
    ]["EnvironmentVariables"]
    grants = [
        s
        for r in template["Resources"].values()
        if r["Type"] == "AWS::IAM::Policy"
        for s in r["Properties"]["PolicyDocument"]["Statement"]
        if s["Action"] == "sts:AssumeRole" and s["Resource"] == role_arn
    ]
    assert len(grants) == 2, "the smoke test's and the model check's projects (image publication has its own role)"


def test_prod_is_smoke_tested_after_its_approval_and_deployment(stages: dict[str, Any]) -> None:
    """Every stage the pipeline deploys is smoke-tested, prod included (issue 38)."""
    (smoke,) = _builds(stages["prod"], "SmokeTest")
    (approval,) = [a for a in stages["prod"] if a["ActionTypeId"]["Category"] == "Approval"]
    assert approval["RunOrder"] < smoke["RunOrder"]


def _builds(actions: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [
        a for a in actions if a["ActionTypeId"]["Provider"] == "CodeBuild" and a["Name"].split(".")[-1].startswith(name)
    ]


def _deploy_order(actions: list[dict[str, Any]], stack: str) -> tuple[int, int]:
    """(first, last) RunOrder of the change-set actions of ``stack`` (e.g. "GravitonEndpoint") in a stage."""
    orders = [a["RunOrder"] for a in _deploys(actions) if a["Name"].startswith(f"{stack}.")]
    assert orders, [a["Name"] for a in _deploys(actions)]
    return min(orders), max(orders)


@pytest.mark.parametrize("environment", list(ACCOUNTS))
def test_model_check_runs_after_foundation_and_before_the_endpoint_deploys(
    environment: str, template: dict[str, Any], stages: dict[str, Any]
) -> None:
    """Never deploy an endpoint whose model is absent: the check needs the deployed bucket and role, and a failed
    check stops the stage before the Graviton endpoint's change set is even created."""
    actions = stages[environment]
    (check,) = _builds(actions, "ModelCheck")
    assert _deploy_order(actions, "Foundation")[1] < check["RunOrder"]
    assert _deploy_order(actions, "SmokeTestAccess")[1] < check["RunOrder"]
    assert check["RunOrder"] < _deploy_order(actions, "GravitonEndpoint")[0]
    if environment == "prod":
        (approval,) = [a for a in actions if a["ActionTypeId"]["Category"] == "Approval"]
        assert approval["RunOrder"] < check["RunOrder"]
    variables = {v["name"]: v["value"] for v in json.loads(check["Configuration"]["EnvironmentVariables"])}
    assert variables["ARTIFACTS_BUCKET"].startswith(f"#{{PromotionPipeline{environment}Foundation")
    assert variables["ARTIFACTS_BUCKET"].endswith(".ArtifactsBucketName}")
    commands = _buildspec(template, check)["phases"]["build"]["commands"]
    assert commands[-1] == (
        "AWS_PROFILE=smoke-test python -m inference_assets.tools.model_check "
        f'--bucket "$ARTIFACTS_BUCKET" --key {MODEL_KEY} --region us-west-2'
    )


@pytest.mark.parametrize("environment", list(ACCOUNTS))
def test_model_check_role_reads_only_the_model_archive_and_its_digest(environment: str, assembly: Path) -> None:
    folder = assembly / f"assembly-PromotionPipeline-{environment}"
    (template_file,) = folder.glob("*SmokeTestAccess*.template.json")
    resources = json.loads(template_file.read_text())["Resources"]
    (policy,) = [r for lid, r in resources.items() if lid.startswith("ModelCheckPolicy")]
    get, decrypt, listing = policy["Properties"]["PolicyDocument"]["Statement"]
    # The archive and the digest recorded beside it (the check refuses an archive replaced since it was written).
    assert get["Action"] == "s3:GetObject"
    assert [
        json.dumps(r).endswith(f'/{MODEL_KEY}{suffix}"]]}}')
        for r, suffix in zip(get["Resource"], ("", ".sha256"), strict=True)
    ] == [True, True]
    assert decrypt["Action"] == "kms:Decrypt"
    assert decrypt["Condition"] == {"StringEquals": {"kms:ViaService": "s3.us-west-2.amazonaws.com"}}
    assert listing["Action"] == "s3:ListBucket"
    assert listing["Condition"] == {"StringEquals": {"s3:prefix": "endpoints/sentiment/"}}
    assert [lid for lid in resources if lid.startswith("SmokeTestPolicy")], "every stage's role may smoke-test"


@pytest.mark.parametrize("environment", list(ACCOUNTS))
def test_smoke_test_role_in_the_target_account_only_describes_and_invokes(environment: str, assembly: Path) -> None:
    folder = assembly / f"assembly-PromotionPipeline-{environment}"
    (template_file,) = folder.glob("*SmokeTestAccess*.template.json")
    resources = json.loads(template_file.read_text())["Resources"]
    (role,) = [r for r in resources.values() if r["Type"] == "AWS::IAM::Role"
               and r["Properties"]["RoleName"] == f"pytorch-platform-{environment}-pipeline-smoke-test"]  # fmt: skip
    (trust,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert json.dumps(trust["Principal"]).count(f":iam::{TOOLING}:root") == 1
    (policy,) = [r for lid, r in resources.items() if lid.startswith("SmokeTestPolicy")]
    (statement,) = policy["Properties"]["PolicyDocument"]["Statement"]
    assert statement["Action"] == ["sagemaker:DescribeEndpoint", "sagemaker:InvokeEndpoint"]
    # Only the stage's endpoint (fixed name, lower-cased in its ARN), no wildcard.
    assert statement["Resource"] == (
        f"arn:aws:sagemaker:us-west-2:{ACCOUNTS[environment]}:endpoint/{environment}-gravitonendpoint"
    )
    manifest = json.loads((folder / "manifest.json").read_text())
    environments = {a["environment"] for a in manifest["artifacts"].values() if a["type"] == "aws:cloudformation:stack"}
    assert environments == {f"aws://{ACCOUNTS[environment]}/us-west-2"}


def _assumable_by(role: dict[str, Any], account: str, principal_arn: str) -> bool:
    """Whether the trust policy of ``role`` (in ``account``) lets ``principal_arn`` assume it. Cross-account, the
    trust policy must allow on its own (the caller's identity policy allows sts:AssumeRole on the role: the step's
    role_policy_statements): it names the caller's account and its condition holds. The evaluator models
    same-account decisions, so the trust statement is evaluated as the only grant."""
    trust = resolve(role["Properties"]["AssumeRolePolicyDocument"], refs={"AWS::Partition": "aws",
                                                                          "AWS::AccountId": account})  # fmt: skip
    role_arn = f"arn:aws:iam::{account}:role/{role['Properties']['RoleName']}"
    caller_account = principal_arn.split(":")[4]
    context = {"aws:PrincipalArn": principal_arn, "aws:PrincipalAccount": caller_account}
    (statement,) = trust["Statement"]
    as_grant = {k: v for k, v in statement.items() if k != "Principal"} | {"Resource": role_arn}
    return statement["Principal"] == {"AWS": f"arn:aws:iam::{caller_account}:root"} and is_allowed(
        [{"Statement": [as_grant]}], Request("sts:AssumeRole", role_arn, context)
    )


def _step_role_arns(template: dict[str, Any], environment: str) -> dict[str, str]:
    """The ARNs of the tooling account's roles of the environment's cross-account steps, by step (their fixed
    names, read from the pipeline's template)."""
    roles = [r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::IAM::Role"]
    names = {role["RoleName"] for role in roles if f"-{environment}-pipeline-" in role.get("RoleName", "")}
    return {name.rsplit("-", 1)[1]: f"arn:aws:iam::{TOOLING}:role/{name}" for name in names}


@pytest.mark.parametrize("environment", list(ACCOUNTS))
def test_each_environment_role_is_assumed_by_exactly_its_steps_role(
    environment: str, assembly: Path, template: dict[str, Any]
) -> None:
    """Issue 41.5: the smoke-test role is assumed by the model-check and smoke-test steps' roles, the image-publishing
    role by the image-publishing step's role, each by exact ARN: not by the pipeline's other roles (self-mutation,
    asset publishing, the other steps), nor by any role named like the pipeline stack, nor by any other principal."""
    folder = assembly / f"assembly-PromotionPipeline-{environment}"
    (template_file,) = folder.glob("*SmokeTestAccess*.template.json")
    resources = json.loads(template_file.read_text())["Resources"]
    roles = {r["Properties"]["RoleName"].rsplit("-pipeline-", 1)[1]: r
             for r in resources.values() if r["Type"] == "AWS::IAM::Role"}  # fmt: skip
    steps = _step_role_arns(template, environment)
    assert set(steps) == {"ModelCheck", "SmokeTest", "PublishImages"}
    expected = {"smoke-test": {"ModelCheck", "SmokeTest"}, "image-publishing": {"PublishImages"}}
    assert set(roles) == set(expected)
    account = ACCOUNTS[environment]
    others = [f"arn:aws:iam::{TOOLING}:role/PromotionPipeline-PipelineUpdatePipelineSelfMutationRole-1A2B",
              f"arn:aws:iam::{TOOLING}:role/PromotionPipeline-PipelineAssetsFileRole-9XYZ",
              f"arn:aws:iam::{TOOLING}:role/developer", f"arn:aws:iam::{TOOLING}:user/ci-bot",
              f"arn:aws:iam::{account}:role/pytorch-platform-{environment}-pipeline-SmokeTest"]  # fmt: skip
    for kind, role in roles.items():
        for step, arn in steps.items():
            assert _assumable_by(role, account, arn) is (step in expected[kind]), (kind, step)
        assert not any(_assumable_by(role, account, arn) for arn in others), kind
    # Only the image-publishing role writes the image parameters.
    writers = [r for lid, r in resources.items() if lid.startswith("ImagePromotionPolicy")]
    (writer,) = writers
    (role_ref,) = writer["Properties"]["Roles"]
    assert resources[role_ref["Ref"]]["Properties"]["RoleName"].endswith("-image-publishing")


@pytest.mark.parametrize("environment", list(ACCOUNTS))
def test_stages_deploy_cross_account_through_the_bootstrap_roles(environment: str, stages: dict[str, Any]) -> None:
    role = f":iam::{ACCOUNTS[environment]}:role/cdk-hnb659fds-deploy-role-{ACCOUNTS[environment]}-us-west-2"
    deploys = _deploys(stages[environment])
    assert deploys and all(role in json.dumps(a["RoleArn"]) for a in deploys)


def test_artifacts_and_build_logs_are_encrypted_with_the_pipeline_key(template: dict[str, Any]) -> None:
    resources = template["Resources"]
    (key_id,) = [lid for lid, r in resources.items() if r["Type"] == "AWS::KMS::Key"]
    assert resources[key_id]["Properties"]["EnableKeyRotation"] is True
    key_arn = {"Fn::GetAtt": [key_id, "Arn"]}
    (pipeline,) = [r for r in resources.values() if r["Type"] == "AWS::CodePipeline::Pipeline"]
    assert pipeline["Properties"]["ArtifactStore"]["EncryptionKey"] == {"Id": key_arn, "Type": "KMS"}
    bucket_id = pipeline["Properties"]["ArtifactStore"]["Location"]["Ref"]
    sse = resources[bucket_id]["Properties"]["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]
    assert sse["ServerSideEncryptionByDefault"] == {"KMSMasterKeyID": key_arn, "SSEAlgorithm": "aws:kms"}
    assert "LoggingConfiguration" in resources[bucket_id]["Properties"]
    projects = [r for r in resources.values() if r["Type"] == "AWS::CodeBuild::Project"]
    assert projects and all(p["Properties"]["EncryptionKey"] == key_arn for p in projects)
    (logs,) = [r for r in resources.values() if r["Type"] == "AWS::Logs::LogGroup"]
    # A year: CT.CLOUDWATCH.PR.2.
    assert logs["Properties"]["KmsKeyId"] == key_arn and logs["Properties"]["RetentionInDays"] == 365
    # Every key policy statement for another account is for the stage accounts' bootstrap roles.
    key_policy = json.dumps(resources[key_id]["Properties"]["KeyPolicy"])
    for account in ACCOUNTS.values():
        assert f":iam::{account}:role/cdk-hnb659fds-deploy-role-{account}-us-west-2" in key_policy


def test_app_adds_the_pipeline_of_all_environments_whenever_settings_exist(cdk_context: dict[str, Any]) -> None:
    """`pipeline` settings add the pipeline of the real PlatformStage, with every environment even when -c env=...
    narrows the top-level stages (`make synth` passes -c env, and the pipeline's synth step runs `make synth`)."""
    for selection in ({}, {"env": "dev"}):
        app = build_app(context={**cdk_context, "pipeline": PIPELINE, **selection}, **WITHOUT_BUILTIN_VALIDATION)
        pipeline = app.node.try_find_child("PromotionPipeline")
        assert isinstance(pipeline, PromotionPipelineStack)
        assert [stage.node.id for stage in pipeline.stages] == list(cdk_context["environments"])
        assert all(type(stage) is PlatformStage for stage in pipeline.stages)
    assert build_app(context={**cdk_context, "env": "dev"}).node.try_find_child("PromotionPipeline") is None


def test_pipeline_templates_lint_clean(assembly: Path) -> None:
    """cfn-lint, zero errors and warnings, on the templates this module owns (the stage stacks lint in their own
    stacks' tests)."""
    templates = [
        assembly / "PromotionPipeline.template.json",
        *assembly.glob("assembly-*/*SmokeTestAccess*.template.json"),
    ]
    assert len(templates) == 4
    assert [str(match) for template in templates for match in lint_file(template)] == []


def test_environments_outside_the_pipeline_region_are_refused(cdk_context: dict[str, Any]) -> None:
    environments = load_environments(cdk_context["environments"], None)
    environments[1] = environments[1].model_copy(update={"region": "eu-west-1"})
    with pytest.raises(SettingsError) as error:
        PromotionPipelineStack(cdk.App(), "Pipeline", settings=load_pipeline(PIPELINE), environments=environments)
    assert str(error.value) == (
        "environments.staging.region: the promotion pipeline deploys within its own region (us-west-2); "
        "set pipeline.region to eu-west-1 or deploy staging with cdk deploy."
    )


def test_the_iam_analysers_pass_on_the_pipeline_and_its_stages(assembly: Path) -> None:
    """parliament and cloudsplaining (the gates' scripts/iam_analysers.py) over the pipeline's roles too, with the
    exceptions written for them."""
    analysed = iam_analysers.run(assembly)
    assert analysed["open"] == [] and analysed["stale_exceptions"] == [], analysed["open"][:5]
    pipeline = {f["principal"] for f in analysed["excused"] if f["stack"] == "PromotionPipeline"}
    assert any(name.startswith("Images") for name in pipeline)


def test_the_pipeline_templates_pass_checkov(assembly: Path, tmp_path: Path) -> None:
    """checkov, as `make synth` runs it (.checkov.yaml), over the pipeline's own templates: the stack and the role
    it deploys into each environment (the stages' other stacks are the session's, gated in tests/scripts)."""
    for template in [
        assembly / "PromotionPipeline.template.json",
        *assembly.glob("assembly-*/*SmokeTestAccess*.template.json"),
    ]:
        shutil.copy(template, tmp_path / template.name)
    scan = template_gates.checkov(tmp_path)
    counts = template_gates.checkov_counts(scan.stdout)
    assert scan.returncode == 0 and counts["failed"] == 0 and counts["passed"] > 50, scan.stdout[-3000:]
