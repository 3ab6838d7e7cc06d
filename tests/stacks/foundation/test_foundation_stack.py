"""The foundation of every environment: encryption, bucket hygiene, retention, IAM scope and the network."""

from __future__ import annotations

import re

import pytest
from aws_cdk import region_info
from aws_cdk.assertions import Match, Template

from stacks.settings import DEFAULT_REGION, parse_environment
from tests.conftest import cdk_context

SETTINGS = {name: parse_environment(name, raw) for name, raw in cdk_context()["environments"].items()}
ENVIRONMENTS = list(SETTINGS)
# What each environment's removal policy (cdk.json) makes of its key and buckets.
EXPECTED_DELETION = {name: "Delete" if settings.destroy_on_delete else "Retain" for name, settings in SETTINGS.items()}


@pytest.fixture(scope="module", params=ENVIRONMENTS)
def env(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def foundation(templates, env: str) -> dict:
    return templates[env]["Foundation"]


def resources(template: dict, resource_type: str) -> dict[str, dict]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == resource_type}


def test_one_rotating_customer_managed_key_with_environment_retention(foundation: dict, env: str) -> None:
    keys = resources(foundation, "AWS::KMS::Key")
    assert len(keys) == 1
    (key,) = keys.values()
    assert key["Properties"]["EnableKeyRotation"] is True
    assert key["DeletionPolicy"] == EXPECTED_DELETION[env]


def test_every_bucket_is_encrypted_tls_only_versioned_private_logged_and_retained_per_environment(
    foundation: dict, env: str
) -> None:
    (key_id,) = resources(foundation, "AWS::KMS::Key")
    buckets = resources(foundation, "AWS::S3::Bucket")
    log_buckets = [name for name in buckets if name.startswith("AccessLogs")]
    assert len(buckets) == 4 and len(log_buckets) == 1
    policies = {
        p["Properties"]["Bucket"]["Ref"]: p["Properties"]["PolicyDocument"]["Statement"]
        for p in resources(foundation, "AWS::S3::BucketPolicy").values()
    }
    for name, bucket in buckets.items():
        props = bucket["Properties"]
        assert bucket["DeletionPolicy"] == EXPECTED_DELETION[env], name
        assert props["VersioningConfiguration"] == {"Status": "Enabled"}, name
        assert props["PublicAccessBlockConfiguration"] == dict.fromkeys(
            ["BlockPublicAcls", "BlockPublicPolicy", "IgnorePublicAcls", "RestrictPublicBuckets"], True
        ), name
        assert props["LifecycleConfiguration"]["Rules"], name
        (encryption,) = props["BucketEncryption"]["ServerSideEncryptionConfiguration"]
        tls_denied = any(
            s["Effect"] == "Deny" and s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
            for s in policies[name]
        )
        assert tls_denied, f"{name} accepts plain HTTP"
        if name in log_buckets:
            # S3 server access logs can only be delivered to SSE-S3 buckets.
            assert encryption["ServerSideEncryptionByDefault"] == {"SSEAlgorithm": "AES256"}
        else:
            assert encryption["ServerSideEncryptionByDefault"] == {
                "SSEAlgorithm": "aws:kms",
                "KMSMasterKeyID": {"Fn::GetAtt": [key_id, "Arn"]},
            }, name
            assert props["LoggingConfiguration"]["DestinationBucketName"] == {"Ref": log_buckets[0]}, name


def test_dev_buckets_are_emptied_on_destroy_and_retained_ones_are_not(foundation: dict, env: str) -> None:
    auto_delete = resources(foundation, "Custom::S3AutoDeleteObjects")
    assert len(auto_delete) == (4 if SETTINGS[env].destroy_on_delete else 0)


def _statements(template: dict):
    for name, policy in {
        **resources(template, "AWS::IAM::ManagedPolicy"),
        **resources(template, "AWS::IAM::Policy"),
    }.items():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            yield name, statement


def _as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def test_no_role_has_a_star_action_or_an_aws_full_access_policy(foundation: dict) -> None:
    for name, statement in _statements(foundation):
        for action in _as_list(statement["Action"]):
            assert action != "*" and not action.endswith(":*"), f"{name} allows {action}"
    for name, role in resources(foundation, "AWS::IAM::Role").items():
        for arn in role["Properties"].get("ManagedPolicyArns", []):
            assert "FullAccess" not in str(arn), f"{name} has {arn}"


