"""The instance-side run script (ec2_run.sh) against recording stand-ins for aws, curl, docker and nvidia-smi:
node discovery and the run id, the image (pulled by digest or built), inputs staged on NVMe or the root volume, the
checkpoint restore and upload, the barrier and torchrun launch, packaging and upload happen in order with the right
arguments. Also the log shipper's batching within the CloudWatch Logs API limits."""

from __future__ import annotations

import hashlib
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
# container (rank 0 writes saved_model/ and metrics.json into the mounted output folder when SAVES_MODEL is set) and
# the packaging container (model.tar.gz).
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
elif name == "aws" and args[:2] == ["s3", "cp"] and args[-1] == "-":  # to stdout (a launch record)
    source = Path(os.environ["S3_ROOT"], args[-2][5:])
    if not source.is_file():
        sys.exit(1)
    print(source.read_text(), end="")
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
elif name == "docker" and "inference_assets.tools.package_model" in args:
    output = Path(next(a.split(":")[0] for a in args if a.endswith(":/work/output")))
    (output / "model.tar.gz").write_bytes(b"the archive")
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


ROLE_ID = "AROATRAINING"
# This node's folder of the run: the only place its session (aws:userid <role id>:<instance id>) may write.
MINE = f"nodes/{ROLE_ID}:i-0abc"


def _record(s3_root: Path, run: str, reservation: str, instances: list[str]) -> None:
    """The launcher's record of one launch (stacks/components/run_launcher/handler.py writes it)."""
    path = s3_root / "dev-artifacts" / "training-output" / run / "launches" / f"{reservation}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    writers = [f"{ROLE_ID}:{instance}" for instance in instances]
    path.write_text(json.dumps({"run_id": run, "reservation_id": reservation, "writers": writers}))


@pytest.fixture()
def instance(tmp_path: Path) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("aws", "curl", "docker", "nvidia-smi", "mountpoint", "iptables"):
        (bin_dir / name).write_text(FAKE.format(python=sys.executable))
        (bin_dir / name).chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    devices = tmp_path / "infiniband"  # the EFA devices of a p4d.24xlarge (one per network card)
    devices.mkdir()
    for card in range(4):
        (devices / f"uverbs{card}").touch()
    # What the user data unpacks: the two code assets, under their repository paths.
    for folder in ("training_assets/instance", "inference_assets"):
        shutil.copytree(ROOT / folder, work / folder)
    # The launcher's record of this launch (reservation r-0123, both nodes), for each run name the tests launch.
    for run in ("r-0123", "sentiment-7", "sentiment-8"):
        _record(tmp_path / "s3", run, "r-0123", ["i-0abc", "i-0def"])
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
        "INSTANCE_ROLE_ID": ROLE_ID,
        "DATASET": "tweet_eval:sentiment",
        "BASE_MODEL": "cardiffnlp/twitter-roberta-base-sentiment-latest",
        "EFA": "true",
        "TRAIN_ARGS": "--epochs 3 --torch-compile --bf16 --fused-adamw",
        # describe-instances rows (";" between rows): private IP, instance id, run-id tag (the launcher's run_name).
        "PEERS": "10.0.1.9\ti-0def\tr-0123;10.0.1.7\ti-0abc\tr-0123",
        "SAVES_MODEL": "1",
        "EFA_DEVICE_DIR": str(devices),
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


