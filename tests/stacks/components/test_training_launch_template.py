"""TrainingLaunchTemplate on a bare stack: the template a run launches from, and grant_launch's RunInstances scope,
checked by evaluating the granted policy against RunInstances requests (each resource of a request must be allowed,
as EC2 authorizes RunInstances per resource)."""

from __future__ import annotations

import fnmatch
import json
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk.assertions import Template

from stacks.components.training_launch_template import KEEP_LOGICAL_IDS, TrainingLaunchTemplate, TrainingRun
from tests.stacks.components.bare_stack import launch_data, resources

ACCOUNT, REGION = "111122223333", "us-west-2"
DLAMI = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"


def _build(*, instance_type: str = "g5.2xlarge", efa: bool = False, nodes: int = 1) -> dict[str, Any]:
    stack = cdk.Stack(cdk.App(), "Bare", env=cdk.Environment(account=ACCOUNT, region=REGION))
    vpc = ec2.Vpc(stack, "Vpc", max_azs=2, nat_gateways=1)
    role = iam.Role(stack, "InstanceRole", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"))
    template = TrainingLaunchTemplate(
        stack,
        KEEP_LOGICAL_IDS,
        vpc=vpc,
        subnet=vpc.private_subnets[1],
        instance_type=instance_type,
        image_ssm_parameter=DLAMI,
        instance_role=role,
        instance_profile=iam.InstanceProfile(stack, "Profile", role=role),
        key=kms.Key(stack, "Key", enable_key_rotation=True),
        run=TrainingRun(
            code={"training_assets": "s3://code-bucket/training.zip"},
            environment={"DATASET": "tweet_eval:sentiment", "TRAIN_ARGS": "--epochs 3 --bf16"},
            run_command="bash training_assets/ec2_run.sh",
            ship_logs_script="training_assets/ship_logs.py",
            log_group_name="training-logs",
            max_run_hours=6,
        ),
        efa=efa,
        nodes=nodes,
    )
    launcher = iam.ManagedPolicy(stack, "Launcher")
    template.grant_launch(launcher)
    operator = iam.Role(stack, "Operator", assumed_by=iam.AccountRootPrincipal())
    template.grant_launch(operator)
    return Template.from_stack(stack).to_json()


@pytest.fixture(scope="module")
def single() -> dict[str, Any]:
    return _build()


@pytest.fixture(scope="module")
def efa() -> dict[str, Any]:
    return _build(instance_type="p4d.24xlarge", efa=True, nodes=2)


def test_logical_ids_are_those_of_direct_children_of_the_stack(single: dict[str, Any]) -> None:
    names = set(single["Resources"])
    assert {"TrainingLaunchTemplate049E303C", "TrainingSecurityGroup8F11F539"} <= names


def test_the_template_pins_image_type_volume_imds_and_subnet(single: dict[str, Any]) -> None:
    data = launch_data(single)
    assert data["ImageId"] == f"resolve:ssm:{DLAMI}"
    assert data["InstanceType"] == "g5.2xlarge"
    assert data["MetadataOptions"] == {
        "HttpTokens": "required",
        "HttpPutResponseHopLimit": 1,
    }  # host only (CT.EC2.PR.2)
    assert data["InstanceInitiatedShutdownBehavior"] == "terminate"
    (volume,) = data["BlockDeviceMappings"]
    assert volume["Ebs"]["Encrypted"] is True and volume["Ebs"]["KmsKeyId"]["Fn::GetAtt"][0].startswith("Key")
    (interface,) = data["NetworkInterfaces"]
    assert interface["SubnetId"]["Ref"].startswith("VpcPrivateSubnet2"), "the subnet passed in, not the first"
    assert interface["AssociatePublicIpAddress"] is False and "InterfaceType" not in interface
    assert "Placement" not in data and not resources(single, "AWS::EC2::PlacementGroup")
    tags = {t["Key"]: t["Value"] for spec in data["TagSpecifications"] for t in spec["Tags"]}
    assert tags["Name"] == "Bare/TrainingLaunchTemplate", "the hidden Default id stays out of instance names"


def test_efa_puts_an_interface_on_each_card_in_one_subnet_and_a_cluster_group(efa: dict[str, Any]) -> None:
    data = launch_data(efa)
    cards = [(i["NetworkCardIndex"], i["DeviceIndex"], i["InterfaceType"]) for i in data["NetworkInterfaces"]]
    assert cards == [(0, 0, "efa"), (1, 1, "efa"), (2, 1, "efa"), (3, 1, "efa")]
    assert len({json.dumps(i["SubnetId"]) for i in data["NetworkInterfaces"]}) == 1
    ((_, group),) = resources(efa, "AWS::EC2::PlacementGroup").items()
    assert group["Properties"]["Strategy"] == "cluster"
    ((sg_id, _),) = resources(efa, "AWS::EC2::SecurityGroup").items()
    (ingress,) = resources(efa, "AWS::EC2::SecurityGroupIngress").values()
    assert ingress["Properties"]["SourceSecurityGroupId"] == {"Fn::GetAtt": [sg_id, "GroupId"]}


# Network cards of each type (https://docs.aws.amazon.com/ec2/latest/instancetypes/ac.html, network specifications):
# one EFA interface goes on each card.
@pytest.mark.parametrize(("instance_type", "cards"), [("p5.48xlarge", 32), ("g6e.48xlarge", 4), ("g5.12xlarge", 1)])
def test_efa_interfaces_follow_the_types_network_cards(instance_type: str, cards: int) -> None:
    interfaces = launch_data(_build(instance_type=instance_type, efa=True, nodes=2))["NetworkInterfaces"]
    assert [i["NetworkCardIndex"] for i in interfaces] == list(range(cards))
    assert {i["InterfaceType"] for i in interfaces} == {"efa"}


def test_efa_on_a_type_without_it_is_refused() -> None:
    with pytest.raises(ValueError, match=r"g6e\.xlarge has no Elastic Fabric Adapter"):
        _build(instance_type="g6e.xlarge", efa=True, nodes=2)


def _ec2_refuses(interfaces: list[dict[str, Any]]) -> str | None:
    """EC2's rule for RunInstances network interfaces (API reference, InstanceNetworkInterfaceSpecification
    AssociatePublicIpAddress: "You cannot specify more than one network interface in the request"): with several
    interfaces the parameter, even false, is an InvalidParameterCombination."""
    if len(interfaces) > 1 and any("AssociatePublicIpAddress" in i for i in interfaces):
        return "InvalidParameterCombination"
    return None


@pytest.mark.parametrize("build", ["single", "efa"])
def test_ec2_accepts_the_network_interfaces(build: str, request: pytest.FixtureRequest) -> None:
    interfaces = launch_data(request.getfixturevalue(build))["NetworkInterfaces"]
    assert _ec2_refuses(interfaces) is None
    # No public address either way: one interface says so, several cannot have one (private subnet).
    assert all(i.get("AssociatePublicIpAddress", False) is False for i in interfaces)


def test_user_data_arms_power_off_before_anything_can_fail(single: dict[str, Any]) -> None:
    parts = launch_data(single)["UserData"]["Fn::Base64"]
    script = parts if isinstance(parts, str) else "".join(p for p in parts["Fn::Join"][1] if isinstance(p, str))
    lines = script.splitlines()
    trap = next(i for i, line in enumerate(lines) if line.startswith("trap "))
    assert "shutdown -h +360 " in script
    assert (
        "/opt/sentiment-training/training_assets/ship_logs.py --region us-west-2 --log-group training-logs"
        in (lines[trap])
    )
    assert trap < next(i for i, line in enumerate(lines) if line.startswith("aws s3 cp"))
    assert "export TRAIN_ARGS='--epochs 3 --bf16'" in lines
    assert lines[-1] == "bash training_assets/ec2_run.sh"


# ------------------------------------------------------------------------------------- grant_launch, evaluated

PSEUDO = {"AWS::Partition": "aws", "AWS::URLSuffix": "amazonaws.com"}
TEMPLATE_ARN = f"arn:aws:ec2:{REGION}:{ACCOUNT}:launch-template/<TrainingLaunchTemplate049E303C>"


def _render(value: Any) -> Any:
    """CloudFormation values as strings: a Ref or GetAtt becomes <logical id>, joins are joined."""
    if isinstance(value, dict):
        if "Ref" in value:
            return PSEUDO.get(value["Ref"], f"<{value['Ref']}>")
        if "Fn::GetAtt" in value:
            return f"<{value['Fn::GetAtt'][0]}>"
        if "Fn::Join" in value:
            separator, parts = value["Fn::Join"]
            return separator.join(_render(part) for part in parts)
        return {key: _render(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_render(item) for item in value]
    return value


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _condition_holds(conditions: dict[str, dict[str, Any]], context: dict[str, str]) -> bool:
    for operator, keys in conditions.items():
        for key, expected in keys.items():
            actual = context.get(key)
            if actual is None:
                return False
            if operator == "ArnLike":
                if not any(fnmatch.fnmatchcase(actual, pattern) for pattern in _as_list(expected)):
                    return False
            elif operator in ("StringEquals", "Bool"):
                if actual not in _as_list(expected):
                    return False
            elif operator == "NumericLessThanEquals":
                if not any(float(actual) <= float(limit) for limit in _as_list(expected)):
                    return False
            else:
                raise AssertionError(f"unexpected condition operator {operator}")
    return True


def _allowed(statements: list[dict[str, Any]], action: str, resource: str, context: dict[str, str]) -> bool:
    return any(
        s["Effect"] == "Allow"
        and action in _as_list(s["Action"])
        and any(fnmatch.fnmatchcase(resource, pattern) for pattern in _as_list(s["Resource"]))
        and _condition_holds(s.get("Condition", {}), context)
        for s in statements
    )


def _statements(template: dict[str, Any]) -> list[dict[str, Any]]:
    (policy,) = resources(template, "AWS::IAM::ManagedPolicy").values()
    return _render(policy["Properties"]["PolicyDocument"]["Statement"])


def _subnet_id(template: dict[str, Any]) -> str:
    (interface, *_) = launch_data(template)["NetworkInterfaces"]
    return _render(interface["SubnetId"])


def _instance_context(template: dict[str, Any]) -> dict[str, str]:
    """The instance resource's keys as EC2 fills them from the launch template's own data."""
    data = launch_data(template)
    (profile,) = resources(template, "AWS::IAM::InstanceProfile")
    assert data["IamInstanceProfile"] == {"Arn": {"Fn::GetAtt": [profile, "Arn"]}}
    return {
        "ec2:InstanceType": data["InstanceType"],
        "ec2:MetadataHttpTokens": data["MetadataOptions"]["HttpTokens"],
        "ec2:MetadataHttpPutResponseHopLimit": str(data["MetadataOptions"]["HttpPutResponseHopLimit"]),
        "ec2:InstanceProfile": f"<{profile}>",
        "ec2:Tenancy": data.get("Placement", {}).get("Tenancy", "default"),
    }


def _request(template: dict[str, Any], **overrides: Any) -> list[tuple[str, dict[str, str]]]:
    """The resources one `run-instances --launch-template` request is authorized on, with their condition keys."""
    base = {"ec2:LaunchTemplate": TEMPLATE_ARN, "ec2:IsLaunchTemplateResource": "true"}
    arn = f"arn:aws:ec2:{REGION}:{ACCOUNT}"
    (group_id,) = resources(template, "AWS::EC2::SecurityGroup")
    request = {
        "launch-template": (TEMPLATE_ARN, {"ec2:LaunchTemplate": TEMPLATE_ARN}),
        "instance": (f"{arn}:instance/*", {**base, **_instance_context(template)}),
        "volume": (f"{arn}:volume/*", base),
        "network-interface": (f"{arn}:network-interface/*", base),
        "subnet": (f"{arn}:subnet/{_subnet_id(template)}", base),
        "security-group": (f"{arn}:security-group/<{group_id}>", base),
        "image": (f"arn:aws:ec2:{REGION}::image/ami-0dlami", {**base, "ec2:Owner": "amazon"}),
    }
    for kind, value in overrides.items():
        request[kind.replace("_", "-")] = value
    return [(resource, context) for resource, context in request.values() if resource]


def _launch_allowed(template: dict[str, Any], **overrides: Any) -> bool:
    statements = _statements(template)
    return all(_allowed(statements, "ec2:RunInstances", r, c) for r, c in _request(template, **overrides))


def test_a_launch_from_the_template_as_it_is_is_allowed(single: dict[str, Any], efa: dict[str, Any]) -> None:
    assert _launch_allowed(single)
    (group,) = resources(efa, "AWS::EC2::PlacementGroup")
    placement = (
        f"arn:aws:ec2:{REGION}:{ACCOUNT}:placement-group/<{group}>",
        {"ec2:LaunchTemplate": TEMPLATE_ARN, "ec2:IsLaunchTemplateResource": "true"},
    )
    assert _launch_allowed(efa, placement_group=placement)


def _overridden(context: dict[str, str], **changes: str) -> dict[str, str]:
    return {**context, "ec2:IsLaunchTemplateResource": "false", **changes}


@pytest.mark.parametrize(
    "override",
    [
        "instance_type",
        "imdsv1",
        "hop_limit",
        "instance_profile",
        "tenancy",
        "subnet",
        "security_group",
        "own_image",
        "key_pair",
        "other_template",
    ],
)
def test_overriding_the_template_is_refused(single: dict[str, Any], override: str) -> None:
    arn = f"arn:aws:ec2:{REGION}:{ACCOUNT}"
    request = dict((r.split(":")[-1].split("/")[0], (r, c)) for r, c in _request(single))
    base, instance = request["volume"][1], request["instance"][1]
    overrides: dict[str, tuple[str, dict[str, str]]] = {
        "instance_type": {"instance": (request["instance"][0], {**instance, "ec2:InstanceType": "p5.48xlarge"})},
        # Issue 22.2: IMDSv1, a hop limit a bridged container can cross, another profile, dedicated hardware.
        "imdsv1": {"instance": (request["instance"][0], {**instance, "ec2:MetadataHttpTokens": "optional"})},
        "hop_limit": {"instance": (request["instance"][0], {**instance, "ec2:MetadataHttpPutResponseHopLimit": "2"})},
        "instance_profile": {
            "instance": (request["instance"][0], {**instance, "ec2:InstanceProfile": f"{arn}:instance-profile/admin"})
        },
        "tenancy": {"instance": (request["instance"][0], {**instance, "ec2:Tenancy": "dedicated"})},
        "subnet": {"subnet": (f"{arn}:subnet/subnet-0other", _overridden(base))},
        "security_group": {"security_group": (f"{arn}:security-group/sg-0open", _overridden(base))},
        "own_image": {"image": (f"arn:aws:ec2:{REGION}::image/ami-0mine", _overridden(base, **{"ec2:Owner": ACCOUNT}))},
        "key_pair": {"key_pair": (f"{arn}:key-pair/backdoor", _overridden(base))},
        "other_template": {
            "launch_template": (
                f"{arn}:launch-template/lt-0other",
                {"ec2:LaunchTemplate": f"{arn}:launch-template/lt-0other"},
            )
        },
    }[override]  # type: ignore[assignment]
    assert not _launch_allowed(single, **overrides)


def test_the_instance_role_is_passed_only_to_ec2(single: dict[str, Any]) -> None:
    statements = _statements(single)
    (passing,) = [s for s in statements if "iam:PassRole" in _as_list(s["Action"])]
    role = passing["Resource"]
    assert role.startswith("<InstanceRole")

    def may_pass(resource: str, context: dict[str, str]) -> bool:
        return _allowed(statements, "iam:PassRole", resource, context)

    assert may_pass(role, {"iam:PassedToService": "ec2.amazonaws.com"})
    assert not may_pass(role, {"iam:PassedToService": "sagemaker.amazonaws.com"})
    assert not may_pass(role, {})  # no service named: refused
    assert not may_pass(f"arn:aws:iam::{ACCOUNT}:role/admin", {"iam:PassedToService": "ec2.amazonaws.com"})


def test_the_dlami_parameter_is_the_only_parameter_read(single: dict[str, Any]) -> None:
    (reading,) = [s for s in _statements(single) if "ssm:GetParameters" in _as_list(s["Action"])]
    assert reading["Resource"] == f"arn:aws:ssm:{REGION}::parameter{DLAMI}"


def test_a_role_grantee_gets_the_same_statements(single: dict[str, Any]) -> None:
    (operator_policy,) = [
        p
        for p in resources(single, "AWS::IAM::Policy").values()
        if p["Properties"]["Roles"][0]["Ref"].startswith("Operator")
    ]
    sids = [s["Sid"] for s in operator_policy["Properties"]["PolicyDocument"]["Statement"]]
    assert sids == [s["Sid"] for s in _statements(single)]
