"""The pre-deploy model check against moto's S3 and CloudFormation: present, absent, wrong key, bucket lookup, and an
archive replaced after it was written (or without a recorded digest) refused."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber

from inference_assets.tools.model_check import main
from inference_assets.tools.package_model import upload

REGION = "us-west-2"
BUCKET = "dev-foundation-artifacts-0123"
KEY = "endpoints/sentiment/model-v1.tar.gz"
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def aws(mocked_aws: str):
    session = boto3.session.Session(region_name=mocked_aws)
    session.client("s3").create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": mocked_aws})
    return session


def _upload(session, key: str = KEY) -> None:
    """The archive and its digest beside it, as `pytorch-platform package --upload` writes them."""
    key_id = session.client("kms").create_key()["KeyMetadata"]["Arn"]
    with tempfile.TemporaryDirectory() as folder:
        archive = Path(folder, "model.tar.gz")
        archive.write_bytes(b"archive")
        with contextlib.redirect_stderr(io.StringIO()):  # its progress bar
            upload(archive, f"s3://{BUCKET}/{key}", kms_key_id=key_id, s3_client=session.client("s3"))


class _WithStack:
    """moto's S3 plus a stubbed CloudFormation (moto's CloudFormation needs every moto extra installed)."""

    def __init__(self, session, outputs: list[dict] | None) -> None:
        self.session = session
        self.cloudformation = session.client("cloudformation")
        stubber = Stubber(self.cloudformation)
        if outputs is None:
            stubber.add_client_error(
                "describe_stacks",
                service_error_code="ValidationError",
                service_message="Stack with id dev-Foundation does not exist",
                expected_params={"StackName": "dev-Foundation"},
            )
        else:
            stack = {
                "StackName": "dev-Foundation",
                "CreationTime": "2026-12-01T00:00:00Z",
                "StackStatus": "CREATE_COMPLETE",
                "Outputs": outputs,
            }
            stubber.add_response("describe_stacks", {"Stacks": [stack]}, {"StackName": "dev-Foundation"})
        stubber.activate()

    def client(self, name: str):
        return self.cloudformation if name == "cloudformation" else self.session.client(name)


def _cdk_json(tmp_path: Path, graviton: dict) -> Path:
    path = tmp_path / "cdk.json"
    path.write_text(json.dumps({"context": {"environments": {"dev": {"graviton_endpoint": graviton}}}}))
    return path


def _one_sentence(text: str) -> str:
    assert text.endswith(".\n") and text.count("\n") == 1, text
    return text


def test_present_model_passes(aws, capsys: pytest.CaptureFixture[str]) -> None:
    _upload(aws)
    assert main(["--bucket", BUCKET, "--key", KEY], session=aws) == 0
    digest = hashlib.sha256(b"archive").hexdigest()
    assert f"s3://{BUCKET}/{KEY} exists and is the archive that was written (SHA-256 {digest})" in (
        capsys.readouterr().out
    )


def test_a_replaced_archive_is_refused_in_one_sentence(aws, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 41.4: the archive written beside its digest, then replaced (a poisoned candidate): refused."""
    _upload(aws)
    aws.client("s3").put_object(Bucket=BUCKET, Key=KEY, Body=b"poisoned")
    assert main(["--bucket", BUCKET, "--key", KEY], session=aws) == 1
    assert _one_sentence(capsys.readouterr().err) == (
        f"Model s3://{BUCKET}/{KEY} is not the archive that was written: its SHA-256 is "
        f"{hashlib.sha256(b'poisoned').hexdigest()}, the digest recorded when it was written ({KEY}.sha256) is "
        f"{hashlib.sha256(b'archive').hexdigest()}, so it was replaced since and must not be deployed.\n"
    )


