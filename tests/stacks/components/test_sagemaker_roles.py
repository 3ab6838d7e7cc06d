"""EndpointExecutionRole and RemoteJobRole on a bare stack: who may assume them, and the calls their synthesized
policies allow and refuse (evaluated with ops_review/iam_policy.py); the stack passes the compliance gates."""

from __future__ import annotations

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3

from ops_review.iam_policy import Request, is_allowed, resolve
from proving_ground.iam_requests import logical_id, role_policies
from stacks.components.sagemaker_roles import EndpointExecutionRole, RemoteJobRole, VpcAttachment
from tests.stacks.components.bare_stack import (
    ACCOUNT,
    REGION,
    bare_stack,
    refs,
    resources,
    synth_through_the_gates,
    template_of,
)
from tests.stacks.components.statement_requests import (
    allowed_without_context,
    concrete,
    each_key_matters,
    granted_actions,
)

OTHER_ACCOUNT = "999999999999"
KEY = f"arn:aws:kms:{REGION}:{ACCOUNT}:key/platform"
VPC = "vpc-platform"
SUBNETS = ["subnet-a", "subnet-b"]
GROUP = "sg-workloads"


def _build(stack: cdk.Stack) -> None:
    """The roles over imported scaffolding (key, VPC, group, buckets): only the roles' resources are synthesized."""
    key = kms.Key.from_key_arn(stack, "Key", KEY)
    vpc = ec2.Vpc.from_vpc_attributes(
        stack, "Vpc", vpc_id=VPC, availability_zones=[f"{REGION}a", f"{REGION}b"], private_subnet_ids=SUBNETS
    )
    group = ec2.SecurityGroup.from_security_group_id(stack, "Workloads", GROUP)
    network = VpcAttachment(vpc=vpc, subnets=vpc.private_subnets, security_group=group)
    buckets = {
        name: s3.Bucket.from_bucket_name(stack, name, name.lower()) for name in ("Datasets", "Artifacts", "RemoteJobs")
    }
    EndpointExecutionRole(
        stack,
        "EndpointRole",
        artifacts=buckets["Artifacts"],
        model_prefixes=["endpoints/", "mme/"],
        data_capture_prefix="data-capture/",
        key=key,
        network=network,
        endpoint_name_prefix="dev-",
    )
    RemoteJobRole(
        stack,
        "JobRole",
        caller="nlp",
        remote_jobs=buckets["RemoteJobs"],
        datasets=buckets["Datasets"],
        training_job_log_group="/aws/sagemaker/TrainingJobs",
        training_repository="pytorch-training",
        key=key,
        network=network,
    )


@pytest.fixture(scope="module")
def template() -> dict:
    stack = bare_stack()
    _build(stack)
    return template_of(stack)


def _policies(template: dict, role: str) -> list[dict]:
    return role_policies(template, logical_id(template, "AWS::IAM::Role", role), refs(template))


def _object(bucket: str, key: str) -> str:
    return f"arn:aws:s3:::{bucket.lower()}/{key}"


@pytest.mark.parametrize(
    ("role", "resource"), [("EndpointRole", "endpoint/sentiment"), ("JobRole", "training-job/nlp-fn-2026")]
)
def test_only_sagemaker_acting_for_this_accounts_resources_may_assume_the_roles(
    template: dict, role: str, resource: str
) -> None:
    role_id = logical_id(template, "AWS::IAM::Role", role)
    trust = resolve(template["Resources"][role_id]["Properties"]["AssumeRolePolicyDocument"], refs=refs(template))

    def may_assume(account: str) -> bool:
        context = {
            "aws:PrincipalServiceName": "sagemaker.amazonaws.com",
            "aws:SourceArn": f"arn:aws:sagemaker:{REGION}:{account}:{resource}",
        }
        return is_allowed(
            [], Request("sts:AssumeRole", f"arn:aws:iam::{ACCOUNT}:role/x", context), resource_policies=[trust]
        )

    assert may_assume(ACCOUNT)
    assert not may_assume(OTHER_ACCOUNT)


