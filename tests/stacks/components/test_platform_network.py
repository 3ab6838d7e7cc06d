"""PlatformNetwork and WorkloadSecurityGroup on a bare stack: what can reach the network, what its endpoints let
through (their policies evaluated), who may deliver its flow logs, and the names it gives its resources."""

from __future__ import annotations

import ipaddress

import aws_cdk as cdk
import pytest
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import region_info

from ops_review.iam_policy import Request, is_allowed, resolve
from stacks.components.platform_network import (
    ENDPOINTS_WITH_IDENTITY_PERIMETER,
    INTERFACE_ENDPOINTS,
    PlatformNetwork,
    WorkloadSecurityGroup,
)
from stacks.settings import VpcSettings
from tests.stacks.components.bare_stack import ACCOUNT, REGION, bare_stack, refs, resources, template_of

CIDR = "10.7.0.0/16"
MASKS = (VpcSettings.PRIVATE_SUBNET_MASK, VpcSettings.PUBLIC_SUBNET_MASK)
OTHER_ACCOUNT = "999999999999"
REGISTRY = "222222222222"  # the pipeline's account, whose ECR holds the platform's built images
ALLOW_ALL = [{"Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}]
# The AWS-owned buckets workloads read through the S3 gateway: ECR's image layers (ECR user guide, "Minimum Amazon S3
# bucket permissions for Amazon ECR") and those SSM Agent reads (Systems Manager user guide, "SSM Agent communications
# with AWS managed S3 buckets").
AWS_OWNED_BUCKETS = ("prod-{region}-starport-layer-bucket", "aws-ssm-{region}", "aws-windows-downloads-{region}",
                     "amazon-ssm-{region}", "amazon-ssm-packages-{region}", "{region}-birdwatcher-prod",
                     "aws-ssm-distributor-file-{region}", "aws-ssm-document-attachments-{region}",
                     "patch-baseline-snapshot-{region}")  # fmt: skip


@pytest.fixture(scope="module")
def network() -> tuple[PlatformNetwork, dict]:
    """The network (one NAT gateway) and the security group of its workloads on a bare stack, and its template."""
    stack = bare_stack()
    network = PlatformNetwork(
        stack,
        "Network",
        cidr=CIDR,
        max_azs=2,
        nat_gateways=1,
        subnet_masks=MASKS,
        flow_log_key=kms.Key(stack, "Key"),
        flow_log_retention=logs.RetentionDays.TWO_WEEKS,
        removal_policy=cdk.RemovalPolicy.DESTROY,
    )
    WorkloadSecurityGroup(stack, "Workloads", vpc=network.vpc)
    return network, template_of(stack)


@pytest.fixture(scope="module")
def network_template(network: tuple[PlatformNetwork, dict]) -> dict:
    return network[1]


@pytest.fixture(scope="module")
def isolated_template() -> dict:
    """No NAT gateway (isolated subnets), and the pipeline's account as a registry of the platform's built images."""
    stack = bare_stack()
    PlatformNetwork(stack, "Network", cidr=CIDR, max_azs=2, nat_gateways=0, subnet_masks=MASKS,
                    flow_log_key=kms.Key(stack, "Key"),
                    flow_log_retention=logs.RetentionDays.TWO_WEEKS, removal_policy=cdk.RemovalPolicy.DESTROY,
                    image_registry_accounts=[REGISTRY])  # fmt: skip
    return template_of(stack)


def _endpoint_policy(template: dict, name: str) -> dict | None:
    (endpoint,) = [r for lid, r in resources(template, "AWS::EC2::VPCEndpoint").items() if lid[:-8].endswith(name)]
    policy = endpoint["Properties"].get("PolicyDocument")
    return resolve(policy, refs=refs(template)) if policy else None


def test_no_address_outside_the_vpc_can_open_a_connection_into_it(network_template: dict) -> None:
    for subnet in resources(network_template, "AWS::EC2::Subnet").values():
        assert subnet["Properties"]["MapPublicIpOnLaunch"] is False
    ingress = [
        rule
        for group in resources(network_template, "AWS::EC2::SecurityGroup").values()
        for rule in group["Properties"].get("SecurityGroupIngress", [])
    ] + [r["Properties"] for r in resources(network_template, "AWS::EC2::SecurityGroupIngress").values()]
    assert ingress == [
        {"CidrIp": CIDR, "Description": "HTTPS from the VPC", "FromPort": 443, "IpProtocol": "tcp", "ToPort": 443}
    ]


def test_workloads_only_send_https(network_template: dict) -> None:
    (group,) = [g for lid, g in resources(network_template, "AWS::EC2::SecurityGroup").items() if "Workloads" in lid]
    assert "SecurityGroupIngress" not in group["Properties"]
    (egress,) = group["Properties"]["SecurityGroupEgress"]
    assert (egress["IpProtocol"], egress["FromPort"], egress["ToPort"]) == ("tcp", 443, 443)


def test_private_subnets_reach_the_internet_only_through_the_nat_gateway(network_template: dict) -> None:
    routes = resources(network_template, "AWS::EC2::Route")
    private = [r["Properties"] for lid, r in routes.items() if "PrivateSubnet" in lid]
    assert private and all("NatGatewayId" in route and "GatewayId" not in route for route in private)
    # the NAT gateways asked for and no more (each is paid by the hour): here one, which both zones' routes share
    (nat_id,) = resources(network_template, "AWS::EC2::NatGateway")
    assert all(route["NatGatewayId"] == {"Ref": nat_id} for route in private)


def test_workloads_are_given_the_private_subnets(network: tuple[PlatformNetwork, dict]) -> None:
    """``private_subnets`` is where the stacks put SageMaker jobs, endpoints and training instances (they read its
    subnets): every private subnet, and no public one."""
    construct, template = network
    given = {
        cdk.Stack.of(construct).resolve(subnet.subnet_id)["Ref"] for subnet in construct.private_subnets.subnets or []
    }
    assert given == {lid for lid in resources(template, "AWS::EC2::Subnet") if "PrivateSubnet" in lid}
    assert len(given) == 2


def test_without_nat_gateways_nothing_in_the_vpc_leads_to_the_internet(isolated_template: dict) -> None:
    """No NAT gateway asked for: isolated subnets only, no internet gateway attached (one would wait for the first
    route anyone adds) and no route out of the VPC."""
    for kind in ("AWS::EC2::InternetGateway", "AWS::EC2::VPCGatewayAttachment", "AWS::EC2::NatGateway"):
        assert not resources(isolated_template, kind), kind
    assert not [r for r in resources(isolated_template, "AWS::EC2::Route").values()
                if "DestinationCidrBlock" in r["Properties"]]  # fmt: skip
    subnets = resources(isolated_template, "AWS::EC2::Subnet")
    assert len(subnets) == 2 and all(s["Properties"]["MapPublicIpOnLaunch"] is False for s in subnets.values())


def test_the_vpc_takes_its_cidr_and_lays_its_subnets_out_as_the_settings_size_it(network_template: dict) -> None:
    """The VPC's block is the one asked for; its subnets have the settings' masks, public ones first, each on a
    boundary of its size, as ``VpcSettings`` plans them when it refuses a VPC too small
    (``largest_prefix_for_subnets``): the smallest VPC the settings accept holds every subnet."""
    (vpc,) = resources(network_template, "AWS::EC2::VPC").values()
    assert vpc["Properties"]["CidrBlock"] == CIDR
    settings = VpcSettings(cidr=CIDR, max_azs=2, nat_gateways=1)
    subnets = {lid: ipaddress.IPv4Network(s["Properties"]["CidrBlock"])
               for lid, s in resources(network_template, "AWS::EC2::Subnet").items()}  # fmt: skip
    blocks = sorted(subnets.values())
    assert [block.prefixlen for block in blocks] == settings.subnet_masks()
    assert {lid for lid, block in subnets.items() if block.prefixlen == VpcSettings.PUBLIC_SUBNET_MASK} == {
        lid for lid in subnets if "PublicSubnet" in lid
    }
    smallest = ipaddress.IPv4Network(f"{vpc['Properties']['CidrBlock'].split('/')[0]}/"
                                     f"{settings.largest_prefix_for_subnets()}")  # fmt: skip
    assert all(block.subnet_of(smallest) for block in blocks)


def test_every_platform_service_has_an_interface_endpoint(network_template: dict) -> None:
    endpoints = resources(network_template, "AWS::EC2::VPCEndpoint")
    interface = [r for r in endpoints.values() if r["Properties"].get("VpcEndpointType") == "Interface"]
    assert len(interface) == len(INTERFACE_ENDPOINTS)
    assert all(r["Properties"]["PrivateDnsEnabled"] is True for r in interface)
    # each behind the group that admits HTTPS from the VPC (a group of its own would admit nothing: open=False)
    (group_id,) = [lid for lid, g in resources(network_template, "AWS::EC2::SecurityGroup").items()
                   if g["Properties"].get("SecurityGroupIngress", [{}])[0].get("CidrIp") == CIDR]  # fmt: skip
    assert all(r["Properties"]["SecurityGroupIds"] == [{"Fn::GetAtt": [group_id, "GroupId"]}] for r in interface)


@pytest.mark.parametrize("name", ENDPOINTS_WITH_IDENTITY_PERIMETER)
def test_interface_endpoints_admit_this_accounts_principals_and_aws_services_only(
    network_template: dict, name: str
) -> None:
    policy = _endpoint_policy(network_template, name)
    assert policy is not None

    def through_endpoint(context: dict) -> bool:
        return is_allowed(ALLOW_ALL, Request("sts:GetCallerIdentity", "*", context), endpoint_policies=[policy])

    assert through_endpoint({"aws:PrincipalAccount": ACCOUNT, "aws:PrincipalIsAWSService": "false"})
    assert through_endpoint({"aws:PrincipalIsAWSService": "true"})
    assert not through_endpoint({"aws:PrincipalAccount": OTHER_ACCOUNT, "aws:PrincipalIsAWSService": "false"})


@pytest.mark.parametrize("name", ENDPOINTS_WITH_IDENTITY_PERIMETER)
def test_interface_endpoints_reach_only_this_accounts_resources_and_for_ecr_the_dlc_registry(
    network_template: dict, name: str
) -> None:
    """Through an interface endpoint, even this account's principals reach only this account's resources (the ECR
    API also the Deep Learning Containers' registry account): no copy to, or role of, another account."""
    policy = _endpoint_policy(network_template, name)
    assert policy is not None
    dlc_account = region_info.Fact.find(REGION, region_info.FactName.DLC_REPOSITORY_ACCOUNT)
    assert dlc_account and dlc_account != ACCOUNT
    own = {"aws:PrincipalAccount": ACCOUNT, "aws:PrincipalIsAWSService": "false"}

    def reaches(resource_account: str | None) -> bool:
        context = own if resource_account is None else {**own, "aws:ResourceAccount": resource_account}
        return is_allowed(ALLOW_ALL, Request("ecr:BatchGetImage", "*", context), endpoint_policies=[policy])

    assert reaches(ACCOUNT)
    assert reaches(None)  # an action on no resource (sts:GetCallerIdentity, ecr:GetAuthorizationToken)
    assert not reaches(OTHER_ACCOUNT)
    assert reaches(dlc_account) == (name == "EcrApi")


def test_the_ecr_endpoint_also_reaches_the_registry_of_the_platforms_built_images(isolated_template: dict) -> None:
    """Nodes that pull the pipeline-built training image by digest pull from the pipeline's (tooling) account through
    the ECR API endpoint: that account is admitted there, and nowhere else."""
    own = {"aws:PrincipalAccount": ACCOUNT, "aws:PrincipalIsAWSService": "false"}
    for name in ENDPOINTS_WITH_IDENTITY_PERIMETER:
        policy = _endpoint_policy(isolated_template, name)
        assert policy is not None, name
        request = Request("ecr:BatchGetImage", "*", {**own, "aws:ResourceAccount": REGISTRY})
        assert is_allowed(ALLOW_ALL, request, endpoint_policies=[policy]) == (name == "EcrApi"), name


def test_s3_gateway_reaches_this_accounts_buckets_and_only_reads_the_aws_owned_ones_it_needs(
    network_template: dict,
) -> None:
    policy = _endpoint_policy(network_template, "S3")
    assert policy is not None
    own = {"aws:PrincipalAccount": ACCOUNT, "aws:PrincipalIsAWSService": "false"}

    def allowed(action: str, resource: str, bucket_account: str) -> bool:
        context = {**own, "aws:ResourceAccount": bucket_account}
        return is_allowed(ALLOW_ALL, Request(action, resource, context), endpoint_policies=[policy])

    assert allowed("s3:PutObject", "arn:aws:s3:::datasets/x", ACCOUNT)
    assert not allowed("s3:PutObject", "arn:aws:s3:::exfiltration/x", OTHER_ACCOUNT)
    for bucket in AWS_OWNED_BUCKETS:
        objects = f"arn:aws:s3:::{bucket.format(region=REGION)}/object"
        assert allowed("s3:GetObject", objects, OTHER_ACCOUNT), bucket
        assert not allowed("s3:PutObject", objects, OTHER_ACCOUNT), bucket
    assert not allowed("s3:GetObject", f"arn:aws:s3:::prod-{REGION}-other-bucket/object", OTHER_ACCOUNT)


def test_s3_gateway_admits_aws_services_and_no_other_accounts_principal(network_template: dict) -> None:
    """An AWS service acting for the workloads passes (it has no principal account of this one); a principal of
    another account does not, even to this account's buckets."""
    policy = _endpoint_policy(network_template, "S3")
    assert policy is not None

    def allowed(context: dict) -> bool:
        request = Request("s3:PutObject", "arn:aws:s3:::datasets/x", {**context, "aws:ResourceAccount": ACCOUNT})
        return is_allowed(ALLOW_ALL, request, endpoint_policies=[policy])

    assert allowed({"aws:PrincipalIsAWSService": "true"})
    assert not allowed({"aws:PrincipalIsAWSService": "false"})
    assert not allowed({"aws:PrincipalAccount": OTHER_ACCOUNT, "aws:PrincipalIsAWSService": "false"})
    assert allowed({"aws:PrincipalAccount": ACCOUNT, "aws:PrincipalIsAWSService": "false"})


def test_only_this_accounts_flow_logs_may_use_the_delivery_role(network_template: dict) -> None:
    ((role_id, role),) = [
        (lid, r) for lid, r in resources(network_template, "AWS::IAM::Role").items() if "FlowLog" in lid
    ]
    trust = resolve(role["Properties"]["AssumeRolePolicyDocument"], refs=refs(network_template))

    def may_assume(source_account: str, flow_log_account: str | None = None, service: str = "vpc-flow-logs") -> bool:
        context = {
            "aws:PrincipalServiceName": f"{service}.amazonaws.com",
            "aws:SourceAccount": source_account,
            "aws:SourceArn": f"arn:aws:ec2:{REGION}:{flow_log_account or source_account}:vpc-flow-log/fl-0123",
        }
        return is_allowed([], Request("sts:AssumeRole", f"arn:aws:iam::{ACCOUNT}:role/{role_id}", context),
                          resource_policies=[trust])  # fmt: skip

    assert may_assume(ACCOUNT)
    assert not may_assume(OTHER_ACCOUNT)
    # each condition holds on its own: a source account of this one with another's flow log, and the reverse
    assert not may_assume(ACCOUNT, OTHER_ACCOUNT)
    assert not may_assume(OTHER_ACCOUNT, ACCOUNT)
    assert not may_assume(ACCOUNT, service="lambda")


def test_flow_logs_go_to_an_encrypted_group_kept_as_long_as_asked(network_template: dict) -> None:
    ((group_id, group),) = resources(network_template, "AWS::Logs::LogGroup").items()
    assert "KmsKeyId" in group["Properties"] and group["Properties"]["RetentionInDays"] == 14
    # asked to go with the stack (RemovalPolicy.DESTROY), as tests/stacks/test_destroy.py checks app-wide
    assert (group.get("DeletionPolicy", "Delete"), group.get("UpdateReplacePolicy", "Delete")) == ("Delete", "Delete")
    ((_, flow_log),) = resources(network_template, "AWS::EC2::FlowLog").items()
    assert flow_log["Properties"]["LogGroupName"] == {"Ref": group_id}
    assert flow_log["Properties"]["ResourceType"] == "VPC"


def test_the_vpc_and_its_subnets_are_named_after_the_construct(network_template: dict) -> None:
    names = {
        lid: next(t["Value"] for t in r["Properties"]["Tags"] if t["Key"] == "Name")
        for lid, r in network_template["Resources"].items()
        if r["Type"] in ("AWS::EC2::VPC", "AWS::EC2::Subnet")
    }
    assert sorted(set(names.values())) == [
        "Bare/Network",
        "Bare/Network/PrivateSubnet1",
        "Bare/Network/PrivateSubnet2",
        "Bare/Network/PublicSubnet1",
        "Bare/Network/PublicSubnet2",
    ]


def test_the_default_security_group_is_emptied_and_the_endpoints_group_sends_nothing(network_template: dict) -> None:
    """The VPC's default security group (all traffic between its members) loses its rules through CDK's custom
    resource; the endpoints' group answers HTTPS from the VPC and opens no connection (CDK's placeholder egress rule
    matches no traffic: ICMP type 252, code 86, to 255.255.255.255)."""
    (vpc_id,) = resources(network_template, "AWS::EC2::VPC")
    (restrict,) = resources(network_template, "Custom::VpcRestrictDefaultSG").values()
    assert restrict["Properties"]["DefaultSecurityGroupId"] == {"Fn::GetAtt": [vpc_id, "DefaultSecurityGroup"]}
    (group,) = [g for lid, g in resources(network_template, "AWS::EC2::SecurityGroup").items() if "Endpoint" in lid]
    for rule in group["Properties"]["SecurityGroupEgress"]:
        assert (rule["IpProtocol"], rule["CidrIp"]) == ("icmp", "255.255.255.255/32"), rule
