"""Attacks on the principals of the synthesized dev templates, evaluated by ops_review/iam_policy.py: each must
be denied, while the legitimate request next to it is allowed (the recorded SDK flows are in
tests/training_assets/test_remote_sdk_moto.py). The evaluator itself is checked against AWS's documented examples."""

from __future__ import annotations

from typing import Any

import pytest

from ops_review.iam_policy import Request, is_allowed, resolve
from proving_ground.iam_requests import logical_id, role_policies
from tests.stacks.security.conftest import ACCOUNT, BUCKETS, REGION
from tests.stacks.security.exports import template_exports


def _role(foundation: tuple[dict[str, Any], dict[str, Any]], prefix: str) -> list[dict[str, Any]]:
    template, refs = foundation
    return role_policies(template, logical_id(template, "AWS::IAM::Role", prefix), refs)


def test_the_training_instance_role_holds_session_manager_and_no_parameter_reads(foundation: Any) -> None:
    """Issue 22.2: AmazonSSMManagedInstanceCore granted ssm:GetParameter(s) on every parameter (and Run Command's
    ec2messages); the role now holds exactly the Session Manager actions AWS documents."""
    role = _role(foundation, "TrainingInstanceRole")
    any_parameter = f"arn:aws:ssm:{REGION}:{ACCOUNT}:parameter/other-team/db-password"
    for action in ("ssm:GetParameter", "ssm:GetParameters", "ssm:GetDocument", "ec2messages:GetMessages",
                   "ssm:SendCommand"):  # fmt: skip
        assert not is_allowed(role, Request(action, any_parameter)), action
    for action in ("ssm:UpdateInstanceInformation", "ssmmessages:CreateControlChannel",
                   "ssmmessages:OpenDataChannel"):  # fmt: skip
        assert is_allowed(role, Request(action, "*")), action


@pytest.mark.parametrize("role", ["TrainingInstanceRole", "RemoteJobRoleNlp", "EndpointExecutionRole"])
def test_only_the_promotion_path_writes_what_endpoints_read(foundation: Any, role: str) -> None:
    """Training instances write candidates under training-output/ (each into its own folder of a run: aws:userid is
    the instance-profile session), @remote jobs only under their caller's prefix of the remote-jobs bucket; no
    workload role writes the endpoints' model prefixes (endpoints/, multi-model/)."""
    policies = _role(foundation, role)
    for prefix in ("endpoints/", "multi-model/"):
        assert not is_allowed(policies, Request("s3:PutObject", f"arn:aws:s3:::artifacts-bucket/{prefix}m.tar.gz"))
    session = {"aws:userid": "AROAINSTANCE:i-0123"}
    writes_candidates = is_allowed(
        policies,
        Request("s3:PutObject", "arn:aws:s3:::artifacts-bucket/training-output/r/nodes/AROAINSTANCE:i-0123/m", session),
    )
    assert writes_candidates == (role == "TrainingInstanceRole")


# ------------------------------------------------------------------ the evaluator against AWS's documented examples


def _doc(*statements: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"Version": "2012-10-17", "Statement": list(statements)}]


def test_an_explicit_deny_wins_over_any_allow() -> None:
    """IAM User Guide, "Policy evaluation logic": an explicit deny in any policy overrides any allow."""
    policies = _doc({"Effect": "Allow", "Action": "s3:*", "Resource": "*"},
                    {"Effect": "Deny", "Action": "s3:DeleteObject", "Resource": "arn:aws:s3:::b/*"})  # fmt: skip
    assert is_allowed(policies, Request("s3:GetObject", "arn:aws:s3:::b/k"))
    assert not is_allowed(policies, Request("s3:DeleteObject", "arn:aws:s3:::b/k"))
    bucket = _doc({"Effect": "Deny", "Principal": "*", "Action": "s3:*", "Resource": "arn:aws:s3:::b/*",
                   "Condition": {"Bool": {"aws:SecureTransport": "false"}}})  # fmt: skip
    assert not is_allowed(policies, Request("s3:GetObject", "arn:aws:s3:::b/k", {"aws:SecureTransport": "false"}),
                          resource_policies=bucket)  # fmt: skip
    assert is_allowed(policies, Request("s3:GetObject", "arn:aws:s3:::b/k", {"aws:SecureTransport": "true"}),
                      resource_policies=bucket)  # fmt: skip


