"""The instance-side run script (ec2_run.sh) against recording stand-ins for aws, curl, docker and nvidia-smi:
node discovery and the run id, the image (pulled by digest or built), inputs staged on NVMe or the root volume, the
checkpoint restore and upload, the barrier and torchrun launch, packaging and upload happen in order with the right
arguments. Also the log shipper's batching within the CloudWatch Logs API limits."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stacks.settings import TrainingSettings
from training_assets.instance import ship_logs

ROOT = Path(__file__).resolve().parents[2]
# The nodes' training DLC as the stack exports it (the image table's entry for the default training.image_tag).
IMAGE = TrainingSettings().image

MODULE = "training_assets.instance.train_sentiment"


def _in_container(after_image: list[str]) -> list[str]:
    """As in test_container: the container runs
    ``bash -c '<input check> && exec torchrun ... --module MODULE "$@"' launch_training ARGS``; check that shape and
    return the torchrun command as it runs (its options, then ARGS)."""
    assert after_image[:2] == ["bash", "-c"] and after_image[3] == "launch_training"
    check, _, run = after_image[2].partition(" && exec ")
    assert shlex.split(check) == ["python", "-m", MODULE, "--check-only", "$@"]
    torchrun = shlex.split(run)
    assert torchrun[-3:] == ["--module", MODULE, "$@"]
    return [*torchrun[:-1], *after_image[4:]]


# One stand-in for every command: records its argv, answers what ec2_run.sh reads, and plays the training
# container (rank 0 writes saved_model/ and metrics.json into the mounted output folder when SAVES_MODEL is set).
FAKE = r"""#!{python}
import json, os, sys, time
from pathlib import Path
name, args = Path(sys.argv[0]).name, sys.argv[1:]
with open(os.environ["CALLS"], "a") as calls:
    calls.write(json.dumps([name, *args]) + "\n")
if name == "curl":
    url = next(arg for arg in args if arg.startswith("http"))
    print("token" if url.endswith("/api/token") else {{"instance-id": "i-0abc", "reservation-id": "r-0123",
          "local-ipv4": "10.0.1.7"}}[url.rsplit("/", 1)[-1]], end="")
elif name == "nvidia-smi":
    print("\n".join(f"GPU {{i}}: NVIDIA A100-SXM4-40GB" for i in range(8)))
elif name == "aws" and args[:2] == ["ec2", "describe-instances"]:
    print(os.environ["PEERS"].replace(";", "\n"))
elif name == "aws" and args[:2] == ["s3api", "head-object"]:
    sys.exit(0 if os.environ.get("FINISHED") else 254)  # 254: the CLI's status for a 404
elif name == "aws" and args[:2] == ["ecr", "get-login-password"]:
    print("password")
elif name == "aws" and args[:2] == ["s3", "sync"]:
    Path(args[-1]).mkdir(parents=True, exist_ok=True)
elif name == "aws" and args[:2] == ["s3api", "list-objects-v2"]:  # the bucket's objects as `aws s3 cp` wrote them
    bucket = Path(os.environ["S3_ROOT"], args[args.index("--bucket") + 1])
    keys = {{str(path.relative_to(bucket)): path.stat().st_size for path in bucket.rglob("*") if path.is_file()}}
    rows = [[key, size] for key, size in sorted(keys.items()) if key.startswith(args[args.index("--prefix") + 1])]
    print(json.dumps(rows or None))  # the CLI prints null for an empty listing
elif name == "aws" and args[:2] == ["s3", "cp"]:  # s3://BUCKET/KEY is S3_ROOT/BUCKET/KEY
    place = lambda uri: Path(os.environ["S3_ROOT"], uri[5:]) if uri.startswith("s3://") else Path(uri)
    pairs = [(args[-2], args[-1])]
    if "--recursive" in args:  # SOURCE/ TARGET/ --exclude * --include NAME ...
        exclude = args.index("--exclude")
        names = [args[i + 1] for i, arg in enumerate(args) if arg == "--include"]
        pairs = [(f"{{args[exclude - 2]}}{{name}}", f"{{args[exclude - 1]}}{{name}}") for name in names]
    for source, target in pairs:
        if place(source).is_file():  # (the stand-in for the packaging container writes no model.tar.gz)
            place(target).parent.mkdir(parents=True, exist_ok=True)
            place(target).write_bytes(place(source).read_bytes())
elif name == "docker" and args[0] == "login":
    sys.stdin.read()
