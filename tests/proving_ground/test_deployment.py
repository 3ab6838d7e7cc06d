"""The rehearsal's CloudFormation (proving_ground/rehearsal/deployment.py) on dev's Foundation, in moto in this process:
what moto's CloudFormation creates and what the rehearsal makes by hand carry the template's policies, and deleting
the stack empties and removes the buckets (the auto-delete custom resource's Delete) and schedules the key's deletion
after its pending window, as CloudFormation does; a bucket still holding objects fails the delete. The whole journey,
with the ENI release wait and change-endpoint-instance, is tests/proving_ground/test_rehearsal.py."""

from __future__ import annotations

import ast
import copy
import io
import json
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from ops_review.review import StackTemplate, load_assembly
from proving_ground.rehearsal.deployment import Deployment
from proving_ground.rehearsal.journey import ACCOUNT, StepFailed
from proving_ground.rehearsal.rehearse import _patch_moto

REGION = "us-west-2"


@pytest.fixture
def account(cloud_assembly: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, StackTemplate]]:
    """moto with what `cdk bootstrap` and `cdk deploy` leave before the stacks: the assets bucket holding each zip
    asset the templates name, the bootstrap version parameter; yields dev's stacks."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "testing")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    assembly = Path(cloud_assembly.directory)
    with mock_aws():
        undo = _patch_moto()
        try:
            s3 = boto3.client("s3", region_name=REGION)
            bucket = f"cdk-hnb659fds-assets-{ACCOUNT}-{REGION}"
            s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": REGION})
            for manifest in (assembly / "assembly-dev").glob("*.assets.json"):
                for asset_hash in json.loads(manifest.read_text())["files"]:
                    code = io.BytesIO()
                    with zipfile.ZipFile(code, "w") as archive:
                        archive.writestr("index.py", "def handler(event, context): pass\n")
                    s3.put_object(Bucket=bucket, Key=f"{asset_hash}.zip", Body=code.getvalue())
            boto3.client("ssm", region_name=REGION).put_parameter(
                Name="/cdk-bootstrap/hnb659fds/version", Value="30", Type="String"
            )
            yield {s.stack: s for s in load_assembly(assembly) if s.environment == "dev"}
        finally:
            undo()


def _deployment(stacks: dict[str, StackTemplate]) -> Deployment:
    return Deployment(stacks, lambda service: boto3.client(service, region_name=REGION), REGION)


def test_the_foundation_carries_its_policies_and_its_delete_empties_the_buckets_and_schedules_the_key(
    account: dict[str, StackTemplate],
) -> None:
    deployment = _deployment(account)
    deployed = deployment.deploy("Foundation")
    resources = account["Foundation"].template["Resources"]

    def of_type(kind: str) -> list[str]:
        return [logical for logical, resource in resources.items() if resource["Type"] == kind]

    coverage = deployment.coverage
    assert coverage.played["AWS::S3::Bucket"] == len(of_type("AWS::S3::Bucket")) == 4
    assert coverage.by_hand["AWS::S3::BucketPolicy"] == 4 and coverage.by_hand["AWS::KMS::Key"] == 1
    assert coverage.played["AWS::EC2::VPCEndpoint"] == len(of_type("AWS::EC2::VPCEndpoint"))
    s3, kms, ec2 = (boto3.client(s, region_name=REGION) for s in ("s3", "kms", "ec2"))
    for logical in of_type("AWS::S3::BucketPolicy"):
        props = deployment.resolve("Foundation", resources[logical]["Properties"])
        assert json.loads(s3.get_bucket_policy(Bucket=props["Bucket"])["Policy"]) == props["PolicyDocument"]
    (key,) = of_type("AWS::KMS::Key")
    key_id = deployed.refs[key]
    key_policy = json.loads(kms.get_key_policy(KeyId=key_id, PolicyName="default")["Policy"])
    assert key_policy == deployment.resolve("Foundation", resources[key]["Properties"]["KeyPolicy"])
    with_policy = [k for k in of_type("AWS::EC2::VPCEndpoint") if "PolicyDocument" in resources[k]["Properties"]]
    described = ec2.describe_vpc_endpoints(VpcEndpointIds=[deployed.refs[k] for k in with_policy])["VpcEndpoints"]
    # moto answers the document its CloudFormation was given as Python's repr of it, not as JSON.
    documents = sorted((ast.literal_eval(e["PolicyDocument"]) for e in described), key=json.dumps)
    assert documents == sorted(
        (deployment.resolve("Foundation", resources[k]["Properties"]["PolicyDocument"]) for k in with_policy),
        key=json.dumps,
    )
    buckets = [str(deployed.refs[k]) for k in of_type("AWS::S3::Bucket")]
    s3.put_object(Bucket=buckets[0], Key="left/behind.txt", Body=b"x")

    retained = deployment.destroy("Foundation")

    assert retained == []  # dev deletes everything
    assert not set(buckets) & {b["Name"] for b in s3.list_buckets()["Buckets"]}
    metadata = kms.describe_key(KeyId=key_id)["KeyMetadata"]
    assert metadata["KeyState"] == "PendingDeletion"
    window = (metadata["DeletionDate"] - metadata["CreationDate"]).days
    assert window == resources[key]["Properties"]["PendingWindowInDays"] == 7


def test_a_bucket_left_with_objects_fails_the_delete(account: dict[str, StackTemplate]) -> None:
    """Without the auto-delete custom resource (staging and prod retain their buckets instead), CloudFormation's
    DeleteBucket meets BucketNotEmpty: the destroy fails and names the bucket."""
    foundation = account["Foundation"]
    template = copy.deepcopy(foundation.template)
    for logical, resource in list(template["Resources"].items()):
        if resource["Type"] == "Custom::S3AutoDeleteObjects":
            del template["Resources"][logical]
    stacks = {**account, "Foundation": StackTemplate(**{**foundation.__dict__, "template": template})}
    deployment = _deployment(stacks)
    deployed = deployment.deploy("Foundation")
    (artifacts,) = [k for k in template["Resources"] if k.startswith("Artifacts") and k[9:].isalnum()
                    and template["Resources"][k]["Type"] == "AWS::S3::Bucket"]  # fmt: skip
    boto3.client("s3", region_name=REGION).put_object(Bucket=deployed.refs[artifacts], Key="model.tar.gz", Body=b"x")

    with pytest.raises(StepFailed, match=rf"bucket {deployed.refs[artifacts]} \({artifacts}\) is not empty"):
        deployment.destroy("Foundation")
