"""The path a user runs is the fast one: each entry point is run (tiny model, CPU, the shipped sample data) and its
metrics.json says what the run did: bucketed padding with batches of one bucket, the optimizer step compiled whenever
the model is, and a padding fraction of 0.4 or less (0.86 when every text is padded to max_seq_length).

Entry points: train_sentiment.py with its defaults; launch_training.sh (the container's torchrun launch) and
ec2_run.sh (the GPU instance's run, with the training stack's own arguments), both through a docker stand-in that
runs the container's command on this machine; the @remote job body with what ``remote_train train`` sends it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from stacks.settings import HyperParameters, TrainingSettings
from stacks.training import train_arguments
from training_assets import remote_train
from training_assets.instance.hardware import bf16_native
from training_assets.instance.train_config import TrainConfig
from training_assets.instance.train_sentiment import main

# The SDK's config validated once per distinct config (tests/conftest.py): ~1 CPU-s per job otherwise.
pytestmark = pytest.mark.usefixtures("sdk_config_validated_once")

ROOT = Path(__file__).resolve().parents[2]
MODULE = "training_assets.instance.train_sentiment"
# The target for the shipped sample data (8.8 tokens per text on average, 64 positions).
MOST_PADDING = 0.4


def assert_fast_path(metrics: dict[str, Any]) -> None:
    config = metrics["config"]
    assert (config["padding"], config["group_by_length"]) == ("bucketed", True)
    assert config["compile_optimizer"] == config["torch_compile"]  # with a GPU both default to on
    assert 0 < metrics["throughput"]["padding_fraction"] <= MOST_PADDING


@pytest.mark.slow
def test_train_sentiment_defaults(tiny_model_dir: Path, sample_data: Path, tmp_path: Path) -> None:
    """The CLI's main() with no training flag, in this process (``python -m`` of the module is run by
    test_train_sentiment.py and test_dataset.py, and under torchrun by the launch_training.sh test below)."""
    code = main(["--model", str(tiny_model_dir), "--dataset", str(sample_data), "--output-dir", str(tmp_path / "out"),
                 "--use-cpu"])  # fmt: skip
    assert code == 0
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert_fast_path(metrics)
    defaults = TrainConfig()
    assert metrics["config"]["epochs"] == defaults.epochs
    assert metrics["config"]["per_device_batch_size"] == defaults.per_device_batch_size


@pytest.mark.slow
def test_remote_job_with_what_remote_train_sends(
    tiny_model_dir: Path, sample_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``remote_train train -- ARGS`` parses ARGS on the laptop and sends ``asdict(config)`` to the job, where
    run_training_job trains (the SageMaker side of this is tests/training_assets/test_remote_sdk_moto.py)."""
    monkeypatch.setenv("SM_MODEL_DIR", str(tmp_path / "model"))
    _, config = remote_train.parse(["train", "--", "--model", str(tiny_model_dir), "--dataset", str(sample_data),
                                    "--use-cpu"])  # fmt: skip
    remote_train.run_training_job(asdict(config))
    assert_fast_path(json.loads((tmp_path / "model" / "metrics.json").read_text()))


