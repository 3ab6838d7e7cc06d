"""The foundation every other stack builds on: the platform KMS key, buckets, network and least-privilege roles."""

from __future__ import annotations

from typing import cast

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import region_info
from constructs import Construct

from stacks.compliance import (
    acknowledge,
    acknowledge_control,
    acknowledge_short_retention,
    acknowledge_wildcards,
    log_retention,
)
from stacks.components.secure_buckets import KEEP_LOGICAL_IDS, SecureBuckets
from stacks.environment_stack import EnvironmentStack
from stacks.settings import ENDPOINT_MODELS_PREFIX, EnvironmentSettings
from training_assets.remote_jobs import CALLER_ID_VARIABLE, OWNER_TAG_KEY, REMOTE_JOBS_PREFIX

TRAINING_OUTPUT_PREFIX = "training-output/"
# The construct id suffix CDK gives its singleton LogRetention function (aws-logs/lib/log-retention.ts).
_LOG_RETENTION_ID = "aae0aa3c5b4d4f87b02d85b201efdd8a"
DATA_CAPTURE_PREFIX = "data-capture/"
# The one log group SageMaker writes every training job's streams to (<job name>/algo-<n>-<timestamp>).
TRAINING_JOB_LOG_GROUP = "/aws/sagemaker/TrainingJobs"


def remote_config_parameter_name(settings: EnvironmentSettings) -> str:
    """The SSM parameter holding the environment's @remote config.yaml (written by the TrainingStack, read by the
    launcher policy's holders)."""
    return f"/{settings.tags.project}/{settings.name}/sagemaker/remote-function-config"


