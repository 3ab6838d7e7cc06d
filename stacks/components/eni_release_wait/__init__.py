"""EniReleaseWait: a custom resource that, when its stack is deleted, waits until SageMaker has released the VPC
network interfaces of a security group (the waiting logic is ``handler.py``; see there for why).

Make the resources that put interfaces in the group (the SageMaker model) depend on it: CloudFormation then
creates it first and, on delete, deletes it last, once the endpoint is gone.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import cast

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import Construct

from stacks.compliance import acknowledge_wildcards
from stacks.components.stack_function import function_logs_and_role, stack_function, write_own_logs

HANDLER_DIR = Path(__file__).resolve().parent
# Lambda's limit; the handler keeps 30 s of it to answer CloudFormation, so it waits up to 14.5 minutes.
TIMEOUT = cdk.Duration.minutes(15)


class EniReleaseWait(Construct):
    # Long: one custom resource with its log group, role, policy and Lambda, declared in dependency order, each
    # acknowledgement next to the resource it excuses.
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        security_group_ids: Sequence[str],
        key: kms.IKey,
        log_retention_days: int = 30,
        removal_policy: cdk.RemovalPolicy = cdk.RemovalPolicy.RETAIN,
    ) -> None:
        super().__init__(scope, construct_id)
        stack = cdk.Stack.of(self)
        self._shared_with: list[str] = []
        self._describe_endpoints_added = False
        self.log_group, self.role = function_logs_and_role(
            self,
            key=key,
            log_retention_days=log_retention_days,
            removal_policy=removal_policy,
            role_description="Waits, on stack deletion, until SageMaker has released its network interfaces",
        )
        describe = iam.PolicyStatement(
            sid="ListTheGroupsInterfaces", actions=["ec2:DescribeNetworkInterfaces"], resources=["*"]
        )
        self._describe_endpoints = iam.PolicyStatement(
            sid="SeeWhetherOtherEndpointsStillUseTheGroup", actions=["sagemaker:DescribeEndpoint"]
        )
        self.policy = iam.ManagedPolicy(
            self,
            "Policy",
            description="Least privilege of the ENI release wait: describe network interfaces, write its own logs",
            roles=[self.role],
            statements=[
                describe,
                write_own_logs(self.log_group),
            ],
        )
        acknowledge_wildcards(
            self.policy, (describe, "ec2:DescribeNetworkInterfaces has no resource-level permissions.")
        )
        self.function = stack_function(
            self,
            handler_dir=HANDLER_DIR,
            timeout=TIMEOUT,
            role=self.role,
            policy=self.policy,
            log_group=self.log_group,
            description="On delete: wait until no network interface of the SageMaker security group remains",
            outside_vpc="Kept out of the VPC on purpose: its own network interfaces would sit in the subnets whose "
            "release it waits for.",
            outside_vpc_control=(
                "Kept out of the VPC on purpose (CT.LAMBDA.PR.3): its own network interfaces would sit in the subnets "
                "whose release it waits for; it calls only the EC2 and SageMaker APIs."
            ),
        )
        self.resource = cdk.CustomResource(
            self,
            "Resource",
            service_token=self.function.function_arn,
            resource_type="Custom::EniReleaseWait",
            properties={"SecurityGroupIds": list(security_group_ids)},
            # Give up a little after the function's own limit instead of CloudFormation's default hour.
            service_timeout=TIMEOUT.plus(cdk.Duration.minutes(1)),
        )
        self.resource.node.add_dependency(self.policy, self.log_group)
        self._stack = stack

    def also_used_by(self, *endpoint_names: str) -> None:
        """Other endpoints that put interfaces in the same group: while one of them lives, its stack's own wait
        covers the group, so this one does not wait (it would time out on the other's interfaces)."""
        self._shared_with.extend(endpoint_names)
        cast(cdk.CfnResource, self.resource.node.default_child).add_property_override(
            "SharedWithEndpoints", list(self._shared_with)
        )
        stack = self._stack
        # SageMaker lower-cases endpoint names in their ARNs.
        self._describe_endpoints.add_resources(
            *(
                f"arn:{stack.partition}:sagemaker:{stack.region}:{stack.account}:endpoint/{name.lower()}"
                for name in endpoint_names
            )
        )
        if not self._describe_endpoints_added:
            self.policy.add_statements(self._describe_endpoints)
            self._describe_endpoints_added = True
