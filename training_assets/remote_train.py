"""Run the sentiment fine-tuning as SageMaker training jobs with the SDK's ``@remote`` decorator.

Your caller's SDK config (``config.yaml``: your caller's role, S3 root, security group and owner tag, the KMS key,
VPC, image, instance type, tags) comes from the TrainingStack, one per caller of ``training.remote_callers``; run
from the repository root so the job gets ``training_assets/`` and the dependencies file:

    aws ssm get-parameter --name /pytorch-platform/dev/sagemaker/remote-function-config/<caller> \\
        --query Parameter.Value --output text > config.yaml
    python -m training_assets.remote_train --config config.yaml train -- \\
        --dataset s3://<datasets bucket>/tweet_eval/ --epochs 3 --torch-compile --bf16 --fused-adamw
    python -m training_assets.remote_train --config config.yaml sweep --learning-rates 1e-5,2e-5,5e-5 -- --epochs 2

``train`` blocks until its job ends and prints the metrics; ``sweep`` runs one job per learning rate through
``RemoteExecutor`` (``--max-parallel-jobs`` at a time) and prints the best. Each job's model (model and tokenizer,
safetensors) lands in ``<S3RootUri>/<job name>/output/model.tar.gz``, encrypted with the config's KMS key.

On a GPU type the job runs under torchrun with one process per GPU (DistributedDataParallel; 8 on ml.p4d.24xlarge,
the count from the platform's instance facts). ``--instance-count N`` runs one job on N instances: the SDK's
torchrun spans them (``algo-1`` ... ``algo-N``, static rendezvous on ``algo-1``), every process calls the same
function, and the instances reach each other through the caller's own security group, which admits its own
members (the Foundation stack's ``RemoteJobsSecurityGroup<Caller>``). The volume key follows the instance type
actually used: types with NVMe instance storage (p4d, p5, g5, ...) get none, as SageMaker requires; EBS-only types
(p3, ...) get the config's KMS key.

Checkpoints (``-- --checkpoint-steps N``) go to the job's ``/opt/ml/checkpoints``, which SageMaker copies to
``<your S3 root>/checkpoints/<run id>/`` (the SDK's ``CheckpointLocation``; SageMaker's CheckpointConfig) and back
into a restarted job; ``--spot`` runs on managed spot capacity, and an interrupted job resumes from its newest
complete checkpoint. ``--run-id`` names the checkpoint folder, so a new job with the same run id resumes too.
A job that compiles (torch.compile: on by default with a GPU) keeps TorchInductor's cache in ``compile-cache/`` of
that folder, with or without checkpoints: SageMaker restores it into every instance of a restarted job or of a job
with the same run id, which then loads the kernels compiled before instead of compiling them again.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import yaml

from training_assets.instance.dataset import TrainingInputError
from training_assets.instance.train_config import TrainConfig, parse_args
from training_assets.instance.train_sentiment import end_distributed, train
from training_assets.remote_jobs import OWNER_TAG_KEY, job_name_prefix

ROOT = Path(__file__).resolve().parents[1]
DEPENDENCIES = ROOT / "training_assets" / "requirements-remote.txt"
JOB_INPUT_DIR = Path("/opt/ml/input/remote")
REMOTE_FUNCTION = ("SageMaker", "PythonSDK", "Modules", "RemoteFunction")
COMPILE_CACHE = "compile-cache"  # TorchInductor's cache, in the job's checkpoint folder


class RemoteSetupError(ValueError):
    """The local set-up cannot start a job as asked; the message says what to fix."""


# ------------------------------------------------------------------------------------------- inside the training job


def download_once_per_instance(uri: str, target: Path) -> Path:
    """Copy an s3:// folder into ``target`` once per instance (the job role reads the datasets bucket).

    Under torchrun every process of the instance runs this: the first to take the lock downloads, the others wait
    for it and find the completion marker.
    """
    import fcntl

    target.mkdir(parents=True, exist_ok=True)
    done = target.with_name(f"{target.name}.done")  # beside the folder: the dataset reader sees only the data
    with open(target.with_name(f"{target.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.is_file():
            _download_folder(uri, target)
            done.write_text(uri)
    return target


def _download_folder(uri: str, target: Path) -> None:
    import boto3

    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    s3 = boto3.client("s3")
    count = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            relative = item["Key"][len(prefix) :].lstrip("/")
            if relative and not item["Key"].endswith("/"):
                (target / relative).parent.mkdir(parents=True, exist_ok=True)
                s3.download_file(bucket, item["Key"], str(target / relative))
                count += 1
    if not count:
        raise TrainingInputError(f"{uri} holds no files")


def run_training_job(config: dict[str, Any], checkpoints: os.PathLike[str] | None = None) -> dict[str, Any]:
    """The job's body: fetch S3 inputs, train, leave saved_model/ in SM_MODEL_DIR for SageMaker to upload.

    Under torchrun each GPU's process runs it (train() joins them in one DDP run); rank 0 writes the model, and
    every rank returns rank 0's metrics, since each process uploads its return value to the same results key.
    ``checkpoints``: the SDK's CheckpointLocation (the job's /opt/ml/checkpoints, which SageMaker keeps in S3): the
    run checkpoints there and resumes from the newest complete checkpoint it finds there, and keeps TorchInductor's
    cache in its ``compile-cache/`` (unless the config names another folder).
    """
    settings = TrainConfig(**config)
    for field, name in (("dataset", "dataset"), ("model", "base_model")):
        value = getattr(settings, field)
        if value.startswith("s3://"):
            local: dict[str, Any] = {field: str(download_once_per_instance(value, JOB_INPUT_DIR / name))}
            settings = replace(settings, **local)
    # The instance's processes share one tokenized copy (the output folder below is each process's own).
    settings = replace(settings, tokenized_dir=settings.tokenized_dir or str(JOB_INPUT_DIR / "tokenized"))
    if checkpoints is not None:
        cache = settings.compile_cache_dir or os.path.join(checkpoints, COMPILE_CACHE)
        settings = replace(settings, checkpoint_dir=os.fspath(checkpoints), compile_cache_dir=cache)
    with tempfile.TemporaryDirectory() as output:
        metrics = train(replace(settings, output_dir=output))
        if int(os.environ.get("RANK", "0")) == 0:
            model_dir = Path(os.environ.get("SM_MODEL_DIR", "/opt/ml/model"))
            shutil.copytree(Path(output) / "saved_model", model_dir, dirs_exist_ok=True)
            shutil.copy2(Path(output) / "metrics.json", model_dir / "metrics.json")
    shared = _rank_zero(metrics)
    end_distributed()
    return shared


def _rank_zero(metrics: dict[str, Any]) -> dict[str, Any]:
    """Rank 0's metrics on every rank of a torchrun job (the process group train() set up); as is otherwise."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return metrics
    shared = [metrics]
    dist.broadcast_object_list(shared, src=0)
    return shared[0]