# A stand-in for docker, nvidia-smi and aws: records its calls; `docker run` of the training image runs the
# container's command here (mounts mapped to their host folders, torchrun as `python -m torch.distributed.run`);
# `aws s3 sync/cp` and `aws s3api put-object` copy between s3://BUCKET/KEY and $S3_ROOT/BUCKET/KEY.
STAND_IN = r"""#!{python}
import json, os, shutil, subprocess, sys
from pathlib import Path
name, args = Path(sys.argv[0]).name, sys.argv[1:]
with open(os.environ["CALLS"], "a") as calls:
    calls.write(json.dumps([name, *args]) + "\n")
def local(uri):
    return Path(os.environ["S3_ROOT"], uri.removeprefix("s3://")) if uri.startswith("s3://") else Path(uri)
if name == "nvidia-smi":
    print("GPU 0: NVIDIA A100-SXM4-40GB")
elif name == "curl":
    url = next(arg for arg in args if arg.startswith("http"))
    print("token" if url.endswith("/api/token") else {{"instance-id": "i-0abc", "reservation-id": "r-0123",
          "local-ipv4": "10.0.1.7"}}[url.rsplit("/", 1)[-1]], end="")
elif name == "aws" and args[:2] == ["ec2", "describe-instances"]:  # one node, tagged by the launcher
    print("10.0.1.7\ti-0abc\tr-0123")
elif name == "aws" and args[:2] == ["s3api", "list-objects-v2"]:  # [[key, size], ...] or null, as the CLI prints
    bucket = Path(os.environ["S3_ROOT"], args[args.index("--bucket") + 1])
    prefix = args[args.index("--prefix") + 1]
    rows = sorted([str(p.relative_to(bucket)), p.stat().st_size] for p in bucket.rglob("*") if p.is_file()
                  and str(p.relative_to(bucket)).startswith(prefix))
    print(json.dumps(rows or None))
elif name == "aws" and args[:2] == ["s3", "cp"] and args[-1] == "-":  # to stdout
    if not local(args[-2]).exists():
        sys.exit(1)
    print(local(args[-2]).read_text(), end="")
elif name == "aws" and args[:2] == ["s3api", "head-object"]:  # a finished run's model.tar.gz exists
    bucket, key = args[args.index("--bucket") + 1], args[args.index("--key") + 1]
    sys.exit(0 if Path(os.environ["S3_ROOT"], bucket, key).exists() else 254)
elif name == "aws" and args[:2] == ["ecr", "get-login-password"]:
    print("password")
elif name == "aws" and args[:2] == ["s3", "sync"]:  # from a prefix that holds nothing: nothing copied, as aws does
    if local(args[-2]).exists():
        shutil.copytree(local(args[-2]), local(args[-1]), dirs_exist_ok=True)
elif name == "aws" and args[:2] == ["s3", "cp"] and local(args[-2]).exists():
    local(args[-1]).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(local(args[-2]), local(args[-1]))
elif name == "aws" and args[:2] == ["s3api", "put-object"]:  # a write-once upload
    target = Path(os.environ["S3_ROOT"], args[args.index("--bucket") + 1], args[args.index("--key") + 1])
    if target.exists():
        sys.exit(254)  # S3's 412 to If-None-Match
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(args[args.index("--body") + 1], target)
elif name == "docker" and args[:1] == ["login"]:
    sys.stdin.read()
elif name == "docker" and args[:1] == ["run"]:  # the training container, and the packaging one
    mounts, env, i, workdir = {{}}, dict(os.environ), 1, None
    while args[i].startswith("-"):
        value = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("-") else None
        if args[i] == "-v":
            host, container = value.split(":")[:2]
            mounts[container] = host
        elif args[i] == "-e":
            key, _, val = value.partition("=")
            env[key] = val
        elif args[i] == "-w":
            workdir = value
        i += 2 if value is not None and args[i] in ("-v", "-e", "-w", "--log-driver", "--log-opt", "--ulimit",
                                                   "--gpus", "--network", "--user", "--security-opt",
                                                   "--device") else 1
    command = args[i + 1:]  # after the image
    for container, host in sorted(mounts.items(), key=lambda item: -len(item[0])):
        command = [arg.replace(container, host) for arg in command]
        workdir = workdir.replace(container, host) if workdir else workdir
    env["PATH"] = os.environ["STAND_IN_BIN"] + os.pathsep + env["PATH"]
    sys.exit(subprocess.run(command, env=env, cwd=workdir).returncode)
elif name == "torchrun":
    os.execv(sys.executable, [sys.executable, "-m", "torch.distributed.run", *args])
elif name == "python":
    os.execv(sys.executable, [sys.executable, *args])
"""


ROLE_ID = "AROATRAINING"


@pytest.fixture()
def stand_ins(tmp_path: Path, tiny_model_dir: Path, sample_data: Path) -> dict[str, Any]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("aws", "curl", "docker", "nvidia-smi", "torchrun", "python", "iptables"):
        (bin_dir / name).write_text(STAND_IN.format(python=sys.executable))
        (bin_dir / name).chmod(0o755)
    s3 = tmp_path / "s3"
    shutil.copytree(sample_data, s3 / "dev-datasets" / "tweets")
    shutil.copytree(tiny_model_dir, s3 / "dev-datasets" / "models" / "tiny")
    # The launcher's record of this launch: this node is the run's one writer (run_lineage.py).
    record = s3 / "dev-artifacts" / "training-output" / "r-0123" / "launches" / "r-0123.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"run_id": "r-0123", "reservation_id": "r-0123", "writers": [f"{ROLE_ID}:i-0abc"]}))
    work = tmp_path / "work"
    for folder in ("training_assets/instance", "inference_assets"):  # what the user data unpacks
        shutil.copytree(ROOT / folder, work / folder)
    env = {
        "PATH": f"{bin_dir}{os.pathsep}/usr/bin:/bin",
        "STAND_IN_BIN": str(bin_dir),
        "CALLS": str(tmp_path / "calls.jsonl"),
        "S3_ROOT": str(s3),
        # The container has the repository's package on its path (Dockerfile: PYTHONPATH=/opt/training).
        "PYTHONPATH": str(ROOT),
        "HOME": str(tmp_path),
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
    }
    return {"env": env, "work": work, "s3": s3, "tmp": tmp_path}