elif name == "docker" and any("--check-only" in a for a in args):
    output = Path(next(a.split(":")[0] for a in args if a.endswith(":/opt/ml/output")))
    if os.environ.get("CHECKPOINTS"):  # a complete checkpoint (the marker lists every other file with its size)
        folder = output / "checkpoints" / "checkpoint-5"
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"weights")
        (folder / "checkpoint-complete.json").write_text(json.dumps(
            {{"state": "complete", "step": 5, "files": {{"model.safetensors": 7}}}}))
    if os.environ.get("TRAINING_FAILS"):
        if os.environ.get("FAILS_AFTER_UPLOAD"):  # ... once the uploader has put the checkpoint in S3
            marker, waited = Path(os.environ["S3_ROOT"], os.environ["FAILS_AFTER_UPLOAD"]), 0
            while not (marker.is_file() and '"complete"' in marker.read_text()) and waited < 2400:
                time.sleep(0.05)  # (at most two minutes: a run whose uploader never uploads fails the test)
                waited += 1
        sys.exit(1)
    if os.environ.get("SAVES_MODEL"):
        (output / "saved_model").mkdir(parents=True)
        (output / "metrics.json").write_text("{{}}")
"""


@pytest.fixture()
def instance(tmp_path: Path) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("aws", "curl", "docker", "nvidia-smi", "mountpoint"):
        (bin_dir / name).write_text(FAKE.format(python=sys.executable))
        (bin_dir / name).chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    # What the user data unpacks: the two code assets, under their repository paths.
    for folder in ("training_assets/instance", "inference_assets"):
        shutil.copytree(ROOT / folder, work / folder)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "CALLS": str(tmp_path / "calls.jsonl"),
        "S3_ROOT": str(tmp_path / "s3"),
        "AWS_REGION": "us-west-2",
        "DLC_ACCOUNT": "763104351884",
        "REGISTRY_DOMAIN": "amazonaws.com",
        "DLC_REPOSITORY": IMAGE.repository,
        "IMAGE_TAG": IMAGE.tag,
        "LOG_GROUP": "dev-training-logs",
        "ARTIFACTS_BUCKET": "dev-artifacts",
        "OUTPUT_PREFIX": "training-output/",
        "KMS_KEY_ID": "arn:aws:kms:us-west-2:123456789012:key/k",
        "DATASET": "tweet_eval:sentiment",
        "BASE_MODEL": "cardiffnlp/twitter-roberta-base-sentiment-latest",
        "EFA": "true",
        "TRAIN_ARGS": "--epochs 3 --torch-compile --bf16 --fused-adamw",
        # describe-instances rows (";" between rows): private IP, instance id, run-id tag.
        "PEERS": "10.0.1.9\ti-0def\tNone;10.0.1.7\ti-0abc\tNone",
        "SAVES_MODEL": "1",
    }
    return {"work": work, "env": env, "calls": tmp_path / "calls.jsonl"}


def _script(instance: dict, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "training_assets/instance/ec2_run.sh"], cwd=instance["work"], check=False,
                          text=True, capture_output=True, env={**instance["env"], **env})  # fmt: skip


def _calls(instance: dict) -> list[list[str]]:
    return [json.loads(line) for line in instance["calls"].read_text().splitlines()]


def _run(instance: dict, **env: str) -> list[list[str]]:
    result = _script(instance, **env)
    assert result.returncode == 0, result.stderr
    return _calls(instance)


def _docker_runs(calls: list[list[str]]) -> list[list[str]]:
    return [call for call in calls if call[:2] == ["docker", "run"]]


def test_two_node_efa_run_builds_meets_trains_packages_and_uploads(instance: dict) -> None:
    result = _script(instance)
    assert result.returncode == 0, result.stderr
    calls = _calls(instance)
    work = str(instance["work"])
    commands = [call[:3] for call in calls if call[0] in ("aws", "docker")]
    # The registry login is a pipe: its two sides start together, in either order.
    commands[2:4] = sorted(commands[2:4])
    assert commands == [
        ["aws", "ec2", "describe-instances"],
        ["aws", "s3api", "head-object"],  # is this run id finished already?
        ["aws", "ecr", "get-login-password"],
        ["docker", "login", "--username"],
        ["docker", "build", "-t"],
        ["aws", "s3api", "list-objects-v2"],  # the run's checkpoints in S3 (none)
        ["docker", "run", "--rm"],  # training
        ["docker", "run", "--rm"],  # packaging
        ["aws", "s3", "cp"],  # model.tar.gz
        ["aws", "s3", "cp"],  # metrics.json
    ]
    assert "no pipeline-built image is configured (training.image_registry_account is not set)" in result.stdout
    build = next(call for call in calls if call[:2] == ["docker", "build"])
    # The node builds on the DLC the image table names: repository and tag from the user data, no Dockerfile default.
    assert f"DLC_REPOSITORY={IMAGE.repository}" in build and f"BASE_TAG={IMAGE.tag}" in build
    assert build[-1] == "training_assets/instance/"
    listing = next(call for call in calls if call[:2] == ["aws", "s3api"] and call[2] == "list-objects-v2")
    assert listing[listing.index("--prefix") + 1] == "training-output/r-0123/checkpoints/"
    train, package = _docker_runs(calls)
    assert "--privileged" in train and "FI_PROVIDER=efa" in train and "awslogs-group=dev-training-logs" in train
    assert "awslogs-stream=r-0123/i-0abc/train" in train
    inside = _in_container(train[train.index("sentiment-training:latest") + 1 :])
    # This node (10.0.1.7) is first in private-IP order: the rendezvous node. The nodes meet at the barrier, then
    # torchrun starts with the c10d rendezvous, both bounded by RENDEZVOUS_TIMEOUT.
    assert inside[: inside.index("--module")] == [
        "python", "-m", "training_assets.instance.rendezvous", "--nodes", "i-0abc@10.0.1.7,i-0def@10.0.1.9",
        "--node", "i-0abc@10.0.1.7", "--endpoint", "10.0.1.7:29500", "--run-id", "r-0123", "--timeout", "600",
        "--max-restarts", "0", "--record", "/opt/ml/output/rendezvous.json", "--", "--nproc_per_node=8",
    ]  # fmt: skip
    # --expect-efa: a run over EFA that NCCL put on TCP sockets stops (hardware.check_transport).
    assert inside[inside.index(MODULE) + 1 :] == [
        "--output-dir", "/opt/ml/output", "--tokenized-dir", "/opt/ml/output/tokenized", "--expect-efa",
        "--epochs", "3", "--torch-compile", "--bf16", "--fused-adamw",
        "--dataset", "tweet_eval", "--dataset-config", "sentiment",
        "--model", "cardiffnlp/twitter-roberta-base-sentiment-latest",
    ]  # fmt: skip
    assert f"{work}/output:/opt/ml/output" in train
    assert package[package.index("sentiment-training:latest") + 1 :] == [
        "python", "-m", "inference_assets.tools.package_model", "--model-dir", "output/saved_model",
        "--output", "output/model.tar.gz",
    ]  # fmt: skip
    uploads = [call[-2:] for call in calls if call[:3] == ["aws", "s3", "cp"]]
    assert uploads == [
        [f"{work}/output/{name}", f"s3://dev-artifacts/training-output/r-0123/{name}"]
        for name in ("model.tar.gz", "metrics.json")
    ]


def test_the_other_node_joins_the_barrier_with_the_run_id_of_its_tag(instance: dict) -> None:
    """A launch tagged training-run-id=<id> names the run (a relaunch with the same tag resumes it): the rendezvous
    id, the checkpoint prefix and the model's prefix all take it. This node is second in IP order."""
    calls = _run(instance, PEERS="10.0.1.2\ti-0def\tsentiment-7;10.0.1.7\ti-0abc\tsentiment-7", SAVES_MODEL="",
                 RENDEZVOUS_TIMEOUT="120", MAX_RESTARTS="2")  # fmt: skip
    (train,) = _docker_runs(calls)
    inside = _in_container(train[train.index("sentiment-training:latest") + 1 :])
    assert inside[: inside.index("--")] == [
        "python", "-m", "training_assets.instance.rendezvous", "--nodes", "i-0def@10.0.1.2,i-0abc@10.0.1.7",
        "--node", "i-0abc@10.0.1.7", "--endpoint", "10.0.1.2:29500", "--run-id", "sentiment-7", "--timeout", "120",
        "--max-restarts", "2", "--record", "/opt/ml/output/rendezvous.json",
    ]  # fmt: skip
    finished = next(call for call in calls if call[:3] == ["aws", "s3api", "head-object"])
    assert finished[finished.index("--key") + 1] == "training-output/sentiment-7/model.tar.gz"


