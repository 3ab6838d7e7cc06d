"""The role and instance profile of the GPU training instances (EC2): Session Manager instead of SSH, the training
image's pull, read datasets, write model artifacts (each instance into its own folder of its run, a candidate only
once)."""

from __future__ import annotations

from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from constructs import Construct

from stacks.components.iam_statements import (
    ReasonedStatement,
    checkov_skip,
    dlc_pull,
    read_datasets,
    read_training_output,
    reasoned_policy,
    use_key,
    write_training_output,
)
from training_assets.instance.run_lineage import LAUNCHES, NODES


def _session_manager_only() -> ReasonedStatement:
    """Exactly the Session Manager actions of the Systems Manager user guide, "Create a custom IAM instance
    profile for Session Manager" (no session logging to S3 or CloudWatch and no session KMS key are configured,
    so none of its optional s3/logs/kms statements). Unlike AmazonSSMManagedInstanceCore: no
    ssm:GetParameter(s), ssm:GetDocument, ec2messages (Run Command) or s3:GetEncryptionConfiguration."""
    return (
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
    )


# What a run writes once at its end (ec2_run.sh), into the folder of its instance of rank 0: its candidate model, the
# model's SHA-256 that promotion checks, and its metrics. Nobody holding this role replaces them once written, and no
# other instance writes that folder at all (write_training_output).
WRITTEN_ONCE = ("model.tar.gz", "model.tar.gz.sha256", "metrics.json")


def _candidates_written_once(artifacts: s3.IBucket, prefix: str) -> ReasonedStatement:
    """Deny writing a run's candidate files unless the write is conditional on the key being absent (If-None-Match:
    *, which S3 refuses with 412 when the key exists; condition key s3:if-none-match, S3 User Guide, "Enforce
    conditional writes on Amazon S3 buckets"). A negated operator: a write without the header is denied too."""
    return (
        iam.PolicyStatement(
            sid="WriteCandidatesOnlyOnce",
            effect=iam.Effect.DENY,
            actions=["s3:PutObject"],
            resources=[artifacts.arn_for_objects(f"{prefix}*/{name}") for name in WRITTEN_ONCE],
            conditions={"StringNotEquals": {"s3:if-none-match": "*"}},
        ),
        None,
    )


def _nothing_outside_the_own_folder(artifacts: s3.IBucket, prefix: str) -> ReasonedStatement:
    """The write grant's first ``*`` may span folders, so a key such as ``<run>/nodes/<victim>/x/nodes/<own>/y``
    would match it and land inside another instance's folder; and ``launches/`` is the launcher's record of which
    instances make up a run. Neither is writable by any instance."""
    return (
        iam.PolicyStatement(
            sid="WriteNoOtherFolder",
            effect=iam.Effect.DENY,
            actions=["s3:PutObject"],
            resources=[
                artifacts.arn_for_objects(f"{prefix}*/{NODES}*/{NODES}*"),
                artifacts.arn_for_objects(f"{prefix}*/{LAUNCHES}*"),
            ],
        ),
        None,
    )


def _launch_record_policy(scope: Construct, artifacts: s3.IBucket, prefix: str, key: kms.IKey) -> iam.ManagedPolicy:
    """Write a run's launch records (training_assets/instance/run_lineage.py): they name the folders a run trusts,
    so no instance may write them (WriteNoOtherFolder); the launcher's role attaches this policy."""
    return reasoned_policy(
        scope,
        "LaunchRecordPolicy",
        "Record each launch of a training run: which instances make it up",
        [
            (
                iam.PolicyStatement(
                    sid="RecordLaunches",
                    actions=["s3:PutObject"],
                    resources=[artifacts.arn_for_objects(f"{prefix}*/{LAUNCHES}*")],
                    conditions={"StringEquals": {"s3:if-none-match": "*"}},
                ),
                "The launcher records each launch of any run under that run's launches/ folder, once.",
            ),
            use_key(key, "kms:GenerateDataKey"),
        ],
    )


class TrainingInstanceRole(Construct):
    """The role (this construct's default child), its policy (``policy``) and its ``instance_profile``. Stacks that
    own more of the instances' resources attach their own grants to ``role``. ``launch_record_policy`` lets its
    holder (the launcher) record which instances make up a run, in ``artifacts`` under ``output_prefix``."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        datasets: s3.IBucket,
        artifacts: s3.IBucket,
        training_output_prefix: str,
        training_repository: str,
        key: kms.IKey,
    ) -> None:
        super().__init__(scope, construct_id)
        self.artifacts, self.output_prefix = artifacts, training_output_prefix  # where runs write (run_lineage.py)
        self.role = iam.Role(
            self,
            "Default",
            assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            description="GPU training instances: Session Manager, DLC pulls, read datasets, write model artifacts",
        )
        self.policy = reasoned_policy(
            self,
            "Policy",
            "Least-privilege permissions of the GPU training instances",
            [
                *dlc_pull(self, training_repository),
                read_datasets(datasets),
                read_training_output(artifacts, training_output_prefix),
                write_training_output(artifacts, training_output_prefix),
                _nothing_outside_the_own_folder(artifacts, training_output_prefix),
                _candidates_written_once(artifacts, training_output_prefix),
                (
                    iam.PolicyStatement(
                        sid="ListBuckets",
                        actions=["s3:ListBucket"],
                        resources=[datasets.bucket_arn, artifacts.bucket_arn],
                    ),
                    None,
                ),
                use_key(key, "kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey", "kms:DescribeKey"),
                _session_manager_only(),
            ],
            roles=[self.role],
        )
        checkov_skip(
            self.policy,
            "CKV_AWS_111",
            "ssm:UpdateInstanceInformation and the ssmmessages channel actions of Session Manager are granted on * in "
            "AWS's documented custom instance profile; no narrower resource.",
        )
        self.instance_profile = iam.InstanceProfile(self, "InstanceProfile", role=self.role)
        # Whoever holds it records which instances make up a run (the platform's launcher only).
        self.launch_record_policy = _launch_record_policy(self, artifacts, training_output_prefix, key)
