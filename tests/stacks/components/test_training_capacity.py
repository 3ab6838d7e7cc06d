"""The training launch template can target capacity bought ahead: an On-Demand Capacity Reservation or a Capacity
Block for ML (by id) or a Capacity Reservation resource group. The launch grant's RunInstances requests, as
proving_ground/iam_requests.py builds them from the template's data, are evaluated against the synthesized launcher
policy:
a run from the template into its reservation is allowed, into another reservation is not, and the template
conditions of every other resource still hold."""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms

from ops_review.iam_policy import Request, is_allowed, resolve
from proving_ground.iam_requests import Call, run_instances_requests
from stacks.components.training_launch_template import (
    KEEP_LOGICAL_IDS,
    CapacityTarget,
    TrainingLaunchTemplate,
    TrainingRun,
)
from stacks.settings import parse_environment
from tests.conftest import cdk_context
from tests.stacks.components.bare_stack import ACCOUNT, REGION, bare_stack, launch_data, refs, resources, template_of

DLAMI = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
RESERVATION = "cr-0123456789abcdef0"
GROUP = f"arn:aws:resource-groups:{REGION}:{ACCOUNT}:group/p4d-reservations"
RAW = cdk_context()["environments"]


def _build(capacity: CapacityTarget | None) -> dict[str, Any]:
    stack = bare_stack()
    vpc = ec2.Vpc(stack, "Vpc", max_azs=1, nat_gateways=0, subnet_configuration=[
        ec2.SubnetConfiguration(name="Private", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED)])  # fmt: skip
    role = iam.Role(stack, "InstanceRole", assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"))
    template = TrainingLaunchTemplate(
        stack,
        KEEP_LOGICAL_IDS,
        vpc=vpc,
        subnet=vpc.isolated_subnets[0],
        instance_type="p4d.24xlarge",
        image_ssm_parameter=DLAMI,
        instance_role=role,
        instance_profile=iam.InstanceProfile(stack, "Profile", role=role),
        key=kms.Key(stack, "Key", enable_key_rotation=True),
        run=TrainingRun(
            code={},
            environment={},
            run_command="true",
            ship_logs_script="ship.py",
            log_group_name="logs",
            max_run_hours=6,
        ),
        efa=True,
        nodes=2,
        capacity=capacity,
    )
    template.grant_launch(iam.ManagedPolicy(stack, "Launcher"))
    return template_of(stack)


def _requests(template: dict[str, Any], data: dict[str, Any] | None = None) -> tuple[list[dict], list[Request]]:
    """The launcher's policy and the requests of `run-instances --launch-template` (two nodes), both resolved."""
    values = refs(template)
    values.update({f"{group}.GroupName": group.lower() for group in resources(template, "AWS::EC2::PlacementGroup")})
    (launch_id,) = resources(template, "AWS::EC2::LaunchTemplate")
    (policy,) = resources(template, "AWS::IAM::ManagedPolicy").values()
    (role_id,) = (lid for lid in resources(template, "AWS::IAM::Role") if lid.startswith("InstanceRole"))
    known = {values[launch_id]: {
        "arn": f"arn:aws:ec2:{REGION}:{ACCOUNT}:launch-template/{values[launch_id]}",
        "data": resolve(data or launch_data(template), refs=values), "image_id": "ami-0dlami",
        "image_owner": "amazon", "instance_role_arn": values[f"{role_id}.Arn"],
    }}  # fmt: skip
    call = Call("ec2", "RunInstances", {"LaunchTemplate": {"LaunchTemplateId": values[launch_id]}, "MinCount": 2,
                                        "MaxCount": 2}, REGION, ACCOUNT)  # fmt: skip
    return [resolve(policy["Properties"]["PolicyDocument"], refs=values)], run_instances_requests(call, known, {})


def _reservation_request(requests: list[Request]) -> Request:
    (request,) = [r for r in requests if ":capacity-reservation/" in r.resource]
    return request


@pytest.mark.parametrize("block", [False, True], ids=["on-demand-reservation", "capacity-block"])
def test_a_run_launches_into_its_reservation_and_no_other(block: bool) -> None:
    template = _build(CapacityTarget(reservation_id=RESERVATION, capacity_block=block))
    data = launch_data(template)
    assert data["CapacityReservationSpecification"] == {"CapacityReservationTarget": {"CapacityReservationId":
                                                                                      RESERVATION}}  # fmt: skip
    assert data.get("InstanceMarketOptions") == ({"MarketType": "capacity-block"} if block else None)
    policies, requests = _requests(template)
    assert _reservation_request(requests).resource.endswith(f":capacity-reservation/{RESERVATION}")
    assert all(is_allowed(policies, r) for r in requests)
    other = dict(
        data,
        CapacityReservationSpecification={
            "CapacityReservationTarget": {"CapacityReservationId": "cr-0fedcba9876543210"}
        },
    )
    _, elsewhere = _requests(template, other)
    assert not is_allowed(policies, _reservation_request(elsewhere))


def test_a_resource_group_lets_ec2_choose_its_reservation() -> None:
    template = _build(CapacityTarget(resource_group_arn=GROUP))
    data = launch_data(template)
    assert data["CapacityReservationSpecification"]["CapacityReservationTarget"] == {
        "CapacityReservationResourceGroupArn": GROUP
    }
    policies, requests = _requests(template)
    assert all(is_allowed(policies, r) for r in requests)
    # The reservation grant alone launches nothing: the instance still needs the template's conditions.
    (instance,) = [r for r in requests if ":instance/" in r.resource and r.action == "ec2:RunInstances"]
    assert not is_allowed(policies, Request(instance.action, instance.resource, {}))


def test_without_a_target_no_reservation_is_granted() -> None:
    template = _build(None)
    data = launch_data(template)
    assert "CapacityReservationSpecification" not in data and "InstanceMarketOptions" not in data
    policies, requests = _requests(template)
    assert all(is_allowed(policies, r) for r in requests)
    targeted = dict(
        data, CapacityReservationSpecification={"CapacityReservationTarget": {"CapacityReservationId": RESERVATION}}
    )
    _, into_reservation = _requests(template, targeted)
    assert not is_allowed(policies, _reservation_request(into_reservation))


def test_the_training_stack_targets_what_the_settings_name() -> None:
    from stacks.platform_stage import PlatformStage

    training = {**RAW["staging"].get("training", {}), "capacity_reservation_id": RESERVATION,
                "market_type": "capacity-block"}  # fmt: skip
    settings = parse_environment("staging", {**RAW["staging"], "training": training})
    stage = PlatformStage(cdk.App(context=cdk_context()), settings, construct_id="reserved")
    template = cdk.assertions.Template.from_stack(stage.training).to_json()
    data = launch_data(template)
    assert data["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
    assert data["CapacityReservationSpecification"]["CapacityReservationTarget"]["CapacityReservationId"] == (
        RESERVATION
    )
