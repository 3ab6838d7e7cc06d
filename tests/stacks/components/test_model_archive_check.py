"""ModelArchiveCheck: the handler run for real against moto (archive present / absent), its S3 calls checked against
the synthesized role policy, and the construct's place before the model in a bare Stack and in the platform."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sagemaker as sagemaker
from moto import mock_aws

from inference_assets.tools.package_model import upload
from ops_review.iam_policy import Request, is_allowed
from proving_ground.iam_requests import Call, logical_id, requests_for, role_policies
from stacks.components.model_archive_check import TIMEOUT, ModelArchiveCheck, handler
from tests.stacks.components.bare_stack import ACCOUNT, REGION, bare_stack, refs, resources, template_of
from tests.stacks.components.cloudformation_answers import capture_answers

KEY = "endpoints/sentiment/model-v2.tar.gz"
SETTING = "environments.staging.graviton_endpoint.model_data_key"


@pytest.fixture(scope="module")
def synthesized() -> dict[str, Any]:
    stack = bare_stack()
    key = kms.Key(stack, "Key")
    bucket = s3.Bucket(stack, "Artifacts", encryption=s3.BucketEncryption.KMS, encryption_key=key)
    check = ModelArchiveCheck(
        stack, "Check", bucket=bucket, object_key=KEY, setting=SETTING, key=key, log_retention_days=14
    )
    model = sagemaker.CfnModel(stack, "Model", execution_role_arn=f"arn:aws:iam::{ACCOUNT}:role/r")
    check.guard(model)
    return template_of(stack)


@pytest.fixture
def s3_client(synthesized) -> Iterator[tuple[Any, str, list[Call]]]:
    """moto's S3 with the bucket the template names; every call the client makes is recorded."""
    template = synthesized
    bucket = refs(template)[logical_id(template, "AWS::S3::Bucket", "Artifacts")]
    calls: list[Call] = []
    with mock_aws():
        client = boto3.client("s3", region_name=REGION)
        client.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": REGION})

        def record(params: dict[str, Any], model: Any, **_: Any) -> None:
            calls.append(Call("s3", model.name, dict(params), REGION, ACCOUNT))

        client.meta.events.register("before-parameter-build.s3.*", record)
        yield client, bucket, calls


def _event(request_type: str, bucket: str) -> dict[str, Any]:
    return {
        "RequestType": request_type,
        "ResponseURL": "https://cloudformation-custom-resource-response.example/abc",
        "StackId": f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/staging-GravitonEndpoint/1",
        "RequestId": "r-1",
        "LogicalResourceId": "ModelArchiveCheck",
        "PhysicalResourceId": "model-archive-check",
        "ResourceProperties": {"ServiceToken": "arn", "Bucket": bucket, "Key": KEY, "Setting": SETTING},
    }


