"""What each kind of archive carries, read from archives built here and listed: the Graviton endpoint's (Ray Serve)
only what Ray Serve runs, the multi-model endpoint's (DJL Serving) only what DJL runs, and the proving ground's
TorchServe harness's only the shared modules beside its own handler."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from inference_assets.tools import package_model, publish_models
from proving_ground.torchserve_mme import archive as torchserve_archive

SHARED = {"__init__.py", "contract.py", "predictor.py", "protocol.py"}
RAY = {"ray_deployment.py", "ray_server.py", "ray_settings.py"}
DJL = {"djl_adapter.py"}


def _listing(archive: Path, model_dir: Path) -> tuple[set[str], set[str]]:
    """(the serving package's modules, every other entry that is not one of ``model_dir``'s files) of ``archive``."""
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    package = "code/sentiment_serving/"
    modules = {name.removeprefix(package) for name in names if name.startswith(package)}
    model_files = {path.relative_to(model_dir).as_posix() for path in model_dir.rglob("*") if path.is_file()}
    assert model_files <= names
    return modules, names - model_files - {package + module for module in modules}


@pytest.fixture(scope="module")
def archives(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("archives")
    return {
        "ray": package_model.build_model_archive(tiny_model_dir, folder / "ray.tar.gz"),
        "djl": publish_models.build_archive(tiny_model_dir, folder / "djl.tar.gz"),
        "torchserve": torchserve_archive.build_archive(tiny_model_dir, folder / "torchserve.tar.gz"),
    }


def test_the_graviton_archive_carries_only_what_ray_serve_runs(archives: dict[str, Path], tiny_model_dir: Path) -> None:
    modules, others = _listing(archives["ray"], tiny_model_dir)
    assert modules == SHARED | RAY
    assert others == {"config.yaml", "deployment.py"}


def test_the_multi_model_archive_carries_only_what_djl_runs(archives: dict[str, Path], tiny_model_dir: Path) -> None:
    modules, others = _listing(archives["djl"], tiny_model_dir)
    assert modules == SHARED | DJL
    assert others == {"model.py", "serving.properties", "code/requirements.txt"}


def test_the_torchserve_harness_archive_carries_the_shared_modules_and_its_handler(
    archives: dict[str, Path], tiny_model_dir: Path
) -> None:
    modules, others = _listing(archives["torchserve"], tiny_model_dir)
    assert modules == SHARED
    assert others == {"MAR-INF/MANIFEST.json", "code/inference.py", "code/requirements.txt"}
    with tarfile.open(archives["torchserve"]) as tar:
        handler = tar.extractfile("code/inference.py").read()  # type: ignore[union-attr]
    assert handler == torchserve_archive.HANDLER.read_bytes()


def test_every_module_of_the_container_package_belongs_to_an_archive() -> None:
    """A new module of inference_assets/container/ must be named shared or one server's, or no archive carries it."""
    listed = set(package_model.SHARED_MODULES).union(*package_model.SERVER_MODULES.values())
    assert {path.name for path in package_model.CONTAINER.glob("*.py")} == listed