def test_a_finished_run_id_is_not_trained_again(instance: dict) -> None:
    result = _script(instance, FINISHED="1")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "run r-0123 is finished: its model is s3://dev-artifacts/training-output/r-0123/model.tar.gz; launch a new "
        "run (another training-run-id tag)"
    )
    assert not [call for call in _calls(instance) if call[0] == "docker"]


def test_every_node_pulls_the_pipeline_built_image_by_digest(instance: dict) -> None:
    image = "999999999999.dkr.ecr.us-east-1.amazonaws.com/pytorch-platform/training@sha256:" + "a" * 64
    result = _script(instance, TRAINING_IMAGE_URI=image)
    assert result.returncode == 0, result.stderr
    calls = _calls(instance)
    assert f"training image: {image} (built and promoted by the platform's pipeline" in result.stdout
    assert not [call for call in calls if call[:2] == ["docker", "build"]]
    # The registry's own region (the pipeline's), not the instance's.
    login = next(call for call in calls if call[:3] == ["aws", "ecr", "get-login-password"])
    assert login[login.index("--region") + 1] == "us-east-1"
    assert ["docker", "login", "--username", "AWS", "--password-stdin", image.split("/")[0]] in calls
    assert ["docker", "pull", "--quiet", image] in calls
    train, package = _docker_runs(calls)
    assert image in train and image in package


