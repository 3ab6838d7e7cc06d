"""Building blocks of the platform's least-privilege policies: each statement travels with the reason for its
wildcards (None when it has none), and a policy acknowledges exactly those wildcards (``acknowledge_wildcards``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk import region_info
from constructs import Construct, IConstruct

from stacks.compliance import acknowledge_wildcards
from training_assets.instance.run_lineage import NODES

# A statement and why its wildcards are needed (None: it has none).
ReasonedStatement = tuple[iam.PolicyStatement, str | None]


def arn(scope: IConstruct, service: str, resource: str) -> str:
    """An ARN of ``service`` in the stack's partition, region and account."""
    stack = cdk.Stack.of(scope)
    return f"arn:{stack.partition}:{service}:{stack.region}:{stack.account}:{resource}"


def cloudwatch_logs_may_use_key(scope: IConstruct, sid: str) -> iam.PolicyStatement:
    """The key-policy statement that lets CloudWatch Logs encrypt this account's log groups in the stack's region
    with the key (CloudWatch Logs User Guide, "Encrypt log data in CloudWatch Logs using AWS KMS": the service
    principal, scoped by the log group ARN in the encryption context)."""
    return iam.PolicyStatement(
        sid=sid,
        principals=[iam.ServicePrincipal(f"logs.{cdk.Stack.of(scope).region}.amazonaws.com")],
        actions=["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"],
        resources=["*"],
        conditions={"ArnLike": {"kms:EncryptionContext:aws:logs:arn": arn(scope, "logs", "*")}},
    )


def deny_grants_except_for_aws_resources() -> iam.PolicyStatement:
    """The key-policy statement that allows kms:CreateGrant only for AWS resources (EBS volumes, SageMaker jobs) or
    from AWS services (Control Tower CT.KMS.PR.3): a principal with kms:CreateGrant cannot hand the key's use to
    anyone else directly."""
    return iam.PolicyStatement(
        sid="DenyGrantsExceptForAwsResources",
        effect=iam.Effect.DENY,
        principals=[iam.AnyPrincipal()],
        actions=["kms:CreateGrant"],
        resources=["*"],
        conditions={"BoolIfExists": {"kms:GrantIsForAWSResource": "false", "aws:PrincipalIsAWSService": "false"}},
    )


def list_own_prefix(bucket: s3.IBucket, prefix: str) -> ReasonedStatement:
    """ListBucket on ``bucket`` only for keys under ``prefix`` (a caller's ``jobs/<caller>``)."""
    statement = iam.PolicyStatement(
        sid="ListOwnPrefix",
        actions=["s3:ListBucket"],
        resources=[bucket.bucket_arn],
        conditions={"StringLike": {"s3:prefix": [prefix, f"{prefix}/*"]}},
    )
    return statement, None


def reasoned_policy(
    scope: Construct,
    construct_id: str,
    description: str,
    statements: Sequence[ReasonedStatement],
    *,
    roles: Sequence[iam.IRole] | None = None,
) -> iam.ManagedPolicy:
    """A customer-managed policy (NIST: no inline policies); each wildcard statement carries its reason."""
    policy = iam.ManagedPolicy(
        scope,
        construct_id,
        description=description,
        roles=list(roles) if roles is not None else None,
        statements=[statement for statement, _ in statements],
    )
    acknowledge_wildcards(policy, *((statement, reason) for statement, reason in statements if reason))
    return policy


def checkov_skip(policy: iam.ManagedPolicy, check_id: str, comment: str) -> None:
    """A checkov exception, written where checkov reads it: the template metadata of the resource it excuses."""
    cast(cdk.CfnResource, policy.node.default_child).add_metadata(
        "checkov", {"skip": [{"id": check_id, "comment": comment}]}
    )


def dlc_pull(scope: IConstruct, *repositories: str) -> list[ReasonedStatement]:
    """ECR login, plus the pull of the Deep Learning Containers ``repositories``; roles whose images grant their own
    pull (the endpoints': ``DlcImage.bind`` in stacks/components/sagemaker_endpoint.py) pass none."""
    stack = cdk.Stack.of(scope)
    login: ReasonedStatement = (
        iam.PolicyStatement(sid="EcrLogin", actions=["ecr:GetAuthorizationToken"], resources=["*"]),
        "ecr:GetAuthorizationToken has no resource-level permissions.",
    )
    if not repositories:
        return [login]
    dlc_account = stack.regional_fact(region_info.FactName.DLC_REPOSITORY_ACCOUNT)
    return [
        login,
        (
            iam.PolicyStatement(
                sid="PullDeepLearningContainers",
                actions=["ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"],
                resources=[
                    f"arn:{stack.partition}:ecr:{stack.region}:{dlc_account}:repository/{repository}"
                    for repository in repositories
                ],
            ),
            None,
        ),
    ]


def use_key(key: kms.IKey, *actions: str) -> ReasonedStatement:
    return iam.PolicyStatement(sid="UsePlatformKey", actions=list(actions), resources=[key.key_arn]), None


def read_datasets(datasets: s3.IBucket) -> ReasonedStatement:
    return (
        iam.PolicyStatement(sid="ReadDatasets", actions=["s3:GetObject"], resources=[datasets.arn_for_objects("*")]),
        "Training reads whichever dataset files the run names; the bucket holds datasets only.",
    )


def write_training_output(artifacts: s3.IBucket, prefix: str) -> ReasonedStatement:
    """Reads of every run's output (a resumed run reads its earlier instances' checkpoints); writes only into the
    calling instance's own folder of a run, ``<prefix><run>/nodes/<role id>:<instance id>/``. ``${aws:userid}`` of an
    instance-profile session is ``<role id>:<instance id>`` (IAM User Guide, "IAM policy elements: Variables and
    tags", "Request information that you can use for policy variables": role assigned to an Amazon EC2 instance), a
    session EC2 names after the instance, which nothing on the instance chooses."""
    return (
        iam.PolicyStatement(
            sid="WriteTrainingOutput",
            actions=["s3:PutObject", "s3:AbortMultipartUpload"],
            resources=[artifacts.arn_for_objects(f"{prefix}*/{NODES}${{aws:userid}}/*")],
        ),
        "Each instance writes its checkpoints, compile cache and candidate into its own folder of any run it is "
        "launched for (the run name is the launcher's); the folder is the instance's session, ${aws:userid}.",
    )


def read_training_output(artifacts: s3.IBucket, prefix: str) -> ReasonedStatement:
    return (
        iam.PolicyStatement(
            sid="ReadTrainingOutput",
            actions=["s3:GetObject"],
            resources=[artifacts.arn_for_objects(f"{prefix}*")],
        ),
        "A run launched again reads its launch records and its earlier instances' checkpoints and compile cache.",
    )