def test_every_pass_role_names_the_service_it_passes_to(foundation: dict) -> None:
    pass_roles = [(n, s) for n, s in _statements(foundation) if "iam:PassRole" in _as_list(s["Action"])]
    assert pass_roles
    for name, statement in pass_roles:
        assert "iam:PassedToService" in statement["Condition"]["StringEquals"], name


def test_roles_and_instance_profile(foundation: dict) -> None:
    template = Template.from_json(foundation)
    template.resource_properties_count_is(
        "AWS::IAM::Role",
        {
            "AssumeRolePolicyDocument": Match.object_like(
                {"Statement": [Match.object_like({"Principal": {"Service": "sagemaker.amazonaws.com"}})]}
            )
        },
        1 + len(_remote_callers(foundation)),  # the endpoints' and one per @remote caller
    )
    template.resource_count_is("AWS::IAM::InstanceProfile", 1)
    # The endpoint role reads the model prefixes only.
    template.has_resource_properties(
        "AWS::IAM::ManagedPolicy",
        {
            "PolicyDocument": {
                "Statement": Match.array_with(
                    [Match.object_like({"Sid": "ReadModelArchives", "Action": "s3:GetObject"})]
                )
            }
        },
    )


def test_network_has_private_subnets_flow_logs_and_the_platform_endpoints(foundation: dict) -> None:
    template = Template.from_json(foundation)
    template.resource_count_is("AWS::EC2::FlowLog", 1)
    for subnet in resources(foundation, "AWS::EC2::Subnet").values():
        assert subnet["Properties"]["MapPublicIpOnLaunch"] is False
    services = set()
    for endpoint in resources(foundation, "AWS::EC2::VPCEndpoint").values():
        name = endpoint["Properties"]["ServiceName"]
        services.add(name if isinstance(name, str) else "".join(p for p in name["Fn::Join"][1] if isinstance(p, str)))
    expected = {
        "ecr.api",
        "ecr.dkr",
        "sagemaker.api",
        "sagemaker.runtime",
        "sts",
        "logs",
        "ssm",
        "ssmmessages",
        "ec2messages",
        "s3",
    }
    found = {suffix for suffix in expected if any(s.endswith(f".{suffix}") for s in services)}
    assert found == expected, services


def test_no_security_group_accepts_traffic_from_outside_the_vpc(foundation: dict) -> None:
    for name, group in resources(foundation, "AWS::EC2::SecurityGroup").items():
        for rule in group["Properties"].get("SecurityGroupIngress", []):
            assert rule.get("CidrIp") not in ("0.0.0.0/0", None) or "SourceSecurityGroupId" in rule, name
            assert rule.get("CidrIp", "").startswith("10."), name


def _statements_by_sid(template: dict, policy_prefix: str) -> dict[str, dict]:
    (policy,) = (
        r for name, r in resources(template, "AWS::IAM::ManagedPolicy").items() if name.startswith(policy_prefix)
    )
    return {s["Sid"]: s for s in policy["Properties"]["PolicyDocument"]["Statement"]}


def _remote_callers(template: dict) -> list[str]:
    """The construct-id suffixes of the template's @remote callers (RemoteJobRole<Suffix>)."""
    roles = resources(template, "AWS::IAM::Role")
    return sorted(re.fullmatch(r"RemoteJobRole([A-Z][a-z0-9]*)[0-9A-F]{8}", name)[1]  # type: ignore[index]
                  for name in roles if re.fullmatch(r"RemoteJobRole[A-Z][a-z0-9]*[0-9A-F]{8}", name))  # fmt: skip


