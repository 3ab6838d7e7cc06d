"""ec2_run.sh for real against a moto server: the real AWS CLI on the "host" (the CLI v1 that aws-cdk-lib ships for
BucketDeployment), a container shim for ``docker`` that runs the container's command on this machine with what a
bridge-networked container has on the instance: the network, but no AWS credentials (the launch template's
metadata hop limit of 1 keeps IMDS, and so the instance role, from it). The shims are
proving_ground/rehearsal/ec2_host.py's, shared
with the rehearsal (proving_ground/rehearsal/rehearse.py). The trained model must land in S3 under the platform key."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from proving_ground.rehearsal.training_steps import launcher_handler
from stacks.settings import TrainingSettings
from tests.training_assets.moto_host import REGION, host_client, host_tools

ROOT = Path(__file__).resolve().parents[2]
BUCKET = "dev-artifacts"
ROLE_ID = "AROAMOTOTRAINING"


def _seed_compile_cache(s3: Any, prefix: str, local: Path) -> None:
    """TorchInductor's cache: an earlier attempt of the run left an entry in S3; a kernel compiled on this node (by a
    torchrun restart, say) is there locally."""
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}compile-cache/fxgraph/ab/entry", Body=b"graph")
    (local / "triton" / "0").mkdir(parents=True)
    (local / "triton" / "0" / "kernel.cubin").write_bytes(b"kernel")


# Long: the instance's whole environment as the user data exports it, then what S3 holds, field by field.
@pytest.mark.slow
def test_the_model_lands_in_s3_under_the_platform_key(tmp_path: Path, aws_cli: Path, moto_endpoint: str) -> None:
    ec2, s3 = host_client("ec2", moto_endpoint), host_client("s3", moto_endpoint)
    s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
    key_arn = host_client("kms", moto_endpoint).create_key()["KeyMetadata"]["Arn"]
    host_client("logs", moto_endpoint).create_log_group(logGroupName="dev-training-logs")  # the TrainingStack's
    image = ec2.describe_images()["Images"][0]["ImageId"]
    run_tag = {"ResourceType": "instance", "Tags": [{"Key": "training-run-id", "Value": "sentiment-moto"}]}
    reservation = ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1, InstanceType="p4d.24xlarge",
                                    TagSpecifications=[run_tag])  # fmt: skip
    instance = reservation["Instances"][0]
    # The launcher's record of the launch, written by its own code (as it does right after RunInstances).
    handler = launcher_handler()
    settings = handler.Settings("lt-0", "1", ("p4d.24xlarge",), 1, BUCKET, "training-output/", key_arn, ROLE_ID)
    handler.record(s3, "sentiment-moto", reservation["ReservationId"], [instance["InstanceId"]], settings)

    work = tmp_path / "work"
    for folder in ("training_assets/instance", "inference_assets"):
        shutil.copytree(ROOT / folder, work / folder, ignore=shutil.ignore_patterns("__pycache__"))
    run = "training-output/sentiment-moto/"
    prefix = f"{run}nodes/{ROLE_ID}:{instance['InstanceId']}/"  # the instance's own folder of the run
    # An earlier launch of the run (resume) left its compile cache in its own folder; this one restores it.
    handler.record(s3, "sentiment-moto", "r-00000000", ["i-00000000"], settings)
    _seed_compile_cache(s3, f"{run}nodes/{ROLE_ID}:i-00000000/", work / "compile-cache")
    with host_tools(aws_cli, moto_endpoint, tmp_path) as (_, host_environment, _):
        env = {
            **host_environment,
            "HOME": str(tmp_path),
            "IMDS_instance_id": instance["InstanceId"],
            "IMDS_reservation_id": reservation["ReservationId"],
            "IMDS_local_ipv4": instance["PrivateIpAddress"],
            "AWS_REGION": REGION,
            "DLC_ACCOUNT": "763104351884",
            "REGISTRY_DOMAIN": "amazonaws.com",
            "DLC_REPOSITORY": TrainingSettings().image.repository,
            "IMAGE_TAG": TrainingSettings().image_tag,
            "LOG_GROUP": "dev-training-logs",
            "ARTIFACTS_BUCKET": BUCKET,
            "OUTPUT_PREFIX": "training-output/",
            "KMS_KEY_ID": key_arn,
            "INSTANCE_ROLE_ID": ROLE_ID,
            "DATASET": "tweet_eval:sentiment",
            "BASE_MODEL": "cardiffnlp/twitter-roberta-base-sentiment-latest",
            "EFA": "false",
            "IPTABLES_RULES": str(tmp_path / "iptables.rules"),
        }
        result = subprocess.run(["bash", "training_assets/instance/ec2_run.sh"], cwd=work, env=env, check=False,
                                capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr

    assert (work / "compile-cache" / "fxgraph" / "ab" / "entry").read_bytes() == b"graph"  # restored
    for name in ("compile-cache/triton/0/kernel.cubin", "model.tar.gz", "metrics.json", "model.tar.gz.sha256"):
        head = s3.head_object(Bucket=BUCKET, Key=prefix + name)  # uploaded, encrypted
        assert (head["ServerSideEncryption"], head["SSEKMSKeyId"]) == ("aws:kms", key_arn), name
    archive = s3.get_object(Bucket=BUCKET, Key=prefix + "model.tar.gz")["Body"].read()
    # The digest promotion checks, recorded as the run wrote the archive (sha256sum's line).
    recorded = s3.get_object(Bucket=BUCKET, Key=prefix + "model.tar.gz.sha256")["Body"].read().decode()
    assert recorded == f"{hashlib.sha256(archive).hexdigest()}  model.tar.gz\n"
    # Written once: a second write of the archive is refused by S3 itself (412), whoever holds the permission.
    with pytest.raises(ClientError, match="PreconditionFailed"):
        s3.put_object(Bucket=BUCKET, Key=prefix + "model.tar.gz", Body=b"poisoned", IfNoneMatch="*")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        names = set(tar.getnames())
    # The Ray Serve archive the Graviton endpoint serves: model files, Ray's config and deployment, the serving code.
    ray_archive = {
        "config.json",
        "model.safetensors",
        "config.yaml",
        "deployment.py",
        "code/sentiment_serving/ray_server.py",
    }
    assert ray_archive <= names
    metrics = s3.get_object(Bucket=BUCKET, Key=prefix + "metrics.json")["Body"].read()
    assert json.loads(metrics) == {"eval_accuracy": 0.7}
    # The container's output went to the run's stream through Docker's awslogs driver.
    streams = host_client("logs", moto_endpoint).describe_log_streams(logGroupName="dev-training-logs")["logStreams"]
    assert [s["logStreamName"] for s in streams] == [f"{reservation['ReservationId']}/{instance['InstanceId']}/train"]
