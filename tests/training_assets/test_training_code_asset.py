"""The Training stack's code assets hold what the instance runs: edits to local harnesses, tests or operator-side
training code leave their hashes (and so the stack) unchanged; edits to what the instance runs change them."""

from __future__ import annotations

import shutil
from pathlib import Path

import aws_cdk as cdk
import pytest

from stacks.training import CODE_ASSETS, code_asset

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def repository(tmp_path: Path) -> Path:
    """A copy of the two asset folders, with a local harness and a test file where the layout puts them."""
    copy = tmp_path / "repo"
    for folder in ("training_assets", "inference_assets"):
        shutil.copytree(ROOT / folder, copy / folder, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "inference_assets" / "local").mkdir(exist_ok=True)
    (copy / "inference_assets" / "local" / "local_server.py").write_text("PORT = 8080\n")
    (copy / "inference_assets" / "tests").mkdir(exist_ok=True)
    (copy / "inference_assets" / "tests" / "test_protocol.py").write_text("def test_nothing(): ...\n")
    return copy


def _hashes(root: Path) -> dict[str, str]:
    stack = cdk.Stack(cdk.App())
    return {construct_id: code_asset(stack, construct_id, root).asset_hash for construct_id in CODE_ASSETS}


def _append(path: Path, text: str = "\n# edited\n") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        handle.write(text)


@pytest.mark.parametrize(
    "edited",
    [
        "inference_assets/local/local_server.py",
        "inference_assets/tests/test_protocol.py",
        "inference_assets/local/new_harness.py",
        "inference_assets/__pycache__/stale.cpython-311.pyc",
        "training_assets/remote_train.py",
        "training_assets/tiny_model.py",
        "training_assets/sample_data/train.jsonl",
    ],
)
def test_edits_outside_what_the_instance_runs_leave_the_assets_unchanged(repository: Path, edited: str) -> None:
    before = _hashes(repository)
    _append(repository / edited)
    assert _hashes(repository) == before


@pytest.mark.parametrize(
    ("edited", "asset"),
    [
        ("training_assets/instance/train_sentiment.py", "TrainingAssetsCode"),
        ("training_assets/instance/ec2_run.sh", "TrainingAssetsCode"),
        ("package_model.py", "InferenceAssetsCode"),  # wherever the inference package keeps it
    ],
)
def test_edits_to_what_the_instance_runs_change_its_asset(repository: Path, edited: str, asset: str) -> None:
    if "/" not in edited:
        (found,) = repository.glob(f"inference_assets/**/{edited}")
        edited = str(found.relative_to(repository))
    assert (repository / edited).is_file()
    before = _hashes(repository)
    _append(repository / edited)
    after = _hashes(repository)
    assert after[asset] != before[asset]
    assert {k: v for k, v in after.items() if k != asset} == {k: v for k, v in before.items() if k != asset}


def test_the_training_asset_is_the_instance_folder_only() -> None:
    folder, _ = CODE_ASSETS["TrainingAssetsCode"]
    assert folder == "training_assets/instance"
    instance = ROOT / folder
    for needed in ("train_sentiment.py", "Dockerfile", "launch_training.sh", "ec2_run.sh", "ship_logs.py",
                   "requirements.txt"):  # fmt: skip
        assert (instance / needed).is_file(), needed
    assert not list(instance.glob("remote_train.py")) and not (instance / "sample_data").exists()
