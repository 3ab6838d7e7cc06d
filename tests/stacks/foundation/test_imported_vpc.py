"""An environment can run in an existing VPC named by explicit ids: no lookups, no new network."""

from __future__ import annotations

import copy
from pathlib import Path

from app import build_app
from tests.conftest import cdk_context

IMPORTED = {
    "vpc_id": "vpc-0123456789abcdef0",
    "availability_zones": ["us-west-2a", "us-west-2b"],
    "private_subnet_ids": ["subnet-0123456789abcdef0", "subnet-0123456789abcdef1"],
}


def test_imported_vpc_synthesizes_offline_without_creating_a_network(tmp_path: Path) -> None:
    context = cdk_context(env="dev")
    context["environments"] = copy.deepcopy(context["environments"])
    context["environments"]["dev"]["vpc"] = IMPORTED
    assembly = build_app(context=context, outdir=str(tmp_path)).synth()
    (stage,) = assembly.nested_assemblies
    (stack,) = (s for s in stage.nested_assembly.stacks if s.hierarchical_id.endswith("Foundation"))
    types = {r["Type"] for r in stack.template["Resources"].values()}
    assert not types & {"AWS::EC2::VPC", "AWS::EC2::Subnet", "AWS::EC2::NatGateway", "AWS::EC2::VPCEndpoint"}
    # The workload group and one group per @remote caller, all in the imported VPC.
    groups = [r for r in stack.template["Resources"].values() if r["Type"] == "AWS::EC2::SecurityGroup"]
    callers = context["environments"]["dev"]["training"]["remote_callers"]
    assert len(groups) == 1 + len(callers)
    assert all(group["Properties"]["VpcId"] == IMPORTED["vpc_id"] for group in groups)
    assert stack.template["Outputs"]["PrivateSubnetIds"]["Value"] == ",".join(IMPORTED["private_subnet_ids"])
    # No context lookups were needed: synth never called AWS.
    assert not (tmp_path / "cdk.context.json").exists()
