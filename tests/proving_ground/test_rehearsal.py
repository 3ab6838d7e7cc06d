"""The rehearsal (proving_ground/rehearsal/rehearse.py, `make rehearse`): the README's journey in one piece against
one moto server,
on the session's synthesized assembly, every AWS call checked against its principal's synthesized policy; and two
broken joints, each named by the step where the journey stops."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from proving_ground.rehearsal.rehearse import STEPS, Report, rehearse

pytestmark = pytest.mark.slow

# ec2_run.sh's step 5 as it was before the fix: the upload runs inside the bridge-networked container.
_UPLOAD_IN_THE_CONTAINER = """  docker run --rm -v "$WORK:/work" -w /work "$IMAGE" \\
    python -m inference_assets.tools.package_model --model-dir output/saved_model --output output/model.tar.gz \\
    --upload "$destination/model.tar.gz" --kms-key-id "$KMS_KEY_ID" "${package_args[@]}"
"""


def _copy(assembly: Any, target: Path) -> Path:
    shutil.copytree(Path(assembly.directory), target)
    return target


def _template(assembly: Path, environment: str, stack: str) -> Path:
    (path,) = (assembly / f"assembly-{environment}").glob(f"{environment}{stack}[0-9A-F]*.template.json")
    return path


def _training_code(assembly: Path, environment: str) -> Path:
    """The staged training_assets/instance folder the launch template's user data downloads."""
    manifest = json.loads(next((assembly / f"assembly-{environment}").glob("*Training*.assets.json")).read_text())
    (asset,) = [a for a in manifest["files"].values() if a.get("displayName") == "TrainingAssetsCode"]
    return (assembly / f"assembly-{environment}" / asset["source"]["path"]).resolve()


def test_the_journey_passes_with_every_call_allowed_by_its_principals_policy(
    cloud_assembly: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    report = rehearse(Path(cloud_assembly.directory), "staging", tmp_path / "work", tiny_model_dir)

    assert report.ok, "\n".join(report.lines())
    assert [r.step for r in report.results] == list(STEPS)
    checked = {r.principal for r in report.records if r.allowed is not None}
    assert checked >= {
        "training launcher",
        "training run launcher",
        "training instance role",
        "endpoint execution role",
        "multi-model client",
        "@remote launcher",
        "@remote job role",
        "endpoint operator",  # change-endpoint-instance, holding only its --print-policy
        "ENI release wait (MultiModelEndpoint)",
    }
    operations = {(r.principal, r.service, r.operation) for r in report.records}
    # The joints the journey crosses, each made by the principal that makes it on AWS.
    assert {
        ("training launcher", "lambda", "Invoke"),  # people only ask the platform's launcher
        ("training run launcher", "ec2", "RunInstances"),
        ("training instance role", "ec2", "DescribeInstances"),
        ("training instance role", "s3", "PutObject"),  # the run's model, from the host
        ("training instance role", "logs", "PutLogEvents"),  # Docker's awslogs driver and the bootstrap log
        ("endpoint execution role", "s3", "GetObject"),  # SageMaker loading the model
        ("multi-model client", "sagemaker-runtime", "InvokeEndpoint"),
        ("@remote job role", "s3", "PutObject"),
        ("aws service", "ec2", "TerminateInstances"),  # every node powered off
    } <= operations
    (run,) = [r for r in report.results if r.step == "EC2 training run"]
    assert run.detail.startswith("2 node(s)")  # staging: two nodes over EFA
    # Deployed the way CloudFormation deploys: moto's CloudFormation for what it parses, the rest by hand with
    # their policies, one row per type of the templates.
    rows = {line.split()[0]: [int(n) for n in line.split()[1:]] for line in report.coverage[1:]}
    assert rows["AWS::S3::Bucket"] == [4, 0, 0] and rows["AWS::S3::BucketPolicy"] == [0, 4, 0]
    assert rows["AWS::SageMaker::Endpoint"] == [2, 0, 0] and rows["AWS::KMS::Key"] == [0, 1, 0]
    assert rows["AWS::SNS::TopicPolicy"] == [0, 2, 0] and rows["AWS::EC2::PlacementGroup"] == [0, 0, 1]
    assert "Resources per type: played by moto's CloudFormation" in "\n".join(report.lines())
    (change,) = [r for r in report.results if r.step == "change-endpoint-instance"]
    assert change.detail.endswith("autoscaled as before.")
    (destroy,) = [r for r in report.results if r.step == "destroy and clean up"]
    # The Graviton stack goes first while the multi-model endpoint still holds the shared group; the multi-model
    # stack's wait sees the interfaces SageMaker releases after the endpoint is gone. Staging retains its key.
    assert "GravitonEndpoint: Not waiting: endpoint staging-MultiModelEndpoint still uses" in destroy.detail
    assert re.search(r"MultiModelEndpoint: No network interface of sg-\w+ remains", destroy.detail)
    polls = [r for r in report.records if (r.principal, r.operation) == ("ENI release wait (MultiModelEndpoint)",
                                                                         "DescribeNetworkInterfaces")]  # fmt: skip
    assert len(polls) >= 2 and all(r.allowed for r in polls)  # it found interfaces, waited, found none
    assert re.search(r"Foundation retains Key [0-9a-f-]+, Bucket", destroy.detail)


def test_an_upload_from_inside_the_container_stops_the_ec2_run(
    cloud_assembly: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Issue 23's first finding: on Docker's bridge network (metadata hop limit 1) the container has no
    credentials, so an upload from inside it fails and the run ends without its model."""
    assembly = _copy(cloud_assembly, tmp_path / "cdk.out")
    script = _training_code(assembly, "dev") / "ec2_run.sh"
    text = script.read_text()
    step5 = re.search(r'  docker run --rm --user "\$CONTAINER_USER".*?\n  for file in model.tar.gz metrics.json '
                      r'model.tar.gz.sha256; do\n.*?done\n', text, re.S)  # fmt: skip
    assert step5, "ec2_run.sh's step 5 changed: update this test"
    script.write_text(text.replace(step5[0], _UPLOAD_IN_THE_CONTAINER))

    report = rehearse(assembly, "dev", tmp_path / "work", tiny_model_dir)

    assert report.failed_step == "EC2 training run", "\n".join(report.lines())
    assert "Unable to locate credentials" in report.results[-1].detail


def test_a_policy_without_an_action_names_the_step_and_the_refused_call(
    cloud_assembly: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    assembly = _copy(cloud_assembly, tmp_path / "cdk.out")
    path = _template(assembly, "dev", "Training")
    template = json.loads(path.read_text())
    (policy,) = [r for r in template["Resources"].values()
                 if r["Type"] == "AWS::IAM::Policy" and "TrainingInstancePolicy" in json.dumps(r)]  # fmt: skip
    document = policy["Properties"]["PolicyDocument"]
    statements = document["Statement"]
    document["Statement"] = [s for s in statements if s["Action"] != "ec2:DescribeInstances"]
    assert len(document["Statement"]) == len(statements) - 1
    path.write_text(json.dumps(template))

    report: Report = rehearse(assembly, "dev", tmp_path / "work", tiny_model_dir)

    assert report.failed_step == "EC2 training run", "\n".join(report.lines())
    detail = report.results[-1].detail
    assert "refused: training instance role ec2:DescribeInstances" in detail
    assert "[ec2:DescribeInstances on *]" in detail