def test_an_archive_without_a_recorded_digest_is_refused(aws, capsys: pytest.CaptureFixture[str]) -> None:
    aws.client("s3").put_object(Bucket=BUCKET, Key=KEY, Body=b"archive")
    assert main(["--bucket", BUCKET, "--key", KEY], session=aws) == 1
    assert _one_sentence(capsys.readouterr().err).startswith(
        f"Model s3://{BUCKET}/{KEY} has no recorded digest ({KEY}.sha256): copy a run's model.tar.gz together with"
    )


def test_absent_model_stops_with_one_sentence(aws, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--bucket", BUCKET, "--key", KEY], session=aws) == 1
    error = _one_sentence(capsys.readouterr().err)
    assert error.startswith(f"Model s3://{BUCKET}/{KEY} does not exist: upload the archive there")


def test_wrong_key_names_the_archives_that_do_exist(aws, capsys: pytest.CaptureFixture[str]) -> None:
    _upload(aws, "endpoints/sentiment/model-v2.tar.gz")
    assert main(["--bucket", BUCKET, "--key", KEY], session=aws) == 1
    error = _one_sentence(capsys.readouterr().err)
    assert "does not exist (archives under endpoints/sentiment/: endpoints/sentiment/model-v2.tar.gz)" in error


def test_every_key_is_checked(aws, capsys: pytest.CaptureFixture[str]) -> None:
    _upload(aws)
    assert main(["--bucket", BUCKET, "--key", KEY, "--key", "endpoints/other.tar.gz"], session=aws) == 1
    assert "endpoints/other.tar.gz does not exist" in capsys.readouterr().err


def test_bucket_and_key_come_from_the_foundation_output_and_cdk_json(
    aws, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _upload(aws)
    session = _WithStack(aws, [{"OutputKey": "ArtifactsBucketName", "OutputValue": BUCKET}])
    cdk_json = _cdk_json(tmp_path, {"model_data_key": KEY})
    assert main(["--env", "dev", "--cdk-json", str(cdk_json)], session=session) == 0
    assert f"s3://{BUCKET}/{KEY} exists and is the archive that was written" in capsys.readouterr().out


def test_missing_foundation_stack_says_deploy_it_first(aws, tmp_path: Path, capsys) -> None:
    cdk_json = _cdk_json(tmp_path, {"model_data_key": KEY})
    assert main(["--env", "dev", "--cdk-json", str(cdk_json)], session=_WithStack(aws, None)) == 1
    assert _one_sentence(capsys.readouterr().err) == (
        "Stack dev-Foundation does not exist: deploy the Foundation stack first.\n"
    )


def test_a_stack_without_the_output_is_refused(aws, capsys) -> None:
    session = _WithStack(aws, [])
    assert main(["--stack-name", "dev-Foundation", "--key", KEY], session=session) == 1
    assert "has no ArtifactsBucketName output" in _one_sentence(capsys.readouterr().err)


def test_an_environment_without_a_model_has_nothing_to_check(tmp_path: Path, capsys) -> None:
    cdk_json = _cdk_json(tmp_path, {"instance_type": "ml.c7g.xlarge"})
    assert main(["--env", "dev", "--cdk-json", str(cdk_json)]) == 0
    assert "names no model" in capsys.readouterr().out


def test_runs_as_a_module_and_refuses_incomplete_arguments() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "inference_assets.tools.model_check", "--key", KEY],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr == "Name the bucket with --bucket, or its Foundation stack with --stack-name or --env.\n"


def test_access_denied_fails_closed(capsys: pytest.CaptureFixture[str]) -> None:
    s3 = boto3.session.Session(region_name=REGION, aws_access_key_id="a", aws_secret_access_key="b").client("s3")
    stubber = Stubber(s3)
    stubber.add_client_error("head_object", service_error_code="403", http_status_code=403)
    stubber.activate()

    class Session:
        def client(self, name: str):
            return s3

    assert main(["--bucket", BUCKET, "--key", KEY], session=Session()) == 1
    assert "is absent or unreadable (403)" in _one_sentence(capsys.readouterr().err)
