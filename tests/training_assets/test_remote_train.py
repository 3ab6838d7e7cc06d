"""@remote training, offline: argument parsing, the set-up checks, the job body on CPU, and that the decorated
function and the sweep's executor are built from the environment's config.yaml (no AWS call is made)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from platform_facts.images import image_facts
from stacks.settings import TrainingSettings
from stacks.training import remote_function_config
from tests.training_assets.warm_python import WarmPython
from training_assets import remote_train
from training_assets.instance.train_config import TrainConfig
from training_assets.remote_train import RemoteSetupError

# The SDK's config validated once per distinct config (tests/conftest.py): ~1 CPU-s per job otherwise.
pytestmark = pytest.mark.usefixtures("sdk_config_validated_once")

ROOT = Path(remote_train.__file__).resolve().parents[1]
PYTHON = f"py{sys.version_info.major}{sys.version_info.minor}"
KEY = "arn:aws:kms:us-west-2:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
ROLE = "arn:aws:iam::123456789012:role/dev-Foundation-RemoteJobRoleNlp"
REGISTRY = "763104351884.dkr.ecr.us-west-2.amazonaws.com"


def _stand_in_image(python: str) -> str:
    """An image of the user's own in the default job image's repository, whose tag spells ``python`` (pyXY)."""
    return f"{REGISTRY}/{TrainingSettings().remote_image.image}-{python}"


def _write_config(path: Path, python: str = PYTHON, instance_type: str = "ml.p4d.24xlarge") -> Path:
    config = remote_function_config(
        caller="nlp",
        role_arn=ROLE,
        bucket_name="dev-remote-jobs",
        kms_key_id=KEY,
        security_group_ids=["sg-0123456789abcdef0"],
        subnets=["subnet-0123456789abcdef0", "subnet-0123456789abcdef1"],
        tags={"environment": "dev"},
        instance_type=instance_type,
        image_uri=_stand_in_image(python),
    )
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture()
def offline_sdk(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A region and dummy credentials for the SDK's session, run from the repo root, no default-bucket lookup
    (tests/training_assets/test_remote_sdk_moto.py runs that lookup against moto)."""
    from sagemaker.core.helper.session_helper import Session

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-west-2")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "offline")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "offline")
    monkeypatch.delenv("SAGEMAKER_USER_CONFIG_OVERRIDE", raising=False)
    monkeypatch.setattr(Session, "default_bucket", lambda self: "dev-remote-jobs")
    return _write_config(tmp_path / "config.yaml")


def test_parse_train_and_sweep_arguments() -> None:
    args, config = remote_train.parse(["--config", "c.yaml", "--instance-type", "ml.g5.2xlarge", "train", "--",
                                       "--epochs", "2", "--bf16"])  # fmt: skip
    assert (args.command, args.instance_type, config.epochs, config.bf16) == ("train", "ml.g5.2xlarge", 2, True)
    args, config = remote_train.parse(["sweep", "--learning-rates", "1e-5,2e-5,5e-5", "--max-parallel-jobs", "3"])
    assert args.learning_rates == [1e-5, 2e-5, 5e-5] and args.max_parallel_jobs == 3
    assert config.epochs == TrainConfig().epochs  # no training flags: train_sentiment's own defaults


