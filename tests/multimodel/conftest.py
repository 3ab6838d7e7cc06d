"""Shared fixtures of the multi-model tests: the tiny model's archive for both model servers, unpacked."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def mme_archive(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One archive for both model servers, built by the publishing tool (DJL files + toolkit handler)."""
    from inference_assets.tools.publish_models import build_archive
    from inference_assets.tools.serving_properties import DjlModelSettings
    from tests.serving.request_table import TEST_LIMITS

    settings = DjlModelSettings(
        max_workers=2,
        max_request_batch=TEST_LIMITS.max_request_batch,
        max_text_chars=TEST_LIMITS.max_text_chars,
        max_request_bytes=TEST_LIMITS.max_request_bytes,
    )
    return build_archive(tiny_model_dir, tmp_path_factory.mktemp("archive") / "sentiment.tar.gz", settings)


@pytest.fixture(scope="session")
def unpacked_mme_archive(mme_archive: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The archive unpacked into its own directory, as DJL Serving and SageMaker lay out each model."""
    target = tmp_path_factory.mktemp("models") / "sentiment"
    with tarfile.open(mme_archive) as tar:
        tar.extractall(target, filter="data")
    return target