# ------------------------------------------------------------------------------------------------------ local side


def only_training_code(path: str, names: list[str]) -> list[str]:
    """``copy_workdir`` filter: upload the ``.py`` files of ``training_assets/`` (and its code folders, such as
    ``instance/``) and nothing else of the working directory."""
    if Path(path).resolve() == ROOT:
        return [name for name in names if name != "training_assets"]
    keep = lambda name: name.endswith(".py") or Path(path, name).is_dir()  # noqa: E731
    return [name for name in names if name in ("__pycache__", "sample_data") or not keep(name)]


def load_remote_config(config_path: Path, image_uri: str | None = None) -> dict[str, Any]:
    """Read ``config_path`` (the whole SDK config), with ``image_uri`` replacing its ImageUri when given, checked
    against this machine (the image that will run is the one whose Python version must match)."""
    if not config_path.is_file():
        raise RemoteSetupError(f"{config_path} does not exist: fetch it with the FetchRemoteFunctionConfigCommand "
                               "output of the training stack")  # fmt: skip
    try:
        config = yaml.safe_load(config_path.read_text())
        settings = _remote_section(config)
    except (yaml.YAMLError, KeyError, TypeError):
        raise RemoteSetupError(f"{config_path} is not a SageMaker SDK config with a RemoteFunction section") from None
    if image_uri:
        settings["ImageUri"] = image_uri
    if Path.cwd().resolve() != ROOT:
        raise RemoteSetupError(f"run from the repository root ({ROOT}): the job imports training_assets/ from there")
    image = settings.get("ImageUri", "")
    python = image_python(image)
    local_python = f"{sys.version_info.major}.{sys.version_info.minor}"
    if python is not None and python != local_python:
        raise RemoteSetupError(
            f"the job image runs Python {python} but this is Python {local_python}; @remote needs the same "
            "major.minor version on both sides (use a matching virtualenv, or an image with your version via "
            "--image-uri)"
        )
    return config


