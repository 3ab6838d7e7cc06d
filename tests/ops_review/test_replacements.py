"""`pytorch-platform review --diff` marks what CloudFormation replaces (issue 40, item 5) and refuses, in one line,
what it would fail: a copy of the platform's assembly, changed as a later update would change it."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ops_review.__main__ import main
from ops_review.diff import replacements
from ops_review.review import load_assembly


@pytest.fixture(scope="module")
def assembly(cloud_assembly: Any) -> Path:
    return Path(cloud_assembly.directory)


def _changed(old: Path, tmp_path: Path, stage: str, stack: str, change: Callable[[dict[str, Any]], None]) -> Path:
    new = tmp_path / "new"
    shutil.copytree(old, new, ignore=shutil.ignore_patterns("asset.*"))
    (template_file,) = new.glob(f"assembly-{stage}/{stage}{stack}*.template.json")
    template = json.loads(template_file.read_text())
    change(template["Resources"])
    template_file.write_text(json.dumps(template))
    return new


def _of_type(resources: dict[str, Any], kind: str) -> tuple[str, dict[str, Any]]:
    return next((logical_id, r) for logical_id, r in resources.items() if r["Type"] == kind)


def test_an_unchanged_assembly_replaces_nothing(assembly: Path) -> None:
    stacks = load_assembly(assembly)
    assert replacements(stacks, stacks) == {"replaced": [], "refused": []}


def test_a_renamed_endpoint_is_replaced_and_allowed(assembly: Path, tmp_path: Path) -> None:
    def rename(resources: dict[str, Any]) -> None:
        _of_type(resources, "AWS::SageMaker::Endpoint")[1]["Properties"]["EndpointName"] = "staging-Graviton2"

    new = _changed(assembly, tmp_path, "staging", "GravitonEndpoint", rename)
    found = replacements(load_assembly(assembly), load_assembly(new))
    assert found == {
        "replaced": ["staging/GravitonEndpoint Endpoint (AWS::SageMaker::Endpoint): REPLACED, create-only "
                     "EndpointName changed"],
        "refused": [],
    }  # fmt: skip


def test_a_fixed_name_replaced_is_refused_in_one_line(assembly: Path, tmp_path: Path) -> None:
    """The scaling policy's name is fixed; a new scalable target (create-only ScalingTargetId) replaces it under
    the same name, which CloudFormation cannot do."""

    def retarget(resources: dict[str, Any]) -> None:
        _, policy = _of_type(resources, "AWS::ApplicationAutoScaling::ScalingPolicy")
        policy["Properties"]["ScalingTargetId"] = "endpoint/staging-Graviton2/variant/AllTraffic"

    new = _changed(assembly, tmp_path, "staging", "GravitonEndpoint", retarget)
    found = replacements(load_assembly(assembly), load_assembly(new))
    (refused,) = found["refused"]
    assert refused.startswith("REFUSED staging/GravitonEndpoint ScalableTargetInvocationsPerInstance")
    assert "replacing it fails, its PolicyName" in refused and "cannot replace a custom-named resource" in refused


def test_an_export_in_use_whose_resource_is_replaced_is_refused(assembly: Path, tmp_path: Path) -> None:
    """The endpoint execution role is exported to the endpoint stacks; a new Path (create-only) replaces it, so its
    ARN export changes while they import it: the command exits 1 with the line."""

    def move(resources: dict[str, Any]) -> None:
        resources[next(i for i in resources if i.startswith("EndpointExecutionRole") and
                       resources[i]["Type"] == "AWS::IAM::Role")]["Properties"]["Path"] = "/platform/"  # fmt: skip

    new = _changed(assembly, tmp_path, "staging", "Foundation", move)
    found = replacements(load_assembly(assembly), load_assembly(new))
    assert any("EndpointExecutionRole" in line and "REPLACED, create-only Path changed" in line
               for line in found["replaced"])  # fmt: skip
    assert found["refused"] and {line.split(":")[0] for line in found["refused"]} == {"REFUSED staging/Foundation"}
    assert all("EndpointExecutionRole" in line and "staging-GravitonEndpoint" in line for line in found["refused"])
    assert main(["--diff", str(assembly), str(new), "--out", str(tmp_path / "out")]) == 1
    assert "## Replacements" in (tmp_path / "out" / "diff.md").read_text()