# Long: one run read end to end, in the order the script makes its calls (rules, discovery, image, inputs, training,
# packaging, the three write-once uploads), each with the arguments that matter.
def test_two_node_efa_run_builds_meets_trains_packages_and_uploads(instance: dict) -> None:
    result = _script(instance)
    assert result.returncode == 0, result.stderr
    calls = _calls(instance)
    work = str(instance["work"])
    commands = [call[:3] for call in calls if call[0] in ("aws", "docker", "iptables")]
    # The registry login is a pipe: its two sides start together, in either order.
    commands[9:11] = sorted(commands[9:11])
    assert commands == [
        # Before anything else, the containers lose the metadata service (test_training_container.py: the rules).
        ["iptables", "-w", "-N"],
        ["iptables", "-w", "-I"],
        ["iptables", "-w", "-I"],
        ["aws", "ec2", "describe-instances"],
        ["aws", "s3api", "list-objects-v2"],  # the launcher's records of the run: is this launch's there yet?
        ["aws", "s3", "cp"],  # ... and does it name this node?
        ["aws", "s3api", "list-objects-v2"],  # the run's writers: every launch record of the run
        ["aws", "s3", "cp"],
        ["aws", "s3api", "list-objects-v2"],  # is the run finished (did one of its writers write the candidate)?
        ["aws", "ecr", "get-login-password"],
        ["docker", "login", "--username"],
        ["docker", "build", "-t"],
        ["aws", "s3api", "list-objects-v2"],  # this node's checkpoints in S3 (none)
        ["aws", "s3api", "list-objects-v2"],  # the other writer's (none)
        ["aws", "s3", "sync"],  # the run's compile cache, restored from each writer's folder
        ["aws", "s3", "sync"],
        ["docker", "run", "--rm"],  # training
        ["aws", "s3", "sync"],  # the compile cache, uploaded (this node is the rendezvous node)
        ["docker", "run", "--rm"],  # packaging
        ["aws", "s3api", "put-object"],  # model.tar.gz
        ["aws", "s3api", "put-object"],  # metrics.json
        ["aws", "s3api", "put-object"],  # model.tar.gz.sha256
    ]
    assert "no pipeline-built image is configured (training.image_registry_account is not set)" in result.stdout
    build = next(call for call in calls if call[:2] == ["docker", "build"])
    # The node builds on the DLC the image table names: repository and tag from the user data, no Dockerfile default.
    assert f"DLC_REPOSITORY={IMAGE.repository}" in build and f"BASE_TAG={IMAGE.tag}" in build
    assert build[-1] == "training_assets/instance/"
    listings = [call for call in calls if call[:2] == ["aws", "s3api"] and call[2] == "list-objects-v2"]
    assert [listing[listing.index("--prefix") + 1] for listing in listings] == [
        "training-output/r-0123/launches/",
        "training-output/r-0123/launches/",
        "training-output/r-0123/nodes/",
        f"training-output/r-0123/{MINE}/checkpoints/",
        f"training-output/r-0123/nodes/{ROLE_ID}:i-0def/checkpoints/",
    ]
    train, package = _docker_runs(calls)
    assert "--privileged" not in train and "FI_PROVIDER=efa" in train and "awslogs-group=dev-training-logs" in train
    # The EFA devices passed through, one per network card, to a container of the unprivileged user.
    devices = [train[i + 1] for i, arg in enumerate(train) if arg == "--device"]
    assert devices == [f"{instance['env']['EFA_DEVICE_DIR']}/uverbs{card}" for card in range(4)]
    assert train[train.index("--user") + 1] == package[package.index("--user") + 1] == "2000:2000"
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
        "--compile-cache-dir", "/opt/ml/compile-cache", "--epochs", "3", "--torch-compile", "--bf16", "--fused-adamw",
        "--dataset", "tweet_eval", "--dataset-config", "sentiment",
        "--model", "cardiffnlp/twitter-roberta-base-sentiment-latest",
    ]  # fmt: skip
    assert f"{work}/output:/opt/ml/output" in train
    assert package[package.index("sentiment-training:latest") + 1 :] == [
        "python", "-m", "inference_assets.tools.package_model", "--model-dir", "output/saved_model",
        "--output", "output/model.tar.gz",
    ]  # fmt: skip
    uploads = [call for call in calls if call[:3] == ["aws", "s3api", "put-object"]]
    # Each written once (If-None-Match: *), SSE-KMS with the platform key; the digest is the archive's SHA-256.
    assert [(u[u.index("--body") + 1], u[u.index("--key") + 1]) for u in uploads] == [
        (f"{work}/output/{name}", f"training-output/r-0123/{MINE}/{name}")
        for name in ("model.tar.gz", "metrics.json", "model.tar.gz.sha256")
    ]
    assert all(u[u.index("--if-none-match") + 1] == "*" for u in uploads)
    assert all(u[u.index("--ssekms-key-id") + 1] == instance["env"]["KMS_KEY_ID"] for u in uploads)
    digest = hashlib.sha256((instance["work"] / "output" / "model.tar.gz").read_bytes()).hexdigest()
    assert (instance["work"] / "output" / "model.tar.gz.sha256").read_text() == f"{digest}  model.tar.gz\n"
    assert f"model: s3://dev-artifacts/training-output/r-0123/{MINE}/model.tar.gz (sha256 {digest})" in result.stdout


