"""ec2_run.sh for real against a moto server: the real AWS CLI on the "host" (the CLI v1 that aws-cdk-lib ships for
BucketDeployment), a container shim for ``docker`` that runs the container's command on this machine with what a
bridge-networked container has on the instance: the network, but no AWS credentials (the launch template's
metadata hop limit of 1 keeps IMDS, and so the instance role, from it). The trained model must land in S3 under
the platform key."""

from __future__ import annotations

import importlib.metadata
import io
import json
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from moto.ec2.models import instances as moto_instances
from moto.ec2.utils import filter_reservations as moto_filter_reservations
from moto.server import ThreadedMotoServer

ROOT = Path(__file__).resolve().parents[2]
REGION = "us-west-2"
BUCKET = "dev-artifacts"
HOST_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}

# The container shim. `docker run` of the training image plays rank 0 (writes saved_model/ and metrics.json into
# the mounted output folder: real training is test_container's subject); any other `docker run` runs its command
# here, with the mounts mapped to their host folders and an environment holding no credentials.
DOCKER = r"""#!{python}
import os, subprocess, sys
from pathlib import Path
args = sys.argv[1:]
if args[0] == "login":
    sys.stdin.read()
    sys.exit(0)
if args[0] == "build":
    sys.exit(0)
assert args[0] == "run", args
VALUED = {{"-v", "-w", "-e", "--ulimit", "--log-driver", "--log-opt", "--gpus", "--network"}}
mounts, env, workdir, i = {{}}, {{}}, "/", 1
while args[i].startswith("-"):
    option = args[i]
    if option in VALUED:
        value = args[i + 1]
        i += 2
        if option == "-v":
            host, inside = value.split(":")[:2]
            mounts[inside] = host
        elif option == "-e":
            key, _, val = value.partition("=")
            env[key] = val
        elif option == "-w":
            workdir = value
    else:
        i += 1
command = args[i + 1 :]
def host_path(path):
    for inside, host in mounts.items():
        if path == inside or path.startswith(inside + "/"):
            return host + path[len(inside):]
    return path
if any("--check-only" in arg for arg in command):
    output = Path(mounts["/opt/ml/output"])
    (output / "saved_model").mkdir(parents=True)
    (output / "saved_model" / "config.json").write_text('{{"model_type": "roberta"}}')
    (output / "saved_model" / "model.safetensors").write_bytes(b"weights")
    (output / "metrics.json").write_text('{{"eval_accuracy": 0.7}}')
    sys.exit(0)
# What the container sees: the network (the endpoint), no credentials, no metadata service.
env.update(PATH="{python_dir}:/usr/bin:/bin", HOME=mounts.get("/root", "/nonexistent"),
           AWS_ENDPOINT_URL=os.environ["AWS_ENDPOINT_URL"], AWS_EC2_METADATA_DISABLED="true",
           AWS_CONFIG_FILE="/nonexistent", AWS_SHARED_CREDENTIALS_FILE="/nonexistent")
sys.exit(subprocess.run(command, cwd=host_path(workdir), env=env).returncode)
"""

# The instance metadata the host reads (token, then instance-id / reservation-id / local-ipv4).
CURL = r"""#!{python}
import os, sys
url = next(arg for arg in sys.argv[1:] if arg.startswith("http"))
print("token" if url.endswith("/api/token") else os.environ["IMDS_" + url.rsplit("/", 1)[-1].replace("-", "_")], end="")
"""

NVIDIA_SMI = "#!/bin/sh\necho 'GPU 0: NVIDIA A100-SXM4-40GB'\n"