def test_endpoints_read_models_and_write_captured_data_only(template: dict) -> None:
    policies = _policies(template, "EndpointRole")
    allowed = {
        ("s3:GetObject", _object("Artifacts", "endpoints/sentiment/model-v1.tar.gz")): True,
        ("s3:GetObject", _object("Artifacts", "mme/m-1.tar.gz")): True,
        ("s3:PutObject", _object("Artifacts", "data-capture/2026/12/01/x.jsonl")): True,
        ("s3:GetObject", _object("Artifacts", "training-output/r-1/model.tar.gz")): False,
        ("s3:PutObject", _object("Artifacts", "endpoints/sentiment/model-v2.tar.gz")): False,
        ("s3:GetObject", _object("Datasets", "train.csv")): False,
        ("ecr:BatchGetImage", f"arn:aws:ecr:{REGION}:763104351884:repository/pytorch-training"): False,
        ("kms:Decrypt", KEY): True,
        ("kms:Decrypt", f"arn:aws:kms:{REGION}:{ACCOUNT}:key/another"): False,
    }
    assert {call: is_allowed(policies, Request(*call)) for call in allowed} == allowed


def test_endpoints_write_only_their_own_environments_log_groups(template: dict) -> None:
    """Issue 22.4: the endpoint role writes /aws/sagemaker/Endpoints/<its environment's endpoints>, not another
    environment's or team's endpoint logs, nor any other log group."""
    policies = _policies(template, "EndpointRole")
    group = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/aws/sagemaker/Endpoints"
    expected = {
        f"{group}/dev-GravitonEndpoint:log-stream:AllTraffic/i-0abc": True,
        f"{group}/staging-GravitonEndpoint:log-stream:AllTraffic/i-0abc": False,
        f"{group}/other-team-endpoint:log-stream:AllTraffic/i-0abc": False,
        f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/aws/lambda/other:log-stream:s": False,
    }
    assert {arn: is_allowed(policies, Request("logs:PutLogEvents", arn)) for arn in expected} == expected


LOG_ACTIONS = ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"]


def test_each_role_creates_finds_and_writes_its_own_log_group(template: dict) -> None:
    """What SageMaker does with an endpoint's or a job's logs under its execution role: create the group if missing,
    list its streams, create and write its own streams. Group-level actions are checked on the group's ARN in both
    forms (with and without the ':*' that CloudWatch Logs authorizes them on)."""
    logs = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/aws/sagemaker"
    endpoint = f"{logs}/Endpoints/dev-GravitonEndpoint"
    calls = [(action, arn) for action in LOG_ACTIONS for arn in (endpoint, f"{endpoint}:log-stream:AllTraffic/i-0")]
    assert [call for call in calls if not is_allowed(_policies(template, "EndpointRole"), Request(*call))] == []
    jobs = f"{logs}/TrainingJobs"
    calls = [(action, arn) for action in LOG_ACTIONS[::3] for arn in (jobs, f"{jobs}:*")]
    calls += [(action, f"{jobs}:log-stream:nlp-fn-2026/algo-1-1700000000") for action in LOG_ACTIONS[1:3]]
    assert [call for call in calls if not is_allowed(_policies(template, "JobRole"), Request(*call))] == []


