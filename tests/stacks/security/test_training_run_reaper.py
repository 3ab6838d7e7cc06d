"""The outside bound of EC2 training runs (issue 41.2, its second half): the dev Training stack's TrainingRunReaper
handler against moto, every call it makes checked against its synthesized policy by the rehearsal's call gate. An
instance of the training launch template past training.max_run_hours and the grace period is terminated, its
termination protection (which a caller may set at launch) notwithstanding; a fresh one, and any instance of another
template, are left alone, and the reaper's own policy refuses to terminate the latter."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from ops_review.iam_policy import resolve
from proving_ground.iam_requests import logical_id, role_policies
from proving_ground.rehearsal.aws_calls import Gate, Principal, install
from proving_ground.rehearsal.training_steps import lambda_handler
from stacks.components.training_run_reaper import GRACE_MINUTES, HANDLER
from stacks.settings import parse_environment
from tests.stacks.security.conftest import ACCOUNT, LAMBDA_DEFAULT_TIMEOUT_S, clients_made_by, longest_call_s

REAPER = Principal("reaper", "AKIAREAPER000000", None, {"aws:PrincipalArn": f"arn:aws:iam::{ACCOUNT}:role/reaper"})
LOOKUP = Principal("tag lookup", "AKIALOOKUP000000", None)  # IAM's own lookup of a resource's tags: not checked


@pytest.fixture()
def fleet(templates: dict[str, dict[str, dict]], mocked_aws: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Instances of the training template (one protected against termination), of another template and of none; the
    gate installed with the reaper's policy resolved against them."""
    region = mocked_aws
    ec2 = boto3.client("ec2", region_name=region)
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    data = {"ImageId": image, "InstanceType": "t3.micro"}
    training = ec2.create_launch_template(LaunchTemplateName="training", LaunchTemplateData=data)["LaunchTemplate"]
    other = ec2.create_launch_template(LaunchTemplateName="other", LaunchTemplateData=data)["LaunchTemplate"]

    def run(template: dict | None, **extra: Any) -> str:
        spec = (
            {"LaunchTemplate": {"LaunchTemplateId": template["LaunchTemplateId"]}} if template else {"ImageId": image}
        )
        return ec2.run_instances(MinCount=1, MaxCount=1, **spec, **extra)["Instances"][0]["InstanceId"]

    ids = {"training": run(training), "protected": run(training), "other template": run(other),
           "no template": run(None)}  # fmt: skip
    # Termination protection, as a caller may set it at launch (moto takes it from ModifyInstanceAttribute only).
    ec2.modify_instance_attribute(InstanceId=ids["protected"], DisableApiTermination={"Value": True})
    with pytest.raises(ClientError, match="OperationNotPermitted"):
        ec2.terminate_instances(InstanceIds=[ids["protected"]])

    template = templates["dev"]["Training"]
    (template_id,) = [n for n, r in template["Resources"].items() if r["Type"] == "AWS::EC2::LaunchTemplate"]
    refs: dict[str, Any] = {"AWS::AccountId": ACCOUNT, "AWS::Partition": "aws", "AWS::Region": region,
                            template_id: training["LaunchTemplateId"]}  # fmt: skip
    for name in template["Resources"]:
        refs.setdefault(name, f"{name}-ref")
        refs.setdefault(f"{name}.Arn", f"arn:aws:placeholder::{ACCOUNT}:{name}")
    # What the function may do: the policies attached to the role it runs as.
    function_id = logical_id(template, "AWS::Lambda::Function", "TrainingRunReaperFunction")
    function = template["Resources"][function_id]["Properties"]
    policies = role_policies(template, function["Role"]["Fn::GetAtt"][0], refs)
    (rule,) = [r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::Events::Rule"]
    sweep = json.loads(resolve(rule["Targets"][0]["Input"], refs=refs))
    assert sweep["launch_template_id"] == training["LaunchTemplateId"]
    # The function Lambda calls: the one its Handler property names ("<file>.<function>") in the asset folder.
    file, _, name = function["Handler"].rpartition(".")
    assert (HANDLER / f"{file}.py").is_file()
    entry = getattr(lambda_handler(HANDLER, "run_reaper_handler"), name)
    reaper = Principal(REAPER.name, REAPER.access_key, policies, REAPER.identity)
    gate = Gate(ACCOUNT, region, tmp_path / "calls.jsonl", [reaper, LOOKUP])
    lookup = boto3.client("ec2", region_name=region, aws_access_key_id=LOOKUP.access_key,
                          aws_secret_access_key=LOOKUP.secret_key)  # fmt: skip

    def tags(arn: str) -> dict[str, str]:
        found = lookup.describe_tags(Filters=[{"Name": "resource-id", "Values": [arn.rpartition("/")[2]]}])["Tags"]
        return {tag["Key"]: tag["Value"] for tag in found}

    uninstall = install(gate, resource_tags=tags)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", REAPER.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", REAPER.secret_key)
    monkeypatch.delenv("AWS_SESSION_TOKEN")
    boto3.DEFAULT_SESSION = None  # the handler's boto3.client("ec2") takes the reaper's keys
    yield ids, gate, lookup, sweep, entry
    uninstall()
    boto3.DEFAULT_SESSION = None


def _states(lookup: Any, ids: dict[str, str]) -> dict[str, str]:
    found = lookup.describe_instances(InstanceIds=list(ids.values()))["Reservations"]
    by_id = {i["InstanceId"]: i["State"]["Name"] for r in found for i in r["Instances"]}
    return {name: by_id[instance_id] for name, instance_id in ids.items()}