# Interface endpoints the platform's private subnets need: image pulls, SageMaker, credentials, logs, Session Manager.
_INTERFACE_ENDPOINTS = {
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

# Interface endpoints that take the identity-perimeter policy. They support endpoint policies (ECR, SageMaker,
# STS, CloudWatch Logs and SSM user guides). Left with the default (full access) policy: ECR's Docker endpoint,
# whose registry protocol starts with unauthenticated requests, and the Session Manager channels (ssmmessages,
# ec2messages).
_ENDPOINTS_WITH_IDENTITY_PERIMETER = ("EcrApi", "SageMakerApi", "SageMakerRuntime", "Sts", "Logs", "Ssm")

# What SageMaker needs to attach a job's or a model's containers to the VPC.
_SAGEMAKER_VPC_DESCRIBE_ACTIONS = [
    "ec2:DescribeNetworkInterfaces",
    "ec2:DescribeVpcs",
    "ec2:DescribeDhcpOptions",
    "ec2:DescribeSubnets",
    "ec2:DescribeSecurityGroups",
]


class FoundationStack(EnvironmentStack):
    """KMS key, S3 buckets, VPC and the IAM roles of one environment."""

    def __init__(self, scope: Construct, construct_id: str, *, settings: EnvironmentSettings, **kwargs) -> None:
        super().__init__(
            scope,
            construct_id,
            description=f"PyTorch platform foundation ({settings.name}): KMS key, buckets, network, IAM roles",
            settings=settings,
            **kwargs,
        )

        self.key = self._platform_key()
        buckets = SecureBuckets(
            self,
            KEEP_LOGICAL_IDS,
            key=self.key,
            removal_policy=self.removal_policy,
            access_log_expiration_days=90 if settings.destroy_on_delete else 365,
            noncurrent_version_days=30 if settings.destroy_on_delete else 90,
            no_replication_reason="The platform is single-region by design; versioning plus the retain policy of "
            "staging and prod protect the data, and datasets and models can be rebuilt from their sources.",
        )
        self.access_logs_bucket = buckets.access_logs
        self.datasets_bucket = buckets.add_data_bucket("Datasets")
        self.artifacts_bucket = buckets.add_data_bucket("Artifacts")
        self.remote_jobs_bucket = buckets.add_data_bucket("RemoteJobs")
        self._control_tower_buckets(buckets)

        self.vpc, self.private_subnets = self._network()
        self.workload_security_group = ec2.SecurityGroup(
            self,
            "WorkloadSecurityGroup",
            vpc=self.vpc,
            description="SageMaker jobs and models: no inbound, HTTPS out to VPC endpoints and AWS APIs",
            allow_all_outbound=False,
        )
        self.workload_security_group.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(443), "HTTPS to AWS APIs")

        self.endpoint_role = self._endpoint_role()
        self.training_instance_role, self.training_instance_profile = self._training_instance_role()
        self.remote_job_role = self._remote_job_role()
        self.remote_job_launcher_policy = self._remote_job_launcher_policy()
        if settings.logs.manage_training_job_log_group:
            self._training_job_log_retention()
        self._outputs()

    @property
    def availability_zones(self) -> list[str]:
        """The region's first zones as deploy-time tokens: no account lookup at synth and no hard-coded zone names
        (an environment-agnostic stack would otherwise get only two zones)."""
        return [cdk.Fn.select(i, cdk.Fn.get_azs()) for i in range(self.settings.vpc.max_azs)]

    # --- encryption and storage ---------------------------------------------------------------------------------

    def _platform_key(self) -> kms.Key:
        key = kms.Key(
            self,
            "PlatformKey",
            alias=f"alias/{self.settings.tags.project}-{self.settings.name}",
            description=f"Encrypts the {self.settings.name} PyTorch platform's data at rest",
            enable_key_rotation=True,
            removal_policy=self.removal_policy,
            pending_window=cdk.Duration.days(7 if self.settings.destroy_on_delete else 30),
        )
        # Services that encrypt on the platform's behalf: log groups (flow logs, training logs) and alarm topics.
        key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="AllowCloudWatchLogs",
                principals=[iam.ServicePrincipal(f"logs.{self.region}.amazonaws.com")],
                actions=["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"],
                resources=["*"],
                conditions={"ArnLike": {"kms:EncryptionContext:aws:logs:arn": self._arn("logs", "*")}},
            )
        )
        key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="AllowCloudWatchAlarmsToPublishToEncryptedTopics",
                principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
                actions=["kms:Decrypt", "kms:GenerateDataKey*"],
                resources=["*"],
                conditions={"StringEquals": {"aws:SourceAccount": self.account}},
            )
        )
        # Grants only for AWS resources (EBS volumes, SageMaker jobs) or from AWS services (Control Tower
        # CT.KMS.PR.3): a principal with kms:CreateGrant cannot hand the key's use to anyone else directly.
        key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="DenyGrantsExceptForAwsResources",
                effect=iam.Effect.DENY,
                principals=[iam.AnyPrincipal()],
                actions=["kms:CreateGrant"],
                resources=["*"],
                conditions={
                    "BoolIfExists": {"kms:GrantIsForAWSResource": "false", "aws:PrincipalIsAWSService": "false"}
                },
            )
        )
        return key

    def _control_tower_buckets(self, buckets: SecureBuckets) -> None:
        """The Control Tower controls of the buckets: what is real is set, the rest acknowledged with its reason."""
        acknowledge_control(
            buckets.access_logs,
            "S3 delivers server access logs only to buckets encrypted with SSE-S3, not SSE-KMS (CT.S3.PR.10).",
            "s3_bucket_default_encryption_kms_check",
        )
        acknowledge_control(
            buckets.access_logs,
            "This bucket is the server-access-log target of the other buckets; logging it into itself would loop "
            "(CT.S3.PR.2).",
            "s3_bucket_logging_enabled_check",
        )
        acknowledge_control(
            buckets.access_logs,
            "Only S3's log delivery writes here; notifications of every delivered log object would be noise "
            "(CT.S3.PR.4).",
            "s3_event_notifications_enabled_check",
        )
        for bucket in buckets.data_buckets:
            # Object-level events (new datasets, models, captured data) go to EventBridge, where pipelines and
            # audits can subscribe (CT.S3.PR.4). Set on the bucket itself: CDK's event_bridge_enabled adds a
            # custom-resource Lambda for the same setting.
            cast(cdk.CfnResource, bucket.node.default_child).add_property_override(
                "NotificationConfiguration.EventBridgeConfiguration.EventBridgeEnabled", True
            )
        for bucket in [buckets.access_logs, *buckets.data_buckets]:
            acknowledge_control(
                bucket,
                "No S3 Object Lock (CT.S3.PR.9): versioning keeps overwritten and deleted objects, lifecycle rules "
                "must expire noncurrent versions and logs, and dev is emptied on destroy; a WORM lock would block "
                "all three.",
                "s3_bucket_object_lock_enabled_check",
            )

    # --- network ------------------------------------------------------------------------------------------------

    def _network(self) -> tuple[ec2.IVpc, ec2.SubnetSelection]:
        vpc_settings = self.settings.vpc
        if vpc_settings.vpc_id is not None:  # imported
            # Explicit ids, no lookup: synth stays offline; the imported VPC brings its own endpoints and flow logs.
            vpc = ec2.Vpc.from_vpc_attributes(
                self,
                "Vpc",
                vpc_id=vpc_settings.vpc_id,
                availability_zones=vpc_settings.availability_zones,
                private_subnet_ids=vpc_settings.private_subnet_ids,
            )
            return vpc, ec2.SubnetSelection(subnets=vpc.private_subnets)

        private_type = (
            ec2.SubnetType.PRIVATE_WITH_EGRESS if vpc_settings.nat_gateways else ec2.SubnetType.PRIVATE_ISOLATED
        )
        subnets = [ec2.SubnetConfiguration(name="Private", subnet_type=private_type, cidr_mask=20)]
        if vpc_settings.nat_gateways:
            # Public subnets hold only the NAT gateways: nothing launched there gets a public address.
            subnets.insert(
                0,
                ec2.SubnetConfiguration(
                    name="Public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24, map_public_ip_on_launch=False
                ),
            )
        vpc = ec2.Vpc(
            self,
            "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(vpc_settings.cidr),
            max_azs=vpc_settings.max_azs,
            nat_gateways=vpc_settings.nat_gateways,
            subnet_configuration=subnets,
            restrict_default_security_group=True,
        )
        flow_log_group = logs.LogGroup(
            self,
            "FlowLogs",
            encryption_key=self.key,
            retention=log_retention(vpc_settings.flow_log_retention_days),
            removal_policy=self.removal_policy,
        )
        acknowledge_short_retention(flow_log_group, vpc_settings.flow_log_retention_days, "vpc.flow_log_retention_days")
        # The delivery role trusts VPC Flow Logs only for this account's flow logs (confused deputy; condition block
        # from the VPC user guide, "IAM role for publishing flow logs to CloudWatch Logs").
        flow_log_role = iam.Role(
            self,
            "FlowLogRole",
            assumed_by=iam.ServicePrincipal(
                "vpc-flow-logs.amazonaws.com",
                conditions={
                    "StringEquals": {"aws:SourceAccount": self.account},
                    "ArnLike": {"aws:SourceArn": self._arn("ec2", "vpc-flow-log/*")},
                },
            ),
            description="VPC Flow Logs delivery into the flow-log group",
        )
        vpc.add_flow_log(
            "FlowLog", destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_log_group, flow_log_role)
        )
        acknowledge(
            flow_log_role,
            "CDK grants this flow-log delivery role one policy scoped to its own log group.",
            "NIST.800.53.R5-IAMNoInlinePolicy",
        )
        for subnet in vpc.public_subnets:
            acknowledge(
                subnet,
                "Public subnets hold only the NAT gateways that give private subnets outbound access; they never "
                "auto-assign public addresses and nothing else is launched in them.",
                "NIST.800.53.R5-VPCNoUnrestrictedRouteToIGW",
            )

        private = ec2.SubnetSelection(subnets=vpc.select_subnets(subnet_type=private_type).subnets)
        s3_endpoint = vpc.add_gateway_endpoint("S3", service=ec2.GatewayVpcEndpointAwsService.S3, subnets=[private])
        for statement in self._s3_endpoint_policy():
            s3_endpoint.add_to_policy(statement)
        # One security group for all interface endpoints; its rule names the CIDR literally so checks can read it.
        endpoint_security_group = ec2.SecurityGroup(
            self,
            "VpcEndpointSecurityGroup",
            vpc=vpc,
            description="Interface VPC endpoints: HTTPS from inside the VPC only",
            allow_all_outbound=False,
        )
        endpoint_security_group.add_ingress_rule(
            ec2.Peer.ipv4(vpc_settings.cidr), ec2.Port.tcp(443), "HTTPS from the VPC"
        )
        for name, service in _INTERFACE_ENDPOINTS.items():
            endpoint = vpc.add_interface_endpoint(
                name,
                service=service,
                subnets=private,
                private_dns_enabled=True,
                security_groups=[endpoint_security_group],
                open=False,
            )
            if name in _ENDPOINTS_WITH_IDENTITY_PERIMETER:
                for statement in self._identity_perimeter():
                    endpoint.add_to_policy(statement)
        return vpc, private

    def _identity_perimeter(self) -> list[iam.PolicyStatement]:
        """Interface endpoint policy: only this account's principals (and AWS services on their behalf) may call the
        service through the platform's VPC, so credentials brought from elsewhere cannot move data out through it.
        After aws-samples/data-perimeter-policy-examples (vpc_endpoint_policies), with the account for the org."""
        return [
            iam.PolicyStatement(
                sid="AllowThisAccountsPrincipals",
                principals=[iam.AnyPrincipal()],
                actions=["*"],
                resources=["*"],
                conditions={"StringEquals": {"aws:PrincipalAccount": self.account}},
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
        layers (ECR user guide, "Minimum Amazon S3 bucket permissions for Amazon ECR") and what SSM Agent needs for
        Session Manager (Systems Manager user guide, "SSM Agent communications with AWS managed S3 buckets"). Any
        other bucket, in particular one of another account, is out of reach from the private subnets."""
        region = self.region
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
                    "StringEquals": {"aws:PrincipalAccount": self.account, "aws:ResourceAccount": self.account}
                },
            ),
            iam.PolicyStatement(
                sid="AllowReadsOfAwsOwnedBuckets",
                principals=[iam.AnyPrincipal()],
                actions=["s3:GetObject"],
                resources=[f"arn:{self.partition}:s3:::{bucket}/*" for bucket in aws_owned],
            ),
            iam.PolicyStatement(
                sid="AllowAwsServicePrincipals",
                principals=[iam.AnyPrincipal()],
                actions=["s3:*"],
                resources=["*"],
                conditions={"Bool": {"aws:PrincipalIsAWSService": "true"}},
            ),
        ]

    # --- IAM ----------------------------------------------------------------------------------------------------

    def _dlc_pull(self, *repositories: str) -> list[tuple[iam.PolicyStatement, str | None]]:
        """ECR login, plus the pull of ``repositories``; roles whose images grant their own pull (the endpoints':
        ``DlcImage.bind`` in stacks/components/sagemaker_endpoint.py) pass none."""
        dlc_account = cdk.Stack.of(self).regional_fact(region_info.FactName.DLC_REPOSITORY_ACCOUNT)
        login = (
            iam.PolicyStatement(sid="EcrLogin", actions=["ecr:GetAuthorizationToken"], resources=["*"]),
            "ecr:GetAuthorizationToken has no resource-level permissions.",
        )
        if not repositories:
            return [login]
        return [
            login,
            (
                iam.PolicyStatement(
                    sid="PullDeepLearningContainers",
                    actions=["ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"],
                    resources=[
                        f"arn:{self.partition}:ecr:{self.region}:{dlc_account}:repository/{repository}"
                        for repository in repositories
                    ],
                ),
                None,
            ),
        ]

    def _attach_to_vpc(self) -> list[tuple[iam.PolicyStatement, str | None]]:
        """The network-interface calls SageMaker makes with the execution role to join a job or model to the VPC,
        held to the platform's VPC, private subnets and workload security group. `ec2:Vpc` is a condition key of
        the network-interface, subnet and security-group resource types of CreateNetworkInterface,
        CreateNetworkInterfacePermission and DeleteNetworkInterface (Service Authorization Reference, Amazon EC2);
        DeleteNetworkInterfacePermission has no resource-level permissions there, so it can only name `*`."""
        in_platform_vpc = {"ArnEquals": {"ec2:Vpc": self._arn("ec2", f"vpc/{self.vpc.vpc_id}")}}
        return [
            (
                iam.PolicyStatement(
                    sid="CreateInterfacesInThePlatformSubnets",
                    actions=["ec2:CreateNetworkInterface"],
                    resources=[
                        *(
                            self._arn("ec2", f"subnet/{subnet.subnet_id}")
                            for subnet in self.private_subnets.subnets or []
                        ),
                        self._arn("ec2", f"security-group/{self.workload_security_group.security_group_id}"),
                        self._arn("ec2", "network-interface/*"),
                    ],
                    conditions=in_platform_vpc,
                ),
                "The network interfaces SageMaker creates get generated ids; ec2:Vpc holds them (and the named "
                "subnets and security group) to the platform's VPC.",
            ),
            (
                iam.PolicyStatement(
                    sid="ManageInterfacesInThePlatformVpc",
                    actions=["ec2:CreateNetworkInterfacePermission", "ec2:DeleteNetworkInterface"],
                    resources=[self._arn("ec2", "network-interface/*")],
                    conditions=in_platform_vpc,
                ),
                "SageMaker hands over and deletes the interfaces it created (generated ids), only in the platform's "
                "VPC (ec2:Vpc).",
            ),
            (
                iam.PolicyStatement(
                    sid="DeleteInterfacePermissions",
                    actions=["ec2:DeleteNetworkInterfacePermission"],
                    resources=["*"],
                ),
                "ec2:DeleteNetworkInterfacePermission has no resource-level permissions or condition keys; SageMaker "
                "revokes the interface permission it granted itself when a job or endpoint ends.",
            ),
        ]

    def _use_key(self, *actions: str) -> tuple[iam.PolicyStatement, str | None]:
        return iam.PolicyStatement(sid="UsePlatformKey", actions=list(actions), resources=[self.key.key_arn]), None

    def _policy(
        self,
        name: str,
        description: str,
        statements: list[tuple[iam.PolicyStatement, str | None]],
        *,
        roles: list[iam.IRole] | None = None,
    ) -> iam.ManagedPolicy:
        """A customer-managed policy (NIST: no inline policies); each wildcard statement carries its reason."""
        policy = iam.ManagedPolicy(
            self, name, description=description, roles=roles, statements=[statement for statement, _ in statements]
        )
        acknowledge_wildcards(policy, *((statement, reason) for statement, reason in statements if reason))
        return policy

    def _sagemaker_role(
        self,
        name: str,
        description: str,
        log_group_prefix: str,
        repositories: list[str],
        statements: list[tuple[iam.PolicyStatement, str | None]],
        *,
        source_arn: str,
    ) -> iam.Role:
        # Confused deputy: SageMaker may assume the role only for this account's resources in this region (the
        # aws:SourceArn templates of the SageMaker developer guide, "Cross-service confused deputy prevention").
        principal = iam.ServicePrincipal(
            "sagemaker.amazonaws.com", conditions={"ArnLike": {"aws:SourceArn": source_arn}}
        )
        role = iam.Role(self, name, assumed_by=principal, description=description)
        policy = self._policy(
            f"{name}Policy",
            f"Least-privilege permissions of the {name}",
            [
                *self._dlc_pull(*repositories),
                (
                    iam.PolicyStatement(
                        sid="WriteOwnLogs",
                        actions=[
                            "logs:CreateLogGroup",
                            "logs:CreateLogStream",
                            "logs:PutLogEvents",
                            "logs:DescribeLogStreams",
                        ],
                        resources=[self._arn("logs", f"log-group:{log_group_prefix}*")],
                    ),
                    "SageMaker names one log group per endpoint or job under this prefix, and streams per instance.",
                ),
                (
                    iam.PolicyStatement(
                        sid="PublishSageMakerMetrics",
                        actions=["cloudwatch:PutMetricData"],
                        resources=["*"],
                        conditions={"StringLike": {"cloudwatch:namespace": ["/aws/sagemaker/*", "aws/sagemaker/*"]}},
                    ),
                    "cloudwatch:PutMetricData has no resource-level permissions; a namespace condition limits it.",
                ),
                (
                    iam.PolicyStatement(sid="DescribeVpc", actions=_SAGEMAKER_VPC_DESCRIBE_ACTIONS, resources=["*"]),
                    "The EC2 Describe calls SageMaker makes before joining the VPC have no resource-level permissions.",
                ),
                *self._attach_to_vpc(),
                self._use_key(
                    "kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey", "kms:DescribeKey", "kms:CreateGrant"
                ),
                *statements,
            ],
            roles=[role],
        )
        # checkov reads its exceptions from the template metadata of the resource they excuse.
        cast(cdk.CfnResource, policy.node.default_child).add_metadata(
            "checkov",
            {
                "skip": [
                    {
                        "id": "CKV_AWS_109",
                        "comment": "ec2:DeleteNetworkInterfacePermission (IAM access level: permissions management) "
                        "has no resource-level permissions; SageMaker's VPC setup needs it on *.",
                    }
                ]
            },
        )
        return role

    def _endpoint_role(self) -> iam.Role:
        artifacts = self.artifacts_bucket
        model_prefixes = [ENDPOINT_MODELS_PREFIX, self.settings.multi_model_endpoint.models_prefix]
        return self._sagemaker_role(
            "EndpointExecutionRole",
            "SageMaker execution role of the platform's endpoints: reads model archives; images grant their own pull",
            "/aws/sagemaker/Endpoints/",
            [],  # each endpoint's image grants its own pull (DlcImage.bind)
            [
                (
                    iam.PolicyStatement(
                        sid="ReadModelArchives",
                        actions=["s3:GetObject"],
                        resources=[artifacts.arn_for_objects(f"{prefix}*") for prefix in model_prefixes],
                    ),
                    "Endpoints load any model version under their own model prefixes (and any model of the MME).",
                ),
                (
                    iam.PolicyStatement(
                        sid="ListModelPrefixes",
                        actions=["s3:ListBucket"],
                        resources=[artifacts.bucket_arn],
                        conditions={"StringLike": {"s3:prefix": [f"{prefix}*" for prefix in model_prefixes]}},
                    ),
                    None,
                ),
                (
                    iam.PolicyStatement(
                        sid="WriteDataCapture",
                        actions=["s3:PutObject"],
                        resources=[artifacts.arn_for_objects(f"{DATA_CAPTURE_PREFIX}*")],
                    ),
                    "Data capture writes one object per captured batch under the data-capture prefix.",
                ),
            ],
            # Inference: the guide's template must stay "<account>:*", never a model or endpoint ARN.
            source_arn=self._arn("sagemaker", "*"),
        )

    def _remote_job_role(self) -> iam.Role:
        return self._sagemaker_role(
            "RemoteJobRole",
            "SageMaker training jobs started with the SDK's @remote decorator",
            "/aws/sagemaker/TrainingJobs",
            ["pytorch-training"],
            [
                (
                    iam.PolicyStatement(
                        sid="ReadWriteRemoteFunctionRoot",
                        actions=["s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload"],
                        resources=[self.remote_jobs_bucket.arn_for_objects("*")],
                    ),
                    "The SDK stages each job's function, arguments and results under generated keys of this bucket.",
                ),
                self._read_datasets(),
                self._write_training_output(),
                (
                    iam.PolicyStatement(
                        sid="ListBuckets",
                        actions=["s3:ListBucket", "s3:GetBucketLocation"],
                        resources=[
                            b.bucket_arn for b in (self.remote_jobs_bucket, self.datasets_bucket, self.artifacts_bucket)
                        ],
                    ),
                    None,
                ),
            ],
            source_arn=self._arn("sagemaker", "training-job/*"),
        )

    def _read_datasets(self) -> tuple[iam.PolicyStatement, str]:
        return (
            iam.PolicyStatement(
                sid="ReadDatasets", actions=["s3:GetObject"], resources=[self.datasets_bucket.arn_for_objects("*")]
            ),
            "Training reads whichever dataset files the run names; the bucket holds datasets only.",
        )

    def _write_training_output(self) -> tuple[iam.PolicyStatement, str]:
        return (
            iam.PolicyStatement(
                sid="WriteTrainingOutput",
                actions=["s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload"],
                resources=[self.artifacts_bucket.arn_for_objects(f"{TRAINING_OUTPUT_PREFIX}*")],
            ),
            "Each training run writes its model under a new key of the training-output prefix.",
        )

    def _training_instance_role(self) -> tuple[iam.Role, iam.InstanceProfile]:
        role = iam.Role(
            self,
            "TrainingInstanceRole",
            assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            description="GPU training instances: Session Manager, DLC pulls, read datasets, write model artifacts",
        )
        policy = self._policy(
            "TrainingInstancePolicy",
            "Least-privilege permissions of the GPU training instances",
            [
                *self._dlc_pull("pytorch-training"),
                self._read_datasets(),
                self._write_training_output(),
                (
                    iam.PolicyStatement(
                        sid="ListBuckets",
                        actions=["s3:ListBucket"],
                        resources=[self.datasets_bucket.bucket_arn, self.artifacts_bucket.bucket_arn],
                    ),
                    None,
                ),
                self._use_key("kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey", "kms:DescribeKey"),
                (
                    # Exactly the Session Manager actions of the Systems Manager user guide, "Create a custom IAM
                    # instance profile for Session Manager" (no session logging to S3 or CloudWatch and no session
                    # KMS key are configured, so none of its optional s3/logs/kms statements). Unlike
                    # AmazonSSMManagedInstanceCore: no ssm:GetParameter(s), ssm:GetDocument, ec2messages (Run
                    # Command) or s3:GetEncryptionConfiguration.
                    iam.PolicyStatement(
                        sid="SessionManagerOnly",
                        actions=[
                            "ssm:UpdateInstanceInformation",
                            "ssmmessages:CreateControlChannel",
                            "ssmmessages:CreateDataChannel",
                            "ssmmessages:OpenControlChannel",
                            "ssmmessages:OpenDataChannel",
                        ],
                        resources=["*"],
                    ),
                    "The Session Manager channel actions have no resource-level permissions (the AWS guide's "
                    "custom instance profile names *); Session Manager replaces SSH.",
                ),
            ],
            roles=[role],
        )
        cast(cdk.CfnResource, policy.node.default_child).add_metadata(
            "checkov",
            {
                "skip": [
                    {
                        "id": "CKV_AWS_111",
                        "comment": "ssm:UpdateInstanceInformation and the ssmmessages channel actions of Session "
                        "Manager are granted on * in AWS's documented custom instance profile; no narrower resource.",
                    }
                ]
            },
        )
        return role, iam.InstanceProfile(self, "TrainingInstanceProfile", role=role)

    def _remote_job_launcher_policy(self) -> iam.ManagedPolicy:
        """Attach to data scientists' roles: start @remote jobs with the platform's role and nothing broader."""
        caller_root = f"{REMOTE_JOBS_PREFIX}/{CALLER_ID_VARIABLE}"
        return self._policy(
            "RemoteJobLauncherPolicy",
            "Lets a data scientist run @remote SageMaker training jobs on this environment",
            [
                # Callers are isolated from each other (training_assets/remote_jobs.py): a job is created only with
                # the caller's own owner tag, and only the owner may describe or stop it. DescribeTrainingJob returns
                # the job's Environment: the user's variables and the public key that verifies the function the
                # client signed (sagemaker-core 2.27 job.py compile: REMOTE_FUNCTION_SECRET_KEY = public key PEM).
                # aws:RequestTag, aws:TagKeys and aws:ResourceTag are condition keys of CreateTrainingJob, AddTags,
                # DescribeTrainingJob and StopTrainingJob (Service Authorization Reference, Amazon SageMaker).
                (
                    iam.PolicyStatement(
                        sid="CreateOwnTrainingJobs",
                        actions=["sagemaker:CreateTrainingJob", "sagemaker:AddTags"],
                        resources=[self._arn("sagemaker", "training-job/*")],
                        conditions=self._owner_tagged_on_create(),
                    ),
                    "The SDK generates a new training-job name for every @remote call; the owner tag binds it to "
                    "its caller.",
                ),
                (
                    iam.PolicyStatement(
                        sid="DescribeAndStopOwnTrainingJobs",
                        actions=["sagemaker:DescribeTrainingJob", "sagemaker:StopTrainingJob"],
                        resources=[self._arn("sagemaker", "training-job/*")],
                        conditions={"StringEquals": {f"aws:ResourceTag/{OWNER_TAG_KEY}": CALLER_ID_VARIABLE}},
                    ),
                    "Only jobs whose owner tag is the caller's aws:userid.",
                ),
                (
                    iam.PolicyStatement(
                        sid="PassOnlyTheRemoteJobRoleToSageMaker",
                        actions=["iam:PassRole"],
                        resources=[self.remote_job_role.role_arn],
                        conditions={"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}},
                    ),
                    None,
                ),
                (
                    iam.PolicyStatement(
                        sid="StageOwnFunctionsAndResults",
                        actions=["s3:GetObject", "s3:PutObject"],
                        resources=[self.remote_jobs_bucket.arn_for_objects(f"{caller_root}/*")],
                    ),
                    "The SDK uploads each call's function and downloads its results under generated keys of the "
                    "caller's own prefix (jobs/<aws:userid>/).",
                ),
                (
                    iam.PolicyStatement(
                        sid="ListOwnPrefix",
                        actions=["s3:ListBucket"],
                        resources=[self.remote_jobs_bucket.bucket_arn],
                        conditions={"StringLike": {"s3:prefix": [caller_root, f"{caller_root}/*"]}},
                    ),
                    None,
                ),
                (
                    # job.wait() (and so every @remote call) follows the job's log streams and re-raises an access
                    # error: DescribeLogStreams on the group, GetLogEvents on its streams (<job name>/algo-<n>-...).
                    # The log-group ARN is used with and without the trailing ":*" (CloudWatch Logs access control).
                    iam.PolicyStatement(
                        sid="FollowTrainingJobLogs",
                        actions=["logs:DescribeLogStreams", "logs:GetLogEvents"],
                        resources=[
                            self._arn("logs", f"log-group:{TRAINING_JOB_LOG_GROUP}"),
                            self._arn("logs", f"log-group:{TRAINING_JOB_LOG_GROUP}:*"),
                        ],
                    ),
                    "SageMaker names each job's log streams after the generated job name, in the one log group "
                    "of all training jobs.",
                ),
                (
                    # The README's first step (the FetchRemoteFunctionConfigCommand output): fetch config.yaml.
                    iam.PolicyStatement(
                        sid="ReadTheRemoteFunctionConfig",
                        actions=["ssm:GetParameter"],
                        resources=[self._arn("ssm", f"parameter{remote_config_parameter_name(self.settings)}")],
                    ),
                    None,
                ),
                self._use_key("kms:Decrypt", "kms:GenerateDataKey", "kms:DescribeKey"),
            ],
        )

    def _owner_tagged_on_create(self) -> dict[str, dict[str, object]]:
        """Conditions of CreateTrainingJob and AddTags: the request carries the owner tag with the caller's id, only
        the environment's tag keys besides it, and an existing job's owner (aws:ResourceTag, absent while the job
        is created) is the caller: nobody re-tags another caller's job as theirs."""
        owner = f"aws:ResourceTag/{OWNER_TAG_KEY}"
        return {
            "StringEquals": {f"aws:RequestTag/{OWNER_TAG_KEY}": CALLER_ID_VARIABLE},
            "ForAllValues:StringEquals": {"aws:TagKeys": [OWNER_TAG_KEY, *self.settings.resource_tags]},
            "StringEqualsIfExists": {owner: CALLER_ID_VARIABLE},
        }

    def _training_job_log_retention(self) -> None:
        """Retention for /aws/sagemaker/TrainingJobs, where SageMaker writes every training job's logs (@remote jobs
        included); it never expires on its own.

        The group belongs to the account, not to this environment: SageMaker creates it with the first training job
        of the account and region and writes every job into it (the name cannot be chosen), so a stack must not own
        it. As an AWS::Logs::LogGroup, CloudFormation would fail to create it wherever a job ran before, and deleting
        the stack would delete every team's training logs. CDK's LogRetention custom resource instead creates the
        group if it is missing and sets its retention; the group stays when the stack goes. No platform key: one
        environment's key (dev's is deleted with dev) would decide whether every job in the account can log.
        """
        group = "/aws/sagemaker/TrainingJobs"
        role = iam.Role(
            self,
            "TrainingJobLogRetentionRole",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=f"Sets the retention of {group}",
        )
        handler_logs = self._arn("logs", f"log-group:/aws/lambda/{self.stack_name}-LogRetention*")
        policy = self._policy(
            "TrainingJobLogRetentionPolicy",
            f"Sets the retention of {group} only",
            [
                (
                    iam.PolicyStatement(
                        sid="SetTheRetentionOfTheTrainingJobLogGroup",
                        actions=["logs:CreateLogGroup", "logs:PutRetentionPolicy", "logs:DeleteRetentionPolicy"],
                        resources=[self._arn("logs", f"log-group:{group}")],
                    ),
                    None,
                ),
                (
                    iam.PolicyStatement(
                        sid="WriteOwnLogs",
                        # On Create the handler also creates its own group and gives it a 1-day retention (aws-cdk
                        # custom-resource-handlers/lib/aws-logs/log-retention-handler/index.ts).
                        actions=[
                            "logs:CreateLogGroup",
                            "logs:CreateLogStream",
                            "logs:PutLogEvents",
                            "logs:PutRetentionPolicy",
                        ],
                        resources=[handler_logs, f"{handler_logs}:log-stream:*"],
                    ),
                    "The handler's own log group is named after the function name CloudFormation generates.",
                ),
            ],
            roles=[role],
        )
        retention = logs.LogRetention(
            self,
            "TrainingJobLogRetention",
            log_group_name=group,
            retention=log_retention(self.settings.logs.retention_days),
            removal_policy=cdk.RemovalPolicy.RETAIN,
            # Immutable: CDK would otherwise add logs:PutRetentionPolicy on * to the role.
            role=role.without_policy_updates(),
        )
        handler = self.node.find_child(f"LogRetention{_LOG_RETENTION_ID}")
        acknowledge_control(
            handler,
            "CDK's singleton LogRetention handler has no VPC option; it runs once per deployment and calls only "
            "CloudWatch Logs.",
            "lambda_inside_vpc_check",
        )
        retention.node.add_dependency(policy)  # the handler runs with these permissions

    def _arn(self, service: str, resource: str) -> str:
        return f"arn:{self.partition}:{service}:{self.region}:{self.account}:{resource}"

    def _outputs(self) -> None:
        values = {
            "PlatformKeyArn": (self.key.key_arn, "KMS key encrypting the platform's data at rest"),
            "DatasetsBucketName": (self.datasets_bucket.bucket_name, "Training datasets"),
            "ArtifactsBucketName": (self.artifacts_bucket.bucket_name, "Training output and endpoint model archives"),
            "RemoteJobsBucketName": (self.remote_jobs_bucket.bucket_name, "S3RootUri of @remote jobs"),
            "AccessLogsBucketName": (self.access_logs_bucket.bucket_name, "S3 server access logs"),
            "EndpointExecutionRoleArn": (self.endpoint_role.role_arn, "SageMaker execution role of the endpoints"),
            "TrainingInstanceProfileArn": (self.training_instance_profile.instance_profile_arn, "GPU instance profile"),
            "RemoteJobRoleArn": (self.remote_job_role.role_arn, "Role of @remote SageMaker training jobs"),
            "RemoteJobLauncherPolicyArn": (
                self.remote_job_launcher_policy.managed_policy_arn,
                "Attach to users of @remote",
            ),
            "PrivateSubnetIds": (
                cdk.Fn.join(",", [s.subnet_id for s in self.private_subnets.subnets or []]),
                "Private subnets",
            ),
            "WorkloadSecurityGroupId": (
                self.workload_security_group.security_group_id,
                "Security group of SageMaker workloads",
            ),
        }
        for name, (value, description) in values.items():
            cdk.CfnOutput(self, name, value=value, description=description)
