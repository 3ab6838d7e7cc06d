"""PlatformKey on a bare stack: its key policy, evaluated for the principals that use the key."""

from __future__ import annotations

import aws_cdk as cdk
import pytest

from ops_review.iam_policy import Request, is_allowed, resolve
from stacks.components.platform_key import PlatformKey
from stacks.components.platform_network import NETWORK_PERIMETER_TAG
from tests.stacks.components.bare_stack import ACCOUNT, REGION, bare_stack, refs, resources, template_of

KEY_ARN = f"arn:aws:kms:{REGION}:{ACCOUNT}:key/platformkey"
# An identity policy that allows everything on the key: the key policy alone must decide.
ALLOW_ALL = {"Statement": [{"Effect": "Allow", "Action": "kms:*", "Resource": "*"}]}
USER = {"aws:PrincipalAccount": ACCOUNT, "aws:PrincipalArn": f"arn:aws:iam::{ACCOUNT}:role/someone"}
VPC = "vpc-0platform"


@pytest.fixture(scope="module")
def key_template() -> dict:
    stack = bare_stack()
    PlatformKey(
        stack,
        "PlatformKey",
        alias="alias/platform-test",
        description="test key",
        removal_policy=cdk.RemovalPolicy.RETAIN,
        pending_window_days=30,
    ).hold_to_network(VPC)  # as the foundation holds it
    return template_of(stack)


@pytest.fixture(scope="module")
def key_policy(key_template: dict) -> dict:
    ((_, key),) = resources(key_template, "AWS::KMS::Key").items()
    return resolve(key["Properties"]["KeyPolicy"], refs=refs(key_template))


def _allowed(key_policy: dict, action: str, context: dict, identity: dict | None = None) -> bool:
    policies = [identity] if identity else []
    return is_allowed(policies, Request(action, KEY_ARN, context), key_policy=key_policy)


def test_the_key_rotates_is_retained_as_asked_and_has_its_alias(key_template: dict) -> None:
    ((_, key),) = resources(key_template, "AWS::KMS::Key").items()
    assert key["Properties"]["EnableKeyRotation"] is True
    assert key["Properties"]["PendingWindowInDays"] == 30
    assert key["DeletionPolicy"] == "Retain"
    ((_, alias),) = resources(key_template, "AWS::KMS::Alias").items()
    assert alias["Properties"]["AliasName"] == "alias/platform-test"


def test_a_key_asked_to_go_is_deleted_after_its_window() -> None:
    """What an environment that destroys on delete asks (foundation.py: 7 days): neither is the key's default (kms.Key
    retains and waits 30 days), so a key that dropped either would outlive the environment or wait longer."""
    stack = bare_stack()
    PlatformKey(stack, "PlatformKey", alias="alias/platform-test", description="test key",
                removal_policy=cdk.RemovalPolicy.DESTROY, pending_window_days=7)  # fmt: skip
    ((_, key),) = resources(template_of(stack), "AWS::KMS::Key").items()
    assert (key["DeletionPolicy"], key["Properties"]["PendingWindowInDays"]) == ("Delete", 7)


VIA_S3 = {**USER, "kms:ViaService": f"s3.{REGION}.amazonaws.com"}


def test_account_principals_use_the_key_through_their_iam_policies(key_policy: dict) -> None:
    assert _allowed(key_policy, "kms:Decrypt", VIA_S3, ALLOW_ALL)
    assert not _allowed(key_policy, "kms:Decrypt", VIA_S3)  # no identity policy: no use
    assert _allowed(key_policy, "kms:DescribeKey", USER, ALLOW_ALL)  # not a cryptographic operation


@pytest.mark.parametrize("action", ["kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey", "kms:ReEncryptFrom"])
@pytest.mark.parametrize("service", ["s3", "sagemaker", "ec2", "ecr", "sns", "logs"])
def test_principals_use_the_key_through_the_platforms_services(key_policy: dict, action: str, service: str) -> None:
    """Issue 22.4: through a platform service (kms:ViaService) a role uses the key."""
    assert _allowed(key_policy, action, {**USER, "kms:ViaService": f"{service}.{REGION}.amazonaws.com"}, ALLOW_ALL)


@pytest.mark.parametrize("action", ["kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey", "kms:ReEncryptFrom"])
@pytest.mark.parametrize("via", [None, f"dynamodb.{REGION}.amazonaws.com", "s3.us-east-1.amazonaws.com"])
def test_a_direct_call_or_another_service_is_denied(key_policy: dict, action: str, via: str | None) -> None:
    """Issue 22.4: a role allowed everything on the key, calling KMS itself (a copied ciphertext, data keys for use
    elsewhere) or through a service that holds none of the platform's data, is refused."""
    context = {**USER, "aws:PrincipalIsAWSService": "false", **({"kms:ViaService": via} if via else {})}
    assert not _allowed(key_policy, action, context, ALLOW_ALL)


@pytest.mark.parametrize(
    ("for_aws_resource", "allowed"), [("true", True), ("false", False)], ids=["for-aws-resource", "to-anyone"]
)
def test_grants_only_for_aws_resources(key_policy: dict, for_aws_resource: str, allowed: bool) -> None:
    context = {**USER, "kms:GrantIsForAWSResource": for_aws_resource, "aws:PrincipalIsAWSService": "false"}
    assert _allowed(key_policy, "kms:CreateGrant", context, ALLOW_ALL) is allowed


