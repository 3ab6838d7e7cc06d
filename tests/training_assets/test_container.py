"""The training container: the Dockerfile's base image and pins, and the docker/torchrun commands of the launcher."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "training_assets" / "instance"
LAUNCHER = ASSETS / "launch_training.sh"

# Modules the instance's host runs itself (standard library and the AWS CLI), not the training container.
HOST_ONLY = {"ship_logs.py", "run_lineage.py"}


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.-]+)==(\S+)$", line.strip())
        if match:
            pins[match[1].lower()] = match[2]
    return pins


def test_dockerfile_extends_the_training_dlc_that_ec2_run_names() -> None:
    """The base is DLC_REPOSITORY:BASE_TAG with no default (ec2_run.sh passes the user data's DLC_REPOSITORY and
    IMAGE_TAG, the image table's entry for training.image_tag): no second copy of the image to fall out of date."""
    dockerfile = (ASSETS / "Dockerfile").read_text()
    defaults = dict(re.findall(r"^ARG (\w+)=(\S+)$", dockerfile, flags=re.MULTILINE))
    assert defaults == {"DLC_ACCOUNT": "763104351884", "REGION": "us-west-2", "REGISTRY_DOMAIN": "amazonaws.com"}
    assert {"DLC_REPOSITORY", "BASE_TAG"} <= set(re.findall(r"^ARG (\w+)$", dockerfile, flags=re.MULTILINE))
    assert re.search(
        r"^FROM \$\{DLC_ACCOUNT\}\.dkr\.ecr\.\$\{REGION\}\.\$\{REGISTRY_DOMAIN\}/\$\{DLC_REPOSITORY\}:\$\{BASE_TAG\}$",
        dockerfile,
        flags=re.MULTILINE,
    )
    run = (ASSETS / "ec2_run.sh").read_text()
    assert '--build-arg "DLC_REPOSITORY=$DLC_REPOSITORY"' in run and '--build-arg "BASE_TAG=$IMAGE_TAG"' in run
    assert "-r requirements.txt" in dockerfile and "ENV PYTHONPATH=/opt/training" in dockerfile
    # Every Python module of the package is copied under its package path (so `python -m` finds them all).
    joined = dockerfile.replace("\\\n", " ")  # continuation lines
    copied = re.search(r"^COPY (.+) training_assets/instance/$", joined, flags=re.MULTILINE)
    assert copied and set(copied[1].split()) == {p.name for p in ASSETS.glob("*.py") if p.name not in HOST_ONLY}


def test_container_pins_match_the_tested_versions() -> None:
    container = _pins(ASSETS / "requirements.txt")
    tested = _pins(ROOT / "requirements-dev.txt")
    assert set(container) == {"transformers", "tokenizers", "safetensors", "datasets", "accelerate"}
    assert "torch" not in container, "the DLC's CUDA build of torch must not be replaced"
    for package, version in container.items():
        assert tested[package] == version, f"{package}: container {version}, tests {tested[package]}"


def _launch(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(LAUNCHER), "--dry-run", *args],
        check=False,
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )


