"""The synthesized dev Foundation, resolved to placeholder values of the right shape, for the attacks of this folder."""

from __future__ import annotations

from typing import Any

import pytest

from proving_ground.iam_requests import logical_id

ACCOUNT, REGION = "123456789012", "us-west-2"
BUCKETS = {"Artifacts": "artifacts-bucket", "RemoteJobs": "remote-jobs-bucket", "Datasets": "datasets-bucket"}


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
