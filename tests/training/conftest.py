"""Fixtures for the training tests: one tiny RoBERTa classifier per session, built offline."""

from __future__ import annotations

from pathlib import Path

import pytest

from training_assets.tiny_model import SAMPLE_DATA


@pytest.fixture(scope="session")
def sample_data() -> Path:
    return SAMPLE_DATA


@pytest.fixture(scope="session")
def training_templates(templates: dict[str, dict[str, dict]]) -> dict[str, dict]:
    """{environment: TrainingStack template}, from the session's one synth of every environment (with the
    compliance gates: an unacknowledged cdk-nag finding fails it)."""
    return {environment: stacks["Training"] for environment, stacks in templates.items()}