def _command(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> list[str]:
    result = _launch(*args, cwd=cwd, env=env)
    assert result.returncode == 0, result.stderr
    return shlex.split(result.stdout)


MODULE = "training_assets.instance.train_sentiment"


def _in_container(after_image: list[str]) -> list[str]:
    """The container runs ``bash -c '<input check> && exec torchrun ... --module MODULE "$@"' launch_training ARGS``:
    check that shape and return the torchrun command as it runs (its options, then ARGS)."""
    assert after_image[:2] == ["bash", "-c"] and after_image[3] == "launch_training"
    check, _, run = after_image[2].partition(" && exec ")
    assert shlex.split(check) == ["python", "-m", MODULE, "--check-only", "$@"]
    torchrun = shlex.split(run)
    assert torchrun[-3:] == ["--module", MODULE, "$@"]
    return [*torchrun[:-1], *after_image[4:]]


def _split(command: list[str]) -> tuple[list[str], list[str]]:
    """(docker options, torchrun and script arguments) around the image name."""
    index = command.index("sentiment-training:latest")
    return command[:index], _in_container(command[index + 1 :])


def test_single_node_command(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    docker, inside = _split(
        _command(
            "--gpus",
            "8",
            "--data-dir",
            str(data),
            "--output-dir",
            str(tmp_path / "out"),
            "--",
            "--torch-compile",
            "--bf16",
            "--fused-adamw",
        )
    )
    assert docker[:3] == ["docker", "run", "--rm"]
    for flag in ("--gpus", "--ipc=host", "--shm-size=16g", "--ulimit"):
        assert flag in docker
    assert "memlock=-1" in docker and "stack=67108864" in docker
    assert "--privileged" not in docker and "--network" not in docker
    assert "NCCL_DEBUG=INFO" not in docker and "--expect-efa" not in inside  # no EFA, nothing to check
    assert f"{data}:/opt/ml/input/data:ro" in docker and f"{tmp_path / 'out'}:/opt/ml/output" in docker
    assert inside == [
        "torchrun",
        "--nproc_per_node=8",
        "--standalone",
        "--nnodes=1",
        "--max-restarts=0",
        "--module",
        MODULE,
        "--output-dir",
        "/opt/ml/output",
        "--tokenized-dir",
        "/opt/ml/output/tokenized",
        "--dataset",
        "/opt/ml/input/data",
        "--torch-compile",
        "--bf16",
        "--fused-adamw",
    ]


def test_multi_node_command_meets_at_the_barrier_then_uses_c10d_rendezvous_over_efa(tmp_path: Path) -> None:
    for card in range(2):
        (tmp_path / f"uverbs{card}").touch()
    docker, inside = _split(
        _command(
            "--gpus",
            "8",
            "--nnodes",
            "2",
            "--rdzv-endpoint",
            "10.0.1.5:29500",
            "--rdzv-id",
            "r-0abc",
            "--nodes",
            "i-1@10.0.1.5,i-2@10.0.1.9",
            "--node",
            "i-2@10.0.1.9",
            "--rendezvous-timeout",
            "300",
            "--max-restarts",
            "2",
            "--efa",
            "--log-group",
            "/training",
            "--log-stream",
            "i-1",
            env={"EFA_DEVICE_DIR": str(tmp_path)},
        )
    )
    # The EFA devices passed through (AWS Batch's EFA jobs do the same), never --privileged; the host network for
    # the rendezvous and NCCL's bootstrap; an unprivileged user whose IMDS packets the host rejects (ec2_run.sh).
    assert "--privileged" not in docker and docker[docker.index("--network") + 1] == "host"
    assert [docker[i + 1] for i, arg in enumerate(docker) if arg == "--device"] == [
        f"{tmp_path}/uverbs0", f"{tmp_path}/uverbs1"]  # fmt: skip
    assert docker[docker.index("--user") + 1] == "2000:2000" and "no-new-privileges" in docker
    assert "FI_PROVIDER=efa" in docker and "FI_EFA_USE_DEVICE_RDMA=1" in docker
    assert docker[docker.index("--log-driver") + 1] == "awslogs" and "awslogs-group=/training" in docker
    # rendezvous.py holds the barrier, then starts torchrun with the c10d flags bounded by the same 300 s.
    assert inside[: inside.index("--module")] == [
        "python", "-m", "training_assets.instance.rendezvous", "--nodes", "i-1@10.0.1.5,i-2@10.0.1.9",
        "--node", "i-2@10.0.1.9", "--endpoint", "10.0.1.5:29500", "--run-id", "r-0abc", "--timeout", "300",
        "--max-restarts", "2", "--record", "/opt/ml/output/rendezvous.json", "--", "--nproc_per_node=8",
    ]  # fmt: skip
    # NCCL logs the network it chose, and the script stops a run that fell back to TCP sockets (test_hardware.py).
    assert {"NCCL_DEBUG=INFO", "NCCL_DEBUG_SUBSYS=INIT,NET", "NCCL_DEBUG_FILE=/tmp/nccl.%h.%p.log"} <= set(docker)
    assert "--expect-efa" in inside


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--gpus", "8", "--nnodes", "2"), "--nnodes 2 needs --rdzv-endpoint HOST:PORT"),
        (("--gpus", "8", "--nnodes", "2", "--rdzv-endpoint", "h:1", "--nodes", "a"), "--nnodes 2 needs --nodes with 2"),
        (
            ("--gpus", "8", "--nnodes", "2", "--rdzv-endpoint", "h:1", "--nodes", "a,b", "--node", "c"),
            "--node must be one of --nodes (a,b)",
        ),
        (("--gpus", "8", "--max-restarts", "-1"), "--max-restarts must be 0 or more"),
        (("--gpus", "0"), "--gpus must be a positive number"),
        (("--gpus", "8", "--bogus"), "unknown option --bogus"),
    ],
)
def test_bad_launch_options(args: tuple[str, ...], message: str) -> None:
    result = _launch(*args)
    assert result.returncode == 2 and message in result.stderr and not result.stdout


