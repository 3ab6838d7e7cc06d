"""The policy data scientists' roles attach to run ``@remote`` SageMaker training jobs, and nothing broader; the
security group those jobs run in."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from constructs import Construct

from stacks.compliance import acknowledge
from stacks.components.iam_statements import ReasonedStatement, arn, reasoned_policy, use_key
from stacks.components.sagemaker_roles import VpcAttachment
from training_assets.remote_jobs import CALLER_ID_VARIABLE, OWNER_TAG_KEY, REMOTE_JOBS_PREFIX


@dataclass(frozen=True)
class TrainingJobLimits:
    """What a launcher's CreateTrainingJob must request: one of ``instance_types`` (``nvme_instance_types``: those
    with NVMe instance storage, for which SageMaker refuses a volume key) and at most ``max_runtime_seconds``."""

    instance_types: Sequence[str]
    nvme_instance_types: Sequence[str]
    max_runtime_seconds: int


class RemoteJobsSecurityGroup(ec2.SecurityGroup):
    """The @remote training jobs' group: HTTPS out, and all traffic between its members, so the instances of one job
    (``--instance-count`` > 1: torchrun's rendezvous, NCCL, EFA) reach each other. SageMaker's "Give SageMaker AI
    Training Jobs Access to Resources in Your Amazon VPC" (Configure the VPC Security Group): distributed training
    needs a rule that allows inbound connections between members of the same group, and for EFA inbound and outbound
    all traffic from the same group (https://docs.aws.amazon.com/sagemaker/latest/dg/train-vpc.html). Its own group,
    not the workload group the endpoints share: a job's instances admit each other, nothing else."""

    def __init__(self, scope: Construct, construct_id: str, *, vpc: ec2.IVpc) -> None:
        super().__init__(
            scope,
            construct_id,
            vpc=vpc,
            description="SageMaker @remote training jobs: all traffic between instances of the group, HTTPS out",
            allow_all_outbound=False,
        )
        self.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(443), "HTTPS to AWS APIs, registries and the hub")
        self.add_ingress_rule(self, ec2.Port.all_traffic(), "torchrun, NCCL and EFA between instances of a job")
        self.add_egress_rule(self, ec2.Port.all_traffic(), "torchrun, NCCL and EFA between instances of a job")
        acknowledge(
            self,
            "The only inbound rule admits this security group itself (the instances of @remote training jobs), as "
            "SageMaker requires for distributed training and EFA; nothing outside the group can connect.",
            "NIST.800.53.R5-EC2RestrictedCommonPorts",
        )


class RemoteJobLauncherPolicy(Construct):
    """A managed policy (``policy``, this construct's default child): start training jobs that run as ``job_role``,
    each tagged with its caller, and follow only one's own jobs, staged objects and logs.

    Callers are isolated from each other (training_assets/remote_jobs.py): a job is created only with the caller's
    own owner tag, and only the owner may describe or stop it. DescribeTrainingJob returns the job's Environment: the
    user's variables and the public key that verifies the function the client signed (sagemaker-core 2.27 job.py
    compile: REMOTE_FUNCTION_SECRET_KEY = public key PEM). aws:RequestTag, aws:TagKeys and aws:ResourceTag are
    condition keys of CreateTrainingJob, AddTags, DescribeTrainingJob and StopTrainingJob (Service Authorization
    Reference, Amazon SageMaker).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        job_role: iam.IRole,
        remote_jobs: s3.IBucket,
        key: kms.IKey,
        training_job_log_group: str,
        config_parameter_name: str,
        allowed_tag_keys: Sequence[str],
        network: VpcAttachment,
        limits: TrainingJobLimits,
    ) -> None:
        """``config_parameter_name``: the SSM parameter holding config.yaml; ``allowed_tag_keys``: the tag keys a job
        may carry besides the owner tag; ``network``: the subnets and security group every job must use."""
        super().__init__(scope, construct_id)
        self._key, self._network, self._limits = key, network, limits
        self.policy = reasoned_policy(
            self,
            "Default",
            "Lets a data scientist run @remote SageMaker training jobs on this environment",
            [
                *self._job_statements(job_role, allowed_tag_keys),
                *self._staging_statements(remote_jobs, training_job_log_group, config_parameter_name),
                use_key(key, "kms:Decrypt", "kms:GenerateDataKey", "kms:DescribeKey"),
            ],
        )

    def _job_statements(self, job_role: iam.IRole, allowed_tag_keys: Sequence[str]) -> list[ReasonedStatement]:
        """Create, describe and stop one's own training jobs, which run as ``job_role``."""
        training_jobs = arn(self, "sagemaker", "training-job/*")
        return [
            *self._create_statements(training_jobs, allowed_tag_keys),
            (
                iam.PolicyStatement(
                    sid="TagOwnTrainingJobs",
                    actions=["sagemaker:AddTags"],
                    resources=[training_jobs],
                    conditions=_owner_tagged_on_create(allowed_tag_keys),
                ),
                "CreateTrainingJob with tags also authorizes AddTags on the new job, whose name the SDK generates.",
            ),
            (
                iam.PolicyStatement(
                    sid="DescribeAndStopOwnTrainingJobs",
                    actions=["sagemaker:DescribeTrainingJob", "sagemaker:StopTrainingJob"],
                    resources=[training_jobs],
                    conditions={"StringEquals": {f"aws:ResourceTag/{OWNER_TAG_KEY}": CALLER_ID_VARIABLE}},
                ),
                "Only jobs whose owner tag is the caller's aws:userid.",
            ),
            (
                iam.PolicyStatement(
                    sid="PassOnlyTheRemoteJobRoleToSageMaker",
                    actions=["iam:PassRole"],
                    resources=[job_role.role_arn],
                    conditions={"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}},
                ),
                None,
            ),
        ]

    def _create_statements(self, training_jobs: str, allowed_tag_keys: Sequence[str]) -> list[ReasonedStatement]:
        """CreateTrainingJob, tagged with the caller, only in the platform's network, under its key, on an allowed
        instance type, for a bounded time, with inter-container encryption. Condition keys of CreateTrainingJob
        (Service Authorization Reference, "Actions, resources, and condition keys for Amazon SageMaker";
        SageMaker developer guide, "Condition keys for SageMaker": sagemaker:VpcSubnets and
        sagemaker:VpcSecurityGroupIds (multivalued, every one given must be listed, Null refuses none given),
        sagemaker:VolumeKmsKey and sagemaker:OutputKmsKey (ARN), sagemaker:InstanceTypes (multivalued),
        sagemaker:MaxRuntimeInSeconds (numeric), sagemaker:InterContainerTrafficEncryption (Bool)).

        Two statements: SageMaker refuses VolumeKmsKeyId for types with NVMe instance storage (it encrypts those
        with a hardware key), so on those a volume key, if given, is the platform key; on every other type the
        platform key is required."""
        nvme = list(self._limits.nvme_instance_types)
        ebs = [t for t in self._limits.instance_types if t not in nvme]
        reason = (
            "The SDK generates a new training-job name for every @remote call; the owner tag binds it to its caller."
        )
        statements: list[ReasonedStatement] = []
        for sid, types, volume_key in (
            ("CreateOwnTrainingJobsOnEbsTypes", ebs, "ArnEquals"),
            ("CreateOwnTrainingJobsOnNvmeTypes", nvme, "ArnEqualsIfExists"),
        ):
            if not types:
                continue
            conditions = _owner_tagged_on_create(allowed_tag_keys)
            conditions["ForAllValues:StringEquals"] = {
                **conditions["ForAllValues:StringEquals"],
                "sagemaker:InstanceTypes": types,
                "sagemaker:VpcSubnets": [subnet.subnet_id for subnet in self._network.subnets],
                "sagemaker:VpcSecurityGroupIds": [self._network.security_group.security_group_id],
            }
            statement = iam.PolicyStatement(
                sid=sid,
                actions=["sagemaker:CreateTrainingJob"],
                resources=[training_jobs],
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
        """The SDK's own config, one's own staged functions and results, and the jobs' logs."""
        caller_root = f"{REMOTE_JOBS_PREFIX}/{CALLER_ID_VARIABLE}"
        return [
            (
                iam.PolicyStatement(
                    sid="StageOwnFunctionsAndResults",
                    actions=["s3:GetObject", "s3:PutObject"],
                    resources=[remote_jobs.arn_for_objects(f"{caller_root}/*")],
                ),
                "The SDK uploads each call's function and downloads its results under generated keys of the "
                "caller's own prefix (jobs/<aws:userid>/).",
            ),
            (
                iam.PolicyStatement(
                    sid="ListOwnPrefix",
                    actions=["s3:ListBucket"],
                    resources=[remote_jobs.bucket_arn],
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
                        arn(self, "logs", f"log-group:{training_job_log_group}"),
                        arn(self, "logs", f"log-group:{training_job_log_group}:*"),
                    ],
                ),
                "SageMaker names each job's log streams after the generated job name, in the one log group "
                "of all training jobs.",
            ),
            (
                # docs/training.md's first @remote step (FetchRemoteFunctionConfigCommand's output): fetch config.yaml.
                iam.PolicyStatement(
                    sid="ReadTheRemoteFunctionConfig",
                    actions=["ssm:GetParameter"],
                    resources=[arn(self, "ssm", f"parameter{config_parameter_name}")],
                ),
                None,
            ),
        ]


def _owner_tagged_on_create(allowed_tag_keys: Sequence[str]) -> dict[str, dict[str, object]]:
    """Conditions of CreateTrainingJob and AddTags: the request carries the owner tag with the caller's id, only the
    allowed tag keys besides it, and an existing job's owner (aws:ResourceTag, absent while the job is created) is
    the caller: nobody re-tags another caller's job as theirs."""
    owner = f"aws:ResourceTag/{OWNER_TAG_KEY}"
    return {
        "StringEquals": {f"aws:RequestTag/{OWNER_TAG_KEY}": CALLER_ID_VARIABLE},
        "ForAllValues:StringEquals": {"aws:TagKeys": [OWNER_TAG_KEY, *allowed_tag_keys]},
        "StringEqualsIfExists": {owner: CALLER_ID_VARIABLE},
    }


def _merged(*conditions: dict[str, dict[str, object]]) -> dict[str, dict[str, object]]:
    """Condition blocks joined operator by operator (two blocks of one operator must not overwrite each other)."""
    result: dict[str, dict[str, object]] = {}
    for block in conditions:
        for operator, keys in block.items():
            result[operator] = {**result.get(operator, {}), **keys}
    return result