def test_a_fresh_run_is_left_alone(fleet: Any) -> None:
    ids, gate, lookup, sweep, entry = fleet
    assert entry(sweep, None) == {"terminated": []}
    assert set(_states(lookup, ids).values()) == {"running"}
    assert gate.records() and all(r.allowed for r in gate.records() if r.principal == "reaper")


def test_a_run_past_its_bound_is_terminated_even_if_protected_and_nothing_else_is(fleet: Any) -> None:
    ids, gate, lookup, sweep, _ = fleet
    handler = lambda_handler(HANDLER, "run_reaper_handler")
    ec2 = boto3.client("ec2")
    bound = datetime.timedelta(hours=sweep["max_run_hours"], minutes=sweep["grace_minutes"])
    assert sweep["grace_minutes"] == GRACE_MINUTES
    just_inside = datetime.datetime.now(datetime.UTC) + bound - datetime.timedelta(minutes=1)
    assert handler.overdue(ec2, sweep["launch_template_id"], bound, just_inside) == []
    later = datetime.datetime.now(datetime.UTC) + bound + datetime.timedelta(minutes=1)
    found = handler.overdue(ec2, sweep["launch_template_id"], bound, later)
    assert found == sorted([ids["training"], ids["protected"]])
    assert handler.terminate(ec2, found) == found
    states = _states(lookup, ids)
    assert states["training"] == states["protected"] == "terminated"
    assert states["other template"] == states["no template"] == "running"
    reaper_calls = [r for r in gate.records() if r.principal == "reaper"]
    assert {r.operation for r in reaper_calls} >= {"DescribeInstances", "TerminateInstances", "ModifyInstanceAttribute"}
    assert all(r.allowed for r in reaper_calls)
    # The reaper's policy itself refuses any other instance: a bug in the handler could not end another team's.
    with pytest.raises(ClientError, match="AccessDenied"):
        ec2.terminate_instances(InstanceIds=[ids["other template"]])
    assert _states(lookup, ids)["other template"] == "running"


def test_a_sweep_ends_an_overdue_protected_run_within_the_functions_timeout_at_the_apis_slowest(
    fleet: Any, templates: dict[str, dict[str, dict]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each call of a sweep is bounded by its client's limits (connect, read, attempts); the function's timeout covers
    what a sweep must do to make progress when every call takes its limit: find the overdue instances and end a
    protected one (its calls counted from a real sweep). Past that, Lambda would stop every sweep at the same point."""
    ids, gate, _, sweep, entry = fleet
    clients = clients_made_by(entry, monkeypatch)
    assert entry({**sweep, "max_run_hours": 0, "grace_minutes": 0}, None) == {
        "terminated": sorted([ids["training"], ids["protected"]])
    }
    calls = [r for r in gate.records() if r.principal == "reaper"]
    finding = sum(r.operation == "DescribeInstances" for r in calls)
    ending = max(sum(any(target.endswith(f"/{instance}") for _, target in r.requests) for r in calls)
                 for instance in (ids["training"], ids["protected"]))  # fmt: skip
    assert (finding, ending) == (1, 3)  # the protected one: refused, unprotected, terminated
    (client,) = clients
    function = _reaper_function(templates)
    assert (finding + ending) * longest_call_s(client) <= function.get("Timeout", LAMBDA_DEFAULT_TIMEOUT_S)


def test_the_reapers_log_group_goes_with_the_stack_where_the_environment_says_so(
    templates: dict[str, dict[str, dict]], cdk_context: dict[str, Any]
) -> None:
    """As tests/stacks/test_destroy.py checks for the whole app: dev's `cdk destroy` deletes the group the function
    logs to (no DeletionPolicy is Delete too), where a log group left to CloudFormation's default would be kept."""
    settings = parse_environment("dev", cdk_context["environments"]["dev"])
    expected = "Delete" if settings.destroy_on_delete else "Retain"
    template = templates["dev"]["Training"]
    group = template["Resources"][_reaper_function(templates)["LoggingConfig"]["LogGroup"]["Ref"]]
    assert group["Type"] == "AWS::Logs::LogGroup"
    assert (group.get("DeletionPolicy", "Delete"), group.get("UpdateReplacePolicy", "Delete")) == (expected, expected)


def test_the_function_is_created_after_every_policy_of_its_role_and_deleted_before(
    templates: dict[str, dict[str, dict]],
) -> None:
    """CloudFormation creates a resource after those its DependsOn names and deletes it before them: no sweep runs
    with a role that does not hold its permissions yet, or no longer."""
    template = templates["dev"]["Training"]
    function_id = logical_id(template, "AWS::Lambda::Function", "TrainingRunReaperFunction")
    role = {"Ref": template["Resources"][function_id]["Properties"]["Role"]["Fn::GetAtt"][0]}
    policies = {lid for lid, r in template["Resources"].items()
                if r["Type"] == "AWS::IAM::ManagedPolicy" and role in r["Properties"].get("Roles", [])}  # fmt: skip
    assert policies and policies <= set(template["Resources"][function_id].get("DependsOn") or [])


def _reaper_function(templates: dict[str, dict[str, dict]]) -> dict[str, Any]:
    template = templates["dev"]["Training"]
    return template["Resources"][logical_id(template, "AWS::Lambda::Function", "TrainingRunReaperFunction")][
        "Properties"
    ]