def test_not_action_with_allow_and_deny() -> None:
    """IAM User Guide, "IAM JSON policy elements: NotAction": Deny with NotAction denies everything not listed."""
    policies = _doc({"Effect": "Allow", "Action": "*", "Resource": "*"},
                    {"Effect": "Deny", "NotAction": "iam:*", "Resource": "*",
                     "Condition": {"BoolIfExists": {"aws:MultiFactorAuthPresent": "false"}}})  # fmt: skip
    assert not is_allowed(policies, Request("s3:GetObject", "r"))  # no MFA key: IfExists -> the deny applies
    assert is_allowed(policies, Request("iam:ListUsers", "r"))
    assert is_allowed(policies, Request("s3:GetObject", "r", {"aws:MultiFactorAuthPresent": "true"}))


def test_set_operators_and_if_exists_as_documented() -> None:
    """IAM User Guide, "Multivalued context keys": ForAllValues is true for an empty set, ForAnyValue false;
    "...IfExists": true without the key; a negated operator is true without the key."""
    tags = _doc(
        {
            "Effect": "Allow",
            "Action": "ec2:CreateTags",
            "Resource": "*",
            "Condition": {"ForAllValues:StringEquals": {"aws:TagKeys": ["environment", "cost-center"]}},
        }
    )
    assert is_allowed(tags, Request("ec2:CreateTags", "r", {"aws:TagKeys": ["environment"]}))
    assert not is_allowed(tags, Request("ec2:CreateTags", "r", {"aws:TagKeys": ["environment", "owner"]}))
    assert is_allowed(tags, Request("ec2:CreateTags", "r"))  # the documented pitfall: no keys at all passes
    any_value = _doc(
        {
            "Effect": "Allow",
            "Action": "a:b",
            "Resource": "*",
            "Condition": {"ForAnyValue:StringEquals": {"aws:TagKeys": ["environment"]}},
        }
    )
    assert not is_allowed(any_value, Request("a:b", "r"))
    instance = _doc(
        {
            "Effect": "Allow",
            "Action": "ec2:*",
            "Resource": "*",
            "Condition": {"StringEqualsIfExists": {"ec2:InstanceType": ["t2.micro"]}},
        }
    )
    assert is_allowed(instance, Request("ec2:RunInstances", "r"))
    assert not is_allowed(instance, Request("ec2:RunInstances", "r", {"ec2:InstanceType": "p4d.24xlarge"}))
    negated = _doc(
        {
            "Effect": "Allow",
            "Action": "a:b",
            "Resource": "*",
            "Condition": {"StringNotEquals": {"aws:PrincipalTag/team": "red"}},
        }
    )
    assert is_allowed(negated, Request("a:b", "r"))
    assert not is_allowed(negated, Request("a:b", "r", {"aws:PrincipalTag/team": "red"}))
    home = _doc({"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/home/${aws:username}/*"})
    assert is_allowed(home, Request("s3:GetObject", "arn:aws:s3:::b/home/alice/x", {"aws:username": "alice"}))
    assert not is_allowed(home, Request("s3:GetObject", "arn:aws:s3:::b/home/bob/x", {"aws:username": "alice"}))
    assert not is_allowed(home, Request("s3:GetObject", "arn:aws:s3:::b/home//x"))  # variable missing: no match


def test_a_key_policy_must_allow_itself_or_delegate_to_iam() -> None:
    """KMS developer guide, "Key policies": without a key-policy allow (directly or via the account root), an IAM
    policy alone grants nothing."""
    identity = _doc({"Effect": "Allow", "Action": "kms:Decrypt", "Resource": "*"})
    context = {"aws:PrincipalAccount": ACCOUNT, "aws:PrincipalArn": f"arn:aws:iam::{ACCOUNT}:role/r"}
    request = Request("kms:Decrypt", "arn:aws:kms:r:1:key/k", context)
    delegating = {"Statement": [{"Effect": "Allow", "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:root"},
                                 "Action": "kms:*", "Resource": "*"}]}  # fmt: skip
    closed = {"Statement": [{"Effect": "Allow", "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:role/admin"},
                             "Action": "kms:*", "Resource": "*"}]}  # fmt: skip
    assert is_allowed(identity, request, key_policy=delegating)
    assert not is_allowed(identity, request, key_policy=closed)
    assert not is_allowed([], request, key_policy=delegating)


def test_a_request_from_another_account_needs_an_allow_on_both_sides() -> None:
    """IAM User Guide, "Cross-account policy evaluation logic": the caller's identity policy and the resource's
    policy (naming the caller or its account) must both allow; either alone grants nothing."""
    other = "999999999999"
    identity = _doc({"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/*"})
    bucket = _doc({"Effect": "Allow", "Principal": {"AWS": f"arn:aws:iam::{other}:root"}, "Action": "s3:GetObject",
                   "Resource": "arn:aws:s3:::b/*"})  # fmt: skip
    context = {"aws:PrincipalAccount": other, "aws:PrincipalArn": f"arn:aws:iam::{other}:role/r"}
    request = Request("s3:GetObject", "arn:aws:s3:::b/k", context)
    assert is_allowed(identity, request, resource_policies=bucket, same_account=False)
    assert not is_allowed(identity, request, same_account=False)
    assert not is_allowed([], request, resource_policies=bucket, same_account=False)


