"""`pytorch-platform review` shows, per principal, what it can reach: the real command on the session's synthesized
platform, and the reach of changed templates (a widened identity policy, a bucket policy that refuses), each request
evaluated by ops_review/iam_policy.py against identity and resource policies together."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from ops_review.__main__ import main
from ops_review.reach import NOT_EVALUATED, reach_assembly
from ops_review.review import StackTemplate, load_assembly
from stacks.foundation import caller_construct_suffix
from stacks.settings import parse_environment

ENV = "dev"
REMOTE_JOBS = "Foundation/RemoteJobs"
VPC_ONLY = "only from the platform VPC"


@pytest.fixture(scope="module")
def callers(cdk_context: dict[str, Any]) -> list[str]:
    callers = parse_environment(ENV, cdk_context["environments"][ENV]).training.remote_callers
    assert len(callers) >= 2, "dev must declare two @remote callers for these tests to compare"
    return callers


@pytest.fixture(scope="module")
def review_run(platform_assembly: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The review command once for the module, printing the job roles' reach: (its folder, what it printed)."""
    out = tmp_path_factory.mktemp("review")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main([str(platform_assembly), "--out", str(out), "--reach", "RemoteJobRole"]) == 0
    return out, printed.getvalue()


def _role(caller: str) -> str:
    return f"Foundation/RemoteJobRole{caller_construct_suffix(caller)}"


def _is(name: str, construct: str) -> bool:
    """Whether the review's name is the construct's: its path where the assembly has path metadata (the CDK CLI
    writes it), else its logical id (the construct id and CDK's 8-digit hash), as the session's synth names it."""
    return name == construct or re.fullmatch(rf"{re.escape(construct)}[0-9A-F]{{8}}", name) is not None


def _principal(reach: dict[str, Any], construct: str) -> dict[str, Any]:
    (found,) = [entry for name, entry in reach.items() if _is(name, construct)]
    return found


def _rows(reach: dict[str, Any], principal: str, resource: str) -> list[dict[str, Any]]:
    return [row for row in _principal(reach, principal)["reach"] if _is(row["resource"], resource)]


def _object_scopes(rows: list[dict[str, Any]], action: str) -> set[str]:
    return {row["scope"] for row in rows if action in row["actions"] and row["scope"]}


def test_each_job_role_reaches_its_own_prefix_and_no_other_callers(
    review_run: tuple[Path, str], callers: list[str]
) -> None:
    out, printed = review_run
    reach = json.loads((out / f"{ENV}.json").read_text())["reach"]
    for caller in callers:
        rows = _rows(reach, _role(caller), REMOTE_JOBS)
        for action in ("s3:GetObject", "s3:PutObject", "s3:ListBucket"):
            assert _object_scopes(rows, action) == {f"jobs/{caller}/*"}, (caller, action)
        (own,) = [row for row in rows if row["scope"] == f"jobs/{caller}/*"]
        assert own["conditions"] == [VPC_ONLY]  # the bucket policy refuses workload roles outside the VPC
    # The same, as the terminal shows it and as the Markdown page lists it.
    a, b = callers[:2]
    printed_rows = _section(printed, a)
    actions = "s3:AbortMultipartUpload, s3:GetObject, s3:ListBucket, s3:PutObject"
    assert any(
        re.fullmatch(rf"  {REMOTE_JOBS}\S* jobs/{a}/\*: {actions}  \[{VPC_ONLY}\]", line) for line in printed_rows
    )
    assert not any(f"jobs/{b}/" in line for line in printed_rows)
    markdown = (out / f"{ENV}.md").read_text()
    section = _section(markdown.split("## What each principal can reach\n", 1)[1], a, heading="### ")
    assert any(line.startswith(f"| {REMOTE_JOBS}") and f"| jobs/{a}/* |" in line for line in section)
    assert not any(f"jobs/{b}/" in line for line in section)


def _section(text: str, caller: str, heading: str = f"{ENV} ") -> list[str]:
    """The lines about one caller's job role: printed by the command, or its section of the Markdown page."""
    lines = text.splitlines()
    names = [line.removeprefix(heading).split(" ")[0] if line.startswith(heading) else "" for line in lines]
    start = next(i for i, name in enumerate(names) if _is(name, _role(caller)))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith(("### ", heading))), len(lines))
    return lines[start + 1 : end]


def test_a_caller_may_pass_only_its_own_job_role(review_run: tuple[Path, str], callers: list[str]) -> None:
    out, _ = review_run
    reach = json.loads((out / f"{ENV}.json").read_text())["reach"]
    for caller in callers:
        people = f"Foundation/RemoteJobLauncherPolicy{caller_construct_suffix(caller)}"
        (passed,) = [row["resource"] for row in _principal(reach, people)["reach"] if "iam:PassRole" in row["actions"]]
        assert _is(passed, _role(caller))
        (own,) = [row for row in _rows(reach, people, _role(caller)) if "iam:PassRole" in row["actions"]]
        assert own["conditions"] == ["and: StringEquals iam:PassedToService: sagemaker.amazonaws.com"]


