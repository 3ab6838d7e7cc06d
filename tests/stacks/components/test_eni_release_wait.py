"""EniReleaseWait: the waiting logic against stubbed EC2 and SageMaker answers, the CloudFormation answer, and the
construct on a bare Stack (ordering, least privilege)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import boto3
import pytest
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sagemaker as sagemaker
from aws_cdk.assertions import Match, Template
from botocore.stub import Stubber

from stacks.components.eni_release_wait import EniReleaseWait, handler
from tests.stacks.components.cloudformation_answers import capture_answers

GROUP = "sg-0123456789abcdef0"
FILTER = {"Filters": [{"Name": "group-id", "Values": [GROUP]}]}


def _eni(eni_id: str, status: str = "in-use") -> dict[str, Any]:
    return {"NetworkInterfaceId": eni_id, "Status": status, "Description": "SageMaker endpoint"}


def _clients() -> tuple[Any, Stubber, Any, Stubber]:
    session = boto3.session.Session(region_name="us-west-2", aws_access_key_id="a", aws_secret_access_key="b")
    ec2, sm = session.client("ec2"), session.client("sagemaker")
    ec2_stub, sm_stub = Stubber(ec2), Stubber(sm)
    ec2_stub.activate()
    sm_stub.activate()
    return ec2, ec2_stub, sm, sm_stub


class FakeClock:
    """time.monotonic and time.sleep in one: sleeping advances the clock, nothing really waits."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_waits_until_the_interfaces_are_released() -> None:
    ec2, ec2_stub, sm, _ = _clients()
    ec2_stub.add_response("describe_network_interfaces", {"NetworkInterfaces": [_eni("eni-1"), _eni("eni-2")]}, FILTER)
    ec2_stub.add_response("describe_network_interfaces", {"NetworkInterfaces": [_eni("eni-2", "available")]}, FILTER)
    ec2_stub.add_response("describe_network_interfaces", {"NetworkInterfaces": []}, FILTER)
    clock = FakeClock()
    message = handler.wait_for_release(
        ec2, sm, [GROUP], [], budget_seconds=600, poll_seconds=15, sleep=clock.sleep, clock=clock
    )
    assert message == f"No network interface of {GROUP} remains (waited 30 s)."
    assert clock.sleeps == [15, 15]
    ec2_stub.assert_no_pending_responses()


def test_times_out_with_one_sentence_naming_what_remains() -> None:
    ec2, ec2_stub, sm, _ = _clients()
    for _ in range(5):
        ec2_stub.add_response("describe_network_interfaces", {"NetworkInterfaces": [_eni("eni-1")]}, FILTER)
    clock = FakeClock()
    with pytest.raises(handler.StillInUse) as error:
        handler.wait_for_release(
            ec2, sm, [GROUP], [], budget_seconds=60, poll_seconds=15, sleep=clock.sleep, clock=clock
        )
    message = str(error.value)
    assert message.startswith(f"1 network interface(s) of {GROUP} remain after 1 minutes: eni-1 (in-use, SageMaker")
    assert "run the deletion again later" in message and "\n" not in message
    assert clock.now <= 60, "never waits past its budget"


def test_does_not_wait_while_another_endpoint_still_uses_the_group() -> None:
    ec2, ec2_stub, sm, sm_stub = _clients()
    sm_stub.add_response(
        "describe_endpoint",
        {
            "EndpointName": "dev-MultiModelEndpoint",
            "EndpointArn": "arn:aws:sagemaker:us-west-2:111122223333:endpoint/dev-multimodelendpoint",
            "EndpointConfigName": "config",
            "EndpointStatus": "InService",
            "CreationTime": "2026-12-01T00:00:00Z",
            "LastModifiedTime": "2026-12-01T00:00:00Z",
        },
        {"EndpointName": "dev-MultiModelEndpoint"},
    )
    message = handler.wait_for_release(ec2, sm, [GROUP], ["dev-MultiModelEndpoint"], budget_seconds=600)
    assert message.startswith("Not waiting: endpoint dev-MultiModelEndpoint still uses")
    ec2_stub.assert_no_pending_responses()  # no EC2 call at all