def test_inputs_and_output_are_staged_on_nvme_when_the_instance_has_it(instance: dict, tmp_path: Path) -> None:
    nvme = tmp_path / "nvme"
    calls = _run(instance, LOCAL_NVME="true", NVME_MOUNT=str(nvme), DATASET="s3://dev-datasets/tweets/")
    stage = nvme / "sentiment-training"
    assert ["mountpoint", "-q", str(nvme)] in calls
    sync = next(call for call in calls if call[:3] == ["aws", "s3", "sync"])
    assert sync[-1] == f"{stage}/dataset"
    train, package = _docker_runs(calls)
    assert f"{stage}/dataset:/opt/ml/input/data:ro" in train and f"{stage}/output:/opt/ml/output" in train
    assert f"{stage}/output:/work/output" in package
    uploads = [call[-2] for call in calls if call[:3] == ["aws", "s3", "cp"]]
    assert uploads == [f"{stage}/output/model.tar.gz", f"{stage}/output/metrics.json"]


SLOT = "s3://dev-artifacts/training-output/r-0123/checkpoints/slot-0"


def _target(copy: list[str]) -> str:
    """Where ``aws s3 cp [--recursive SOURCE/ TARGET/ --exclude * --include NAME ...| SOURCE TARGET]`` writes."""
    return copy[copy.index("--exclude") - 1] if "--recursive" in copy else copy[-1]


def _uploader_never_starts(instance: dict) -> dict[str, str]:
    """The uploader (``checkpoint_sync.py upload --watch``, started in the background) is stopped by the TERM that
    ends it before its interpreter has set a handler, as when training fails within its first moments: the python3
    that ec2_run.sh finds first on PATH waits in ``sleep`` for it."""
    python3 = Path(instance["env"]["PATH"].split(":")[0], "python3")
    system = shutil.which("python3", path="/usr/bin:/bin")
    python3.write_text(f'#!/bin/bash\n[[ " $* " == *" --watch "* ]] && exec sleep 600\nexec {system} "$@"\n')
    python3.chmod(0o755)
    return {}


# When the uploader gets its TERM: as it comes (usually after its first round, before the checkpoint exists); after it
# has uploaded the checkpoint (training fails only then; rounds every 0.1 s); before it has started at all.
WHEN_THE_RUN_FAILS = {
    "as-it-comes": lambda instance: {},
    "after-the-uploader-uploaded": lambda instance: {"FAILS_AFTER_UPLOAD": f"{SLOT[5:]}/checkpoint-complete.json",
                                                     "CHECKPOINT_UPLOAD_SECONDS": "0.1"},
    "before-the-uploader-starts": _uploader_never_starts,
}  # fmt: skip


@pytest.mark.parametrize("when", list(WHEN_THE_RUN_FAILS))
def test_a_failed_run_uploads_its_newest_checkpoint_and_says_how_to_resume(instance: dict, when: str) -> None:
    result = _script(instance, CHECKPOINTS="1", TRAINING_FAILS="1", **WHEN_THE_RUN_FAILS[when](instance))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "training failed (exit status 1); to resume from its newest complete checkpoint "
        "(s3://dev-artifacts/training-output/r-0123/checkpoints/), launch again with the instance tag "
        "training-run-id=r-0123"
    )
    calls = _calls(instance)
    work = instance["work"]
    folder = f"{work}/output/checkpoints/checkpoint-5"
    copies = [call for call in calls if call[:3] == ["aws", "s3", "cp"] and _target(call).startswith("s3://")]
    # Once, whoever uploads it: the slot is marked as being written, then the files (one call: the marker's files, the
    # marker excluded), then the complete marker; all SSE-KMS with the key.
    marking, files, marker = copies
    assert marking[-1] == marker[-1] == f"{SLOT}/checkpoint-complete.json"
    assert marker[-2] == f"{folder}/checkpoint-complete.json"
    assert files[-6:] == [f"{folder}/", f"{SLOT}/", "--exclude", "*", "--include", "model.safetensors"]
    assert "--recursive" in files
    assert all(call[call.index("--sse-kms-key-id") + 1] == instance["env"]["KMS_KEY_ID"] for call in copies)
    assert len(_docker_runs(calls)) == 1  # no packaging after a failure


