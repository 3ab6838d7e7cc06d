"""The policy data scientists' roles attach to run ``@remote`` SageMaker training jobs, and nothing broader."""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from constructs import Construct

from stacks.components.iam_statements import ReasonedStatement, arn, reasoned_policy, use_key
from training_assets.remote_jobs import CALLER_ID_VARIABLE, OWNER_TAG_KEY, REMOTE_JOBS_PREFIX


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
    ) -> None:
        """``config_parameter_name``: the SSM parameter holding config.yaml; ``allowed_tag_keys``: the tag keys a job
        may carry besides the owner tag."""
        super().__init__(scope, construct_id)
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
            (
                iam.PolicyStatement(
                    sid="CreateOwnTrainingJobs",
                    actions=["sagemaker:CreateTrainingJob", "sagemaker:AddTags"],
                    resources=[training_jobs],
                    conditions=_owner_tagged_on_create(allowed_tag_keys),
                ),
                "The SDK generates a new training-job name for every @remote call; the owner tag binds it to "
                "its caller.",
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
                # The README's first step (the FetchRemoteFunctionConfigCommand output): fetch config.yaml.
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