@pytest.fixture(scope="module")
def aws_cli(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The AWS CLI v1 bundled in aws-cdk-lib's dependency aws-cdk.asset-awscli-v1 (lib/layer.zip in its jsii
    tarball), unpacked; returns its folder (``awscli/aws`` is the entry script)."""
    tarball = next(
        file for file in importlib.metadata.files("aws-cdk.asset-awscli-v1") or [] if str(file).endswith(".jsii.tgz")
    )
    with tarfile.open(Path(str(tarball.locate()))) as package:
        layer = package.extractfile("package/lib/layer.zip")
        assert layer is not None
        target = tmp_path_factory.mktemp("awscli")
        zipfile.ZipFile(io.BytesIO(layer.read())).extractall(target)
    return target / "awscli"


def _filter_reservations(reservations: list, filters: dict) -> list:  # type: ignore[type-arg]
    """moto 5.2.5's DescribeInstances lacks the documented ``reservation-id`` filter (NotImplementedError), which
    ec2_run.sh uses to find the nodes of its run: apply it to the reservations, the other filters as moto does."""
    filters = dict(filters)
    wanted = filters.pop("reservation-id", None)
    kept = [reservation for reservation in reservations if wanted is None or reservation.id in wanted]
    return moto_filter_reservations(kept, filters) if filters else kept


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(moto_instances, "filter_reservations", _filter_reservations)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        try:
            yield f"http://{host}:{port}"
        finally:
            server.stop()


def _client(service: str, endpoint: str):  # type: ignore[no-untyped-def]
    return boto3.client(
        service,
        region_name=REGION,
        endpoint_url=endpoint,
        aws_access_key_id=HOST_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=HOST_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    )


@pytest.mark.slow
def test_the_model_lands_in_s3_under_the_platform_key(tmp_path: Path, aws_cli: Path, endpoint: str) -> None:
    ec2, s3 = _client("ec2", endpoint), _client("s3", endpoint)
    s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
    key_arn = _client("kms", endpoint).create_key()["KeyMetadata"]["Arn"]
    image = ec2.describe_images()["Images"][0]["ImageId"]
    reservation = ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1, InstanceType="p4d.24xlarge")
    instance = reservation["Instances"][0]

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = sys.executable
    scripts = {
        "docker": DOCKER.format(python=python, python_dir=Path(python).parent),
        "curl": CURL.format(python=python),
        "nvidia-smi": NVIDIA_SMI,
        "aws": f'#!/bin/sh\nPYTHONPATH="{aws_cli}" exec "{python}" "{aws_cli}/aws" "$@"\n',
    }
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    work = tmp_path / "work"
    for folder in ("training_assets/instance", "inference_assets"):
        shutil.copytree(ROOT / folder, work / folder, ignore=shutil.ignore_patterns("__pycache__"))
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        **HOST_CREDENTIALS,
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_CONFIG_FILE": "/nonexistent",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
        "IMDS_instance_id": instance["InstanceId"],
        "IMDS_reservation_id": reservation["ReservationId"],
        "IMDS_local_ipv4": instance["PrivateIpAddress"],
        "AWS_REGION": REGION,
        "DLC_ACCOUNT": "763104351884",
        "REGISTRY_DOMAIN": "amazonaws.com",
        "IMAGE_TAG": "2.10.0-gpu-py313-cu130-ubuntu22.04-ec2",
        "LOG_GROUP": "dev-training-logs",
        "ARTIFACTS_BUCKET": BUCKET,
        "OUTPUT_PREFIX": "training-output/",
        "KMS_KEY_ID": key_arn,
        "DATASET": "tweet_eval:sentiment",
        "BASE_MODEL": "cardiffnlp/twitter-roberta-base-sentiment-latest",
        "EFA": "false",
    }
    result = subprocess.run(["bash", "training_assets/instance/ec2_run.sh"], cwd=work, env=env, check=False,
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr

    prefix = f"training-output/{reservation['ReservationId']}/"
    for name in ("model.tar.gz", "metrics.json"):
        head = s3.head_object(Bucket=BUCKET, Key=prefix + name)
        assert (head["ServerSideEncryption"], head["SSEKMSKeyId"]) == ("aws:kms", key_arn), name
    archive = s3.get_object(Bucket=BUCKET, Key=prefix + "model.tar.gz")["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        names = set(tar.getnames())
    assert {"config.json", "model.safetensors", "code/inference.py", "code/requirements.txt"} <= names
    metrics = s3.get_object(Bucket=BUCKET, Key=prefix + "metrics.json")["Body"].read()
    assert json.loads(metrics) == {"eval_accuracy": 0.7}
