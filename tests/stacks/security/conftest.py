"""The synthesized dev Foundation, resolved to placeholder values of the right shape, for the attacks of this folder;
and the limits of the platform's Lambda functions' API calls."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from proving_ground.iam_requests import logical_id

ACCOUNT, REGION = "123456789012", "us-west-2"
BUCKETS = {"Artifacts": "artifacts-bucket", "RemoteJobs": "remote-jobs-bucket", "Datasets": "datasets-bucket"}
# A function that names no Timeout runs at most 3 s (AWS::Lambda::Function, Timeout: "The default is 3 seconds").
LAMBDA_DEFAULT_TIMEOUT_S = 3


def clients_made_by(handler: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The boto3 clients ``handler`` makes from now on (its module's ``boto3.client``, each kept as it is made)."""
    boto3_module = handler.__globals__["boto3"]
    clients: list[Any] = []
    make_client = boto3_module.client

    def client_kept(*args: Any, **kwargs: Any) -> Any:
        clients.append(make_client(*args, **kwargs))
        return clients[-1]

    monkeypatch.setattr(boto3_module, "client", client_kept)
    return clients


def longest_call_s(client: Any) -> float:
    """The longest one call of ``client`` can take at its limits: connect and read, times its attempts."""
    limits = client.meta.config
    return (limits.connect_timeout + limits.read_timeout) * limits.retries["total_max_attempts"]


@pytest.fixture(scope="module")
def foundation(templates: dict[str, dict[str, dict]]) -> tuple[dict[str, Any], dict[str, Any]]:
    template = templates["dev"]["Foundation"]
    refs: dict[str, Any] = {"AWS::AccountId": ACCOUNT, "AWS::Partition": "aws", "AWS::Region": REGION,
                            "AWS::URLSuffix": "amazonaws.com"}  # fmt: skip
    for name, bucket in BUCKETS.items():
        bucket_id = logical_id(template, "AWS::S3::Bucket", name)
        refs.update({bucket_id: bucket, f"{bucket_id}.Arn": f"arn:aws:s3:::{bucket}"})
    key_id = logical_id(template, "AWS::KMS::Key", "PlatformKey")
    refs.update({key_id: "key-id", f"{key_id}.Arn": f"arn:aws:kms:{REGION}:{ACCOUNT}:key/key-id"})
    for name in template["Resources"]:  # every other name resolves to a placeholder of its own
        refs.setdefault(name, f"{name}-ref")
        for attribute in ("Arn", "GroupId", "RoleId"):
            refs.setdefault(f"{name}.{attribute}", f"arn:aws:placeholder::{ACCOUNT}:{name}")
    return template, refs