def test_the_rendezvous_node_restores_and_uploads_the_runs_compile_cache(instance: dict) -> None:
    """TorchInductor's cache: restored from every writer's folder of the run into a host folder the container
    compiles into, then uploaded (SSE-KMS with the platform key) into this node's own folder, for a relaunch."""
    calls = _run(instance)
    work = instance["work"]
    mine, other, upload = [call for call in calls if call[:3] == ["aws", "s3", "sync"]]
    cache = f"s3://dev-artifacts/training-output/r-0123/{MINE}/compile-cache/"
    assert mine[-2:] == [cache, f"{work}/compile-cache"] and upload[-2:] == [f"{work}/compile-cache", cache]
    assert other[-2:] == [f"s3://dev-artifacts/training-output/r-0123/nodes/{ROLE_ID}:i-0def/compile-cache/",
                          f"{work}/compile-cache"]  # fmt: skip
    assert upload[upload.index("--sse") + 1] == "aws:kms"
    assert upload[upload.index("--sse-kms-key-id") + 1] == instance["env"]["KMS_KEY_ID"]
    train, _ = _docker_runs(calls)
    assert f"{work}/compile-cache:/opt/ml/compile-cache" in train


def test_the_other_node_joins_the_barrier_with_the_run_id_of_its_tag(instance: dict) -> None:
    """A launch tagged training-run-id=<id> (the launcher's run_name) names the run (a relaunch with the same name
    resumes it): the rendezvous
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
    finished = [call for call in calls if call[:3] == ["aws", "s3api", "list-objects-v2"]][2]
    assert finished[finished.index("--prefix") + 1] == "training-output/sentiment-7/nodes/"
    # The run's compile cache: restored here too, from each writer; uploaded by the rendezvous node only.
    syncs = [call[-2:] for call in calls if call[:3] == ["aws", "s3", "sync"]]
    assert syncs == [
        [f"s3://dev-artifacts/training-output/sentiment-7/nodes/{ROLE_ID}:{node}/compile-cache/",
         f"{instance['work']}/compile-cache"] for node in ("i-0abc", "i-0def")
    ]  # fmt: skip


def test_a_finished_run_id_is_not_trained_again(instance: dict) -> None:
    """A run one of whose writers wrote the candidate and its digest is finished; a candidate in the folder of an
    instance that no launch of the run names is not the run's (any instance may write its own folder anywhere)."""
    run = Path(instance["env"]["S3_ROOT"], "dev-artifacts", "training-output", "r-0123")
    for name in ("model.tar.gz", "model.tar.gz.sha256"):
        (run / "nodes" / f"{ROLE_ID}:i-0bad" / name).parent.mkdir(parents=True, exist_ok=True)
        (run / "nodes" / f"{ROLE_ID}:i-0bad" / name).write_text("planted")
    calls = _run(instance)  # trains: the planted candidate is nobody's of this run
    assert len(_docker_runs(calls)) == 2
    instance["calls"].unlink()
    _record(run.parents[2], "r-0123", "r-0099", ["i-0999"])  # an earlier launch of the run, which finished
    for name in ("model.tar.gz", "model.tar.gz.sha256"):
        (run / "nodes" / f"{ROLE_ID}:i-0999" / name).parent.mkdir(parents=True, exist_ok=True)
        (run / "nodes" / f"{ROLE_ID}:i-0999" / name).write_text("trained")
    result = _script(instance)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"run r-0123 is finished: its model is s3://dev-artifacts/training-output/r-0123/nodes/{ROLE_ID}:i-0999/"
        "model.tar.gz; launch a new run (another run_name)"
    )
    assert not [call for call in _calls(instance) if call[0] == "docker"]


def test_an_instance_the_launcher_did_not_record_trains_nothing(instance: dict) -> None:
    result = _script(instance, PEERS="10.0.1.7\ti-0abc\tsentiment-9", LAUNCH_RECORD_SECONDS="0")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "s3://dev-artifacts/training-output/sentiment-9/launches/r-0123.json does not name AROATRAINING:i-0abc after "
        "0 s: only instances the platform's launcher started and recorded run a training run."
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
    uploads = [call[call.index("--body") + 1] for call in calls if call[:3] == ["aws", "s3api", "put-object"]]
    assert uploads == [f"{stage}/output/{name}" for name in ("model.tar.gz", "metrics.json", "model.tar.gz.sha256")]


