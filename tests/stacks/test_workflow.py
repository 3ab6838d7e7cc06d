"""The GitHub Actions workflow: valid YAML with the steps the README promises, every action pinned to a version."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

WORKFLOW = Path(__file__).resolve().parents[2] / ".github" / "workflows" / "ci.yml"


@pytest.fixture(scope="module")
def workflow() -> dict[str, Any]:
    return yaml.safe_load(WORKFLOW.read_text())


@pytest.fixture(scope="module")
def steps(workflow: dict[str, Any]) -> list[dict[str, Any]]:
    (job,) = workflow["jobs"].values()
    return job["steps"]


def _index(steps: list[dict[str, Any]], predicate: Any) -> int:
    matches = [i for i, step in enumerate(steps) if predicate(step)]
    assert matches, "step not found"
    return matches[0]


def _uses(action: str):
    return lambda step: step.get("uses", "").split("@")[0] == action


def _runs(command: str):
    return lambda step: command in step.get("run", "")


def test_runs_on_pull_requests_and_main(workflow: dict[str, Any]) -> None:
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` key as True
    assert "pull_request" in triggers
    assert triggers["push"]["branches"] == ["main"]
    assert workflow["permissions"] == {"contents": "read"}


def test_steps_install_test_synthesize_review_and_upload_in_order(steps: list[dict[str, Any]]) -> None:
    order = [
        _index(steps, _uses("actions/checkout")),
        _index(steps, _uses("actions/setup-python")),
        _index(steps, lambda s: s.get("run", "").strip() == "make test"),
        _index(steps, lambda s: s.get("run", "").strip() == "make synth"),
        _index(steps, _runs("python -m ops_review cdk.out --out review/")),
        _index(steps, _uses("actions/upload-artifact")),
    ]
    assert order == sorted(order)
    setup = steps[order[1]]
    assert str(setup["with"]["python-version"]) == "3.11"
    upload = steps[order[-1]]
    assert {"cdk.out/", "review/"} <= set(upload["with"]["path"].split())


def test_pull_requests_get_a_review_diff_against_the_base_branch(steps: list[dict[str, Any]]) -> None:
    diff = steps[_index(steps, _runs("python -m ops_review --diff base/cdk.out cdk.out --out review-diff/"))]
    assert diff["if"] == "github.event_name == 'pull_request'"
    assert "review-diff/" in steps[_index(steps, _uses("actions/upload-artifact"))]["with"]["path"].split()


def test_cdk_diff_per_environment_only_with_an_oidc_role(workflow: dict[str, Any], steps: list[dict[str, Any]]) -> None:
    credentials = steps[_index(steps, _uses("aws-actions/configure-aws-credentials"))]
    assert credentials["with"]["role-to-assume"] == "${{ vars.AWS_DIFF_ROLE_ARN }}"
    assert credentials["if"] == "vars.AWS_DIFF_ROLE_ARN != ''"
    diff = steps[_index(steps, _runs("cdk diff --app cdk.out"))]
    assert diff["if"] == credentials["if"]
    assert "['context']['environments']" in diff["run"] and '"$environment/*"' in diff["run"]
    (job,) = workflow["jobs"].values()
    assert job["permissions"]["id-token"] == "write"


def test_every_action_is_pinned_to_a_full_version_tag(steps: list[dict[str, Any]]) -> None:
    actions = [step["uses"] for step in steps if "uses" in step]
    assert actions
    assert all(re.fullmatch(r"[\w.-]+/[\w.-]+@v\d+\.\d+\.\d+", action) for action in actions), actions
