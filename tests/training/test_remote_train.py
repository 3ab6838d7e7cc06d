"""@remote training, offline: argument parsing, the set-up checks, the job body on CPU, and that the decorated
function and the sweep's executor are built from the environment's config.yaml (no AWS call is made)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from stacks.training import remote_function_config
from training_assets import remote_train
from training_assets.remote_train import RemoteSetupError

ROOT = Path(remote_train.__file__).resolve().parents[1]
PYTHON = f"py{sys.version_info.major}{sys.version_info.minor}"
KEY = "arn:aws:kms:us-west-2:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
ROLE = "arn:aws:iam::123456789012:role/dev-Foundation-RemoteJobRole"


def _write_config(path: Path, python: str = PYTHON) -> Path:
    config = remote_function_config(
        role_arn=ROLE,
        s3_root_uri="s3://dev-remote-jobs/jobs",
        kms_key_id=KEY,
        security_group_ids=["sg-0123456789abcdef0"],
        subnets=["subnet-0123456789abcdef0", "subnet-0123456789abcdef1"],
        tags={"environment": "dev"},
        instance_type="ml.p4d.24xlarge",
        image_uri=f"763104351884.dkr.ecr.us-west-2.amazonaws.com/pytorch-training:2.10.0-gpu-{python}-cu130-ubuntu22.04-sagemaker",
    )
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture()
def offline_sdk(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A region and dummy credentials for the SDK's session, run from the repo root, no default-bucket lookup."""
    from sagemaker.core.helper.session_helper import Session

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-west-2")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "offline")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "offline")
    monkeypatch.delenv(remote_train.CONFIG_ENV, raising=False)
    # _JobSettings computes the default S3 root (an STS call) even when config.yaml sets S3RootUri.
    monkeypatch.setattr(Session, "default_bucket", lambda self: "unused-default-bucket")
    return _write_config(tmp_path / "config.yaml")


def test_parse_train_and_sweep_arguments() -> None:
    args, config = remote_train.parse(["--config", "c.yaml", "--instance-type", "ml.g5.2xlarge", "train", "--",
                                       "--epochs", "2", "--bf16"])  # fmt: skip
    assert (args.command, args.instance_type, config.epochs, config.bf16) == ("train", "ml.g5.2xlarge", 2, True)
    args, config = remote_train.parse(["sweep", "--learning-rates", "1e-5,2e-5,5e-5", "--max-parallel-jobs", "3"])
    assert args.learning_rates == [1e-5, 2e-5, 5e-5] and args.max_parallel_jobs == 3 and config.epochs == 3


@pytest.mark.parametrize("rates", ["fast", "0", "1e-5,1e-5", "2"])
def test_bad_learning_rates(rates: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        remote_train.parse(["sweep", "--learning-rates", rates])
    assert "learning rates must be" in capsys.readouterr().err


def test_the_decorated_function_is_built_from_config_yaml(offline_sdk: Path) -> None:
    args, _ = remote_train.parse(["--config", str(offline_sdk), "train"])
    remote_train.load_remote_settings(offline_sdk)
    job = remote_train.remote_training_job(args)
    (settings,) = [c.cell_contents for c in job.__closure__ if type(c.cell_contents).__name__ == "_JobSettings"]
    assert settings.role == ROLE
    assert settings.s3_root_uri == "s3://dev-remote-jobs/jobs"
    assert settings.s3_kms_key == settings.volume_kms_key == KEY
    assert settings.vpc_config == {"Subnets": ["subnet-0123456789abcdef0", "subnet-0123456789abcdef1"],
                                   "SecurityGroupIds": ["sg-0123456789abcdef0"]}  # fmt: skip
    assert settings.instance_type == "ml.p4d.24xlarge"
    assert settings.image_uri.endswith(f"pytorch-training:2.10.0-gpu-{PYTHON}-cu130-ubuntu22.04-sagemaker")
    assert {"Key": "environment", "Value": "dev"} in settings.tags
    assert settings.dependencies == str(ROOT / "training_assets" / "requirements-remote.txt")
    assert settings.include_local_workdir is True
    assert settings.environment_variables["TOKENIZERS_PARALLELISM"] == "false"


def test_the_sweep_executor_is_built_from_config_yaml(offline_sdk: Path) -> None:
    args, _ = remote_train.parse(["--config", str(offline_sdk), "--instance-type", "ml.g5.2xlarge", "sweep",
                                  "--learning-rates", "1e-5,3e-5", "--max-parallel-jobs", "2"])  # fmt: skip
    remote_train.load_remote_settings(offline_sdk)
    executor = remote_train.remote_executor(args)
    try:
        assert executor.max_parallel_jobs == 2
        assert executor.job_settings.instance_type == "ml.g5.2xlarge"  # the flag overrides the config
        assert executor.job_settings.role == ROLE and executor.job_settings.s3_kms_key == KEY
    finally:
        executor.shutdown()


def test_python_version_mismatch_stops_before_any_job(offline_sdk: Path) -> None:
    other = _write_config(offline_sdk.with_name("other.yaml"), python="py27")
    with pytest.raises(RemoteSetupError, match=r"the job image runs Python 2.7 but this is Python 3\.\d+"):
        remote_train.load_remote_settings(other)


def test_missing_or_foreign_config(offline_sdk: Path, tmp_path: Path) -> None:
    with pytest.raises(RemoteSetupError, match="does not exist: fetch it with the FetchRemoteFunctionConfigCommand"):
        remote_train.load_remote_settings(tmp_path / "absent.yaml")
    (tmp_path / "foreign.yaml").write_text("SchemaVersion: '1.0'\n")
    with pytest.raises(RemoteSetupError, match="not a SageMaker SDK config with a RemoteFunction section"):
        remote_train.load_remote_settings(tmp_path / "foreign.yaml")


def test_cli_reports_setup_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert remote_train.main(["--config", str(tmp_path / "none.yaml"), "train"]) == 2
    assert "remote_train: error:" in capsys.readouterr().err


def test_only_the_training_code_is_uploaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    shutil.copytree(ROOT, tmp_path / "workspace", ignore=remote_train.only_training_code)
    uploaded = sorted(str(p.relative_to(tmp_path / "workspace")) for p in (tmp_path / "workspace").rglob("*")
                      if p.is_file())  # fmt: skip
    assert "training_assets/instance/train_sentiment.py" in uploaded and "training_assets/remote_train.py" in uploaded
    assert all(name.startswith("training_assets/") and name.endswith(".py") for name in uploaded)


@pytest.mark.slow
def test_job_body_trains_and_leaves_the_model_for_sagemaker(tiny_model_dir: Path, sample_data: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setenv("SM_MODEL_DIR", str(tmp_path / "model"))
    config = {"model": str(tiny_model_dir), "dataset": str(sample_data), "epochs": 1, "per_device_batch_size": 16,
              "learning_rate": 5e-3, "max_seq_length": 32, "use_cpu": True}  # fmt: skip
    metrics = remote_train.run_training_job(config)
    assert metrics["epochs"][0]["epoch"] == 1.0
    assert (tmp_path / "model" / "model.safetensors").is_file()
    assert json.loads((tmp_path / "model" / "metrics.json").read_text())["throughput"]["measured_steps"] == 14