def image_python(image_uri: str) -> str | None:
    """The Python (major.minor) that ``image_uri`` runs: the image table's fact for a training DLC it lists (the
    Amazon Linux 2023 DLC tags carry no Python version), else the ``pyXY`` part of the tag of an image of the user's
    own (AWS's older tag convention, e.g. ``-py311-``); None when neither says."""
    from platform_facts.images import fact_of_uri  # local side only: the job gets training_assets/ alone

    fact = fact_of_uri(image_uri)
    if fact is not None and fact.training is not None:
        return fact.training.python
    tag = image_uri.rpartition(":")[2] if ":" in image_uri.rpartition("/")[2] else ""
    spelled = re.search(r"(?:^|-)py(\d)(\d+)(?:-|$)", tag)
    return f"{spelled[1]}.{spelled[2]}" if spelled else None


def _remote_section(config: dict[str, Any]) -> dict[str, Any]:
    section = config
    for key in REMOTE_FUNCTION:
        section = section[key]
    if not isinstance(section, dict):
        raise TypeError("RemoteFunction is not a mapping")
    return section


def config_for_instance_type(config: dict[str, Any], instance_type: str | None) -> tuple[dict[str, Any], str]:
    """The config for a job on ``instance_type`` (default: the config's), and that type.

    SageMaker refuses ``VolumeKmsKeyId`` for types with NVMe instance storage (CreateTrainingJob,
    ResourceConfig.VolumeKmsKeyId), and the SDK takes it from the config whenever the config has one: so the key is
    dropped for those types and, for EBS-only types, set to the config's S3 KMS key (the platform key).
    """
    effective = copy.deepcopy(config)
    remote = _remote_section(effective)
    instance_type = instance_type or remote.get("InstanceType")
    if not instance_type:
        raise RemoteSetupError("no instance type: the config has no InstanceType; pass --instance-type")
    try:
        local_storage = _instance_facts(instance_type).local_nvme
    except ValueError as error:
        raise RemoteSetupError(str(error)) from None
    remote["InstanceType"] = instance_type
    key = remote.get("VolumeKmsKeyId") or remote.get("S3KmsKeyId")
    remote.pop("VolumeKmsKeyId", None)
    if key and not local_storage:
        remote["VolumeKmsKeyId"] = key
    return effective, instance_type


def _instance_facts(instance_type: str) -> Any:
    """The platform's facts of a SageMaker (``ml.``) type. Imported here, not at the top: the ``@remote`` job's
    workspace holds only training_assets/, and the job imports this module without calling this function."""
    from platform_facts.instances import instance_type as facts

    if not instance_type.startswith("ml."):
        raise ValueError(f"{instance_type!r} is not a SageMaker instance type such as ml.g5.2xlarge")
    return facts(instance_type)


def config_caller(config: dict[str, Any]) -> str:
    """The caller whose config.yaml this is (its owner tag): the job names must start with it, since the caller's
    launcher policy creates, describes and stops only training jobs named ``<caller>-...``
    (training_assets/remote_jobs.py)."""
    owners = [tag["Value"] for tag in _remote_section(config).get("Tags", []) if tag.get("Key") == OWNER_TAG_KEY]
    if len(owners) != 1:
        raise RemoteSetupError(f"config.yaml names no caller (tag {OWNER_TAG_KEY}): fetch your caller's config with "
                               "the training stack's FetchRemoteFunctionConfigCommand<Caller> output")  # fmt: skip
    return str(owners[0])


def self_contained_requirements(path: Path, *, into: Path | None = None) -> Path:
    """A copy of the requirements file ``path`` with its ``-r`` includes inlined, as the job needs it.

    The SDK uploads the dependency file alone and the job runs ``pip install -r <workspace>/<file name>``: an
    include such as ``-r requirements.txt`` would point at a file the job does not have.
    """
    target = (into or Path(tempfile.mkdtemp(prefix="remote-train-"))) / path.name
    target.write_text("".join(f"{line}\n" for line in _inlined(path, seen=())))
    return target


