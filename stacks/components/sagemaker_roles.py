"""The execution roles SageMaker assumes for the platform: the endpoints' role and the ``@remote`` training jobs' role.

Both attach their jobs or models to the platform's VPC, write their own logs and metrics and use the platform key;
each adds what its workload reads and writes. Every role is its construct's default child (id ``Default``), so the
construct's id is the role's place in logical ids; its policy is the child ``Policy``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from constructs import Construct

from stacks.components.iam_statements import (
    ReasonedStatement,
    arn,
    checkov_skip,
    dlc_pull,
    list_own_prefix,
    read_datasets,
    reasoned_policy,
    use_key,
)
from training_assets.remote_jobs import caller_prefix, job_name_prefix

# What SageMaker needs to attach a job's or a model's containers to the VPC.
_SAGEMAKER_VPC_DESCRIBE_ACTIONS = [
    "ec2:DescribeNetworkInterfaces",
    "ec2:DescribeVpcs",
    "ec2:DescribeDhcpOptions",
    "ec2:DescribeSubnets",
    "ec2:DescribeSecurityGroups",
]


@dataclass(frozen=True)
class VpcAttachment:
    """Where SageMaker may attach a job's or model's network interfaces."""

    vpc: ec2.IVpc
    subnets: Sequence[ec2.ISubnet]
    security_group: ec2.ISecurityGroup


class SageMakerExecutionRole(Construct):
    """A role SageMaker assumes only for this account's resources (``source_arn``), with its own logs and metrics,
    the VPC attachment, the key, the pulls of ``dlc_repositories`` and the workload's ``statements``."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        description: str,
        source_arn: str,
        log_group_prefix: str,
        dlc_repositories: Sequence[str],
        key: kms.IKey,
        network: VpcAttachment,
        statements: Sequence[ReasonedStatement],
        log_stream_prefix: str | None = None,
    ) -> None:
        """``log_group_prefix``: the role writes the log groups whose names start with it; with ``log_stream_prefix``
        it is one group's name, and the role writes only the streams of that group whose names start with this."""
        super().__init__(scope, construct_id)
        # Confused deputy: SageMaker may assume the role only for this account's resources in this region (the
        # aws:SourceArn templates of the SageMaker developer guide, "Cross-service confused deputy prevention").
        principal = iam.ServicePrincipal(
            "sagemaker.amazonaws.com", conditions={"ArnLike": {"aws:SourceArn": source_arn}}
        )
        self.role = iam.Role(self, "Default", assumed_by=principal, description=description)
        self.policy = reasoned_policy(
            self,
            "Policy",
            f"Least-privilege permissions of the {construct_id}",
            [
                *dlc_pull(self, *dlc_repositories),
                *self._own_logs(log_group_prefix, log_stream_prefix),
                *self._metrics_and_vpc_lookups(),
                *self._attach_to_vpc(network),
                use_key(key, "kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey", "kms:DescribeKey", "kms:CreateGrant"),
                *statements,
            ],
            roles=[self.role],
        )
        checkov_skip(
            self.policy,
            "CKV_AWS_109",
            "ec2:DeleteNetworkInterfacePermission (IAM access level: permissions management) has no resource-level "
            "permissions; SageMaker's VPC setup needs it on *.",
        )

    def _own_logs(self, log_group_prefix: str, log_stream_prefix: str | None) -> list[ReasonedStatement]:
        """The workload's own log groups, or its own streams of one group. SageMaker writes a job's or an endpoint's
        logs with its execution role (CreateTrainingJob, RoleArn: "write logs to Amazon CloudWatch Logs")."""
        actions = ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"]
        if log_stream_prefix is None:
            return [
                (
                    iam.PolicyStatement(
                        sid="WriteOwnLogs",
                        actions=actions,
                        resources=[arn(self, "logs", f"log-group:{log_group_prefix}*")],
                    ),
                    "SageMaker names one log group per endpoint or job under this prefix, and streams per instance.",
                )
            ]
        group = f"log-group:{log_group_prefix}"
        return [
            (
                # Group-level actions in a statement of their own: "<group>:*" would otherwise grant every stream.
                iam.PolicyStatement(
                    sid="FindTheLogGroup",
                    actions=["logs:CreateLogGroup", "logs:DescribeLogStreams"],
                    resources=[arn(self, "logs", group), arn(self, "logs", f"{group}:*")],
                ),
                "CloudWatch Logs authorizes group-level actions on the log-group ARN ending in ':*'; these two "
                "create or list the group, never write a stream.",
            ),
            (
                iam.PolicyStatement(
                    sid="WriteOwnLogStreams",
                    actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                    resources=[arn(self, "logs", f"{group}:log-stream:{log_stream_prefix}*")],
                ),
                "SageMaker names each job's streams <job name>/algo-<n>-<timestamp>; the job names start with this.",
            ),
        ]

    def _metrics_and_vpc_lookups(self) -> list[ReasonedStatement]:
        """The workload's metrics, and the VPC lookups."""
        return [
            (
                # The workloads' namespaces all start with "/aws/sagemaker/" (Model Monitor's defaults
                # /aws/sagemaker/Endpoint/data-metrics and /aws/sagemaker/ModelMonitoring/data-metrics, "CloudWatch
                # Metrics for Bring Your Own Containers"; AWS's SageMakerStudioProjectRoleMachineLearningPolicy grants
                # the same pattern). The one SageMaker namespace without the slash, aws/sagemaker/CapacityReservations,
                # is published by SageMaker's own service-linked role, not by a workload's.
                iam.PolicyStatement(
                    sid="PublishSageMakerMetrics",
                    actions=["cloudwatch:PutMetricData"],
                    resources=["*"],
                    conditions={"StringLike": {"cloudwatch:namespace": "/aws/sagemaker/*"}},
                ),
                "cloudwatch:PutMetricData has no resource-level permissions; a namespace condition limits it.",
            ),
            (
                iam.PolicyStatement(sid="DescribeVpc", actions=_SAGEMAKER_VPC_DESCRIBE_ACTIONS, resources=["*"]),
                "The EC2 Describe calls SageMaker makes before joining the VPC have no resource-level permissions.",
            ),
        ]

    def _attach_to_vpc(self, network: VpcAttachment) -> list[ReasonedStatement]:
        """The network-interface calls SageMaker makes with the execution role to join a job or model to the VPC,
        held to the VPC, its subnets and security group. `ec2:Vpc` is a condition key of the network-interface,
        subnet and security-group resource types of CreateNetworkInterface, CreateNetworkInterfacePermission and
        DeleteNetworkInterface (Service Authorization Reference, Amazon EC2); DeleteNetworkInterfacePermission has no
        resource-level permissions there, so it can only name `*`."""
        in_platform_vpc = {"ArnEquals": {"ec2:Vpc": arn(self, "ec2", f"vpc/{network.vpc.vpc_id}")}}
        return [
            (
                iam.PolicyStatement(
                    sid="CreateInterfacesInThePlatformSubnets",
                    actions=["ec2:CreateNetworkInterface"],
                    resources=[
                        *(arn(self, "ec2", f"subnet/{subnet.subnet_id}") for subnet in network.subnets),
                        arn(self, "ec2", f"security-group/{network.security_group.security_group_id}"),
                        arn(self, "ec2", "network-interface/*"),
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
                    resources=[arn(self, "ec2", "network-interface/*")],
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


class EndpointExecutionRole(SageMakerExecutionRole):
    """The role of the platform's endpoints: reads model archives under ``model_prefixes`` of ``artifacts`` and
    writes captured data under ``data_capture_prefix``; each endpoint's image grants its own pull (DlcImage.bind)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        artifacts: s3.IBucket,
        model_prefixes: Sequence[str],
        data_capture_prefix: str,
        key: kms.IKey,
        network: VpcAttachment,
        endpoint_name_prefix: str,
    ) -> None:
        """``endpoint_name_prefix``: how the names of this environment's endpoints start (their log groups are
        /aws/sagemaker/Endpoints/<endpoint name>, SageMaker developer guide, "Log Amazon SageMaker events with
        Amazon CloudWatch"); the role writes only those log groups."""
        super().__init__(
            scope,
            construct_id,
            description="SageMaker execution role of the platform's endpoints: reads model archives; images grant "
            "their own pull",
            # Inference: the guide's template must stay "<account>:*", never a model or endpoint ARN.
            source_arn=arn(scope, "sagemaker", "*"),
            log_group_prefix=f"/aws/sagemaker/Endpoints/{endpoint_name_prefix}",
            dlc_repositories=[],
            key=key,
            network=network,
            statements=[
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
                        resources=[artifacts.arn_for_objects(f"{data_capture_prefix}*")],
                    ),
                    "Data capture writes one object per captured batch under the data-capture prefix.",
                ),
            ],
        )


class RemoteJobRole(SageMakerExecutionRole):
    """The role of one caller's ``@remote`` training jobs (training_assets/remote_jobs.py): stages functions,
    results, model output and checkpoints under ``jobs/<caller>/`` of ``remote_jobs`` and nowhere else, reads
    ``datasets``, writes only the log streams of the caller's jobs, pulls the training image.

    The SDK checks a job's results only against a SHA-256 stored beside them (sagemaker-core 2.27
    remote_function/core/serialization.py): no signature. Whoever can write a caller's prefix can replace what that
    caller unpickles, so no other caller's role, nor any job of theirs, may write it."""

    # Long: one statement per place the caller's jobs may touch (their prefix, the datasets, their log streams, the
    # image, the key), each scoped to this caller, declared in the order the docstring lists them.
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        caller: str,
        remote_jobs: s3.IBucket,
        datasets: s3.IBucket,
        training_job_log_group: str,
        training_repository: str,
        key: kms.IKey,
        network: VpcAttachment,
    ) -> None:
        root = caller_prefix(caller)
        super().__init__(
            scope,
            construct_id,
            description=f"SageMaker training jobs of {caller} started with the SDK's @remote decorator",
            source_arn=arn(scope, "sagemaker", f"training-job/{job_name_prefix(caller)}*"),
            log_group_prefix=training_job_log_group,
            log_stream_prefix=job_name_prefix(caller),
            dlc_repositories=[training_repository],
            key=key,
            network=network,
            statements=[
                (
                    iam.PolicyStatement(
                        sid="ReadWriteOwnPrefix",
                        actions=["s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload"],
                        resources=[remote_jobs.arn_for_objects(f"{root}/*")],
                    ),
                    "The SDK stages each job's function, arguments, results, model output and checkpoints under "
                    "generated keys of the caller's prefix.",
                ),
                list_own_prefix(remote_jobs, root),
                read_datasets(datasets),
                (
                    iam.PolicyStatement(
                        sid="ListDatasets",
                        actions=["s3:ListBucket", "s3:GetBucketLocation"],
                        resources=[datasets.bucket_arn],
                    ),
                    None,
                ),
                (
                    iam.PolicyStatement(
                        sid="LocateRemoteJobsBucket",
                        actions=["s3:GetBucketLocation"],
                        resources=[remote_jobs.bucket_arn],
                    ),
                    None,
                ),
            ],
        )
