"""Per ``@remote`` caller (a user or team of ``training.remote_callers``): the policy that caller's people attach to run
SageMaker training jobs, and nothing broader; the security group that caller's jobs run in."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from constructs import Construct

from stacks.compliance import acknowledge
from stacks.components.iam_statements import ReasonedStatement, arn, list_own_prefix, reasoned_policy, use_key
from stacks.components.sagemaker_roles import VpcAttachment
from training_assets.remote_jobs import OWNER_TAG_KEY, caller_prefix, job_name_prefix


@dataclass(frozen=True)
class TrainingJobLimits:
    """What a launcher's CreateTrainingJob must request: one of ``instance_types`` (``nvme_instance_types``: those
    with NVMe instance storage, for which SageMaker refuses a volume key) and at most ``max_runtime_seconds``."""

    instance_types: Sequence[str]
    nvme_instance_types: Sequence[str]
    max_runtime_seconds: int


class RemoteJobsSecurityGroup(ec2.SecurityGroup):
    """One caller's @remote training jobs' group: HTTPS out, and all traffic between its members, so the instances of
    one job (``--instance-count`` > 1: torchrun's rendezvous, NCCL, EFA) reach each other. SageMaker's "Give SageMaker
    AI Training Jobs Access to Resources in Your Amazon VPC" (Configure the VPC Security Group): distributed training
    needs a rule that allows inbound connections between members of the same group, and for EFA inbound and outbound
    all traffic from the same group (https://docs.aws.amazon.com/sagemaker/latest/dg/train-vpc.html). One group per
    caller: torchrun's rendezvous and NCCL have no authentication, so jobs of different callers must not admit each
    other; the endpoints have their own group."""

    def __init__(self, scope: Construct, construct_id: str, *, vpc: ec2.IVpc, caller: str) -> None:
        super().__init__(
            scope,
            construct_id,
            vpc=vpc,
            description=f"SageMaker @remote training jobs of {caller}: all traffic between them, HTTPS out",
            allow_all_outbound=False,
        )
        self.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(443), "HTTPS to AWS APIs, registries and the hub")
        self.add_ingress_rule(self, ec2.Port.all_traffic(), f"torchrun, NCCL and EFA between {caller}'s instances")
        self.add_egress_rule(self, ec2.Port.all_traffic(), f"torchrun, NCCL and EFA between {caller}'s instances")
        acknowledge(
            self,
            "The only inbound rule admits this security group itself (the instances of one caller's @remote training "
            "jobs), as SageMaker requires for distributed training and EFA; nothing outside the group can connect.",
            "NIST.800.53.R5-EC2RestrictedCommonPorts",
        )


class RemoteJobLauncherPolicy(Construct):
    """A managed policy (``policy``, this construct's default child) for the people of one ``caller``: start training
    jobs named ``<caller>-...`` that run as ``job_role`` (the caller's own), follow and stop only those, and stage
    objects only under ``jobs/<caller>/``.

    Callers are apart by names IAM checks and nobody changes later (training_assets/remote_jobs.py): the resource
    ARN of every training-job action (``training-job/<caller>-*``), the S3 prefix, the log-stream names and the role
    that may be passed. Tags are set only when a job is created: AddTags needs ``sagemaker:TaggingAction`` =
    CreateTrainingJob ("Filters access by the API actions to which a user can apply tags", Service Authorization
    Reference, Amazon SageMaker), so nobody re-tags a job afterwards. DescribeTrainingJob returns the job's
    Environment: the user's variables and the public key that verifies the function the client signed
    (sagemaker-core 2.27 job.py compile: REMOTE_FUNCTION_SECRET_KEY = public key PEM).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        caller: str,
        job_role: iam.IRole,
        remote_jobs: s3.IBucket,
        key: kms.IKey,
        training_job_log_group: str,
        config_parameter_name: str,
        allowed_tag_keys: Sequence[str],
        network: VpcAttachment,
        limits: TrainingJobLimits,
    ) -> None:
        """``config_parameter_name``: the SSM parameter holding the caller's config.yaml; ``allowed_tag_keys``: the
        tag keys a job may carry besides the owner tag; ``network``: the subnets and the caller's security group every
        job must use."""
        super().__init__(scope, construct_id)
        self._caller, self._key, self._network, self._limits = caller, key, network, limits
        self.policy = reasoned_policy(
            self,
            "Default",
            f"Lets the data scientists of {caller} run @remote SageMaker training jobs on this environment",
            [
                *self._job_statements(job_role, allowed_tag_keys),
                *self._staging_statements(remote_jobs, training_job_log_group, config_parameter_name),
                use_key(key, "kms:Decrypt", "kms:GenerateDataKey", "kms:DescribeKey"),
            ],
        )

    def _job_statements(self, job_role: iam.IRole, allowed_tag_keys: Sequence[str]) -> list[ReasonedStatement]:
        """Create, describe and stop one's own training jobs, which run as ``job_role``."""
        own_jobs = arn(self, "sagemaker", f"training-job/{job_name_prefix(self._caller)}*")
        return [
            *self._create_statements(own_jobs, allowed_tag_keys),
            (
                iam.PolicyStatement(
                    sid="TagOwnTrainingJobsOnlyWhenCreated",
                    actions=["sagemaker:AddTags"],
                    resources=[own_jobs],
                    conditions=_merged(
                        self._tagged_on_create(allowed_tag_keys),
                        {"StringEquals": {"sagemaker:TaggingAction": "CreateTrainingJob"}},
                    ),
                ),
                "CreateTrainingJob with tags also authorizes AddTags on the new job, whose name the SDK generates "
                "after the caller's prefix; sagemaker:TaggingAction allows it only as part of the creation.",
            ),
            (
                iam.PolicyStatement(
                    sid="DescribeAndStopOwnTrainingJobs",
                    actions=["sagemaker:DescribeTrainingJob", "sagemaker:StopTrainingJob"],
                    resources=[own_jobs],
                ),
                "Only jobs named after the caller (<caller>-<function>-<timestamp>, generated by the SDK).",
            ),
            (
                iam.PolicyStatement(
                    sid="PassOnlyTheCallersJobRoleToSageMaker",
                    actions=["iam:PassRole"],
                    resources=[job_role.role_arn],
                    conditions={"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}},
                ),
                None,
            ),
        ]

    def _tagged_on_create(self, allowed_tag_keys: Sequence[str]) -> dict[str, dict[str, object]]:
        """The request carries the owner tag with the caller's name and only the allowed tag keys besides it."""
        return {
            "StringEquals": {f"aws:RequestTag/{OWNER_TAG_KEY}": self._caller},
            "ForAllValues:StringEquals": {"aws:TagKeys": [OWNER_TAG_KEY, *allowed_tag_keys]},
        }

    def _create_statements(self, own_jobs: str, allowed_tag_keys: Sequence[str]) -> list[ReasonedStatement]:
        """CreateTrainingJob, named and tagged after the caller, only in the platform's network and the caller's
        security group, under its key, on an allowed instance type, for a bounded time, with inter-container
        encryption. Condition keys of CreateTrainingJob (Service Authorization Reference, "Actions, resources, and
        condition keys for Amazon SageMaker"; SageMaker developer guide, "Condition keys for SageMaker":
        sagemaker:VpcSubnets and sagemaker:VpcSecurityGroupIds (multivalued, every one given must be listed, Null
        refuses none given), sagemaker:VolumeKmsKey and sagemaker:OutputKmsKey (ARN), sagemaker:InstanceTypes
        (multivalued), sagemaker:MaxRuntimeInSeconds (numeric), sagemaker:InterContainerTrafficEncryption (Bool)).

        Two statements: SageMaker refuses VolumeKmsKeyId for types with NVMe instance storage (it encrypts those
        with a hardware key), so on those a volume key, if given, is the platform key; on every other type the
        platform key is required."""
        nvme = list(self._limits.nvme_instance_types)
        ebs = [t for t in self._limits.instance_types if t not in nvme]
        reason = (
            "The SDK generates a new training-job name after the caller's prefix for every @remote call; the owner "
            "tag binds it to its caller."
        )
        statements: list[ReasonedStatement] = []
        for sid, types, volume_key in (
            ("CreateOwnTrainingJobsOnEbsTypes", ebs, "ArnEquals"),
            ("CreateOwnTrainingJobsOnNvmeTypes", nvme, "ArnEqualsIfExists"),
        ):
            if not types:
                continue
            conditions = self._tagged_on_create(allowed_tag_keys)
            conditions["ForAllValues:StringEquals"] = {
                **conditions["ForAllValues:StringEquals"],
                "sagemaker:InstanceTypes": types,
                "sagemaker:VpcSubnets": [subnet.subnet_id for subnet in self._network.subnets],
                "sagemaker:VpcSecurityGroupIds": [self._network.security_group.security_group_id],
            }
            statement = iam.PolicyStatement(
                sid=sid,
                actions=["sagemaker:CreateTrainingJob"],
                resources=[own_jobs],
                conditions={
                    **conditions,
                    "Null": dict.fromkeys(
                        ("sagemaker:InstanceTypes", "sagemaker:VpcSubnets", "sagemaker:VpcSecurityGroupIds"), "false"
                    ),
                    **_merged(
                        {"ArnEquals": {"sagemaker:OutputKmsKey": self._key.key_arn}},
                        {volume_key: {"sagemaker:VolumeKmsKey": self._key.key_arn}},
                    ),
                    "NumericLessThanEquals": {"sagemaker:MaxRuntimeInSeconds": str(self._limits.max_runtime_seconds)},
                    "Bool": {"sagemaker:InterContainerTrafficEncryption": "true"},
                },
            )
            statements.append((statement, reason))
        return statements

    def _staging_statements(
        self, remote_jobs: s3.IBucket, training_job_log_group: str, config_parameter_name: str
    ) -> list[ReasonedStatement]:
        """The caller's config, staged functions and results, and their own jobs' logs."""
        root = caller_prefix(self._caller)
        group = f"log-group:{training_job_log_group}"
        return [
            (
                iam.PolicyStatement(
                    sid="StageOwnFunctionsAndResults",
                    actions=["s3:GetObject", "s3:PutObject"],
                    resources=[remote_jobs.arn_for_objects(f"{root}/*")],
                ),
                "The SDK uploads each call's function and downloads its results under generated keys of the "
                "caller's own prefix (jobs/<caller>/).",
            ),
            list_own_prefix(remote_jobs, root),
            (
                # job.wait() (and so every @remote call) lists the job's log streams and re-raises an access error.
                # CloudWatch Logs documents the group's ARN ending in ":*" for it (the bare ARN is for TagResource,
                # UntagResource and ListTagsForResource: user guide, "Overview of managing access permissions to your
                # CloudWatch Logs resources"); the bare ARN too, as proving_ground/iam_requests.py checks both forms:
                # it widens nothing (one action, one group). It shows stream names, never events. Its own
                # statement, so that "<group>:*" grants no stream.
                iam.PolicyStatement(
                    sid="ListTrainingJobLogStreams",
                    actions=["logs:DescribeLogStreams"],
                    resources=[arn(self, "logs", group), arn(self, "logs", f"{group}:*")],
                ),
                "CloudWatch Logs authorizes DescribeLogStreams on the log-group ARN ending in ':*'.",
            ),
            (
                iam.PolicyStatement(
                    sid="ReadOwnTrainingJobLogs",
                    actions=["logs:GetLogEvents"],
                    resources=[arn(self, "logs", f"{group}:log-stream:{job_name_prefix(self._caller)}*")],
                ),
                "SageMaker names each job's log streams <job name>/algo-<n>-<timestamp>, and the caller's job names "
                "start with the caller's prefix.",
            ),
            (
                # docs/training.md's first @remote step (FetchRemoteFunctionConfigCommand's output): fetch config.yaml.
                iam.PolicyStatement(
                    sid="ReadTheCallersRemoteFunctionConfig",
                    actions=["ssm:GetParameter"],
                    resources=[arn(self, "ssm", f"parameter{config_parameter_name}")],
                ),
                None,
            ),
        ]


def _merged(*conditions: dict[str, dict[str, object]]) -> dict[str, dict[str, object]]:
    """Condition blocks joined operator by operator (two blocks of one operator must not overwrite each other)."""
    result: dict[str, dict[str, object]] = {}
    for block in conditions:
        for operator, keys in block.items():
            result[operator] = {**result.get(operator, {}), **keys}
    return result