def test_single_node_with_s3_inputs_and_no_model_on_this_node(instance: dict) -> None:
    calls = _run(instance, PEERS="10.0.1.7\ti-0abc\tNone", EFA="false", SAVES_MODEL="",
                 DATASET="s3://dev-datasets/tweets/", BASE_MODEL="s3://dev-datasets/models/roberta/")  # fmt: skip
    work = str(instance["work"])
    syncs = [call[-2:] for call in calls if call[:3] == ["aws", "s3", "sync"]]
    assert syncs == [["s3://dev-datasets/tweets/", f"{work}/dataset"],
                     ["s3://dev-datasets/models/roberta/", f"{work}/base_model"]]  # fmt: skip
    (train,) = _docker_runs(calls)  # no packaging: saved_model/ is on the node of rank 0
    assert "--privileged" not in train and "--network" not in train
    assert f"{work}/dataset:/opt/ml/input/data:ro" in train and f"{work}/base_model:/opt/ml/input/model:ro" in train
    inside = _in_container(train[train.index("sentiment-training:latest") + 1 :])
    assert inside[:5] == ["torchrun", "--nproc_per_node=8", "--standalone", "--nnodes=1", "--max-restarts=0"]
    assert inside[inside.index(MODULE) + 1 :][:8] == [
        "--output-dir", "/opt/ml/output", "--tokenized-dir", "/opt/ml/output/tokenized",
        "--dataset", "/opt/ml/input/data", "--model", "/opt/ml/input/model",
    ]  # fmt: skip
    assert not [call for call in calls if call[:3] == ["aws", "s3", "cp"]]


def test_missing_setting_stops_the_run(instance: dict) -> None:
    env = {key: value for key, value in instance["env"].items() if key != "ARTIFACTS_BUCKET"}
    result = subprocess.run(["bash", "training_assets/instance/ec2_run.sh"], cwd=instance["work"], env=env, check=False,
                            capture_output=True, text=True)  # fmt: skip
    assert result.returncode != 0 and "ARTIFACTS_BUCKET" in result.stderr
    assert not instance["calls"].exists()


def test_log_batches_stay_within_the_put_log_events_limits() -> None:
    lines = ["x" * 100] * 25_000 + ["y" * 400_000, ""]
    batches = list(ship_logs.batches(lines, timestamp_ms=1))
    assert sum(len(batch) for batch in batches) == len(lines)
    for batch in batches:
        assert len(batch) <= ship_logs.MAX_EVENTS
        assert sum(len(e["message"].encode()) + ship_logs.EVENT_OVERHEAD for e in batch) <= ship_logs.MAX_BATCH_BYTES
    assert len(batches[-1][-2]["message"].encode()) == ship_logs.MAX_EVENT_BYTES  # the long line is cut
    assert batches[-1][-1]["message"] == " "  # CloudWatch rejects empty messages
    assert [len(b) for b in batches[:3]] == [1_048_576 // 126] * 3  # 1 MiB / (100 + 26) bytes


def test_ship_logs_calls_the_aws_cli(instance: dict, tmp_path: Path) -> None:
    log = tmp_path / "bootstrap.log"
    log.write_text("line one\nline two\n")
    env = {**os.environ, **instance["env"]}
    result = subprocess.run([sys.executable, str(ROOT / "training_assets/instance/ship_logs.py"), "--log-group", "g",
                             "--log-stream", "r-1/i-1/bootstrap", "--region", "us-west-2", str(log)],
                            env=env, check=False, capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 0, result.stderr
    calls = [json.loads(line) for line in instance["calls"].read_text().splitlines()]
    assert [call[:3] for call in calls] == [["aws", "logs", "create-log-stream"], ["aws", "logs", "put-log-events"]]
    assert "shipped 2 lines to g" in result.stdout
