"""A created VPC must hold the subnets the stacks make in it (settings/network.py; PlatformNetwork makes them): every
prefix AWS allows for a VPC (/16 to /28) is tried for every zone count with and without NAT gateways, and the
smallest one the settings accept is exactly the smallest one CDK can lay the subnets out in (one size smaller fails
CDK's subnet allocation), so the rule refuses nothing that would have worked."""

from __future__ import annotations

import copy
import ipaddress

import aws_cdk as cdk
import pytest
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs

from stacks.components.platform_network import PlatformNetwork
from stacks.settings import SettingsError, VpcSettings, parse_environment
from tests.conftest import cdk_context
from tests.stacks.components.bare_stack import bare_stack, resources, template_of

# (max_azs, nat_gateways) -> the smallest VPC that holds the subnets, as CDK lays them out (measured: /24 public
# subnets first, then each /20 private one on a /20 boundary).
SMALLEST = {(1, 0): 20, (1, 1): 19, (2, 0): 19, (2, 1): 18, (3, 0): 18, (3, 1): 18}
PREFIXES = range(VpcSettings.LARGEST_PREFIX, VpcSettings.SMALLEST_PREFIX + 1)


def _dev(prefix: int, max_azs: int, nat_gateways: int):
    raw = copy.deepcopy(cdk_context()["environments"]["dev"])
    raw["vpc"] = {**raw.get("vpc", {}), "cidr": f"10.40.0.0/{prefix}", "max_azs": max_azs, "nat_gateways": nat_gateways}
    if not nat_gateways:  # isolated subnets: training must come from S3 and a pipeline-built image
        raw["training"] = {**raw.get("training", {}), "base_model": "s3://models/base/", "dataset": "s3://data/set/",
                           "image_registry_account": "222222222222"}  # fmt: skip
    return parse_environment("dev", raw)


@pytest.mark.parametrize("prefix", PREFIXES, ids=[f"/{p}" for p in PREFIXES])
@pytest.mark.parametrize(
    ("max_azs", "nat_gateways"), sorted(SMALLEST), ids=[f"{a}az-{n}nat" for a, n in sorted(SMALLEST)]
)
def test_each_vpc_size_is_accepted_exactly_when_the_subnets_fit(prefix: int, max_azs: int, nat_gateways: int) -> None:
    smallest = SMALLEST[(max_azs, nat_gateways)]
    if prefix <= smallest:
        assert _dev(prefix, max_azs, nat_gateways).vpc.cidr == f"10.40.0.0/{prefix}"
        return
    with pytest.raises(SettingsError) as refused:
        _dev(prefix, max_azs, nat_gateways)
    message = str(refused.value)
    assert message.startswith(f"environments.dev.vpc.cidr: 10.40.0.0/{prefix} is too small for the subnets")
    assert message.endswith(f"use a prefix length from /16 to /{smallest}.")
    assert message.count(". ") == 0 and ("public /24" in message) == bool(nat_gateways)


@pytest.mark.parametrize("prefix", [15, 29])
def test_a_prefix_aws_does_not_allow_for_a_vpc_is_refused(prefix: int) -> None:
    with pytest.raises(
        SettingsError, match=r"^environments\.dev\.vpc\.cidr: must have a prefix length from /16 to /28\.$"
    ):
        _dev(prefix, 1, 1)


def test_an_imported_vpc_is_not_sized_by_the_subnets_it_would_have_made() -> None:
    raw = copy.deepcopy(cdk_context()["environments"]["dev"])
    raw["vpc"] = {"cidr": "10.40.0.0/24", "vpc_id": "vpc-0123456789abcdef0", "availability_zones": ["us-west-2a"],
                  "private_subnet_ids": ["subnet-0123456789abcdef0"]}  # fmt: skip
    assert parse_environment("dev", raw).vpc.imported


def _subnets(prefix: int, max_azs: int, nat_gateways: int) -> list[str]:
    stack = bare_stack()
    PlatformNetwork(stack, "Network", cidr=f"10.40.0.0/{prefix}", max_azs=max_azs, nat_gateways=nat_gateways,
                    subnet_masks=(VpcSettings.PRIVATE_SUBNET_MASK, VpcSettings.PUBLIC_SUBNET_MASK),
                    flow_log_key=kms.Key(stack, "Key"), flow_log_retention=logs.RetentionDays.TWO_WEEKS,
                    removal_policy=cdk.RemovalPolicy.DESTROY)  # fmt: skip
    return [s["Properties"]["CidrBlock"] for s in resources(template_of(stack), "AWS::EC2::Subnet").values()]


@pytest.mark.parametrize(("max_azs", "nat_gateways"), [(3, 1), (1, 1), (2, 0)])
def test_the_smallest_accepted_vpc_is_the_smallest_cdk_can_lay_the_subnets_out_in(
    max_azs: int, nat_gateways: int
) -> None:
    # The joint with PlatformNetwork: the settings' smallest size synthesizes with every subnet inside the VPC, and
    # one size smaller stops CDK (the raw error the settings rule replaces).
    smallest = SMALLEST[(max_azs, nat_gateways)]
    assert _dev(smallest, max_azs, nat_gateways).vpc.largest_prefix_for_subnets() == smallest
    subnets = _subnets(smallest, max_azs, nat_gateways)
    assert len(subnets) == max_azs * (1 + nat_gateways)
    vpc = ipaddress.IPv4Network(f"10.40.0.0/{smallest}")
    assert all(ipaddress.IPv4Network(cidr).subnet_of(vpc) for cidr in subnets)
    with pytest.raises(RuntimeError, match="exceeds remaining space"):
        _subnets(smallest + 1, max_azs, nat_gateways)