@pytest.mark.parametrize("gone", ["absent", "Deleting"])
def test_waits_when_the_other_endpoint_is_gone_or_going(gone: str) -> None:
    ec2, ec2_stub, sm, sm_stub = _clients()
    if gone == "absent":
        sm_stub.add_client_error(
            "describe_endpoint",
            service_error_code="ValidationException",
            service_message="Could not find endpoint",
        )
    else:
        sm_stub.add_response(
            "describe_endpoint",
            {
                "EndpointName": "other",
                "EndpointArn": "arn:aws:sagemaker:us-west-2:111122223333:endpoint/other",
                "EndpointConfigName": "config",
                "EndpointStatus": "Deleting",
                "CreationTime": "2026-12-01T00:00:00Z",
                "LastModifiedTime": "2026-12-01T00:00:00Z",
            },
        )
    ec2_stub.add_response("describe_network_interfaces", {"NetworkInterfaces": []}, FILTER)
    assert handler.wait_for_release(ec2, sm, [GROUP], ["other"], budget_seconds=600).startswith("No network")


class _Context:
    def get_remaining_time_in_millis(self) -> int:
        return 900_000


def _event(request_type: str) -> dict[str, Any]:
    return {
        "RequestType": request_type,
        "ResponseURL": "https://cloudformation-custom-resource-response.example/abc",
        "StackId": "arn:aws:cloudformation:us-west-2:111122223333:stack/dev-GravitonEndpoint/1",
        "RequestId": "r-1",
        "LogicalResourceId": "EniReleaseWait",
        "PhysicalResourceId": "eni-release-wait",
        "ResourceProperties": {"ServiceToken": "arn", "SecurityGroupIds": [GROUP]},
    }