def test_remote_jobs_stage_under_their_callers_prefix_read_datasets_and_pull_the_training_image(
    template: dict,
) -> None:
    """The role of caller nlp's jobs: its own prefix and log streams, nothing of another caller (vision), and no
    candidate or model of the artifacts bucket."""
    policies = _policies(template, "JobRole")
    streams = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/aws/sagemaker/TrainingJobs:log-stream"
    allowed = {
        ("s3:PutObject", _object("RemoteJobs", "jobs/nlp/nlp-fn-2026/results/payload.pkl")): True,
        ("s3:GetObject", _object("RemoteJobs", "jobs/nlp/checkpoints/run-1/model.safetensors")): True,
        ("s3:PutObject", _object("RemoteJobs", "jobs/vision/vision-fn-2026/results/payload.pkl")): False,
        ("s3:GetObject", _object("RemoteJobs", "jobs/vision/checkpoints/run-1/model.safetensors")): False,
        ("s3:PutObject", _object("RemoteJobs", "jobs/nlpx/fn/payload.pkl")): False,
        ("s3:GetObject", _object("Datasets", "tweets/train.csv")): True,
        ("s3:PutObject", _object("Artifacts", "training-output/j1/model.tar.gz")): False,
        ("s3:PutObject", _object("Artifacts", "endpoints/sentiment/model-v1.tar.gz")): False,
        ("s3:PutObject", _object("Datasets", "tweets/train.csv")): False,
        ("ecr:BatchGetImage", f"arn:aws:ecr:{REGION}:763104351884:repository/pytorch-training"): True,
        ("ecr:BatchGetImage", f"arn:aws:ecr:{REGION}:763104351884:repository/pytorch-inference"): False,
        ("logs:PutLogEvents", f"{streams}:nlp-fn-2026/algo-1-1700000000"): True,
        ("logs:CreateLogStream", f"{streams}:nlp-fn-2026/algo-1-1700000000"): True,
        ("logs:PutLogEvents", f"{streams}:vision-fn-2026/algo-1-1700000000"): False,
        ("logs:CreateLogStream", f"{streams}:vision-fn-2026/algo-1-1700000000"): False,
        ("logs:PutLogEvents", f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/aws/lambda/other:log-stream:s"): False,
    }
    assert {call: is_allowed(policies, Request(*call)) for call in allowed} == allowed
    bucket = _object("RemoteJobs", "").rstrip("/")
    assert is_allowed(policies, Request("s3:ListBucket", bucket, {"s3:prefix": "jobs/nlp/nlp-fn-2026/"}))
    assert not is_allowed(policies, Request("s3:ListBucket", bucket, {"s3:prefix": "jobs/"}))


def test_only_sagemaker_running_the_callers_own_jobs_assumes_a_job_role(template: dict) -> None:
    role_id = logical_id(template, "AWS::IAM::Role", "JobRole")
    trust = resolve(template["Resources"][role_id]["Properties"]["AssumeRolePolicyDocument"], refs=refs(template))

    def may_assume(job: str) -> bool:
        context = {"aws:PrincipalServiceName": "sagemaker.amazonaws.com",
                   "aws:SourceArn": f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-job/{job}"}  # fmt: skip
        return is_allowed(
            [], Request("sts:AssumeRole", f"arn:aws:iam::{ACCOUNT}:role/x", context), resource_policies=[trust]
        )

    assert may_assume("nlp-fn-2026-12-06-07-00-00-000")
    assert not may_assume("vision-fn-2026-12-06-07-00-00-000")


@pytest.mark.parametrize("role", ["EndpointRole", "JobRole"])
def test_network_interfaces_only_in_the_given_vpc_subnets_and_security_group(template: dict, role: str) -> None:
    policies = _policies(template, role)
    vpc = f"arn:aws:ec2:{REGION}:{ACCOUNT}:vpc/{VPC}"

    def create(resource: str, in_vpc: str = vpc) -> bool:
        arn = f"arn:aws:ec2:{REGION}:{ACCOUNT}:{resource}"
        return is_allowed(policies, Request("ec2:CreateNetworkInterface", arn, {"ec2:Vpc": in_vpc}))

    assert all(create(f"subnet/{subnet}") for subnet in SUBNETS)
    assert create(f"security-group/{GROUP}") and create("network-interface/eni-0123")
    assert not create("subnet/subnet-elsewhere") and not create("security-group/sg-elsewhere")
    assert not create("network-interface/eni-0123", in_vpc=f"arn:aws:ec2:{REGION}:{ACCOUNT}:vpc/vpc-other")


# What SageMaker does with the platform key for a job or an endpoint under its execution role: read and write
# encrypted objects (Decrypt, Encrypt, GenerateDataKey), look the key up (DescribeKey) and hand the key to the
# instances' encrypted volumes (CreateGrant). A role missing one fails the job or endpoint at its first use of the key.
KEY_CALLS = ["kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey", "kms:DescribeKey", "kms:CreateGrant"]


@pytest.mark.parametrize("role", ["EndpointRole", "JobRole"])
def test_the_roles_make_every_call_sagemaker_needs_with_the_platform_key(template: dict, role: str) -> None:
    policies = _policies(template, role)
    assert [action for action in KEY_CALLS if not is_allowed(policies, Request(action, KEY))] == []
    assert not is_allowed(policies, Request("kms:ScheduleKeyDeletion", KEY))


def test_checkov_hears_why_each_policy_grants_the_interface_permission_cleanup_on_every_resource(
    template: dict,
) -> None:
    """checkov's CKV_AWS_109 refuses a permissions-management action on "*" unless the policy's metadata skips it
    with a reason: every policy granting ec2:DeleteNetworkInterfacePermission (no resource-level permissions) does."""
    cleanup = ("ec2:DeleteNetworkInterfacePermission", "*")
    policies = [
        policy
        for policy in resources(template, "AWS::IAM::ManagedPolicy").values()
        if cleanup in granted_actions([resolve(policy["Properties"]["PolicyDocument"], refs=refs(template))])
    ]
    assert len(policies) == 2  # fmt: skip
    for policy in policies:
        assert [skip["id"] for skip in policy["Metadata"]["checkov"]["skip"]] == ["CKV_AWS_109"]


def test_each_role_makes_the_calls_of_its_workload_that_no_other_test_names(template: dict) -> None:
    """The calls each role's workload makes beyond those the tests above name: SageMaker's metrics (PutMetricData
    has no resource-level permissions: its resource is *), handing over and deleting the interfaces it created in the
    platform's VPC, listing the model prefixes (endpoints), and for remote jobs a multipart upload aborted, and
    locating and listing the buckets the SDK reads."""
    vpc = {"ec2:Vpc": f"arn:aws:ec2:{REGION}:{ACCOUNT}:vpc/{VPC}"}
    interface = f"arn:aws:ec2:{REGION}:{ACCOUNT}:network-interface/eni-0123"
    both = [
        Request("ec2:CreateNetworkInterfacePermission", interface, vpc),
        Request("ec2:DeleteNetworkInterface", interface, vpc),
        Request("ec2:DeleteNetworkInterfacePermission", "*"),
    ]
    calls = {
        "EndpointRole": [
            *both,
            Request("cloudwatch:PutMetricData", "*", {"cloudwatch:namespace": "/aws/sagemaker/Endpoints"}),
            Request("s3:ListBucket", "arn:aws:s3:::artifacts", {"s3:prefix": "endpoints/sentiment/"}),
        ],
        "JobRole": [
            *both,
            Request("cloudwatch:PutMetricData", "*", {"cloudwatch:namespace": "/aws/sagemaker/TrainingJobs"}),
            Request("s3:AbortMultipartUpload", _object("RemoteJobs", "jobs/nlp/nlp-fn-2026/results/payload.pkl")),
            Request("s3:GetBucketLocation", "arn:aws:s3:::remotejobs"),
            Request("s3:GetBucketLocation", "arn:aws:s3:::datasets"),
            Request("s3:ListBucket", "arn:aws:s3:::datasets"),
        ],
    }
    for role, requests in calls.items():
        policies = _policies(template, role)
        assert [request for request in requests if not is_allowed(policies, request)] == [], role


def test_the_roles_pass_the_compliance_gates_with_every_wildcard_explained() -> None:
    """cdk-nag (AwsSolutions, NIST 800-53) refuses a wildcard or inline policy that no acknowledgement explains."""
    stack = bare_stack()
    _build(stack)
    synth_through_the_gates(stack)


@pytest.mark.parametrize("role", ["EndpointRole", "JobRole"])
def test_every_network_interface_action_needs_the_platform_vpc(template: dict, role: str) -> None:
    """Every action the role grants on network interfaces, subnets or security groups (read from the synthesized
    policy, so an action added later is covered too): allowed in the platform's VPC, refused in another one and
    refused without the ec2:Vpc key."""
    policies = _policies(template, role)
    scoped = [(a, r) for a, r in granted_actions(policies) if a.startswith("ec2:") and r != "*"]
    assert {a for a, _ in scoped} >= {"ec2:CreateNetworkInterface", "ec2:CreateNetworkInterfacePermission",
                                       "ec2:DeleteNetworkInterface"}  # fmt: skip
    platform, other = (f"arn:aws:ec2:{REGION}:{ACCOUNT}:vpc/{vpc}" for vpc in (VPC, "vpc-other"))
    for action, resource in scoped:
        arn = concrete(resource)
        assert each_key_matters(policies, action, arn, {"ec2:Vpc": platform}) == {"ec2:Vpc": False}, action
        assert not is_allowed(policies, Request(action, arn, {"ec2:Vpc": other})), action


# The actions either role is granted only under a condition: the network-interface calls (ec2:Vpc), metrics
# (cloudwatch:namespace) and, for endpoints, listing (s3:prefix). Everything else they are granted needs no condition
# key: the VPC lookups and the interface-permission cleanup (no resource-level permissions or keys, Service
# Authorization Reference), logs and image pulls on their own ARNs. A condition removed from any statement moves its
# actions out of this set.
CONDITIONED = {"ec2:CreateNetworkInterface", "ec2:CreateNetworkInterfacePermission", "ec2:DeleteNetworkInterface",
               "cloudwatch:PutMetricData"}  # fmt: skip


@pytest.mark.parametrize(("role", "conditioned"), [("EndpointRole", CONDITIONED | {"s3:ListBucket"}),
                                                   ("JobRole", CONDITIONED)])  # fmt: skip
def test_only_the_calls_without_condition_keys_are_allowed_without_a_context(
    template: dict, role: str, conditioned: set[str]
) -> None:
    policies = _policies(template, role)
    without_context = {action for action, _ in allowed_without_context(policies)}
    assert {action for action, _ in granted_actions(policies)} - without_context == conditioned


def test_workloads_publish_sagemakers_data_metrics_and_nothing_outside_its_slash_namespaces(template: dict) -> None:
    """Model Monitor's default namespaces for real-time endpoints and batch transform jobs ("CloudWatch Metrics for
    Bring Your Own Containers", SageMaker developer guide) are allowed; SageMaker's capacity reservation metrics
    (aws/sagemaker/CapacityReservations, published by AmazonSageMakerCapacityReservationServiceRolePolicy's
    service-linked role) and another service's namespace are not a workload's."""
    allowed = ["/aws/sagemaker/Endpoint/data-metrics", "/aws/sagemaker/ModelMonitoring/data-metrics"]
    refused = ["aws/sagemaker/CapacityReservations", "aws/sagemaker/Endpoints", "AWS/SageMaker", "AWS/EC2"]
    for role in ("EndpointRole", "JobRole"):
        policies = _policies(template, role)
        allows = {n: is_allowed(policies, Request("cloudwatch:PutMetricData", "*", {"cloudwatch:namespace": n}))
                  for n in allowed + refused}  # fmt: skip
        assert allows == {n: n in allowed for n in allowed + refused}, role


def test_metrics_go_only_to_the_platforms_namespaces(template: dict) -> None:
    for role in ("EndpointRole", "JobRole"):
        policies = _policies(template, role)
        namespaces = {n for a, r in granted_actions(policies) if a == "cloudwatch:PutMetricData"
                      for n in ("/aws/sagemaker/Endpoints", "/aws/sagemaker/TrainingJobs", "AWS/EC2")
                      if is_allowed(policies, Request(a, concrete(r), {"cloudwatch:namespace": n}))}  # fmt: skip
        assert namespaces and "AWS/EC2" not in namespaces, role
