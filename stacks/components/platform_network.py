"""The platform's private network: a VPC whose workloads reach AWS through VPC endpoints held to this account,
with flow logs, and the security group the SageMaker workloads share."""

from __future__ import annotations

from collections.abc import Sequence

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import region_info
from constructs import Construct

from stacks.compliance import acknowledge
from stacks.components.iam_statements import arn

# Interface endpoints the private subnets need: image pulls, SageMaker, credentials, logs, Session Manager.
INTERFACE_ENDPOINTS = {
    "EcrApi": ec2.InterfaceVpcEndpointAwsService.ECR,
    "EcrDocker": ec2.InterfaceVpcEndpointAwsService.ECR_DOCKER,
    "SageMakerApi": ec2.InterfaceVpcEndpointAwsService.SAGEMAKER_API,
    "SageMakerRuntime": ec2.InterfaceVpcEndpointAwsService.SAGEMAKER_RUNTIME,
    "Sts": ec2.InterfaceVpcEndpointAwsService.STS,
    "Logs": ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_LOGS,
    "Ssm": ec2.InterfaceVpcEndpointAwsService.SSM,
    "SsmMessages": ec2.InterfaceVpcEndpointAwsService.SSM_MESSAGES,
    "Ec2Messages": ec2.InterfaceVpcEndpointAwsService.EC2_MESSAGES,
}

# The principal tag that puts a role inside the network perimeter: the buckets and the key refuse its requests unless
# they come from the platform's VPC. The name AWS's data-perimeter examples use for principals whose credentials must
# stay on expected networks (aws-samples/data-perimeter-policy-examples, service_control_policies: "IAM principals
# tagged with the data-perimeter-include tag set to true").
NETWORK_PERIMETER_TAG = "data-perimeter-include"


def hold_to_the_vpc(role: iam.IRole) -> None:
    """Mark ``role`` as one whose requests to the platform's buckets and key must come from the platform's VPC
    (``network_perimeter_statement``): a workload role whose code runs there, so credentials taken from it work
    nowhere else."""
    cdk.Tags.of(role).add(NETWORK_PERIMETER_TAG, "true")


def network_perimeter_statement(
    vpc_id: str, *, actions: Sequence[str], resources: Sequence[str]
) -> iam.PolicyStatement:
    """The resource-policy Deny of the network perimeter: requests of roles tagged ``NETWORK_PERIMETER_TAG`` that do
    not come from the VPC ``vpc_id`` (through its S3 gateway endpoint or any of its interface endpoints, which set
    aws:SourceVpc) are refused. After AWS's data-perimeter example EnforceNetworkPerimeter
    (aws-samples/data-perimeter-policy-examples, resource_based_policies), narrowed to the tagged roles: people and
    the pipeline's builds work from outside the VPC by design and keep their own policies. Not refused: requests an
    AWS service makes on a tagged role's behalf (aws:ViaAWSService, e.g. S3 calling KMS for an SSE-KMS object, which
    carry no aws:SourceVpc), and AWS service principals (which carry no principal tag). IAM User Guide, "AWS global
    condition context keys": aws:SourceVpc is present only for requests through a VPC endpoint."""
    return iam.PolicyStatement(
        sid="DenyWorkloadRolesOutsideThePlatformsVpc",
        effect=iam.Effect.DENY,
        principals=[iam.AnyPrincipal()],
        actions=list(actions),
        resources=list(resources),
        conditions={
            "StringEquals": {f"aws:PrincipalTag/{NETWORK_PERIMETER_TAG}": "true"},
            "StringNotEqualsIfExists": {"aws:SourceVpc": vpc_id},
            "BoolIfExists": {"aws:ViaAWSService": "false"},
        },
    )


# Interface endpoints that take the identity-perimeter policy. They support endpoint policies (ECR, SageMaker,
# STS, CloudWatch Logs and SSM user guides). Left with the default (full access) policy: ECR's Docker endpoint,
# whose registry protocol starts with unauthenticated requests, and the Session Manager channels (ssmmessages,
# ec2messages).
ENDPOINTS_WITH_IDENTITY_PERIMETER = ("EcrApi", "SageMakerApi", "SageMakerRuntime", "Sts", "Logs", "Ssm")


