"""Fixtures shared by the serving tests: one tiny model and one archive per session (building them costs seconds)."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from inference_assets.tools.package_model import build_model_archive


@pytest.fixture(scope="session")
def model_archive(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model_archive(tiny_model_dir, tmp_path_factory.mktemp("archive") / "model.tar.gz")


@pytest.fixture(scope="session")
def torchserve_model(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An archive of the proving ground's TorchServe harness (the Graviton endpoint's archives are Ray Serve's),
    unpacked the way SageMaker lays it out at /opt/ml/model."""
    from proving_ground.torchserve_mme.archive import build_archive

    archive = build_archive(tiny_model_dir, tmp_path_factory.mktemp("torchserve-archive") / "model.tar.gz")
    target = tmp_path_factory.mktemp("torchserve-opt-ml") / "model"
    with tarfile.open(archive) as tar:
        tar.extractall(target, filter="data")
    return target


@pytest.fixture(scope="session")
def unpacked_model(model_archive: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The archive unpacked the way SageMaker lays it out at /opt/ml/model."""
    target = tmp_path_factory.mktemp("opt-ml") / "model"
    with tarfile.open(model_archive) as tar:
        tar.extractall(target, filter="data")
    return target