@pytest.mark.slow
def test_launch_training_sh_without_training_flags(stand_ins: dict[str, Any], tiny_model_dir: Path,
                                                   sample_data: Path) -> None:  # fmt: skip
    output = stand_ins["tmp"] / "output"
    result = subprocess.run(
        ["bash", str(ROOT / "training_assets/instance/launch_training.sh"), "--data-dir", str(sample_data),
         "--model-dir", str(tiny_model_dir), "--output-dir", str(output)],
        env=stand_ins["env"], check=False, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert_fast_path(json.loads((output / "metrics.json").read_text()))


@pytest.mark.slow
def test_ec2_run_with_the_training_stacks_arguments(stand_ins: dict[str, Any]) -> None:
    """The EC2 run with TRAIN_ARGS as the training stack writes them (--torch-compile --bf16 --fused-adamw and the
    hyper-parameters), one epoch. torch.compile's own switch (TORCH_COMPILE_DISABLE=1) keeps CPU code generation,
    minutes on a shared machine, out of this test: what it checks is the configuration the EC2 run arrives at from the
    stack's arguments; what compiling does is tested in test_fast_path (one graph per bucket length, the optimizer
    step compiled once)."""
    arguments = train_arguments(HyperParameters(epochs=1))
    if not bf16_native(use_cuda=False):  # this CPU cannot run --bf16 (the stack's default, for GPUs)
        arguments = ["--no-bf16" if arg == "--bf16" else arg for arg in arguments]
    env = {
        **stand_ins["env"],
        "TORCH_COMPILE_DISABLE": "1",
        "AWS_REGION": "us-west-2", "DLC_ACCOUNT": "763104351884", "REGISTRY_DOMAIN": "amazonaws.com",
        "DLC_REPOSITORY": TrainingSettings().image.repository, "IMAGE_TAG": TrainingSettings().image_tag,
        "LOG_GROUP": "dev-training-logs",
        "ARTIFACTS_BUCKET": "dev-artifacts", "OUTPUT_PREFIX": "training-output/", "KMS_KEY_ID": "key",
        "INSTANCE_ROLE_ID": ROLE_ID,
        "DATASET": "s3://dev-datasets/tweets/", "BASE_MODEL": "s3://dev-datasets/models/tiny/", "EFA": "false",
        "TRAIN_ARGS": " ".join(arguments),
    }  # fmt: skip
    result = subprocess.run(["bash", "training_assets/instance/ec2_run.sh"], cwd=stand_ins["work"], env=env,
                            check=False, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    uploaded = stand_ins["s3"] / "dev-artifacts" / "training-output" / "r-0123" / "nodes" / f"{ROLE_ID}:i-0abc"
    uploaded = uploaded / "metrics.json"  # into this instance's own folder of the run
    # The packaged archive and the SHA-256 the run recorded as it wrote it (what promotion compares).
    archive = (uploaded.parent / "model.tar.gz").read_bytes()
    digest = (uploaded.parent / "model.tar.gz.sha256").read_text()
    assert digest == f"{hashlib.sha256(archive).hexdigest()}  model.tar.gz\n"
    metrics = json.loads(uploaded.read_text())
    assert_fast_path(metrics)
    assert metrics["config"]["torch_compile"] and metrics["optimizer_step"].startswith("compiled")
    assert metrics["config"]["max_seq_length"] == HyperParameters().max_seq_length  # what the stack sends
    assert metrics["max_seq_length"] == 64  # the tiny model's limit
    # TorchInductor's cache: the container's folder (here the host folder the stand-in maps it to; its S3 copy is
    # test_ec2_run's and test_ec2_run_moto's).
    assert metrics["host"]["inductor_cache_dir"] == str(stand_ins["work"] / "compile-cache")