def test_gpu_count_comes_from_nvidia_smi(tmp_path: Path) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text('#!/bin/sh\nfor i in 0 1 2 3; do echo "GPU $i: NVIDIA A100-SXM4-40GB"; done\n')
    (fake / "nvidia-smi").chmod(0o755)
    result = subprocess.run(
        ["bash", str(LAUNCHER), "--dry-run"],
        check=False,
        capture_output=True,
        text=True,
        env={"PATH": f"{fake}:/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    assert "--nproc_per_node=4" in _split(shlex.split(result.stdout))[1]


@pytest.mark.parametrize(("check_status", "trains"), [(0, True), (2, False)])
def test_the_input_check_runs_once_before_torchrun(tmp_path: Path, check_status: int, trains: bool) -> None:
    """The container's bash -c script, run with stand-ins for python and torchrun: arguments with spaces and commas
    arrive intact, and a failed input check (exit 2) is the container's exit status, with no torchrun at all."""
    command = _command("--gpus", "2", "--", "--labels", "bad news,meh", "--epochs", "1")
    after_image = command[command.index("sentiment-training:latest") + 1 :]
    fake = tmp_path / "bin"
    fake.mkdir()
    for name, status in (("python", check_status), ("torchrun", 0)):
        (fake / name).write_text(f'#!/bin/bash\nprintf "%s\\n" "{name}" "$@" >> "$CALLS"\nexit {status}\n')
        (fake / name).chmod(0o755)
    calls = tmp_path / "calls"
    result = subprocess.run(after_image, check=False, capture_output=True, text=True,
                            env={"PATH": f"{fake}:/usr/bin:/bin", "CALLS": str(calls)})  # fmt: skip
    assert result.returncode == check_status
    recorded = calls.read_text().split("\n")
    arguments = ["--output-dir", "/opt/ml/output", "--tokenized-dir", "/opt/ml/output/tokenized", "--labels",
                 "bad news,meh", "--epochs", "1"]  # fmt: skip
    check = ["python", "-m", MODULE, "--check-only", *arguments]
    torchrun = ["torchrun", "--nproc_per_node=2", "--standalone", "--nnodes=1", "--max-restarts=0", "--module", MODULE,
                *arguments]  # fmt: skip
    assert recorded[:-1] == (check + torchrun if trains else check)


def test_an_efa_run_without_efa_devices_stops_with_one_line(tmp_path: Path) -> None:
    result = _launch("--gpus", "8", "--efa", env={"EFA_DEVICE_DIR": str(tmp_path)})
    assert result.returncode == 2 and result.stdout == ""
    assert (
        result.stderr
        == f"launch_training.sh: error: --efa: no EFA device under {tmp_path} (is the EFA driver loaded?)\n"
    )


def test_the_container_user_is_never_root() -> None:
    result = _launch("--gpus", "8", env={"CONTAINER_USER": "0:0"})
    assert result.returncode == 2 and "CONTAINER_USER must be uid:gid other than root, got '0:0'" in result.stderr