@pytest.mark.parametrize("rates", ["fast", "0", "1e-5,1e-5", "2"])
def test_bad_learning_rates(rates: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        remote_train.parse(["sweep", "--learning-rates", rates])
    assert "learning rates must be" in capsys.readouterr().err


def _job_settings(job) -> object:
    # sagemaker-core keeps a decorated function's job settings only in its closure (no public accessor).
    (settings,) = [c.cell_contents for c in job.__closure__ if type(c.cell_contents).__name__ == "_JobSettings"]
    return settings


def test_the_decorated_function_is_built_from_config_yaml(offline_sdk: Path) -> None:
    args, _ = remote_train.parse(["--config", str(offline_sdk), "train"])
    settings = _job_settings(remote_train.remote_training_job(args, remote_train.load_remote_config(offline_sdk)))
    assert settings.role == ROLE
    assert settings.s3_root_uri == "s3://dev-remote-jobs/jobs/nlp"  # the caller's prefix
    assert settings.job_name_prefix == "nlp-sentiment"  # the caller's launcher policy creates only nlp-* jobs
    assert settings.s3_kms_key == KEY
    assert settings.volume_kms_key is None  # p4d has NVMe instance storage: SageMaker refuses a volume key
    assert settings.use_torchrun is True and settings.nproc_per_node == 8  # one process per GPU (instance facts)
    assert settings.instance_count == 1 and settings.use_spot_instances is False
    assert settings.vpc_config == {"Subnets": ["subnet-0123456789abcdef0", "subnet-0123456789abcdef1"],
                                   "SecurityGroupIds": ["sg-0123456789abcdef0"]}  # fmt: skip
    assert settings.instance_type == "ml.p4d.24xlarge"
    assert settings.image_uri == _stand_in_image(PYTHON)
    assert {"Key": "environment", "Value": "dev"} in settings.tags
    assert Path(settings.dependencies).name == "requirements-remote.txt"  # a self-contained copy of it
    assert settings.include_local_workdir is True
    assert settings.environment_variables["TOKENIZERS_PARALLELISM"] == "false"


def test_the_sweep_executor_is_built_from_config_yaml(offline_sdk: Path) -> None:
    args, _ = remote_train.parse(["--config", str(offline_sdk), "--instance-type", "ml.p3.8xlarge", "sweep",
                                  "--learning-rates", "1e-5,3e-5", "--max-parallel-jobs", "2"])  # fmt: skip
    executor = remote_train.remote_executor(args, remote_train.load_remote_config(offline_sdk))
    try:
        assert executor.max_parallel_jobs == 2
        assert executor.job_settings.instance_type == "ml.p3.8xlarge"  # the flag overrides the config
        assert executor.job_settings.role == ROLE and executor.job_settings.s3_kms_key == KEY
        # p3 has EBS volumes only: the override gets the platform key for them, and torchrun on its 4 GPUs.
        assert executor.job_settings.volume_kms_key == KEY
        assert executor.job_settings.use_torchrun is True
    finally:
        executor.shutdown()


@pytest.mark.parametrize(
    ("config_type", "override", "volume_key", "torchrun"),
    [
        ("ml.p4d.24xlarge", None, None, True),
        ("ml.p4d.24xlarge", "ml.g5.12xlarge", None, True),
        ("ml.p4d.24xlarge", "ml.p3.2xlarge", KEY, True),
        ("ml.p3.16xlarge", None, KEY, True),
        ("ml.p3.16xlarge", "ml.p5.48xlarge", None, True),  # the config's key is dropped for the NVMe type
        ("ml.p3.16xlarge", "ml.g6.48xlarge", None, True),
        ("ml.p3.16xlarge", "ml.m5.xlarge", KEY, False),  # a CPU type: one process, no torchrun
        ("ml.p3.16xlarge", "ml.c5d.xlarge", None, False),
    ],
)
def test_volume_key_and_torchrun_follow_the_instance_type_used(
    offline_sdk: Path, config_type: str, override: str | None, volume_key: str | None, torchrun: bool
) -> None:
    config_path = _write_config(offline_sdk.with_name("typed.yaml"), instance_type=config_type)
    argv = ["--config", str(config_path), *(["--instance-type", override] if override else []), "train"]
    args, _ = remote_train.parse(argv)
    config = remote_train.load_remote_config(config_path)
    settings = _job_settings(remote_train.remote_training_job(args, config))
    assert (settings.instance_type, settings.volume_kms_key, settings.use_torchrun) == (
        override or config_type, volume_key, torchrun)  # fmt: skip
    # The adjusted config is what the session carries (Session() validated it against the SDK's schema).
    effective, _ = remote_train.config_for_instance_type(config, override)
    assert ("VolumeKmsKeyId" in effective["SageMaker"]["PythonSDK"]["Modules"]["RemoteFunction"]) == bool(volume_key)


def test_an_unknown_instance_type_is_a_setup_error(offline_sdk: Path) -> None:
    config = remote_train.load_remote_config(offline_sdk)
    with pytest.raises(RemoteSetupError, match=r"is not a SageMaker instance type such as ml\.g5\.2xlarge"):
        remote_train.config_for_instance_type(config, "p4d.24xlarge")


def test_python_version_mismatch_stops_before_any_job(offline_sdk: Path) -> None:
    other = _write_config(offline_sdk.with_name("other.yaml"), python="py27")
    with pytest.raises(RemoteSetupError, match=r"the job image runs Python 2.7 but this is Python 3\.\d+"):
        remote_train.load_remote_config(other)


def test_a_table_images_python_is_the_tables_fact(offline_sdk: Path) -> None:
    """The Amazon Linux 2023 DLC tags spell no Python version: for an image of the image table the check reads the
    table's fact, so a job that would fail on the version mismatch inside SageMaker stops here first."""
    training = [fact for fact in image_facts().values() if fact.training]
    assert {fact.training.platform for fact in training if fact.training} == {"ec2", "sagemaker"}
    for fact in training:
        assert fact.training is not None
        assert remote_train.image_python(f"{REGISTRY}/{fact.image}") == fact.training.python, fact.image
    local = f"{sys.version_info.major}.{sys.version_info.minor}"
    remote = TrainingSettings().remote_image
    assert remote.training and "-py" not in remote.tag  # the default job image's tag says nothing of its Python
    other = next(fact for fact in training if fact.training and fact.training.python != local)
    python = other.training.python if other.training else None
    with pytest.raises(RemoteSetupError, match=rf"runs Python {python} but this is Python {local};"):
        remote_train.load_remote_config(offline_sdk, image_uri=f"{REGISTRY}/{other.image}")
    # An image of the user's own that says nothing of its Python is not checked (nothing to compare with).
    assert remote_train.image_python(f"{REGISTRY}/my-training:latest") is None
    assert remote_train.image_python(f"{REGISTRY}/my-training:2.0-py310-cu121") == "3.10"


def test_missing_or_foreign_config(offline_sdk: Path, tmp_path: Path) -> None:
    with pytest.raises(RemoteSetupError, match="does not exist: fetch it with the FetchRemoteFunctionConfigCommand"):
        remote_train.load_remote_config(tmp_path / "absent.yaml")
    (tmp_path / "foreign.yaml").write_text("SchemaVersion: '1.0'\n")
    with pytest.raises(RemoteSetupError, match="not a SageMaker SDK config with a RemoteFunction section"):
        remote_train.load_remote_config(tmp_path / "foreign.yaml")


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


def test_image_uri_override_is_the_image_whose_python_is_checked(offline_sdk: Path) -> None:
    """The version-check message says to pass --image-uri: that must then satisfy the check."""
    other = _write_config(offline_sdk.with_name("other.yaml"), python="py27")
    image = _stand_in_image(PYTHON)
    config = remote_train.load_remote_config(other, image_uri=image)
    assert config["SageMaker"]["PythonSDK"]["Modules"]["RemoteFunction"]["ImageUri"] == image


def test_inputs_are_downloaded_once_per_instance(tmp_path: Path, mocked_aws: str) -> None:
    """Under torchrun every process of an instance asks for the dataset; the first downloads, the others reuse it
    (after the first, the S3 folder is emptied: a second download would fail with "holds no files")."""
    import boto3

    s3 = boto3.client("s3", region_name=mocked_aws)
    s3.create_bucket(Bucket="datasets", CreateBucketConfiguration={"LocationConstraint": mocked_aws})
    s3.put_object(Bucket="datasets", Key="tweets/train.jsonl", Body=b'{"text": "hi", "label": 1}\n')
    target = tmp_path / "dataset"
    assert remote_train.download_once_per_instance("s3://datasets/tweets/", target) == target
    s3.delete_object(Bucket="datasets", Key="tweets/train.jsonl")
    for _ in range(2):
        assert remote_train.download_once_per_instance("s3://datasets/tweets/", target) == target
    assert (target / "train.jsonl").read_bytes() == b'{"text": "hi", "label": 1}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dataset", "dataset.done", "dataset.lock"]


@pytest.mark.slow
def test_job_body_under_torchrun_trains_one_ddp_run_and_every_rank_returns_rank_zeros_metrics(
    tiny_model_dir: Path, sample_data: Path, tmp_path: Path, warm_python: WarmPython
) -> None:
    """What the SDK's job driver does on a multi-GPU instance, on CPU: torchrun starts 2 processes that each call
    run_training_job (gloo instead of NCCL); train() joins them in one DDP run."""
    config = {"model": str(tiny_model_dir), "dataset": str(sample_data), "epochs": 1, "per_device_batch_size": 8,
              "learning_rate": 5e-3, "max_seq_length": 32, "use_cpu": True}  # fmt: skip
    script = tmp_path / "job.py"
    script.write_text(
        "import json, os, sys\n"
        "from training_assets.remote_train import run_training_job\n"
        f"metrics = run_training_job({config!r})\n"
        f"out = os.path.join({str(tmp_path)!r}, 'rank' + os.environ['RANK'] + '.json')\n"
        "open(out, 'w').write(json.dumps(metrics))\n"
    )
    # torchrun's workers start warm (PYTHON_EXEC: tests/training_assets/warm_python.py).
    environment = warm_python.env(SM_MODEL_DIR=str(tmp_path / "model"), PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    subprocess.run([str(Path(sys.executable).with_name("torchrun")), "--nproc_per_node", "2", "--master_port", "29517",
                    str(script)], cwd=ROOT, env=environment, check=True, timeout=900)  # fmt: skip
    rank0, rank1 = (json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1))
    assert rank0 == rank1  # each rank uploads its return value to the same results key
    assert rank0["device"]["world_size"] == 2
    assert (tmp_path / "model" / "model.safetensors").is_file()
    assert json.loads((tmp_path / "model" / "metrics.json").read_text())["device"]["world_size"] == 2


def test_dependencies_are_made_self_contained_for_the_job(tmp_path: Path) -> None:
    (tmp_path / "instance").mkdir()
    (tmp_path / "instance" / "requirements.txt").write_text("# pins\ntransformers==5.23.0\n-r more.txt\n")
    (tmp_path / "instance" / "more.txt").write_text("datasets==5.2.0\n")
    (tmp_path / "requirements-remote.txt").write_text("-r instance/requirements.txt\nsagemaker-core==2.27.0\n")
    (tmp_path / "out").mkdir()
    flat = remote_train.self_contained_requirements(tmp_path / "requirements-remote.txt", into=tmp_path / "out")
    assert flat.name == "requirements-remote.txt"  # the job looks the file up by this name
    assert flat.read_text().splitlines() == ["transformers==5.23.0", "datasets==5.2.0", "sagemaker-core==2.27.0"]
    (tmp_path / "loop.txt").write_text("-r loop.txt\n")
    with pytest.raises(RemoteSetupError, match="includes itself"):
        remote_train.self_contained_requirements(tmp_path / "loop.txt", into=tmp_path / "out")
    # The repository's own file resolves: every include exists.
    assert "sagemaker-core==2.27.0" in remote_train.self_contained_requirements(remote_train.DEPENDENCIES).read_text()


def test_the_job_names_start_with_the_caller_of_the_config(offline_sdk: Path) -> None:
    """The caller comes from the config's owner tag (each caller fetches their own config.yaml); a config without
    one stops with a sentence that says which config to fetch."""
    config = remote_train.load_remote_config(offline_sdk)
    assert remote_train.config_caller(config) == "nlp"
    remote = config["SageMaker"]["PythonSDK"]["Modules"]["RemoteFunction"]
    assert remote["S3RootUri"].endswith("/jobs/nlp")
    remote["Tags"] = [tag for tag in remote["Tags"] if tag["Key"] != "remote-job-owner"]
    with pytest.raises(RemoteSetupError, match=r"config\.yaml names no caller"):
        remote_train.config_caller(config)