def test_an_aws_service_creates_grants_for_anything(key_policy: dict) -> None:
    """The deny of grants for no AWS resource spares calls made by AWS services themselves (Control Tower
    CT.KMS.PR.3: grants for AWS resources or from AWS services)."""
    context = {**USER, "kms:GrantIsForAWSResource": "false", "aws:PrincipalIsAWSService": "true"}
    assert _allowed(key_policy, "kms:CreateGrant", context, ALLOW_ALL)


def test_cloudwatch_logs_encrypts_this_accounts_log_groups_only(key_policy: dict) -> None:
    logs = {"aws:PrincipalServiceName": f"logs.{REGION}.amazonaws.com", "aws:PrincipalIsAWSService": "true"}
    own = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/flow-logs"
    other = f"arn:aws:logs:{REGION}:999999999999:log-group:/flow-logs"
    assert _allowed(key_policy, "kms:GenerateDataKey", {**logs, "kms:EncryptionContext:aws:logs:arn": own})
    assert not _allowed(key_policy, "kms:GenerateDataKey", {**logs, "kms:EncryptionContext:aws:logs:arn": other})
    assert not _allowed(key_policy, "kms:ScheduleKeyDeletion", {**logs, "kms:EncryptionContext:aws:logs:arn": own})


# What CloudWatch Logs calls with the key of an encrypted log group (CloudWatch Logs User Guide, "Encrypt log data in
# CloudWatch Logs using AWS KMS": the key policy's kms:Encrypt*, Decrypt*, ReEncrypt*, GenerateDataKey*, Describe*).
LOGS_CALLS = ["kms:Encrypt", "kms:Decrypt", "kms:ReEncryptFrom", "kms:ReEncryptTo", "kms:GenerateDataKey",
              "kms:GenerateDataKeyWithoutPlaintext", "kms:DescribeKey"]  # fmt: skip


def test_cloudwatch_logs_makes_every_call_an_encrypted_log_group_needs(key_policy: dict) -> None:
    logs = {"aws:PrincipalServiceName": f"logs.{REGION}.amazonaws.com", "aws:PrincipalIsAWSService": "true",
            "kms:EncryptionContext:aws:logs:arn": f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/flow-logs"}  # fmt: skip
    assert {action: _allowed(key_policy, action, logs) for action in LOGS_CALLS} == dict.fromkeys(LOGS_CALLS, True)


def test_cloudwatch_alarms_of_this_account_publish_to_encrypted_topics(key_policy: dict) -> None:
    alarms = {"aws:PrincipalServiceName": "cloudwatch.amazonaws.com", "aws:PrincipalIsAWSService": "true"}
    # Decrypt and GenerateDataKey* (SNS Developer Guide, "Enable compatibility between event sources from AWS services
    # and encrypted topics": CloudWatch).
    for action in ("kms:Decrypt", "kms:GenerateDataKey"):
        assert _allowed(key_policy, action, {**alarms, "aws:SourceAccount": ACCOUNT})
    assert not _allowed(key_policy, "kms:Decrypt", {**alarms, "aws:SourceAccount": "999999999999"})
    assert not _allowed(key_policy, "kms:Encrypt", {**alarms, "aws:SourceAccount": ACCOUNT})


# A workload role held to the VPC (its sessions carry the perimeter tag), calling KMS itself (not through a service).
HELD = {**USER, f"aws:PrincipalTag/{NETWORK_PERIMETER_TAG}": "true", "aws:ViaAWSService": "false",
        "aws:PrincipalIsAWSService": "false"}  # fmt: skip


@pytest.mark.parametrize("action", ["kms:DescribeKey", "kms:GetKeyPolicy", "kms:CreateGrant"])
def test_a_held_roles_own_calls_work_only_from_inside_the_vpc(key_policy: dict, action: str) -> None:
    grant = {"kms:GrantIsForAWSResource": "true"}  # (a grant for no AWS resource is denied anyway, above)
    assert _allowed(key_policy, action, {**HELD, **grant, "aws:SourceVpc": VPC}, ALLOW_ALL)
    for network in ({}, {"aws:SourceVpc": "vpc-0other"}):
        assert not _allowed(key_policy, action, {**HELD, **grant, **network}, ALLOW_ALL)
    # A role without the tag (a person, the pipeline) is not held.
    assert _allowed(key_policy, action, {**USER, **grant, "aws:PrincipalIsAWSService": "false"}, ALLOW_ALL)


def test_a_held_roles_calls_through_a_service_are_left_to_the_via_service_rule(key_policy: dict) -> None:
    """S3 decrypting an SSE-KMS object for the role (aws:ViaAWSService), and SageMaker creating a job volume's grant
    with the job role from its own network (kms:ViaService only): neither carries aws:SourceVpc, both are allowed."""
    via_s3 = {**HELD, "aws:ViaAWSService": "true", "kms:ViaService": f"s3.{REGION}.amazonaws.com"}
    assert _allowed(key_policy, "kms:Decrypt", via_s3, ALLOW_ALL)
    sagemaker = {**HELD, "kms:ViaService": f"sagemaker.{REGION}.amazonaws.com", "kms:GrantIsForAWSResource": "true"}
    assert _allowed(key_policy, "kms:CreateGrant", sagemaker, ALLOW_ALL)