SLOT = f"s3://dev-artifacts/training-output/r-0123/{MINE}/checkpoints/slot-0"


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
        f"(s3://dev-artifacts/training-output/r-0123/{MINE}/checkpoints/), launch again with run_name r-0123"
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
    calls = _run(instance, PEERS="10.0.1.7\ti-0abc\tr-0123", EFA="false", SAVES_MODEL="",
                 DATASET="s3://dev-datasets/tweets/", BASE_MODEL="s3://dev-datasets/models/roberta/")  # fmt: skip
    work = str(instance["work"])
    syncs = [call[-2:] for call in calls if call[:3] == ["aws", "s3", "sync"]]
    cache = f"s3://dev-artifacts/training-output/r-0123/{MINE}/compile-cache/"
    other = f"s3://dev-artifacts/training-output/r-0123/nodes/{ROLE_ID}:i-0def/compile-cache/"
    assert syncs == [["s3://dev-datasets/tweets/", f"{work}/dataset"],
                     ["s3://dev-datasets/models/roberta/", f"{work}/base_model"],
                     [cache, f"{work}/compile-cache"], [other, f"{work}/compile-cache"],
                     [f"{work}/compile-cache", cache]]  # fmt: skip
    (train,) = _docker_runs(calls)  # no packaging: saved_model/ is on the node of rank 0
    assert "--privileged" not in train and "--network" not in train
    assert f"{work}/dataset:/opt/ml/input/data:ro" in train and f"{work}/base_model:/opt/ml/input/model:ro" in train
    inside = _in_container(train[train.index("sentiment-training:latest") + 1 :])
    assert inside[:5] == ["torchrun", "--nproc_per_node=8", "--standalone", "--nnodes=1", "--max-restarts=0"]
    assert inside[inside.index(MODULE) + 1 :][:8] == [
        "--output-dir", "/opt/ml/output", "--tokenized-dir", "/opt/ml/output/tokenized",
        "--dataset", "/opt/ml/input/data", "--model", "/opt/ml/input/model",
    ]  # fmt: skip
    assert not [call for call in calls if call[:2] == ["aws", "s3api"] and call[2] == "put-object"]


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


@pytest.mark.parametrize("efa", ["true", "false"])
def test_no_container_reaches_the_instance_metadata_service(instance: dict, efa: str) -> None:
    """Issue 41.3, read from the commands ec2_run.sh really runs: before any container starts, the host rejects
    packets to IMDS from the containers' uid (host-network containers: multi-node and EFA runs) and from Docker's
    bridge (single node, image builds); every container runs as that uid, unprivileged, with no added capability and
    no new privileges, so it cannot remove the rules (the launch template's hop limit of 1 is evaluated in
    tests/stacks/security/test_training_container.py)."""
    calls = _run(instance, EFA=efa)
    rules = [call for call in calls if call[0] == "iptables"]
    assert rules == [
        ["iptables", "-w", "-N", "DOCKER-USER"],
        ["iptables", "-w", "-I", "DOCKER-USER", "-d", "169.254.169.254/32", "-j", "REJECT"],
        ["iptables", "-w", "-I", "OUTPUT", "-d", "169.254.169.254/32", "-m", "owner", "--uid-owner", "2000",
         "-j", "REJECT"],
    ]  # fmt: skip
    first_container = min(i for i, call in enumerate(calls) if call[0] == "docker" and call[1] in ("run", "build"))
    assert max(calls.index(rule) for rule in rules) < first_container
    runs = _docker_runs(calls)
    assert len(runs) == 2  # training and packaging
    for run in runs:
        options = run[: run.index("sentiment-training:latest")]
        assert options[options.index("--user") + 1].split(":")[0] == "2000"  # the uid the OUTPUT rule names
        assert "--privileged" not in options and "--cap-add" not in options
        assert options[options.index("--security-opt") + 1] == "no-new-privileges"
    train = runs[0]
    # Two nodes: the host network (rendezvous and NCCL bootstrap between nodes), still without privileges.
    assert train[train.index("--network") + 1] == "host"
    assert ("--device" in train) == (efa == "true")


def test_the_launchers_arguments_tag_reaches_the_script_and_nothing_else_does(instance: dict) -> None:
    """The launcher tags a run with its training arguments (numbers only); ec2_run.sh appends them after the
    environment's, and refuses a tag that is anything else (a tag the launcher never writes)."""
    peers = "10.0.1.7\ti-0abc\tsentiment-8\t--epochs 2 --learning-rate 3e-05"
    calls = _run(instance, PEERS=peers, EFA="false")
    (train, _) = _docker_runs(calls)
    inside = _in_container(train[train.index("sentiment-training:latest") + 1 :])
    arguments = inside[inside.index(MODULE) + 1 :]
    assert arguments[arguments.index("--fused-adamw") + 1 : arguments.index("--fused-adamw") + 5] == [
        "--epochs", "2", "--learning-rate", "3e-05"]  # fmt: skip
    instance["calls"].unlink()
    result = _script(instance, PEERS="10.0.1.7\ti-0abc\tsentiment-8\t--output-dir /etc", EFA="false")
    assert result.returncode == 1
    assert "tag training-run-args='--output-dir /etc': only '--flag number' pairs" in result.stderr
    assert not [call for call in _calls(instance) if call[0] == "docker"]