def test_actions_match_in_any_case_and_resources_only_in_their_own() -> None:
    """IAM User Guide, "IAM JSON policy elements: Action": action names are case-insensitive; resource ARNs (an S3
    key among them) are matched case-sensitively, so a grant on home/alice/ is none on home/Alice/."""
    policies = _doc({"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/home/alice/*"})
    assert is_allowed(policies, Request("S3:getobject", "arn:aws:s3:::b/home/alice/x"))
    assert not is_allowed(policies, Request("s3:GetObject", "arn:aws:s3:::b/home/Alice/x"))


# ------------------------------------------------------------------ RunInstances from the training launch template


@pytest.fixture(scope="module")
def training_launch(
    templates: dict[str, dict[str, dict]], foundation: Any
) -> tuple[list[dict[str, Any]], dict[str, Any], str]:
    """The dev launcher's launch policy (the one holder of the template's launch grant, issue 41.2), the launch
    template's data and its ARN, resolved alike (the Foundation's exports as the foundation fixture resolves them)."""
    template = templates["dev"]["Training"]
    exports = template_exports(*foundation)
    refs: dict[str, Any] = {"AWS::AccountId": ACCOUNT, "AWS::Partition": "aws", "AWS::Region": REGION,
                            "AWS::URLSuffix": "amazonaws.com"}  # fmt: skip
    for name in template["Resources"]:
        refs.setdefault(name, f"{name}-ref")
        for attribute in ("Arn", "GroupId", "LatestVersionNumber"):
            refs.setdefault(f"{name}.{attribute}", f"{name}.{attribute}")
    policy_id = logical_id(template, "AWS::IAM::ManagedPolicy", "TrainingLauncherLaunchPolicy")
    policy = resolve(template["Resources"][policy_id]["Properties"]["PolicyDocument"], refs=refs, exports=exports)
    (template_id,) = [name for name, r in template["Resources"].items() if r["Type"] == "AWS::EC2::LaunchTemplate"]
    data = {name: resolve(value, refs=refs, exports=exports)  # the user data (Fn::Base64) is not needed
            for name, value in template["Resources"][template_id]["Properties"]["LaunchTemplateData"].items()
            if name in ("InstanceType", "MetadataOptions", "IamInstanceProfile", "Placement")}  # fmt: skip
    return [policy], data, f"arn:aws:ec2:{REGION}:{ACCOUNT}:launch-template/{template_id}-ref"