# Endpoints attach in the workload group; each caller's @remote jobs in their caller's own, whose members meet.
@pytest.mark.parametrize("workload", ["endpoints", "first caller's @remote jobs"])
def test_vpc_attachment_is_held_to_the_platform_vpc_subnets_and_security_group(foundation: dict, workload: str) -> None:
    if workload == "endpoints":
        policy, group = "EndpointExecutionRolePolicy", "WorkloadSecurityGroup"
    else:
        caller = _remote_callers(foundation)[0]
        policy, group = f"RemoteJobRole{caller}Policy", f"RemoteJobsSecurityGroup{caller}"
    (vpc_id,) = resources(foundation, "AWS::EC2::VPC")
    groups = resources(foundation, "AWS::EC2::SecurityGroup")
    (group_id,) = [name for name in groups if re.fullmatch(rf"{group}[0-9A-F]{{8}}", name)]
    others = [name for name in groups if name.startswith(("WorkloadSecurityGroup", "RemoteJobsSecurityGroup"))
              and name != group_id]  # fmt: skip
    statements = _statements_by_sid(foundation, policy)
    create = statements["CreateInterfacesInThePlatformSubnets"]
    assert create["Action"] == "ec2:CreateNetworkInterface"
    (condition,) = create["Condition"]["ArnEquals"].items()
    assert condition[0] == "ec2:Vpc" and condition[1]["Fn::Join"][1][-2:] == [":vpc/", {"Ref": vpc_id}]
    resources_text = str(create["Resource"])
    private_subnets = [
        name for name in resources(foundation, "AWS::EC2::Subnet") if name.startswith("VpcPrivateSubnet")
    ]
    assert private_subnets and all(name in resources_text for name in private_subnets)
    assert others and "PublicSubnet" not in resources_text and group_id in resources_text
    assert not [other for other in others if other in resources_text]
    assert "subnet/*" not in resources_text and "security-group/*" not in resources_text
    manage = statements["ManageInterfacesInThePlatformVpc"]
    assert manage["Condition"] == create["Condition"]
    assert sorted(manage["Action"]) == ["ec2:CreateNetworkInterfacePermission", "ec2:DeleteNetworkInterface"]
    assert statements["DeleteInterfacePermissions"]["Action"] == "ec2:DeleteNetworkInterfacePermission"


def test_key_grants_only_for_aws_resources_or_services(foundation: dict) -> None:
    (key,) = resources(foundation, "AWS::KMS::Key").values()
    statements = key["Properties"]["KeyPolicy"]["Statement"]
    (deny,) = [s for s in statements if s.get("Sid") == "DenyGrantsExceptForAwsResources"]
    assert deny == {
        "Sid": "DenyGrantsExceptForAwsResources",
        "Effect": "Deny",
        "Principal": {"AWS": "*"},
        "Action": "kms:CreateGrant",
        "Resource": "*",
        "Condition": {"BoolIfExists": {"kms:GrantIsForAWSResource": "false", "aws:PrincipalIsAWSService": "false"}},
    }


def test_data_buckets_send_object_events_to_eventbridge(foundation: dict) -> None:
    buckets = resources(foundation, "AWS::S3::Bucket")
    for name, bucket in buckets.items():
        notifications = bucket["Properties"].get("NotificationConfiguration")
        if name.startswith("AccessLogs"):
            assert notifications is None, name
        else:
            assert notifications == {"EventBridgeConfiguration": {"EventBridgeEnabled": True}}, name


def test_training_job_log_group_gets_retention_from_one_environment_and_is_never_owned(
    foundation: dict, env: str
) -> None:
    """/aws/sagemaker/TrainingJobs is the account's: no stack creates it as a resource; prod's settings set its
    retention through CDK's LogRetention (which keeps the group when the stack goes)."""
    assert not [
        r
        for r in resources(foundation, "AWS::Logs::LogGroup").values()
        if r["Properties"].get("LogGroupName") == "/aws/sagemaker/TrainingJobs"
    ]
    retention = list(resources(foundation, "Custom::LogRetention").values())
    if not SETTINGS[env].logs.manage_training_job_log_group:
        assert retention == []
        return
    (custom,) = retention
    assert custom["Properties"]["LogGroupName"] == "/aws/sagemaker/TrainingJobs"
    assert custom["Properties"]["RetentionInDays"] == SETTINGS[env].logs.retention_days
    assert custom["Properties"]["RemovalPolicy"] == "retain"
    (policy_id,) = [name for name in resources(foundation, "AWS::IAM::ManagedPolicy") if "LogRetention" in name]
    assert policy_id in custom["DependsOn"]
    statements = _statements_by_sid(foundation, "TrainingJobLogRetentionPolicy")
    scoped = statements["SetTheRetentionOfTheTrainingJobLogGroup"]["Resource"]["Fn::Join"][1]
    assert scoped[-1] == ":log-group:/aws/sagemaker/TrainingJobs"
    assert all("*" not in str(s["Resource"]) or s["Sid"] == "WriteOwnLogs" for s in statements.values())


def _role(template: dict, prefix: str) -> dict:
    (role,) = [r for name, r in resources(template, "AWS::IAM::Role").items() if name.startswith(prefix)]
    return role


def _arn_suffix(value: dict) -> str:
    """The literal tail of an Fn::Join ARN (what follows the account)."""
    return value["Fn::Join"][1][-1]


