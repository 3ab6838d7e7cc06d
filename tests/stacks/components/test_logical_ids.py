"""keep_logical_ids on a bare stack: resources moved under a construct get exactly the logical ids CDK gave them as
the stack's children, so CloudFormation keeps (never replaces) them."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from constructs import Construct

from stacks.components.logical_ids import keep_logical_ids, stack_level_logical_id


def _role_with_default_policy(scope: Construct, construct_id: str) -> iam.Role:
    role = iam.Role(scope, construct_id, assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"))
    role.add_to_policy(iam.PolicyStatement(actions=["s3:GetObject"], resources=["arn:aws:s3:::b/*"]))
    return role


def _logical_ids(stack: cdk.Stack) -> set[tuple[str, str]]:
    template = cdk.assertions.Template.from_stack(stack).to_json()
    return {(name, resource["Type"]) for name, resource in template["Resources"].items()}


def _moved(*, keep: bool) -> cdk.Stack:
    """The same resources under a construct ``Network``, with or without keep_logical_ids."""
    stack = cdk.Stack(cdk.App(), "After")
    vpc = ec2.Vpc(stack, "Vpc", max_azs=1, nat_gateways=0)
    network = Construct(stack, "Network")
    role = _role_with_default_policy(network, "DeliveryRole")
    group = ec2.SecurityGroup(network, "EndpointSecurityGroup", vpc=vpc)
    if keep:
        keep_logical_ids(role, "FlowLogRole")
        keep_logical_ids(group, "VpcEndpointSecurityGroup")
    return stack


def test_moved_resources_keep_the_ids_they_had_as_the_stacks_children() -> None:
    before = cdk.Stack(cdk.App(), "Before")
    _role_with_default_policy(before, "FlowLogRole")
    ec2.SecurityGroup(before, "VpcEndpointSecurityGroup", vpc=ec2.Vpc(before, "Vpc", max_azs=1, nat_gateways=0))

    assert _logical_ids(_moved(keep=False)) != _logical_ids(before)  # the move alone would replace them
    assert _logical_ids(_moved(keep=True)) == _logical_ids(before)


def test_the_id_is_the_one_cdk_allocates_for_the_path() -> None:
    stack = cdk.Stack(cdk.App(), "Stack")
    parent = Construct(stack, "Vpc")
    subnet = Construct(Construct(parent, "Default"), "PublicSubnet1")  # "Default" is left out of logical ids
    resource = cdk.CfnResource(subnet, "Subnet", type="AWS::EC2::Subnet")
    assert stack.resolve(resource.logical_id) == stack_level_logical_id("Vpc", "PublicSubnet1", "Subnet")
