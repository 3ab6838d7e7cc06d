"""parliament and cloudsplaining over the synthesized identity policies (scripts/iam_analysers.py): the platform's
policies pass with the reasoned exceptions, a bad statement planted into a synthesized role is caught by each
analyser, and an exception that excuses nothing fails the gate."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from scripts import iam_analysers, template_gates


def _copy_assembly(source: Path, target: Path) -> Path:
    """The manifests and templates of an assembly (its file assets are not needed to read policies)."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("asset.*"))
    return target


def _template_file(assembly: Path, stack_suffix: str) -> Path:
    (found,) = sorted((assembly / "assembly-dev").glob(f"dev{stack_suffix}*.template.json"))
    return found


def _plant(template_file: Path, logical_prefix: str, statements: list[dict[str, Any]]) -> None:
    """Append ``statements`` to the policy document of the resource whose logical id is ``logical_prefix`` and
    CDK's hash."""
    template = json.loads(template_file.read_text())
    (resource,) = [
        r for lid, r in template["Resources"].items() if re.fullmatch(rf"{logical_prefix}[0-9A-F]{{8}}", lid)
    ]
    resource["Properties"]["PolicyDocument"]["Statement"].extend(statements)
    template_file.write_text(json.dumps(template))


@pytest.fixture(scope="module")
def analysed(cloud_assembly) -> dict[str, Any]:
    return iam_analysers.run(Path(cloud_assembly.directory))


def test_every_identity_policy_is_analysed_and_passes_with_reasoned_exceptions(analysed: dict[str, Any]) -> None:
    assert analysed["policies"] >= 30 and analysed["principals"] >= 30, analysed["policies"]
    assert analysed["open"] == [] and analysed["stale_exceptions"] == [], (
        analysed["open"],
        analysed["stale_exceptions"],
    )
    # Each exception is used, in every environment alike.
    assert {f["analyser"] for f in analysed["excused"]} == {"parliament", "cloudsplaining"}
    assert all(len(f["reason"].split()) >= 5 for f in analysed["excused"])
    principals = {f"{f['stack']}/{f['principal']}" for f in analysed["excused"]}
    assert {"dev/Foundation/RemoteJobRoleNlp", "prod/Foundation/RemoteJobRoleMlteam"} <= principals


def test_intrinsics_resolve_to_arns_of_the_right_shape(cloud_assembly) -> None:
    policies = iam_analysers.identity_policies(iam_analysers.load_templates(Path(cloud_assembly.directory)))
    text = json.dumps([p.document for p in policies])
    assert "Fn::" not in text and '"Ref"' not in text
    (launcher,) = [p for p in policies if p.stack == "dev/Training" and p.principal == "TrainingLauncherRole"]
    resources = {
        r
        for s in launcher.document["Statement"]
        for r in (s["Resource"] if isinstance(s["Resource"], list) else [s["Resource"]])
    }
    # An imported subnet (Fn::ImportValue of the foundation's export) resolves through the exporting template.
    assert any(r.startswith("arn:aws:ec2:") and ":subnet/" in r for r in resources), resources


def test_planted_bad_statements_are_caught_by_each_analyser(cloud_assembly, tmp_path: Path) -> None:
    assembly = _copy_assembly(Path(cloud_assembly.directory), tmp_path / "cdk.out")
    _plant(
        _template_file(assembly, "Training"),
        "TrainingLauncherPolicy",
        [
            # A typo'd action, a condition key of another service, a training-job action on a bucket.
            {"Effect": "Allow", "Action": "sagemaker:CreateTrainingJobs", "Resource": "*"},
            {
                "Effect": "Allow",
                "Action": "s3:GetObject",
                "Resource": "arn:aws:s3:::some-bucket/*",
                "Condition": {"StringEquals": {"sagemaker:VolumeKmsKey": "key"}},
            },
            {"Effect": "Allow", "Action": "sagemaker:StopTrainingJob", "Resource": "arn:aws:s3:::some-bucket"},
        ],
    )
    _plant(
        _template_file(assembly, "Foundation"),
        "RemoteJobRoleNlpPolicy",
        [
            # Any object of any bucket, a new policy version for any policy, access keys for any user.
            {"Effect": "Allow", "Action": ["s3:GetObject", "iam:CreatePolicyVersion"], "Resource": "*"},
            {"Effect": "Allow", "Action": "iam:CreateAccessKey", "Resource": "*"},
        ],
    )
    analysed = iam_analysers.run(assembly)
    found = {(f["analyser"], f["issue"], f["stack"], f["principal"], f["detail"]) for f in analysed["open"]}
    launcher, remote = ("dev/Training", "TrainingLauncherPolicy"), ("dev/Foundation", "RemoteJobRoleNlp")
    assert {
        ("parliament", "UNKNOWN_ACTION", *launcher, "Unknown action sagemaker:CreateTrainingJobs"),
        ("parliament", "UNKNOWN_CONDITION_FOR_ACTION", *launcher,
         "Unknown condition sagemaker:VolumeKmsKey for action s3:GetObject"),
        ("parliament", "RESOURCE_MISMATCH", *launcher,
         "sagemaker:StopTrainingJob: arn:*:sagemaker:*:*:training-job/*"),
        ("cloudsplaining", "DataExfiltration", *remote, "s3:GetObject"),
        ("cloudsplaining", "PrivilegeEscalation", *remote, "CreateNewPolicyVersion: iam:createpolicyversion"),
        ("cloudsplaining", "ResourceExposure", *remote, "iam:CreatePolicyVersion"),
        ("cloudsplaining", "CredentialsExposure", *remote, "iam:CreateAccessKey"),
    } <= found, found  # fmt: skip
    # Only the planted statements are open, and only in the environment they were planted in.
    assert {(f["stack"], f["principal"]) for f in analysed["open"]} == {launcher, remote}
    passed, summary = template_gates.analyser_gate(analysed, "cloudsplaining", "")
    opened = sum(f["analyser"] == "cloudsplaining" for f in analysed["open"])
    assert not passed and opened >= 4 and summary.startswith(f"{opened} open"), summary