def _inlined(path: Path, seen: tuple[Path, ...]) -> list[str]:
    if path.resolve() in seen:
        raise RemoteSetupError(f"{path} includes itself")
    if not path.is_file():
        raise RemoteSetupError(f"dependencies file {path} does not exist")
    lines: list[str] = []
    for line in path.read_text().splitlines():
        include = re.match(r"^\s*(-r|--requirement)[\s=]+(\S+)", line)
        if include:
            lines += _inlined(path.parent / include[2], (*seen, path.resolve()))
        elif line.strip() and not line.lstrip().startswith("#"):
            lines.append(line.strip())
    return lines


def job_options(args: argparse.Namespace, config: dict[str, Any]) -> dict[str, Any]:
    """Decorator/executor arguments; the rest (role, S3, KMS, VPC, tags) comes from the config through the session.

    The session carries the config adjusted to the instance type (volume key), so nothing reads config.yaml again.
    On a GPU type, torchrun starts one process per GPU (the SDK's bootstrap sets nproc_per_node to the GPUs it
    finds; without it the function runs in one process and train() falls back to nn.DataParallel).
    """
    from sagemaker.core.helper.session_helper import Session

    effective, instance_type = config_for_instance_type(config, args.instance_type)
    gpu = _instance_facts(instance_type).gpu
    torchrun = gpu is not None or args.instance_count > 1
    options: dict[str, Any] = {
        "sagemaker_session": Session(sagemaker_config=effective),
        "instance_type": instance_type,
        # Several instances only under torchrun (the SDK refuses instance_count > 1 otherwise), one process per GPU
        # as the instance facts count them (one on a CPU type).
        "instance_count": args.instance_count,
        "use_torchrun": torchrun,
        "nproc_per_node": (gpu.count if gpu else 1) if torchrun else None,
        "dependencies": str(self_contained_requirements(DEPENDENCIES)),
        "include_local_workdir": True,
        "custom_file_filter": only_training_code,
        "job_name_prefix": job_name_prefix(config_caller(config)) + args.job_name_prefix,
        "keep_alive_period_in_seconds": args.keep_alive_seconds,
        "max_runtime_in_seconds": args.max_runtime_hours * 3600,
        "volume_size": args.volume_gib,
    }
    if args.spot:
        # Managed spot: SageMaker waits up to MaxWaitTimeInSeconds (>= the run time) for capacity and restarts an
        # interrupted job, which resumes from the checkpoints SageMaker restores (CreateTrainingJob, StoppingCondition).
        options.update(use_spot_instances=True, max_wait_time_in_seconds=args.max_wait_hours * 3600)
    return options


def checkpoint_location(args: argparse.Namespace, config: dict[str, Any], train_config: TrainConfig,
                        suffix: str = "") -> Any:  # fmt: skip
    """The SDK's CheckpointLocation for the run (None without checkpoints and without torch.compile): ``<caller's S3
    root>/checkpoints/<run id><suffix>/``, in the RemoteJobs bucket the caller's job role writes (SSE-KMS by the
    bucket's default key); it holds the checkpoints and TorchInductor's cache (``compile-cache/``)."""
    compiles = train_config.torch_compile is not False or bool(train_config.compile_optimizer)
    if not (train_config.checkpoint_steps or compiles):
        return None
    from sagemaker.core.remote_function import CheckpointLocation

    root = _remote_section(config)["S3RootUri"]
    return CheckpointLocation(f"{root}/checkpoints/{args.run_id}{suffix}/")


def remote_training_job(args: argparse.Namespace, config: dict[str, Any]) -> Callable[..., dict[str, Any]]:
    from sagemaker.core.remote_function import remote

    return remote(run_training_job, **job_options(args, config))


def remote_executor(args: argparse.Namespace, config: dict[str, Any]) -> Any:
    from sagemaker.core.remote_function import RemoteExecutor

    return RemoteExecutor(max_parallel_jobs=args.max_parallel_jobs, **job_options(args, config))