@pytest.mark.parametrize("role", ["EndpointExecutionRole", "RemoteJobRole"])
def test_sagemaker_trusts_name_this_accounts_resources(foundation: dict, role: str) -> None:
    """The endpoints' role for this account's resources; each caller's job role only for that caller's jobs."""
    if role == "EndpointExecutionRole":
        _trusts_this_accounts(_role(foundation, role), ":*")
    for caller in _remote_callers(foundation) if role == "RemoteJobRole" else []:
        _trusts_this_accounts(_role(foundation, f"RemoteJobRole{caller}"), f":training-job/{caller.lower()}-*")


def _trusts_this_accounts(role: dict, source_arn_tail: str) -> None:
    (statement,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert statement["Principal"] == {"Service": "sagemaker.amazonaws.com"}
    (source_arn,) = statement["Condition"]["ArnLike"].values()
    assert list(statement["Condition"]["ArnLike"]) == ["aws:SourceArn"]
    assert _arn_suffix(source_arn) == source_arn_tail
    assert {"Ref": "AWS::AccountId"} in source_arn["Fn::Join"][1] and ":sagemaker:" in source_arn["Fn::Join"][1][0]


def test_flow_log_role_trusts_only_this_accounts_flow_logs(foundation: dict) -> None:
    (statement,) = _role(foundation, "FlowLogRole")["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert statement["Principal"] == {"Service": "vpc-flow-logs.amazonaws.com"}
    assert statement["Condition"]["StringEquals"] == {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}
    assert _arn_suffix(statement["Condition"]["ArnLike"]["aws:SourceArn"]) == ":vpc-flow-log/*"
    (flow_log,) = resources(foundation, "AWS::EC2::FlowLog").values()
    assert flow_log["Properties"]["DeliverLogsPermissionArn"]["Fn::GetAtt"][0].startswith("FlowLogRole")


def _endpoint(template: dict, name: str) -> dict:
    (endpoint,) = [e for lid, e in resources(template, "AWS::EC2::VPCEndpoint").items() if lid[:-8] == f"Vpc{name}"]
    return endpoint["Properties"]


def test_s3_gateway_endpoint_reaches_only_this_accounts_buckets_and_the_aws_owned_ones_it_needs(
    foundation: dict,
) -> None:
    statements = {s["Sid"]: s for s in _endpoint(foundation, "S3")["PolicyDocument"]["Statement"]}
    assert set(statements) == {
        "AllowThisAccountsPrincipalsToThisAccountsBuckets",
        "AllowReadsOfAwsOwnedBuckets",
        "AllowAwsServicePrincipals",
    }
    account = {"Ref": "AWS::AccountId"}
    assert statements["AllowThisAccountsPrincipalsToThisAccountsBuckets"]["Condition"] == {
        "StringEquals": {"aws:PrincipalAccount": account, "aws:ResourceAccount": account}
    }
    owned = statements["AllowReadsOfAwsOwnedBuckets"]
    assert owned["Action"] == "s3:GetObject" and "Condition" not in owned
    assert "arn:aws:s3:::prod-us-west-2-starport-layer-bucket/*" in owned["Resource"]  # ECR image layers
    assert "arn:aws:s3:::us-west-2-birdwatcher-prod/*" in owned["Resource"]  # SSM Agent (Session Manager)
    assert all(r.endswith("/*") and "*" not in r[:-2] for r in owned["Resource"])


def test_interface_endpoints_admit_only_this_accounts_principals_where_policies_apply(foundation: dict) -> None:
    dlc_account = region_info.Fact.find(DEFAULT_REGION, region_info.FactName.DLC_REPOSITORY_ACCOUNT)
    for name in ("EcrApi", "SageMakerApi", "SageMakerRuntime", "Sts", "Logs", "Ssm"):
        statements = _endpoint(foundation, name)["PolicyDocument"]["Statement"]
        # This account's resources; the ECR API also the registry of AWS's Deep Learning Containers.
        accounts = [{"Ref": "AWS::AccountId"}, *([dlc_account] if name == "EcrApi" else [])]
        assert [s["Condition"] for s in statements] == [
            {
                "StringEquals": {"aws:PrincipalAccount": {"Ref": "AWS::AccountId"}},
                "StringEqualsIfExists": {"aws:ResourceAccount": accounts},
            },
            {"Bool": {"aws:PrincipalIsAWSService": "true"}},
        ], name
    for name in ("EcrDocker", "SsmMessages", "Ec2Messages"):
        assert "PolicyDocument" not in _endpoint(foundation, name), name