@pytest.fixture
def answers(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What the handler answers CloudFormation (the PUT to the pre-signed URL)."""
    return capture_answers(monkeypatch, handler)


@pytest.mark.parametrize("request_type", ["Create", "Update"])
def test_create_and_update_answer_at_once(request_type: str, answers: list[dict[str, Any]]) -> None:
    ec2, ec2_stub, sm, _ = _clients()
    handler.handler(_event(request_type), _Context(), ec2=ec2, sagemaker=sm)
    ec2_stub.assert_no_pending_responses()
    assert answers == [
        {
            "Status": "SUCCESS",
            "Reason": f"{request_type}: nothing to do.",
            "PhysicalResourceId": "eni-release-wait",
            "StackId": _event(request_type)["StackId"],
            "RequestId": "r-1",
            "LogicalResourceId": "EniReleaseWait",
        }
    ]


def test_delete_answers_success_once_released_and_failed_on_errors(answers: list[dict[str, Any]]) -> None:
    ec2, ec2_stub, sm, _ = _clients()
    ec2_stub.add_response("describe_network_interfaces", {"NetworkInterfaces": []}, FILTER)
    handler.handler(_event("Delete"), _Context(), ec2=ec2, sagemaker=sm)
    ec2_stub.add_client_error("describe_network_interfaces", service_error_code="UnauthorizedOperation")
    handler.handler(_event("Delete"), _Context(), ec2=ec2, sagemaker=sm)
    assert [a["Status"] for a in answers] == ["SUCCESS", "FAILED"]
    assert answers[0]["Reason"].startswith("No network interface of")
    assert "UnauthorizedOperation" in answers[1]["Reason"]


# --- the construct --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def construct() -> tuple[cdk.Stack, EniReleaseWait, Template]:
    app = cdk.App(context={"@aws-cdk/core:enablePartitionLiterals": True})
    stack = cdk.Stack(app, "Bare", env=cdk.Environment(account="111122223333", region="us-west-2"))
    wait = EniReleaseWait(stack, "Wait", security_group_ids=[GROUP], key=kms.Key(stack, "Key"), log_retention_days=14)
    wait.also_used_by("dev-MultiModelEndpoint")
    model = sagemaker.CfnModel(stack, "Model", execution_role_arn="arn:aws:iam::111122223333:role/r")
    model.node.add_dependency(wait.resource)
    return stack, wait, Template.from_stack(stack)


def test_the_model_depends_on_the_wait_so_the_wait_is_deleted_last(construct) -> None:
    stack, wait, template = construct
    resource = stack.get_logical_id(wait.resource.node.default_child)
    template.has_resource("AWS::SageMaker::Model", {"DependsOn": [resource]})
    template.has_resource(
        "Custom::EniReleaseWait",
        {
            "Properties": {
                "ServiceToken": {"Fn::GetAtt": [Match.string_like_regexp("^WaitFunction"), "Arn"]},
                "SecurityGroupIds": [GROUP],
                "SharedWithEndpoints": ["dev-MultiModelEndpoint"],
                "ServiceTimeout": "960",
            },
            # Its permissions and log group outlive the wait.
            "DependsOn": Match.array_with([stack.get_logical_id(wait.policy.node.default_child)]),
        },
    )


def test_the_function_waits_at_most_lambdas_limit_outside_the_vpc(construct) -> None:
    stack, wait, template = construct
    # Deleted after the wait, with its permissions: only the policy is named (the role is referenced already).
    template.has_resource(
        "AWS::Lambda::Function", {"DependsOn": [stack.get_logical_id(wait.policy.node.default_child)]}
    )
    template.has_resource_properties(
        "AWS::Lambda::Function",
        {"Handler": "handler.handler", "Runtime": "python3.14", "Timeout": 900, "VpcConfig": Match.absent()},
    )
    template.has_resource_properties("AWS::Logs::LogGroup", {"RetentionInDays": 14, "KmsKeyId": Match.any_value()})


def test_least_privilege(construct) -> None:
    stack, wait, template = construct
    policy = template.to_json()["Resources"][stack.get_logical_id(wait.policy.node.default_child)]
    statements = {s["Sid"]: s for s in policy["Properties"]["PolicyDocument"]["Statement"]}
    assert statements["ListTheGroupsInterfaces"]["Action"] == "ec2:DescribeNetworkInterfaces"
    assert statements["ListTheGroupsInterfaces"]["Resource"] == "*"  # no resource-level permissions exist
    assert statements["SeeWhetherOtherEndpointsStillUseTheGroup"]["Resource"] == (
        "arn:aws:sagemaker:us-west-2:111122223333:endpoint/dev-multimodelendpoint"
    )
    assert statements["WriteOwnLogs"]["Action"] == ["logs:CreateLogStream", "logs:PutLogEvents"]
    template.resource_count_is("AWS::IAM::Policy", 0)  # no inline policies


def test_every_endpoint_stack_waits_for_the_workload_group_after_its_endpoint(templates) -> None:
    checked = 0
    for environment, stacks in templates.items():
        names = {
            stack: next(r for r in t["Resources"].values() if r["Type"] == "AWS::SageMaker::Endpoint")["Properties"][
                "EndpointName"
            ]
            for stack, t in stacks.items()
            if stack in ("GravitonEndpoint", "MultiModelEndpoint")
        }
        for stack in names:
            resources = stacks[stack]["Resources"]
            ((wait_id, wait),) = [(k, r) for k, r in resources.items() if r["Type"] == "Custom::EniReleaseWait"]
            (group,) = wait["Properties"]["SecurityGroupIds"]
            assert "WorkloadSecurityGroup" in json.dumps(group), (environment, stack)
            (model,) = [r for r in resources.values() if r["Type"] == "AWS::SageMaker::Model"]
            assert wait_id in model["DependsOn"], (environment, stack)
            assert model["Properties"]["VpcConfig"]["SecurityGroupIds"] == [group]
            others = [other for key, other in names.items() if key != stack]
            assert wait["Properties"].get("SharedWithEndpoints", []) == others, (environment, stack)
            checked += 1
    assert checked >= 5  # dev has only the multi-model endpoint until a model version is named


def test_endpoint_stacks_leave_no_control_tower_finding_unacknowledged(cloud_assembly) -> None:
    """The Control Tower validator can report violations and still conclude 'success' (synth then passes): read the
    report itself. Every finding in an endpoint stack must be acknowledged with a reason."""
    report_file = Path(cloud_assembly.directory) / "validation-report.json"
    report = json.loads(report_file.read_text()) if report_file.exists() else {"pluginReports": []}
    unacknowledged = [
        (violation["ruleName"], construct["constructPath"])
        for plugin in report["pluginReports"]
        for violation in plugin.get("violations", [])
        for construct in violation["violatingConstructs"]
        if "Endpoint/" in construct["constructPath"]
    ]
    assert not unacknowledged
