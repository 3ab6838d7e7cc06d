"""The container environment shared by the endpoint stack and the local server."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from inference_assets.tools.endpoint_environment import endpoint_environment, instance_vcpus

HANDLER = Path(__file__).resolve().parents[2] / "inference_assets" / "container" / "toolkit_handler.py"


@pytest.mark.parametrize(
    ("instance_type", "vcpus"),
    [("ml.c7g.medium", 1), ("ml.c7g.large", 2), ("ml.c7g.xlarge", 4), ("ml.c7g.4xlarge", 16), ("ml.m6g.16xlarge", 64)],
)
def test_vcpus_follow_the_instance_size(instance_type: str, vcpus: int) -> None:
    assert instance_vcpus(instance_type) == vcpus


def test_an_unknown_size_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot tell the vCPUs"):
        instance_vcpus("ml.c7g.metal")


@pytest.mark.parametrize(("vcpus", "workers", "threads"), [(1, 1, 1), (2, 1, 2), (4, 1, 4), (16, 4, 4), (64, 16, 4)])
def test_default_workers_get_four_cores_each(vcpus: int, workers: int, threads: int) -> None:
    environment = endpoint_environment(vcpus=vcpus)
    assert environment["SAGEMAKER_MODEL_SERVER_WORKERS"] == str(workers)
    assert environment["OMP_NUM_THREADS"] == str(threads)


def test_explicit_workers_are_pinned_for_the_toolkit_model_entry() -> None:
    environment = endpoint_environment(vcpus=16, workers=8, batch_size=4, max_batch_delay_ms=10, max_request_batch=64)
    assert environment == {
        "SAGEMAKER_MODEL_SERVER_WORKERS": "8",
        "SAGEMAKER_TS_MIN_WORKERS": "8",
        "SAGEMAKER_TS_MAX_WORKERS": "8",
        "SAGEMAKER_TS_BATCH_SIZE": "4",
        "SAGEMAKER_TS_MAX_BATCH_DELAY": "10",
        "OMP_NUM_THREADS": "2",
        "OMP_WAIT_POLICY": "PASSIVE",
        "SENTIMENT_MAX_REQUEST_BATCH": "64",
    }


def test_the_handler_reads_the_batch_limit_the_environment_sets() -> None:
    """The container package ships without the tools, so it names the variable itself: both names must agree."""
    tree = ast.parse(HANDLER.read_text())
    (value,) = [
        node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "MAX_REQUEST_BATCH_ENV" for t in node.targets)
    ]
    assert value in endpoint_environment(vcpus=1)
