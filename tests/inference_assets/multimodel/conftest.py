"""Shared fixtures of the multi-model tests: the tiny model's archive for each model server, unpacked."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest


def _unpack(archive: Path, target: Path) -> Path:
    with tarfile.open(archive) as tar:
        tar.extractall(target, filter="data")
    return target


@pytest.fixture(scope="session")
def djl_archive(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The archive for DJL Serving (model.py + serving.properties, no TorchServe manifest), built by the publishing
    tool with the request table's limits."""
    from inference_assets.container.contract import DjlModelSettings
    from inference_assets.tools.publish_models import build_archive
    from tests.inference_assets.request_table import TEST_LIMITS

    settings = DjlModelSettings(
        max_workers=2,
        max_request_batch=TEST_LIMITS.max_request_batch,
        max_request_bytes=TEST_LIMITS.max_request_bytes,
    )
    output = tmp_path_factory.mktemp("djl-archive") / "sentiment.tar.gz"
    return build_archive(tiny_model_dir, output, settings=settings)


@pytest.fixture(scope="session")
def torchserve_archive(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The archive for TorchServe (MAR-INF/MANIFEST.json + code/inference.py), which the local harness serves."""
    from proving_ground.torchserve_mme.archive import build_archive

    output = tmp_path_factory.mktemp("torchserve-archive") / "sentiment.tar.gz"
    return build_archive(tiny_model_dir, output)


@pytest.fixture(scope="session")
def unpacked_djl_archive(djl_archive: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The DJL archive unpacked into its own directory, as DJL Serving lays out each model."""
    return _unpack(djl_archive, tmp_path_factory.mktemp("djl-models") / "sentiment")


@pytest.fixture(scope="session")
def unpacked_torchserve_archive(torchserve_archive: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The TorchServe archive unpacked into its own directory, as SageMaker lays out each model."""
    return _unpack(torchserve_archive, tmp_path_factory.mktemp("models") / "sentiment")
