"""Fixtures for the training tests: one tiny RoBERTa classifier per session, built offline."""

from __future__ import annotations

from pathlib import Path

import pytest

from training_assets.tiny_model import SAMPLE_DATA, build_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def sample_data() -> Path:
    return SAMPLE_DATA


@pytest.fixture(scope="session")
def training_templates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """{environment: TrainingStack template} of every environment in cdk.json, synthesized once with the
    compliance gates (an unacknowledged cdk-nag finding fails the synth)."""
    import json

    from app import build_app

    root = Path(__file__).resolve().parents[2]
    context = json.loads((root / "cdk.json").read_text())["context"]
    assembly = build_app(context=context, outdir=str(tmp_path_factory.mktemp("cdk.out"))).synth()
    templates = {}
    for stage in assembly.nested_assemblies:
        for stack in stage.nested_assembly.stacks:
            if stack.hierarchical_id.endswith("/Training"):
                templates[stack.hierarchical_id.split("/")[0]] = stack.template
    return templates
