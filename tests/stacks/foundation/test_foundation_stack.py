"""The foundation of every environment: encryption, bucket hygiene, retention, IAM scope and the network."""

from __future__ import annotations

import fnmatch
import re

import pytest
from aws_cdk import region_info
from aws_cdk.assertions import Match, Template

from ops_review.iam_policy import Request, is_allowed, resolve
from stacks.settings import DEFAULT_REGION, parse_environment
from tests.conftest import cdk_context
from tests.stacks.components.bare_stack import ACCOUNT, REGION, refs
from tests.stacks.components.statement_requests import (
    ALLOW_EVERYTHING,
    bucket_requests,
    concrete,
    each_key_matters,
    granted_actions,
    over_tls_and_plain_http,
)

SETTINGS = {name: parse_environment(name, raw) for name, raw in cdk_context()["environments"].items()}
ENVIRONMENTS = list(SETTINGS)
# Every environment deploys to the account of its credentials, in the default region: the requests below are made
# in bare_stack's account and region, which the templates' references resolve to.
assert all(not raw.get("account") and raw.get("region", DEFAULT_REGION) == REGION
           for raw in cdk_context()["environments"].values())  # fmt: skip
OTHER_ACCOUNT = "999999999999"
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
    values = refs(foundation)
    policies = {
        p["Properties"]["Bucket"]["Ref"]: resolve(p["Properties"]["PolicyDocument"], refs=values)
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
        requests = bucket_requests(f"arn:aws:s3:::{values[name]}")  # (evaluated: allowed over TLS only)
        assert over_tls_and_plain_http(policies[name], requests) == dict.fromkeys(requests, (True, False)), name
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


def test_every_pass_role_passes_its_role_to_sagemaker_only(foundation: dict) -> None:
    """Each role a policy may pass (the @remote callers' job roles), evaluated: passed to SageMaker, not to another
    service, and not by a request that names no service."""
    values = refs(foundation)
    passed = 0
    for name, policy in {**resources(foundation, "AWS::IAM::ManagedPolicy"),
                         **resources(foundation, "AWS::IAM::Policy")}.items():  # fmt: skip
        raw = policy["Properties"]["PolicyDocument"]
        if not any(fnmatch.fnmatchcase("iam:PassRole", action) for action, _ in granted_actions([raw])):
            continue  # (the others name resources that refs() has no ARN for)
        document = [resolve(raw, refs=values)]
        for action, role in granted_actions(document):
            if fnmatch.fnmatchcase("iam:PassRole", action):
                to_sagemaker = {"iam:PassedToService": "sagemaker.amazonaws.com"}
                assert each_key_matters(document, action, concrete(role), to_sagemaker) == {
                    "iam:PassedToService": False
                }, name
                to_ec2 = Request(action, concrete(role), {"iam:PassedToService": "ec2.amazonaws.com"})
                assert not is_allowed(document, to_ec2), name
                passed += 1
    assert passed == len(_remote_callers(foundation))


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
    values = refs(foundation)
    (document,) = [resolve(r["Properties"]["PolicyDocument"], refs=values)
                   for name, r in resources(foundation, "AWS::IAM::ManagedPolicy").items()
                   if name.startswith(policy)]  # fmt: skip
    subnets = [name for name in resources(foundation, "AWS::EC2::Subnet")]
    private = [values[name] for name in subnets if name.startswith("VpcPrivateSubnet")]
    public = [values[name] for name in subnets if not name.startswith("VpcPrivateSubnet")]
    assert private and public
    platform, other = (
        f"arn:aws:ec2:{REGION}:{ACCOUNT}:vpc/{values[vpc_id]}",
        f"arn:aws:ec2:{REGION}:{ACCOUNT}:vpc/vpc-0other",
    )

    def allowed(action: str, resource: str, vpc: str | None = platform) -> bool:
        context = {"ec2:Vpc": vpc} if vpc else {}
        return is_allowed([document], Request(action, f"arn:aws:ec2:{REGION}:{ACCOUNT}:{resource}", context))

    create, interface = "ec2:CreateNetworkInterface", "network-interface/eni-0123"
    assert all(allowed(create, f"subnet/{subnet}") for subnet in private)
    assert allowed(create, f"security-group/{values[group_id]}") and allowed(create, interface)
    assert not [subnet for subnet in public if allowed(create, f"subnet/{subnet}")]
    assert others and not [o for o in others if allowed(create, f"security-group/{values[o]}")]
    assert not allowed(create, "subnet/subnet-0elsewhere") and not allowed(create, "security-group/sg-0elsewhere")
    # Every action on the interfaces: in the platform's VPC only, and never by a request without the ec2:Vpc key.
    for action in (create, "ec2:CreateNetworkInterfacePermission", "ec2:DeleteNetworkInterface"):
        assert allowed(action, interface), action
        assert not allowed(action, interface, other) and not allowed(action, interface, None), action
    # Deleting an interface's permission has no resource-level permission or condition key (Service Authorization
    # Reference, Amazon EC2): allowed on "*", where SageMaker's cleanup needs it.
    assert allowed("ec2:DeleteNetworkInterfacePermission", "network-interface/eni-0123", None)


def test_key_grants_only_for_aws_resources_or_services(foundation: dict) -> None:
    """The key policy, evaluated for a principal of the account whose IAM policy allows everything: a grant for an
    AWS resource (an integrated service creating it for the caller) or by an AWS service is allowed, a grant the
    caller creates for itself is not (the key decides, whatever the account's IAM policies allow)."""
    values = refs(foundation)
    ((key_id, key),) = resources(foundation, "AWS::KMS::Key").items()
    key_policy = resolve(key["Properties"]["KeyPolicy"], refs=values)
    caller = {"aws:PrincipalAccount": ACCOUNT, "aws:PrincipalArn": f"arn:aws:iam::{ACCOUNT}:role/Admin"}

    def may_grant(**context: str) -> bool:
        request = Request("kms:CreateGrant", values[f"{key_id}.Arn"], {**caller, **context})
        return is_allowed([ALLOW_EVERYTHING], request, key_policy=key_policy)

    assert may_grant(**{"kms:GrantIsForAWSResource": "true", "aws:PrincipalIsAWSService": "false"})
    assert may_grant(**{"kms:GrantIsForAWSResource": "false", "aws:PrincipalIsAWSService": "true"})
    assert not may_grant(**{"kms:GrantIsForAWSResource": "false", "aws:PrincipalIsAWSService": "false"})
    assert not may_grant()  # (neither key: a caller's own CreateGrant call)
    # The same caller keeps the key's other uses (the Deny is on grants only).
    decrypt = Request(
        "kms:Decrypt", values[f"{key_id}.Arn"], {**caller, "kms:ViaService": f"s3.{REGION}.amazonaws.com"}
    )
    assert is_allowed([ALLOW_EVERYTHING], decrypt, key_policy=key_policy)


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
    document = [resolve(resources(foundation, "AWS::IAM::ManagedPolicy")[policy_id]["Properties"]["PolicyDocument"],
                        refs=refs(foundation))]  # fmt: skip

    def allowed(action: str, group: str, suffix: str = ":*") -> bool:
        # group-level actions are checked against the group's ARN ending in ":*" (CloudWatch Logs API reference)
        return is_allowed(document, Request(action, f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{group}{suffix}"))

    for action in ("logs:CreateLogGroup", "logs:PutRetentionPolicy", "logs:DeleteRetentionPolicy"):
        assert allowed(action, "/aws/sagemaker/TrainingJobs"), action
        assert not allowed(action, "/aws/sagemaker/Endpoints/dev-sentiment"), action
    assert not allowed("logs:DeleteLogGroup", "/aws/sagemaker/TrainingJobs")
    assert not allowed("logs:PutLogEvents", "/aws/sagemaker/TrainingJobs", ":log-stream:job/algo-1")


def _role(template: dict, prefix: str) -> dict:
    (role,) = [r for name, r in resources(template, "AWS::IAM::Role").items() if name.startswith(prefix)]
    return role


@pytest.mark.parametrize("role", ["EndpointExecutionRole", "RemoteJobRole"])
def test_sagemaker_trusts_name_this_accounts_resources(foundation: dict, role: str) -> None:
    """The endpoints' role for this account's resources; each caller's job role only for that caller's jobs."""
    if role == "EndpointExecutionRole":
        _trusts_this_accounts(foundation, _role(foundation, role), "endpoint/dev-sentiment", [])
    callers = _remote_callers(foundation) if role == "RemoteJobRole" else []
    for caller in callers:
        job = "training-job/{}-fn-2026-12-06-07-00-00-000"
        others = [job.format(other.lower()) for other in callers if other != caller]
        others += [job.format(f"{caller.lower()}x"), "endpoint/dev-sentiment"]  # a longer name; not a job
        _trusts_this_accounts(
            foundation, _role(foundation, f"RemoteJobRole{caller}"), job.format(caller.lower()), others
        )


def _may_assume(template: dict, role: dict, service: str, source_arn: str | None, **context: str) -> bool:
    trust = resolve(role["Properties"]["AssumeRolePolicyDocument"], refs=refs(template))
    keys = {"aws:PrincipalServiceName": service, **({"aws:SourceArn": source_arn} if source_arn else {}), **context}
    return is_allowed([], Request("sts:AssumeRole", f"arn:aws:iam::{ACCOUNT}:role/x", keys), resource_policies=[trust])


def _trusts_this_accounts(template: dict, role: dict, resource: str, others: list[str]) -> None:
    """SageMaker acting for ``resource`` of this account may assume ``role``; for ``others``, for the same resource in
    another account, without a source, or another service, it may not."""
    sagemaker = "sagemaker.amazonaws.com"
    assert _may_assume(template, role, sagemaker, f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:{resource}")
    for other in others:
        assert not _may_assume(template, role, sagemaker, f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:{other}"), other
    assert not _may_assume(template, role, sagemaker, f"arn:aws:sagemaker:{REGION}:{OTHER_ACCOUNT}:{resource}")
    assert not _may_assume(template, role, sagemaker, None)
    assert not _may_assume(template, role, "ec2.amazonaws.com", f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:{resource}")


def test_flow_log_role_trusts_only_this_accounts_flow_logs(foundation: dict) -> None:
    role, service = _role(foundation, "FlowLogRole"), "vpc-flow-logs.amazonaws.com"

    def may_assume(account: str = ACCOUNT, resource: str = "vpc-flow-log/fl-0123", **context: str) -> bool:
        source = f"arn:aws:ec2:{REGION}:{account}:{resource}"
        return _may_assume(foundation, role, service, source, **{"aws:SourceAccount": account, **context})

    assert may_assume()
    assert not may_assume(OTHER_ACCOUNT) and not may_assume(resource="instance/i-0123")
    assert not may_assume(**{"aws:SourceAccount": OTHER_ACCOUNT})  # a source ARN alone does not do
    assert not _may_assume(foundation, role, service, None, **{"aws:SourceAccount": ACCOUNT})
    assert not _may_assume(
        foundation, role, "sagemaker.amazonaws.com", f"arn:aws:ec2:{REGION}:{ACCOUNT}:vpc-flow-log/f"
    )
    (flow_log,) = resources(foundation, "AWS::EC2::FlowLog").values()
    assert flow_log["Properties"]["DeliverLogsPermissionArn"]["Fn::GetAtt"][0].startswith("FlowLogRole")


def _endpoint(template: dict, name: str) -> dict:
    (endpoint,) = [e for lid, e in resources(template, "AWS::EC2::VPCEndpoint").items() if lid[:-8] == f"Vpc{name}"]
    return endpoint["Properties"]


def test_s3_gateway_endpoint_reaches_only_this_accounts_buckets_and_the_aws_owned_ones_it_needs(
    foundation: dict,
) -> None:
    """The gateway's policy, evaluated for callers whose IAM policies allow everything: this account's principals
    reach this account's buckets only; of other accounts' buckets, reads of the AWS-owned ones the instances need
    (ECR's image layers, the SSM Agent's); AWS services acting through it keep their access."""
    document = resolve(_endpoint(foundation, "S3")["PolicyDocument"], refs=refs(foundation))
    aws_owned = "111111111111"  # (an account of AWS's own buckets: not this one)

    def through(
        action: str, resource: str, principal: str = ACCOUNT, owner: str = ACCOUNT, service: bool = False
    ) -> bool:
        context = {"aws:PrincipalAccount": principal, "aws:ResourceAccount": owner,
                   "aws:PrincipalIsAWSService": str(service).lower()}  # fmt: skip
        return is_allowed([ALLOW_EVERYTHING], Request(action, resource, context), endpoint_policies=[document])

    for action, resource in bucket_requests("arn:aws:s3:::dev-artifacts"):
        assert through(action, resource), action
        assert not through(action, resource, owner=OTHER_ACCOUNT), action  # no copy out to another account's bucket
        assert not through(action, resource, principal=OTHER_ACCOUNT), action
        assert through(action, resource, principal=aws_owned, owner=OTHER_ACCOUNT, service=True), action
    for bucket in (f"prod-{REGION}-starport-layer-bucket", f"{REGION}-birdwatcher-prod"):  # ECR layers, SSM Agent
        assert through("s3:GetObject", f"arn:aws:s3:::{bucket}/sha256/0123", owner=aws_owned), bucket
        assert not through("s3:PutObject", f"arn:aws:s3:::{bucket}/sha256/0123", owner=aws_owned), bucket
        assert not through("s3:ListBucket", f"arn:aws:s3:::{bucket}", owner=aws_owned), bucket
    assert not through("s3:GetObject", f"arn:aws:s3:::prod-{REGION}-starport-layer-bucket-x/o", owner=OTHER_ACCOUNT)


# One call through each interface endpoint whose service applies endpoint policies.
THROUGH_INTERFACE_ENDPOINTS = {"EcrApi": "ecr:BatchGetImage", "SageMakerApi": "sagemaker:CreateTrainingJob",
                               "SageMakerRuntime": "sagemaker:InvokeEndpoint", "Sts": "sts:AssumeRole",
                               "Logs": "logs:PutLogEvents", "Ssm": "ssm:GetParameter"}  # fmt: skip


def test_interface_endpoints_admit_only_this_accounts_principals_where_policies_apply(foundation: dict) -> None:
    """Each endpoint's policy, evaluated: this account's principals to this account's resources (the ECR API also
    to the registry of AWS's Deep Learning Containers; a call with no resource account, as STS's, too), AWS
    services; nobody else's principals, and no other account's resources."""
    dlc_account = region_info.Fact.find(DEFAULT_REGION, region_info.FactName.DLC_REPOSITORY_ACCOUNT)
    for name, action in THROUGH_INTERFACE_ENDPOINTS.items():
        document = resolve(_endpoint(foundation, name)["PolicyDocument"], refs=refs(foundation))

        def through(principal: str = ACCOUNT, owner: str | None = ACCOUNT, service: bool = False,
                    document: dict = document, action: str = action) -> bool:  # fmt: skip
            context = {"aws:PrincipalAccount": principal, "aws:PrincipalIsAWSService": str(service).lower(),
                       **({"aws:ResourceAccount": owner} if owner else {})}  # fmt: skip
            request = Request(action, f"arn:aws:service:{REGION}:{owner}:resource", context)
            return is_allowed([ALLOW_EVERYTHING], request, endpoint_policies=[document])

        assert through() and through(owner=None), name
        assert not through(principal=OTHER_ACCOUNT) and not through(owner=OTHER_ACCOUNT), name
        assert through(owner=dlc_account) == (name == "EcrApi"), name
        assert through(principal=OTHER_ACCOUNT, owner=OTHER_ACCOUNT, service=True), name
    for name in ("EcrDocker", "SsmMessages", "Ec2Messages"):
        assert "PolicyDocument" not in _endpoint(foundation, name), name