@pytest.fixture
def answers(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What the handler answers CloudFormation (the PUT to the pre-signed URL)."""
    return capture_answers(monkeypatch, handler)


def _refs(template: dict[str, Any]) -> dict[str, Any]:
    """bare_stack.refs plus the log group's ARN."""
    values = refs(template)
    for group in resources(template, "AWS::Logs::LogGroup"):
        values[f"{group}.Arn"] = f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{group.lower()}:*"
    return values


def _allowed(template: dict[str, Any], calls: list[Call]) -> list[bool]:
    values = _refs(template)
    role = logical_id(template, "AWS::IAM::Role", "CheckRole")
    policies = role_policies(template, role, values)
    key_arn = values[f"{logical_id(template, 'AWS::KMS::Key', 'Key')}.Arn"]
    return [
        is_allowed(policies, request)
        for call in calls
        for request in requests_for(call, kms_encrypted_buckets={call.params["Bucket"]: key_arn})
    ]


@pytest.mark.parametrize("request_type", ["Create", "Update"])
def test_present_archive_passes(request_type, synthesized, s3_client, answers) -> None:
    template = synthesized
    client, bucket, calls = s3_client
    _write(client, bucket, b"archive")
    calls.clear()
    handler.handler(_event(request_type, bucket), None, s3=client)
    assert [a["Status"] for a in answers] == ["SUCCESS"]
    assert answers[0]["Reason"] == (
        f"Model archive s3://{bucket}/{KEY} exists (7 bytes, SHA-256 {hashlib.sha256(b'archive').hexdigest()} as "
        "recorded)."
    )
    assert answers[0]["PhysicalResourceId"] == f"s3://{bucket}/{KEY}"  # the location that passed
    assert [(c.operation, c.params["Key"]) for c in calls] == [
        ("HeadObject", KEY), ("GetObject", KEY + ".sha256"), ("GetObject", KEY)]  # fmt: skip
    assert all(_allowed(template, calls))  # each S3 request and the decryption through S3 it makes


def _write(client: Any, bucket: str, archive: bytes, digest_of: bytes | None = None) -> None:
    """The archive and, unless ``digest_of`` is empty, the SHA-256 line recorded beside it when it was written."""
    client.put_object(Bucket=bucket, Key=KEY, Body=archive)
    if digest_of != b"":
        line = f"{hashlib.sha256(archive if digest_of is None else digest_of).hexdigest()}  model.tar.gz\n"
        client.put_object(Bucket=bucket, Key=KEY + ".sha256", Body=line.encode())


def test_an_archive_uploaded_by_the_operator_tool_passes(synthesized, s3_client, answers, tmp_path) -> None:
    """The joint with the writer: `pytorch-platform package --upload` records the digest where, and as, the deploy
    check reads it."""
    client, bucket, _ = s3_client
    archive = tmp_path / "model.tar.gz"
    archive.write_bytes(b"an archive " * 1000)
    kms_key = boto3.client("kms", region_name=REGION).create_key()["KeyMetadata"]["Arn"]
    upload(archive, f"s3://{bucket}/{KEY}", kms_key_id=kms_key, s3_client=client)
    handler.handler(_event("Create", bucket), None, s3=client)
    assert [a["Status"] for a in answers] == ["SUCCESS"]
    assert hashlib.sha256(archive.read_bytes()).hexdigest() in answers[0]["Reason"]


@pytest.mark.parametrize("request_type", ["Create", "Update"])
def test_a_changed_archive_is_refused_with_one_sentence(request_type, synthesized, s3_client, answers) -> None:
    """Issue 41.4: a candidate replaced after it was written (its recorded digest names other bytes) is not
    deployed: the model never gets created."""
    template = synthesized
    client, bucket, calls = s3_client
    _write(client, bucket, b"poisoned archive", digest_of=b"archive")
    calls.clear()
    handler.handler(_event(request_type, bucket), None, s3=client)
    ((answer,),) = [answers]
    assert answer["Status"] == "FAILED"
    recorded, now = hashlib.sha256(b"archive").hexdigest(), hashlib.sha256(b"poisoned archive").hexdigest()
    assert answer["Reason"] == (
        f"Model archive s3://{bucket}/{KEY} ({SETTING}) is not the archive that was written: its SHA-256 is {now}, "
        f"the digest recorded when it was written ({KEY}.sha256) is {recorded}, so it was replaced since and is not "
        "deployed."
    )
    assert all(_allowed(template, calls))


def test_an_archive_without_a_recorded_digest_is_refused_with_one_sentence(synthesized, s3_client, answers) -> None:
    client, bucket, _ = s3_client
    _write(client, bucket, b"archive", digest_of=b"")
    handler.handler(_event("Create", bucket), None, s3=client)
    ((answer,),) = [answers]
    assert answer["Status"] == "FAILED"
    assert answer["Reason"] == (
        f"Model archive s3://{bucket}/{KEY} ({SETTING}) has no recorded digest ({KEY}.sha256): copy a run's "
        "model.tar.gz together with its model.tar.gz.sha256, or upload it with `pytorch-platform package --upload`, "
        "then deploy again."
    )


@pytest.mark.parametrize("request_type", ["Create", "Update"])
def test_absent_archive_fails_with_one_sentence(request_type, synthesized, s3_client, answers) -> None:
    template = synthesized
    client, bucket, calls = s3_client
    client.put_object(Bucket=bucket, Key="endpoints/sentiment/model-v1.tar.gz", Body=b"old")
    calls.clear()
    handler.handler(_event(request_type, bucket), None, s3=client)
    ((answer,),) = [answers]
    assert answer["Status"] == "FAILED"
    assert answer["Reason"] == (
        f"Model archive s3://{bucket}/{KEY} ({SETTING}) does not exist: upload it with `pytorch-platform package "
        "--upload` or set the key of an uploaded archive, then deploy again."
    )
    assert _allowed(template, calls) == [True]  # the refusal is S3's answer, not IAM's


def test_a_rollback_to_a_key_that_passed_before_passes_even_if_its_archive_is_gone(s3_client, answers) -> None:
    """A failed update rolls back with an Update to the previous properties; that key passed when it was deployed
    (its location is the physical id), so the rollback is not blocked by an archive deleted since."""
    client, bucket, _ = s3_client
    rollback = {**_event("Update", bucket), "PhysicalResourceId": f"s3://{bucket}/{KEY}"}
    handler.handler(rollback, None, s3=client)
    ((answer,),) = [answers]
    assert (answer["Status"], answer["PhysicalResourceId"]) == ("SUCCESS", f"s3://{bucket}/{KEY}")
    assert (
        answer["Reason"]
        == f"Model archive s3://{bucket}/{KEY} passed this check when it was deployed: back to it (rollback)."
    )


def test_delete_does_nothing_even_without_bucket(answers) -> None:
    """`cdk destroy` and rollbacks never depend on the archive: no S3 call at all (a client that cannot connect)."""
    client = boto3.client(
        "s3", region_name=REGION, endpoint_url="http://127.0.0.1:9", aws_access_key_id="a", aws_secret_access_key="b"
    )
    handler.handler(_event("Delete", "gone-bucket"), None, s3=client)
    assert answers == [
        {
            "Status": "SUCCESS",
            "Reason": "Delete: nothing to do.",
            "PhysicalResourceId": "model-archive-check",
            "StackId": _event("Delete", "x")["StackId"],
            "RequestId": "r-1",
            "LogicalResourceId": "ModelArchiveCheck",
        }
    ]


def test_role_may_read_that_one_archive_and_its_digest_only(synthesized) -> None:
    template = synthesized
    values = _refs(template)
    policies = role_policies(template, logical_id(template, "AWS::IAM::Role", "CheckRole"), values)
    bucket = values[logical_id(template, "AWS::S3::Bucket", "Artifacts")]
    key_arn = values[f"{logical_id(template, 'AWS::KMS::Key', 'Key')}.Arn"]
    for name in (KEY, KEY + ".sha256"):
        assert is_allowed(policies, Request("s3:GetObject", f"arn:aws:s3:::{bucket}/{name}"))
    assert is_allowed(policies, Request("kms:Decrypt", key_arn, {"kms:ViaService": f"s3.{REGION}.amazonaws.com"}))
    for action, resource in [
        ("s3:GetObject", f"arn:aws:s3:::{bucket}/endpoints/sentiment/other.tar.gz"),
        ("s3:PutObject", f"arn:aws:s3:::{bucket}/{KEY}"),
        ("s3:PutObject", f"arn:aws:s3:::{bucket}/{KEY}.sha256"),
        ("s3:ListBucket", f"arn:aws:s3:::{bucket}"),
        ("kms:Decrypt", key_arn),  # not through S3
    ]:
        assert not is_allowed(policies, Request(action, resource)), action
    assert not resources(template, "AWS::IAM::Policy")  # no inline policies


def test_the_model_waits_for_the_check(synthesized) -> None:
    template = synthesized
    (check_id,) = resources(template, "Custom::ModelArchiveCheck")
    (model,) = resources(template, "AWS::SageMaker::Model").values()
    assert model["DependsOn"] == [check_id]
    properties = template["Resources"][check_id]["Properties"]
    assert properties["Key"] == KEY and properties["Setting"] == SETTING
    (function,) = resources(template, "AWS::Lambda::Function").values()
    assert function["Properties"]["Timeout"] == TIMEOUT.to_seconds() and "VpcConfig" not in function["Properties"]
    # CloudFormation waits longer than the function may run: a slow check fails by its own answer, not the wait's.
    assert int(properties["ServiceTimeout"]) > TIMEOUT.to_seconds()
    assert function["Properties"]["LoggingConfig"]["LogGroup"]["Ref"].startswith("CheckLogs")
    (group,) = resources(template, "AWS::Logs::LogGroup").values()
    assert group["Properties"]["RetentionInDays"] == 14


def test_endpoints_with_a_model_key_check_it_before_their_model(templates) -> None:
    checked = 0
    for environment, stacks in templates.items():
        if "GravitonEndpoint" not in stacks:
            continue
        template = stacks["GravitonEndpoint"]
        ((check_id, check),) = resources(template, "Custom::ModelArchiveCheck").items()
        (model,) = resources(template, "AWS::SageMaker::Model").values()
        assert check_id in model["DependsOn"], environment
        assert check["Properties"]["Key"] == template["Outputs"]["ModelDataKey"]["Value"], environment
        assert "model_data_url" not in json.dumps(check)
        checked += 1
    assert checked >= 2  # staging and prod name a model version
