"""The ops review and its diff: on a small synthesized app (old and new version) and on the real platform."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_applicationautoscaling as appscaling
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sagemaker as sagemaker

from mme_sizing.plan import SizingInputs, predict, table_rows
from ops_review.__main__ import main
from ops_review.diff import diff_reviews
from ops_review.review import load_prices, review_assembly
from stacks.compliance import acknowledge, add_template_aspects
from stacks.settings import parse_environment

PRICES = load_prices()["regions"]["us-west-2"]
ACK_REASON = "Endpoints read any model version under the models/ prefix."


# Long: a small app of every resource kind the review reads, synthesized once for the module
def synth_serving_app(outdir: Path, *, wildcard: bool, kms_bucket: bool, instances: int) -> Path:
    """A one-stack 'dev' stage: role, model bucket, endpoint on ml.c7g.xlarge, GPU launch template, VPC rules."""
    app = cdk.App(outdir=str(outdir))
    stage = cdk.Stage(app, "dev", env=cdk.Environment(account="111111111111", region="us-west-2"))
    add_template_aspects(stage)
    stack = cdk.Stack(stage, "Serving")
    key = kms.Key(stack, "Key", enable_key_rotation=True)
    bucket = s3.Bucket(
        stack,
        "Models",
        encryption=s3.BucketEncryption.KMS if kms_bucket else s3.BucketEncryption.S3_MANAGED,
        encryption_key=key if kms_bucket else None,
        enforce_ssl=True,
        block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
        removal_policy=cdk.RemovalPolicy.RETAIN,
    )
    role = iam.Role(stack, "EndpointRole", assumed_by=iam.ServicePrincipal("sagemaker.amazonaws.com"))
    role.add_to_policy(iam.PolicyStatement(actions=["s3:GetObject"], resources=[bucket.arn_for_objects("models/*")]))
    if wildcard:
        role.add_to_policy(iam.PolicyStatement(actions=["s3:*"], resources=[bucket.arn_for_objects("*")]))
    acknowledge(role, ACK_REASON, "AwsSolutions-IAM5")
    vpc = ec2.Vpc(
        stack,
        "Vpc",
        max_azs=1,
        nat_gateways=0,
        subnet_configuration=[ec2.SubnetConfiguration(name="Private", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED)],
    )
    s3_endpoint = vpc.add_gateway_endpoint("S3", service=ec2.GatewayVpcEndpointAwsService.S3)
    s3_endpoint.add_to_policy(
        iam.PolicyStatement(
            principals=[iam.AnyPrincipal()],
            actions=["s3:*"],
            resources=["*"],
            conditions={"StringEquals": {"aws:PrincipalAccount": "111111111111"}},
        )
    )
    group = ec2.SecurityGroup(stack, "Workload", vpc=vpc, allow_all_outbound=False)
    group.add_ingress_rule(ec2.Peer.ipv4("10.0.0.0/16"), ec2.Port.tcp(443), "HTTPS from the VPC")
    model = sagemaker.CfnModel(
        stack,
        "Model",
        execution_role_arn=role.role_arn,
        primary_container=sagemaker.CfnModel.ContainerDefinitionProperty(
            image="763104351884.dkr.ecr.us-west-2.amazonaws.com/pytorch-inference-arm64:2.6.0-cpu-py312-ubuntu22.04-sagemaker",
            model_data_url=f"s3://{bucket.bucket_name}/models/model.tar.gz",
        ),
    )
    config = sagemaker.CfnEndpointConfig(
        stack,
        "Config",
        kms_key_id=key.key_arn,
        production_variants=[
            sagemaker.CfnEndpointConfig.ProductionVariantProperty(
                variant_name="AllTraffic",
                model_name=model.attr_model_name,
                instance_type="ml.c7g.xlarge",
                initial_instance_count=instances,
                initial_variant_weight=1,
            )
        ],
    )
    endpoint = sagemaker.CfnEndpoint(stack, "Endpoint", endpoint_config_name=config.attr_endpoint_config_name)
    appscaling.CfnScalableTarget(
        stack,
        "Scaling",
        service_namespace="sagemaker",
        scalable_dimension="sagemaker:variant:DesiredInstanceCount",
        resource_id=f"endpoint/{endpoint.attr_endpoint_name}/variant/AllTraffic",
        min_capacity=instances,
        max_capacity=4,
    )
    ec2.CfnLaunchTemplate(
        stack,
        "Training",
        launch_template_data={
            "instanceType": "p4d.24xlarge",
            "metadataOptions": {"httpTokens": "required", "httpPutResponseHopLimit": 1},
        },
    )
    app.synth()
    return outdir


@pytest.fixture(scope="module")
def old_and_new(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("review")
    old = synth_serving_app(folder / "old", wildcard=False, kms_bucket=True, instances=1)
    new = synth_serving_app(folder / "new", wildcard=True, kms_bucket=False, instances=2)
    return old, new


@pytest.fixture(scope="module")
def old_review(old_and_new: tuple[Path, Path]) -> dict[str, Any]:
    return review_assembly(old_and_new[0])["dev"]["Serving"]


def _statements(review: dict[str, Any], principal_prefix: str) -> list[dict[str, Any]]:
    (principal,) = [name for name in review["iam"] if name.startswith(principal_prefix)]
    return review["iam"][principal]["statements"]


def test_review_lists_principals_with_actions_resources_and_wildcard_flags(
    old_and_new: tuple[Path, Path], old_review: dict[str, Any]
) -> None:
    (statement,) = _statements(old_review, "EndpointRole")
    assert statement["actions"] == ["s3:GetObject"]
    (resource,) = statement["resources"]
    assert resource.startswith("${Models") and resource.endswith(".Arn}/models/*")
    assert statement["wildcard_resources"] and not statement["wildcard_actions"]
    new_statements = _statements(review_assembly(old_and_new[1])["dev"]["Serving"], "EndpointRole")
    assert any(s["actions"] == ["s3:*"] and s["wildcard_actions"] for s in new_statements)
    role = next(entry for name, entry in old_review["iam"].items() if name.startswith("EndpointRole"))
    assert role["trusted_by"] == ["sagemaker.amazonaws.com"]


def test_review_reports_encryption_retention_exposure_and_acknowledgements(old_review: dict[str, Any]) -> None:
    encryption = {e["type"]: e for e in old_review["encryption"]}
    assert encryption["AWS::S3::Bucket"]["encrypted_with"] == "kms"
    assert encryption["AWS::SageMaker::EndpointConfig"]["encrypted_with"] == "kms"
    assert encryption["AWS::KMS::Key"]["rotation"] is True
    retention = {r["type"]: r for r in old_review["retention"]}
    assert retention["AWS::S3::Bucket"]["deletion_policy"] == "Retain"
    assert retention["AWS::KMS::Key"]["deletion_policy"] == "Retain"
    network = old_review["network"]
    assert network["open_ingress"] == [] and network["public_subnets"] == [] and network["nat_gateways"] == 0
    rules = [rule["summary"] for rules in network["security_groups"].values() for rule in rules]
    assert "ingress tcp 443-443 from 10.0.0.0/16" in rules
    acknowledged = {(a["rule"], a["reason"]) for a in old_review["acknowledgements"]}
    assert ("AwsSolutions-IAM5", ACK_REASON) in acknowledged
    assert old_review["resources_by_type"]["AWS::SageMaker::Endpoint"] == 1


def test_review_prices_the_running_endpoint_and_the_training_run_separately(old_review: dict[str, Any]) -> None:
    cost = old_review["cost"]
    (variant,) = cost["always_on"]
    assert (variant["instance_type"], variant["count"]) == ("ml.c7g.xlarge", 1)
    assert cost["always_on_hourly_usd"] == pytest.approx(PRICES["sagemaker_hosting"]["ml.c7g.xlarge"])
    assert variant["max_count"] == 4  # from the variant's scalable target
    assert cost["always_on_max_hourly_usd"] == pytest.approx(4 * PRICES["sagemaker_hosting"]["ml.c7g.xlarge"])
    (launch_template,) = cost["per_training_run"]
    assert launch_template["instance_type"] == "p4d.24xlarge"
    assert cost["per_training_run_hourly_usd_per_node"] == pytest.approx(PRICES["ec2"]["p4d.24xlarge"])
    assert cost["prices_as_of"] and cost["unpriced"] == []
    # What each priced instance is, from AWS's specifications (instancetypes/co.html and ac.html).
    assert variant["hardware"] == "4 vCPUs, 8 GiB"
    assert launch_template["hardware"] == "96 vCPUs, 1152 GiB, 8 x A100"


def test_every_priced_instance_type_is_one_the_service_offers() -> None:
    """The price table prices types the instance facts hold, each under a use SageMaker offers it for."""
    from platform_facts.instances import instance_type

    for region in load_prices()["regions"].values():
        for section, use in (("sagemaker_hosting", "hosting"), ("sagemaker_training", "training"), ("ec2", None)):
            for name in region[section]:
                facts = instance_type(name)
                assert name.startswith("ml.") is (use is not None), name
                assert use is None or facts.offered(use), (name, use)


def test_review_marks_instance_types_missing_from_the_price_table(old_and_new: tuple[Path, Path]) -> None:
    prices = load_prices()
    del prices["regions"]["us-west-2"]["sagemaker_hosting"]["ml.c7g.xlarge"]
    cost = review_assembly(old_and_new[0], prices)["dev"]["Serving"]["cost"]
    assert cost["unpriced"] == ["SageMaker endpoint variant (initial instance count): ml.c7g.xlarge"]
    assert cost["always_on_hourly_usd"] == 0


def test_diff_catches_added_wildcard_removed_encryption_and_cost_increase(
    old_and_new: tuple[Path, Path], tmp_path: Path
) -> None:
    old, new = old_and_new
    assert main(["--diff", str(old), str(new), "--out", str(tmp_path)]) == 0
    diff = json.loads((tmp_path / "diff.json").read_text())
    findings = diff["findings"]
    assert any("wildcard permission added" in f and "EndpointRole" in f and "may s3:* on" in f for f in findings)
    assert any("encryption weakened on Models" in f and "kms -> sse-s3" in f for f in findings)
    price = PRICES["sagemaker_hosting"]["ml.c7g.xlarge"]
    assert f"dev/Serving: always-on cost up ${price:.4f}/h (${price:.4f} -> ${2 * price:.4f})" in findings
    assert len(findings) == 3, findings
    assert "## Findings" in (tmp_path / "diff.md").read_text()
    changes = diff["stacks"]["dev/Serving"]
    assert changes["encryption"]
    assert any(grant[2] == "s3:*" for grant in changes["permissions_added"])


def test_reverse_and_identical_diffs_raise_no_findings(old_and_new: tuple[Path, Path], tmp_path: Path) -> None:
    old, new = old_and_new
    assert main(["--diff", str(new), str(old), "--out", str(tmp_path / "reverse")]) == 0
    assert json.loads((tmp_path / "reverse" / "diff.json").read_text())["findings"] == []
    assert main(["--diff", str(old), str(old), "--out", str(tmp_path / "same")]) == 0
    assert json.loads((tmp_path / "same" / "diff.json").read_text()) == {
        "findings": [],
        "stacks": {},
        "replaced": [],
        "refused": [],
    }


def test_review_of_the_platform_writes_markdown_and_json_per_environment(
    platform_assembly: Path, cdk_context: dict[str, Any], tmp_path: Path
) -> None:
    assert main([str(platform_assembly), "--out", str(tmp_path)]) == 0
    for environment in cdk_context["environments"]:
        review = json.loads((tmp_path / f"{environment}.json").read_text())
        assert review["environment"] == environment
        foundation = review["stacks"]["Foundation"]
        buckets = {
            e["resource"]: e["encrypted_with"] for e in foundation["encryption"] if e["type"] == "AWS::S3::Bucket"
        }
        assert sorted(buckets.values()) == [
            "kms",
            "kms",
            "kms",
            "sse-s3",
        ]  # the access-log bucket is SSE-S3 by necessity
        vpc = parse_environment(environment, cdk_context["environments"][environment]).vpc
        network = foundation["network"]
        assert network["nat_gateways"] == min(vpc.nat_gateways, vpc.max_azs)
        assert len(network["public_subnets"]) == (vpc.max_azs if vpc.nat_gateways else 0)  # the NAT gateways' subnets
        assert network["open_ingress"] == []
        nat_cost = network["nat_gateways"] * PRICES["network"]["nat_gateway"]
        assert foundation["cost"]["always_on_hourly_usd"] > nat_cost  # plus the interface endpoints
        assert any(a["rule"] == "AwsSolutions-IAM5[Resource::*]" for a in foundation["acknowledgements"])
        markdown = (tmp_path / f"{environment}.md").read_text()
        assert markdown.startswith(f"# Ops review: {environment}") and "### cdk-nag acknowledgements" in markdown
    assert "[dev](dev.md)" in (tmp_path / "index.md").read_text()


def test_review_predicts_each_multi_model_endpoint_like_mme_plan(
    platform_assembly: Path, cdk_context: dict[str, Any], tmp_path: Path
) -> None:
    assert main([str(platform_assembly), "--out", str(tmp_path)]) == 0
    for environment in ("dev", "staging", "prod"):
        review = json.loads((tmp_path / f"{environment}.json").read_text())
        (entry,) = review["stacks"]["MultiModelEndpoint"]["multi_model_sizing"]
        assert [row[0] for row in entry["rows"]] == ["uniform", "hot-model", "top-10"]
        # The inputs come from the template alone, and the plan is the one the command prints from cdk.json.
        settings = parse_environment(environment, cdk_context["environments"][environment]).multi_model_endpoint
        plan = predict(SizingInputs.from_settings(settings))
        assert entry["rows"] == table_rows(plan) and entry["advice"] == list(plan.advice)
        markdown = (tmp_path / f"{environment}.md").read_text()
        section = markdown.split("### Multi-model endpoint sizing\n", 1)[1].split("\n### ", 1)[0]
        pattern_rows = [line.split(" | ")[0] for line in section.splitlines() if line.startswith("| ")][1:]
        assert pattern_rows == ["| uniform", "| hot-model", "| top-10"]
        assert review["stacks"]["Foundation"]["multi_model_sizing"] == []  # only endpoints with sizing inputs


def test_cli_explains_a_missing_cloud_assembly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "nothing"), "--out", str(tmp_path / "review")]) == 2
    assert "not a cloud assembly (no manifest.json); run `make synth` first." in capsys.readouterr().err


# --- the diff raises every weakening injected into an otherwise unchanged template --------------------------------


def _of_type(resources: dict[str, Any], resource_type: str) -> dict[str, Any]:
    (resource,) = (r for r in resources.values() if r["Type"] == resource_type)
    return resource


def _inject(resources: dict[str, Any], change: str) -> None:
    """Weaken the template as a careless change would."""
    if change == "trust anyone":
        role = _of_type(resources, "AWS::IAM::Role")
        role["Properties"]["AssumeRolePolicyDocument"]["Statement"][0]["Principal"] = {"AWS": "*"}
    elif change == "public-access block removed":
        del _of_type(resources, "AWS::S3::Bucket")["Properties"]["PublicAccessBlockConfiguration"]
    elif change == "IMDS optional":
        data = _of_type(resources, "AWS::EC2::LaunchTemplate")["Properties"]["LaunchTemplateData"]
        data["MetadataOptions"]["HttpTokens"] = "optional"
    elif change == "TLS-only statement removed":
        policy = _of_type(resources, "AWS::S3::BucketPolicy")["Properties"]["PolicyDocument"]
        policy["Statement"] = [
            s for s in policy["Statement"] if "aws:SecureTransport" not in json.dumps(s.get("Condition", {}))
        ]
        policy["Statement"].append({"Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::111111111111:root"},
                                    "Action": "s3:GetObject", "Resource": "arn:aws:s3:::models/m.tar.gz"})  # fmt: skip
    elif change == "egress to all traffic":
        group = _of_type(resources, "AWS::EC2::SecurityGroup")["Properties"]
        group["SecurityGroupEgress"] = [{"CidrIp": "0.0.0.0/0", "IpProtocol": "-1", "Description": "all"}]
    elif change == "endpoint policy removed":
        del _of_type(resources, "AWS::EC2::VPCEndpoint")["Properties"]["PolicyDocument"]
    elif change == "NotAction grant":
        role = _of_type(resources, "AWS::IAM::Role")
        role["Properties"]["Policies"] = [
            {
                "PolicyName": "Escape",
                "PolicyDocument": {
                    "Version": "2012-10-17",
                    "Statement": [{"Effect": "Allow", "NotAction": "iam:*", "NotResource": "arn:aws:s3:::audit/*"}],
                },
            }
        ]
    else:
        raise ValueError(change)


def _diff_with(old: Path, tmp_path: Path, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    new = tmp_path / "changed"
    shutil.copytree(old, new)
    (template_file,) = new.glob("assembly-dev/*.template.json")
    template = json.loads(template_file.read_text())
    change(template["Resources"])
    template_file.write_text(json.dumps(template))
    return diff_reviews(review_assembly(old), review_assembly(new))


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ("trust anyone", "dev/Serving: trust policy of EndpointRole1A3BA5E6 lets anyone (*) assume it"),
        (
            "public-access block removed",
            "dev/Serving: S3 public-access block removed on ModelsC55D3500 (off: BlockPublicAcls, BlockPublicPolicy, "
            "IgnorePublicAcls, RestrictPublicBuckets)",
        ),
        (
            "IMDS optional",
            "dev/Serving: IMDSv2 not required on Training (HttpTokens optional): IMDSv1 requests can read the "
            "instance role's credentials",
        ),
        ("TLS-only statement removed", "dev/Serving: TLS-only statement removed from the policy of ModelsC55D3500"),
        (
            "egress to all traffic",
            "dev/Serving: egress to the internet on all traffic added: Workload692FF5F4: egress all all to 0.0.0.0/0",
        ),
        (
            "endpoint policy removed",
            "dev/Serving: VPC endpoint VpcS3A5408339 lost its endpoint policy (it now passes any principal to any "
            "resource)",
        ),
        (
            "NotAction grant",
            "dev/Serving: wildcard permission added: EndpointRole1A3BA5E6 may everything except iam:* on everything "
            "except arn:aws:s3:::audit/*",
        ),
    ],
)
def test_diff_raises_each_injected_weakening_as_a_finding(
    old_and_new: tuple[Path, Path], tmp_path: Path, change: str, expected: str
) -> None:
    diff = _diff_with(old_and_new[0], tmp_path, lambda resources: _inject(resources, change))
    assert diff["findings"] == [expected]


def test_not_action_and_not_resource_are_shown_as_exclusions(old_and_new: tuple[Path, Path], tmp_path: Path) -> None:
    diff = _diff_with(old_and_new[0], tmp_path, lambda resources: _inject(resources, "NotAction grant"))
    (grant,) = diff["stacks"]["dev/Serving"]["permissions_added"]
    assert list(grant[1:4]) == ["Allow", "NOT iam:*", "NOT arn:aws:s3:::audit/*"]
    new = tmp_path / "changed"
    statement = next(s for s in _statements(review_assembly(new)["dev"]["Serving"], "EndpointRole") if s["not_action"])
    assert statement["not_resource"] and statement["wildcard_actions"] and statement["wildcard_resources"]
    assert main([str(new), "--out", str(tmp_path / "review")]) == 0
    markdown = (tmp_path / "review" / "dev.md").read_text()
    assert "NOT iam:*" in markdown and "NOTACTION: every other action" in markdown


def test_service_trust_and_narrow_egress_are_not_findings(old_and_new: tuple[Path, Path], tmp_path: Path) -> None:
    def change(resources: dict[str, Any]) -> None:
        role = _of_type(resources, "AWS::IAM::Role")
        role["Properties"]["AssumeRolePolicyDocument"]["Statement"][0]["Principal"] = {"Service": "ec2.amazonaws.com"}
        group = _of_type(resources, "AWS::EC2::SecurityGroup")["Properties"]
        group["SecurityGroupEgress"] = [{"CidrIp": "0.0.0.0/0", "IpProtocol": "tcp", "FromPort": 443, "ToPort": 443}]

    diff = _diff_with(old_and_new[0], tmp_path, change)
    assert diff["findings"] == []
    assert diff["stacks"]["dev/Serving"]["trust_added"] == [("EndpointRole1A3BA5E6", "Allow", "ec2.amazonaws.com", "")]


def test_endpoint_policies_are_reviewed_but_their_stars_are_not_grants(old_review: dict[str, Any]) -> None:
    (policy,) = [p for p in old_review["resource_policies"] if p["policy_type"] == "AWS::EC2::VPCEndpoint"]
    assert policy["actions"] == ["s3:*"] and policy["public"] is False  # "*" is the endpoint policy's own principal
    (endpoint,) = old_review["network"]["vpc_endpoints"]
    assert endpoint["policy"] is True


def test_review_lists_what_each_principal_can_do_to_which_resource(platform_assembly: Path, tmp_path: Path) -> None:
    """Per principal, by service: the actions, the resources named after their constructs (an import named through
    the stack that exports it), and the conditions, in the JSON and the Markdown."""
    review = review_assembly(platform_assembly)["dev"]
    # The platform's launcher holds the launch grant; the people's TrainingLauncherPolicy only invokes it.
    (people,) = [e for n, e in review["Training"]["iam"].items() if n.startswith("TrainingLauncherPolicy")]
    assert [(row["service"], row["actions"]) for row in people["access"]] == [("lambda", ["InvokeFunction"])]
    (launcher,) = [e for n, e in review["Training"]["iam"].items()
                   if n == "TrainingLauncher/Role" or n.startswith("TrainingLauncherRole")]  # fmt: skip
    text = json.dumps(launcher["access"])
    assert "Fn::" not in text and '"Ref"' not in text and "import(" not in text
    run = [row for row in launcher["access"] if row["service"] == "ec2" and row["actions"] == ["RunInstances"]]
    assert len(run) == 5  # one statement per resource type, each with its conditions
    conditions = {c for row in run for c in row["conditions"]}
    assert "StringEquals ec2:MetadataHttpTokens: required" in conditions
    assert any(c.startswith("ArnLike ec2:InstanceProfile: Foundation/TrainingInstanceProfile") for c in conditions)
    (pass_role,) = [row for row in launcher["access"] if row["service"] == "iam"]
    assert pass_role["actions"] == ["PassRole"] and pass_role["resources"][0].startswith(
        "Foundation/TrainingInstanceRole"
    )
    # One job role per @remote caller (training.remote_callers: dev declares two).
    role, _ = [e for n, e in review["Foundation"]["iam"].items() if n.startswith("RemoteJobRole")]
    services = [row["service"] for row in role["access"]]
    assert services == sorted(services) and {"s3", "kms", "logs", "ecr"} <= set(services)
    assert any(r.startswith("Datasets") for row in role["access"] if row["service"] == "s3" for r in row["resources"])
    assert main([str(platform_assembly), "--out", str(tmp_path)]) == 0
    markdown = (tmp_path / "dev.md").read_text()
    assert "| service | effect | actions | resources | conditions | flags | policy |" in markdown
    assert "StringEquals ec2:MetadataHttpTokens: required" in markdown