def _dev(platform_assembly: Path) -> list[StackTemplate]:
    return [copy.deepcopy(s) for s in load_assembly(platform_assembly) if s.environment == ENV]


def _resources(stacks: list[StackTemplate], stack: str) -> dict[str, Any]:
    (found,) = [s for s in stacks if s.stack == stack]
    return found.template["Resources"]


def _logical_id(resources: dict[str, Any], resource_type: str, construct: str) -> str:
    (found,) = [lid for lid, r in resources.items() if r["Type"] == resource_type and _is(lid, construct)]
    return found


def _replace(value: Any, old: str, new: str) -> Any:
    if isinstance(value, str):
        return value.replace(old, new)
    if isinstance(value, list):
        return [_replace(v, old, new) for v in value]
    if isinstance(value, dict):
        return {k: _replace(v, old, new) for k, v in value.items()}
    return value


def test_a_widened_job_role_policy_shows_the_other_callers_prefix(platform_assembly: Path, callers: list[str]) -> None:
    a, b = callers[:2]
    stacks = _dev(platform_assembly)
    before = reach_assembly(stacks)[ENV]
    assert f"jobs/{b}/*" not in _object_scopes(_rows(before, _role(a), REMOTE_JOBS), "s3:GetObject")
    resources = _resources(stacks, "Foundation")
    policy = _logical_id(resources, "AWS::IAM::ManagedPolicy", f"RemoteJobRole{caller_construct_suffix(a)}Policy")
    document = resources[policy]["Properties"]["PolicyDocument"]
    resources[policy]["Properties"]["PolicyDocument"] = _replace(document, f"/jobs/{a}/*", "/jobs/*")
    after = reach_assembly(stacks)[ENV]
    assert {f"jobs/{a}/*", f"jobs/{b}/*", "jobs/*"} <= _object_scopes(
        _rows(after, _role(a), REMOTE_JOBS), "s3:GetObject"
    )


def test_a_bucket_policy_that_refuses_takes_the_reach_away(platform_assembly: Path, callers: list[str]) -> None:
    """The identity policy is unchanged: only the bucket's policy, evaluated with it, refuses."""
    a = callers[0]
    stacks = _dev(platform_assembly)
    resources = _resources(stacks, "Foundation")
    role = _logical_id(resources, "AWS::IAM::Role", f"RemoteJobRole{caller_construct_suffix(a)}")
    bucket_policy = resources[_logical_id(resources, "AWS::S3::BucketPolicy", "RemoteJobsPolicy")]
    bucket = bucket_policy["Properties"]["Bucket"]
    bucket_policy["Properties"]["PolicyDocument"]["Statement"].append(
        {
            "Effect": "Deny",
            "Principal": {"AWS": {"Fn::GetAtt": [role, "Arn"]}},
            "Action": "s3:PutObject",
            "Resource": {"Fn::Join": ["", ["arn:aws:s3:::", bucket, "/*"]]},
        }
    )
    rows = _rows(reach_assembly(stacks)[ENV], _role(a), REMOTE_JOBS)
    assert _object_scopes(rows, "s3:PutObject") == set()
    assert _object_scopes(rows, "s3:GetObject") == {f"jobs/{a}/*"}


def test_a_policy_the_review_cannot_resolve_is_said_not_guessed(platform_assembly: Path) -> None:
    """A condition function the evaluator's resolver does not know (Fn::If) leaves the environment's reach unshown,
    with one sentence naming the stack, instead of a reach computed without that policy."""
    stacks = _dev(platform_assembly)
    resources = _resources(stacks, "Foundation")
    bucket_policy = resources[_logical_id(resources, "AWS::S3::BucketPolicy", "RemoteJobsPolicy")]
    statement = bucket_policy["Properties"]["PolicyDocument"]["Statement"][0]
    statement["Resource"] = {"Fn::If": ["IsProd", statement["Resource"], {"Ref": "AWS::NoValue"}]}
    reach = reach_assembly(stacks)[ENV]
    assert list(reach) == [NOT_EVALUATED]
    assert reach[NOT_EVALUATED]["not_evaluated"] == ["Foundation uses Fn::If, which the review does not resolve"]


def test_a_write_allowed_only_as_a_create_says_so(review_run: tuple[Path, str]) -> None:
    """The launcher's launch records are written only with If-None-Match: * (never replaced): the review shows that
    write, with that condition, under launches/, and the instances themselves no write there."""
    out, _ = review_run
    reach = json.loads((out / f"{ENV}.json").read_text())["reach"]
    records = [row for row in _principal(reach, "Foundation/TrainingInstanceRoleLaunchRecordPolicy")["reach"]
               if "s3:PutObject" in row["actions"]]  # fmt: skip
    assert [(row["scope"], row["conditions"]) for row in records] == [
        ("training-output/*/launches/*", ["only as a create (If-None-Match: *)"])
    ]
    instance = _principal(reach, "Foundation/TrainingInstanceRole")["reach"]
    assert not [row for row in instance if "launches" in row["scope"] and "s3:PutObject" in row["actions"]]