def _instance_request(data: dict[str, Any], template_arn: str, **changes: str) -> Request:
    """RunInstances on the instance resource, with the keys EC2 fills from the launch template (``changes``: what a
    caller's overrides change)."""
    context = {
        "ec2:LaunchTemplate": template_arn,
        "ec2:IsLaunchTemplateResource": "true",
        "ec2:InstanceType": data["InstanceType"],
        "ec2:MetadataHttpTokens": data["MetadataOptions"]["HttpTokens"],
        "ec2:MetadataHttpPutResponseHopLimit": str(data["MetadataOptions"]["HttpPutResponseHopLimit"]),
        "ec2:InstanceProfile": data["IamInstanceProfile"]["Arn"],
        "ec2:Tenancy": data.get("Placement", {}).get("Tenancy", "default"),
        **changes,
    }
    return Request("ec2:RunInstances", f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/i-0new", context)


def test_a_launch_as_the_template_says_is_allowed(training_launch: Any) -> None:
    policies, data, template_arn = training_launch
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    assert is_allowed(policies, _instance_request(data, template_arn))


@pytest.mark.parametrize(
    "changes",
    [
        {"ec2:MetadataHttpTokens": "optional"},  # IMDSv1: SSRF in the run reads the role's credentials
        {"ec2:MetadataHttpPutResponseHopLimit": "2"},  # a bridged container reaches IMDS
        {"ec2:InstanceProfile": f"arn:aws:iam::{ACCOUNT}:instance-profile/admin"},
        {"ec2:Tenancy": "dedicated"},  # dedicated hardware: a cost nobody budgeted
        {"ec2:IsLaunchTemplateResource": "false"},
        {"ec2:LaunchTemplate": f"arn:aws:ec2:{REGION}:{ACCOUNT}:launch-template/lt-0attacker"},
    ],
    ids=["imdsv1", "hop-limit", "instance-profile", "tenancy", "not-from-template", "other-template"],
)
def test_a_launch_that_overrides_the_instance_settings_is_denied(training_launch: Any, changes: dict) -> None:
    """Issue 22.2: the instance of every RunInstances must have IMDSv2, the hop limit, the training instance
    profile and default tenancy of the template, whatever the caller overrides."""
    policies, data, template_arn = training_launch
    assert not is_allowed(policies, _instance_request(data, template_arn, **changes))


# ------------------------------------------------------------------ issue 22.4: key, buckets, endpoint logs


def test_the_endpoint_role_writes_only_its_environments_endpoint_logs(
    foundation: Any, templates: dict[str, dict[str, dict]]
) -> None:
    role = _role(foundation, "EndpointExecutionRole")
    names = [resource["Properties"]["EndpointName"] for template in templates["dev"].values()
             for resource in template["Resources"].values()
             if resource["Type"] == "AWS::SageMaker::Endpoint"]  # fmt: skip
    assert names, "the dev environment builds at least one endpoint"
    group = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/aws/sagemaker/Endpoints"
    for name in names:
        assert is_allowed(role, Request("logs:PutLogEvents", f"{group}/{name}:log-stream:AllTraffic/i-0abc"))
        other = name.replace("dev-", "staging-", 1)
        assert not is_allowed(role, Request("logs:PutLogEvents", f"{group}/{other}:log-stream:AllTraffic/i-0abc"))


def test_the_platform_key_is_used_only_through_the_platforms_services(foundation: Any) -> None:
    template, refs = foundation
    key_id = logical_id(template, "AWS::KMS::Key", "PlatformKey")
    key_policy = resolve(template["Resources"][key_id]["Properties"]["KeyPolicy"], refs=refs)
    key_arn = refs[f"{key_id}.Arn"]
    role = _role(foundation, "RemoteJobRoleNlp")
    principal = {"aws:PrincipalAccount": ACCOUNT, "aws:PrincipalArn": f"arn:aws:iam::{ACCOUNT}:role/remote-job",
                 "aws:PrincipalIsAWSService": "false"}  # fmt: skip
    via_s3 = Request("kms:Decrypt", key_arn, {**principal, "kms:ViaService": f"s3.{REGION}.amazonaws.com"})
    direct = Request("kms:Decrypt", key_arn, principal)
    assert is_allowed(role, via_s3, key_policy=key_policy)
    assert not is_allowed(role, direct, key_policy=key_policy)  # a copied ciphertext decrypted outside S3


@pytest.mark.parametrize("bucket", list(BUCKETS))
def test_the_platform_buckets_refuse_other_kms_keys_sse_s3_and_sse_c(foundation: Any, bucket: str) -> None:
    template, refs = foundation
    bucket_id = logical_id(template, "AWS::S3::Bucket", bucket)
    (policy,) = [r for r in template["Resources"].values()
                 if r["Type"] == "AWS::S3::BucketPolicy"
                 and r["Properties"]["Bucket"] == {"Ref": bucket_id}]  # fmt: skip
    document = resolve(policy["Properties"]["PolicyDocument"], refs=refs)
    writer = [{"Statement": [{"Effect": "Allow", "Action": "s3:PutObject", "Resource": "*"}]}]
    key_arn = refs[f"{logical_id(template, 'AWS::KMS::Key', 'PlatformKey')}.Arn"]
    obj = f"arn:aws:s3:::{BUCKETS[bucket]}/jobs/x/payload.pkl"

    def put(**context: str) -> bool:
        request = Request("s3:PutObject", obj, {"aws:SecureTransport": "true", **context})
        return is_allowed(writer, request, resource_policies=[document])

    assert put() and put(**{"s3:x-amz-server-side-encryption-aws-kms-key-id": key_arn})
    assert not put(**{"s3:x-amz-server-side-encryption-aws-kms-key-id": "arn:aws:kms:us-east-1:999999999999:key/x"})
    assert not put(**{"s3:x-amz-server-side-encryption-customer-algorithm": "AES256"})
    # SSE-S3 (issue 41.6): the header asks for S3's own key; SSE-KMS named explicitly still passes.
    assert not put(**{"s3:x-amz-server-side-encryption": "AES256"})
    assert not put(
        **{"s3:x-amz-server-side-encryption": "aws:kms:dsse", "s3:x-amz-server-side-encryption-aws-kms-key-id": key_arn}
    )
    assert put(
        **{"s3:x-amz-server-side-encryption": "aws:kms", "s3:x-amz-server-side-encryption-aws-kms-key-id": key_arn}
    )