def test_an_exception_that_excuses_nothing_fails_and_one_that_matches_excuses(cloud_assembly) -> None:
    exceptions = iam_analysers.load_exceptions()
    stale = {
        "analyser": "parliament",
        "issue": "UNKNOWN_ACTION",
        "principal": "Foundation/RemoteJobRoleNlp",
        "detail": "*",
        "reason": "an exception written for a finding that no longer exists",
    }
    absent = {**stale, "principal": "PromotionPipeline/SomeRole"}  # a principal this assembly does not hold
    analysed = iam_analysers.run(Path(cloud_assembly.directory), [*exceptions, stale, absent])
    assert analysed["stale_exceptions"] == [stale]
    assert not template_gates.analyser_gate(analysed, "parliament", "")[0]
    assert template_gates.analyser_gate(analysed, "cloudsplaining", "")[0]
    # Without the exceptions, the findings they excuse are open.
    bare = iam_analysers.run(Path(cloud_assembly.directory), [])
    assert len(bare["open"]) == len(analysed["excused"]) > 0


def test_an_exception_without_a_reason_is_refused(tmp_path: Path) -> None:
    exceptions = tmp_path / "exceptions.yaml"
    exceptions.write_text(
        "- {analyser: parliament, issue: UNKNOWN_ACTION, principal: 'Training/*', detail: '*', reason: because}\n"
    )
    with pytest.raises(ValueError, match="needs a reason of five words or more"):
        iam_analysers.load_exceptions(exceptions)


def test_an_open_finding_and_a_stale_exception_print_in_full_and_fail_the_gate() -> None:
    finding = {
        "analyser": "cloudsplaining",
        "issue": "DataExfiltration",
        "stack": "dev/Foundation",
        "principal": "RemoteJobRole",
        "source": "RemoteJobRolePolicy",
        "detail": "s3:GetObject",
    }
    stale = {
        "analyser": "parliament",
        "issue": "UNKNOWN_ACTION",
        "principal": "Training/*",
        "detail": "*",
        "reason": "r",
    }
    analysed = {"policies": 1, "principals": 1, "open": [finding], "excused": [], "stale_exceptions": [stale]}
    gates = {
        name: {"passed": passed, "summary": summary}
        for name, (passed, summary) in (
            ("cloudsplaining", template_gates.analyser_gate(analysed, "cloudsplaining", "")),
            ("parliament", template_gates.analyser_gate(analysed, "parliament", "")),
        )
    }
    report = {
        "gates": gates,
        "iam_analysers": analysed,
        "unacknowledged": [],
        "cfn_lint_output": "",
        "checkov_output": "",
        "stacks": [],
        "warnings": {},
    }
    lines = template_gates.render(report).splitlines()
    assert (
        lines[0]
        == "cloudsplaining DataExfiltration at dev/Foundation/RemoteJobRole (RemoteJobRolePolicy): s3:GetObject"
    )
    assert lines[1] == "stale exception (parliament UNKNOWN_ACTION Training/*): excuses nothing"
    assert lines[2].startswith("FAIL cloudsplaining: 1 open") and lines[3].startswith("FAIL parliament: 0 open")
