"""The review's reach on the promotion pipeline synthesized from test settings (a tooling account and one account per
environment: tests/stacks/pipeline_assembly.py, in the same SAME_WORKER group as the pipeline's tests): who may write
the image parameters, and which build may become which of an environment's delivery roles, across accounts."""

from __future__ import annotations

from typing import Any

import pytest

from ops_review.reach import reach_assembly
from ops_review.review import load_assembly
from stacks.image_names import image_of_parameter
from tests.stacks.pipeline_assembly import pipeline_assembly

ENV = "staging"
STAGE = f"PromotionPipeline/{ENV}"
SMOKE_TEST_ROLE = "SmokeTestAccess/SmokeTestRole"
PUBLISHING_ROLE = "SmokeTestAccess/ImagePublishingRole"


@pytest.fixture(scope="module")
def reach() -> dict[str, dict[str, dict[str, Any]]]:
    return reach_assembly(load_assembly(pipeline_assembly()))


def _one(entries: dict[str, Any], construct: str) -> dict[str, Any]:
    """The principal whose name is the construct's: its path, or its logical id (the construct id and CDK's hash)."""
    (found,) = [entry for name, entry in entries.items() if name.startswith(construct)]
    return found


def _image_parameters_written(entry: dict[str, Any]) -> set[str]:
    return {
        row["resource"]
        for row in entry["reach"]
        if "ssm:PutParameter" in row["actions"] and image_of_parameter(row["resource"]) is not None
    }


def test_only_the_image_publishing_role_writes_the_image_parameters(reach: dict[str, Any]) -> None:
    stage = reach[STAGE]
    written = {name: _image_parameters_written(entry) for name, entry in stage.items()}
    (writer,) = [name for name, parameters in written.items() if parameters]
    assert writer.startswith(PUBLISHING_ROLE)
    assert all(image_of_parameter(p) is not None for p in written[writer]) and len(written[writer]) >= 2
    assert _image_parameters_written(_one(stage, SMOKE_TEST_ROLE)) == set()


def _assumers(reach: dict[str, Any], role: str) -> set[str]:
    """The pipeline's principals that may assume the environment's ``role`` (its trust policy and their identity
    policies, across the tooling and environment accounts)."""
    target = f"{STAGE}/{role}"
    return {
        name
        for name, entry in reach["(app)"].items()
        for row in entry["reach"]
        if row["resource"].startswith(target) and "sts:AssumeRole" in row["actions"]
    }


def test_each_delivery_role_is_assumed_by_its_own_step_only(reach: dict[str, Any]) -> None:
    smoke = _assumers(reach, SMOKE_TEST_ROLE)
    publishing = _assumers(reach, PUBLISHING_ROLE)
    assert smoke and publishing and not smoke & publishing
    # The environment's smoke-test and model-check builds; no other build, no other environment's. (Names are
    # construct paths, .../staging/SmokeTest-staging/..., or logical ids, PipelinestagingSmokeTeststagingRole...)
    smoke_steps = [_step(name, "SmokeTest") or _step(name, "ModelCheck") for name in smoke]
    assert all(smoke_steps) and any(_step(name, "SmokeTest") for name in smoke), smoke
    assert all(_step(name, "PublishImages") for name in publishing), publishing


def _step(name: str, step: str) -> bool:
    """Whether the principal is the environment's own pipeline step (not the scan gate or publishing step of the
    SmokeTestAccess stack, whose names also hold SmokeTest)."""
    rest = name.replace("SmokeTestAccess", "")
    return ENV in name and step in rest and not any(other in name for other in ("dev", "prod") if other != ENV)