def sweep(args: argparse.Namespace, sdk_config: dict[str, Any], config: TrainConfig) -> list[dict[str, Any]]:
    """One job per learning rate, ``max_parallel_jobs`` at a time; returns the rows best-first by macro-F1."""
    with remote_executor(args, sdk_config) as executor:
        futures = {rate: executor.submit(run_training_job, asdict(replace(config, learning_rate=rate)),
                                         checkpoint_location(args, sdk_config, config, f"-lr{rate:g}"))
                   for rate in args.learning_rates}  # fmt: skip
    rows = []
    for rate, future in futures.items():
        metrics = future.result()
        last = metrics["epochs"][-1]
        rows.append({"learning_rate": rate, "eval_macro_f1": last["eval_macro_f1"],
                     "eval_accuracy": last["eval_accuracy"],
                     "train_samples_per_second": metrics["throughput"]["train_samples_per_second"]})  # fmt: skip
    return sorted(rows, key=lambda row: row["eval_macro_f1"], reverse=True)


def _learning_rates(text: str) -> list[float]:
    try:
        rates = [float(value) for value in text.split(",") if value.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"learning rates must be comma-separated numbers, got {text!r}") from None
    if not rates or any(not 0 < rate < 1 for rate in rates) or len(set(rates)) != len(rates):
        raise argparse.ArgumentTypeError(f"learning rates must be distinct numbers between 0 and 1, got {text!r}")
    return rates


def parse(argv: list[str] | None = None) -> tuple[argparse.Namespace, TrainConfig]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("config.yaml"), help="SageMaker SDK config.yaml")
    parser.add_argument("--instance-type", help="override the config's InstanceType, e.g. ml.g5.2xlarge")
    parser.add_argument("--image-uri", help="override the config's ImageUri")
    parser.add_argument("--job-name-prefix", default="sentiment")
    parser.add_argument("--max-runtime-hours", type=int, default=24)
    parser.add_argument("--volume-gib", type=int, default=100)
    parser.add_argument("--keep-alive-seconds", type=int, default=0, help="warm pool between jobs (0: none)")
    parser.add_argument("--instance-count", type=int, default=1, help="instances of one job (torchrun spans them)")
    parser.add_argument("--spot", action="store_true", help="managed spot capacity; needs -- --checkpoint-steps N")
    parser.add_argument(
        "--max-wait-hours",
        type=int,
        default=None,
        help="spot: hours SageMaker may wait for capacity and run (default: 2 x --max-runtime-hours)",
    )
    parser.add_argument("--run-id", default=None, help="names the run's checkpoint folder; a job with the same run id "
                        "resumes from it (default: <job name prefix>-<UTC time>)")  # fmt: skip
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("train", help="one training job; waits for it and prints its metrics")
    sweep_parser = commands.add_parser("sweep", help="one job per learning rate through RemoteExecutor")
    sweep_parser.add_argument("--learning-rates", type=_learning_rates, required=True, help="e.g. 1e-5,2e-5,5e-5")
    sweep_parser.add_argument("--max-parallel-jobs", type=int, default=2)
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    if args.command == "sweep" and args.max_parallel_jobs < 1:
        parser.error("--max-parallel-jobs must be at least 1")
    if args.instance_count < 1:
        parser.error("--instance-count must be at least 1")
    args.max_wait_hours = args.max_wait_hours or 2 * args.max_runtime_hours
    if args.max_wait_hours < args.max_runtime_hours:
        parser.error("--max-wait-hours must be at least --max-runtime-hours (SageMaker's MaxWaitTimeInSeconds)")
    if args.run_id is not None and not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", args.run_id):
        parser.error("--run-id must be 1-64 letters, digits, '.', '_' or '-'")
    args.run_id = args.run_id or f"{args.job_name_prefix}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    config = parse_args(argv[split + 1 :])
    if args.spot and not config.checkpoint_steps:
        parser.error("--spot needs checkpoints (-- --checkpoint-steps N): an interrupted job resumes from them")
    return args, config


def main(argv: list[str] | None = None) -> int:
    try:
        args, config = parse(argv)
        sdk_config = load_remote_config(args.config, args.image_uri)
        if args.command == "train":
            location = checkpoint_location(args, sdk_config, config)
            metrics = remote_training_job(args, sdk_config)(asdict(config), location)
            print(json.dumps({"epochs": metrics["epochs"], "throughput": metrics["throughput"]}, indent=2))
        else:
            for row in sweep(args, sdk_config, config):
                print(json.dumps(row))
    except (RemoteSetupError, TrainingInputError) as error:
        print(f"remote_train: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