class PlatformNetwork(Construct):
    """A VPC (this construct's default child, ``vpc``) of private subnets in ``max_azs`` zones, with ``nat_gateways``
    NAT gateways in public subnets that hold nothing else (none: isolated subnets without internet routes); the
    gateway and interface endpoints of ``INTERFACE_ENDPOINTS`` behind one security group that admits HTTPS from
    the VPC only; flow logs into a log group encrypted with ``flow_log_key``.

    ``private_subnets`` selects where workloads run. The VPC, its subnets and flow log are named (Name tag) after
    this construct's path.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cidr: str,
        max_azs: int,
        nat_gateways: int,
        subnet_masks: tuple[int, int],
        flow_log_key: kms.IKey,
        flow_log_retention: logs.RetentionDays,
        removal_policy: cdk.RemovalPolicy,
        image_registry_accounts: Sequence[str] = (),
    ) -> None:
        super().__init__(scope, construct_id)
        # Accounts whose ECR repositories the workloads pull the platform's built images from (the pipeline's).
        self.image_registry_accounts = list(image_registry_accounts)
        private_type = ec2.SubnetType.PRIVATE_WITH_EGRESS if nat_gateways else ec2.SubnetType.PRIVATE_ISOLATED
        # (private, public): the settings hold them and check that the VPC's CIDR holds these (settings/network.py).
        private_mask, public_mask = subnet_masks
        subnets = [ec2.SubnetConfiguration(name="Private", subnet_type=private_type, cidr_mask=private_mask)]
        if nat_gateways:
            # Public subnets hold only the NAT gateways: nothing launched there gets a public address.
            subnets.insert(
                0,
                ec2.SubnetConfiguration(
                    name="Public",
                    subnet_type=ec2.SubnetType.PUBLIC,
                    cidr_mask=public_mask,
                    map_public_ip_on_launch=False,
                ),
            )
        self.vpc = ec2.Vpc(
            self,
            "Default",
            vpc_name=self.node.path,
            ip_addresses=ec2.IpAddresses.cidr(cidr),
            max_azs=max_azs,
            nat_gateways=nat_gateways,
            subnet_configuration=subnets,
            restrict_default_security_group=True,
        )
        for subnet in [*self.vpc.public_subnets, *self.vpc.private_subnets, *self.vpc.isolated_subnets]:
            # ec2.Vpc names each subnet after its construct path, which holds the hidden id Default.
            cdk.Tags.of(subnet).add("Name", f"{self.node.path}/{subnet.node.id}")
        for subnet in self.vpc.public_subnets:
            acknowledge(
                subnet,
                "Public subnets hold only the NAT gateways that give private subnets outbound access; they never "
                "auto-assign public addresses and nothing else is launched in them.",
                "NIST.800.53.R5-VPCNoUnrestrictedRouteToIGW",
            )
        self.private_subnets = ec2.SubnetSelection(subnets=self.vpc.select_subnets(subnet_type=private_type).subnets)
        self._flow_logs(flow_log_key, flow_log_retention, removal_policy)
        self._endpoints(cidr)

    def _flow_logs(self, key: kms.IKey, retention: logs.RetentionDays, removal_policy: cdk.RemovalPolicy) -> None:
        self.flow_log_group = logs.LogGroup(
            self, "FlowLogs", encryption_key=key, retention=retention, removal_policy=removal_policy
        )
        # The delivery role trusts VPC Flow Logs only for this account's flow logs (confused deputy; condition block
        # from the VPC user guide, "IAM role for publishing flow logs to CloudWatch Logs").
        self.flow_log_role = iam.Role(
            self,
            "FlowLogRole",
            assumed_by=iam.ServicePrincipal(
                "vpc-flow-logs.amazonaws.com",
                conditions={
                    "StringEquals": {"aws:SourceAccount": cdk.Stack.of(self).account},
                    "ArnLike": {"aws:SourceArn": arn(self, "ec2", "vpc-flow-log/*")},
                },
            ),
            description="VPC Flow Logs delivery into the flow-log group",
        )
        ec2.FlowLog(
            self,
            "FlowLog",
            resource_type=ec2.FlowLogResourceType.from_vpc(self.vpc),
            destination=ec2.FlowLogDestination.to_cloud_watch_logs(self.flow_log_group, self.flow_log_role),
        )
        acknowledge(
            self.flow_log_role,
            "CDK grants this flow-log delivery role one policy scoped to its own log group.",
            "NIST.800.53.R5-IAMNoInlinePolicy",
        )

    def _endpoints(self, cidr: str) -> None:
        s3_endpoint = self.vpc.add_gateway_endpoint(
            "S3", service=ec2.GatewayVpcEndpointAwsService.S3, subnets=[self.private_subnets]
        )
        for statement in self._s3_endpoint_policy():
            s3_endpoint.add_to_policy(statement)
        # One security group for all interface endpoints; its rule names the CIDR literally so checks can read it.
        self.endpoint_security_group = ec2.SecurityGroup(
            self,
            "EndpointSecurityGroup",
            vpc=self.vpc,
            description="Interface VPC endpoints: HTTPS from inside the VPC only",
            allow_all_outbound=False,
        )
        self.endpoint_security_group.add_ingress_rule(ec2.Peer.ipv4(cidr), ec2.Port.tcp(443), "HTTPS from the VPC")
        for name, service in INTERFACE_ENDPOINTS.items():
            endpoint = self.vpc.add_interface_endpoint(
                name,
                service=service,
                subnets=self.private_subnets,
                private_dns_enabled=True,
                security_groups=[self.endpoint_security_group],
                open=False,
            )
            if name in ENDPOINTS_WITH_IDENTITY_PERIMETER:
                for statement in self._identity_perimeter(self._resource_accounts(name)):
                    endpoint.add_to_policy(statement)

    def _resource_accounts(self, endpoint: str) -> list[str]:
        """The accounts whose resources the workloads reach through ``endpoint``: this one, and for the ECR API the
        AWS account that publishes the Deep Learning Containers in this region (CDK's regional fact), whose
        repositories the training and serving images come from, and the accounts of the platform's built images."""
        stack = cdk.Stack.of(self)
        if endpoint == "EcrApi":
            dlc = stack.regional_fact(region_info.FactName.DLC_REPOSITORY_ACCOUNT)
            return list(dict.fromkeys([stack.account, dlc, *self.image_registry_accounts]))
        return [stack.account]

    def _identity_perimeter(self, resource_accounts: list[str]) -> list[iam.PolicyStatement]:
        """Interface endpoint policy: only this account's principals (and AWS services on their behalf) may call the
        service through the platform's VPC, and only on resources of ``resource_accounts``, so neither credentials
        brought from elsewhere nor the platform's own can move data to another account through it. After
        aws-samples/data-perimeter-policy-examples (vpc_endpoint_policies: AllowRequestsByOrgsIdentitiesToOrgsResources
        and, for ECR, ...ToAWSResources), with the account for the organization. ``...IfExists``: an action on no
        resource (sts:GetCallerIdentity, ecr:GetAuthorizationToken, the List calls) carries no resource account."""
        return [
            iam.PolicyStatement(
                sid="AllowThisAccountsPrincipalsToTheseAccountsResources",
                principals=[iam.AnyPrincipal()],
                actions=["*"],
                resources=["*"],
                conditions={
                    "StringEquals": {"aws:PrincipalAccount": cdk.Stack.of(self).account},
                    "StringEqualsIfExists": {"aws:ResourceAccount": resource_accounts},
                },
            ),
            iam.PolicyStatement(
                sid="AllowAwsServicePrincipals",
                principals=[iam.AnyPrincipal()],
                actions=["*"],
                resources=["*"],
                conditions={"Bool": {"aws:PrincipalIsAWSService": "true"}},
            ),
        ]

    def _s3_endpoint_policy(self) -> list[iam.PolicyStatement]:
        """S3 gateway endpoint policy: this account's principals to this account's buckets (the platform's buckets and
        the CDK asset bucket the training code comes from), plus the AWS-owned buckets the workloads read: ECR image
        layers, the DLC account's images' too (ECR user guide, https://docs.aws.amazon.com/AmazonECR/latest/userguide/
        vpc-endpoints.html, "Minimum Amazon S3 bucket permissions for Amazon ECR":
        ``arn:aws:s3:::prod-region-starport-layer-bucket/*``) and what SSM Agent needs for Session Manager (Systems
        Manager user guide, "SSM Agent communications with AWS managed S3 buckets"). Any other bucket, in particular
        one of another account, is out of reach from the private subnets."""
        stack = cdk.Stack.of(self)
        region = stack.region
        aws_owned = [
            f"prod-{region}-starport-layer-bucket",
            f"aws-ssm-{region}",
            f"aws-windows-downloads-{region}",
            f"amazon-ssm-{region}",
            f"amazon-ssm-packages-{region}",
            f"{region}-birdwatcher-prod",
            f"aws-ssm-distributor-file-{region}",
            f"aws-ssm-document-attachments-{region}",
            f"patch-baseline-snapshot-{region}",
        ]
        return [
            iam.PolicyStatement(
                sid="AllowThisAccountsPrincipalsToThisAccountsBuckets",
                principals=[iam.AnyPrincipal()],
                actions=["s3:*"],
                resources=["*"],
                conditions={
                    "StringEquals": {"aws:PrincipalAccount": stack.account, "aws:ResourceAccount": stack.account}
                },
            ),
            iam.PolicyStatement(
                sid="AllowReadsOfAwsOwnedBuckets",
                principals=[iam.AnyPrincipal()],
                actions=["s3:GetObject"],
                resources=[f"arn:{stack.partition}:s3:::{bucket}/*" for bucket in aws_owned],
            ),
            iam.PolicyStatement(
                sid="AllowAwsServicePrincipals",
                principals=[iam.AnyPrincipal()],
                actions=["s3:*"],
                resources=["*"],
                conditions={"Bool": {"aws:PrincipalIsAWSService": "true"}},
            ),
        ]


class WorkloadSecurityGroup(ec2.SecurityGroup):
    """The security group of SageMaker jobs and models: no inbound rule, outbound HTTPS only (to the VPC endpoints
    and AWS APIs)."""

    def __init__(self, scope: Construct, construct_id: str, *, vpc: ec2.IVpc) -> None:
        super().__init__(
            scope,
            construct_id,
            vpc=vpc,
            description="SageMaker jobs and models: no inbound, HTTPS out to VPC endpoints and AWS APIs",
            allow_all_outbound=False,
        )
        self.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(443), "HTTPS to AWS APIs")
