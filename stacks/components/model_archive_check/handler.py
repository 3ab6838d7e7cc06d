"""Custom-resource handler: on Create and Update, stop the deploy at once when the model archive is not in S3, or is
not the archive whose SHA-256 was recorded when it was written (a candidate replaced before promotion).

An endpoint over a missing archive fails only when SageMaker starts its instances ("Could not find model data"),
many minutes into CreateEndpoint, and CloudFormation then rolls the stack back. The SageMaker model depends on this
resource, so CloudFormation runs the check first and, when it fails, rolls back before the model, endpoint config
or endpoint exist, with this handler's one sentence as the reason.

Runs in Lambda (stdlib + boto3). HeadObject and GetObject need s3:GetObject on the archive and its digest; reading
them decrypts through S3 (kms:Decrypt with kms:ViaService). Delete does nothing: `cdk destroy` and rollbacks must
never wait on, or fail because of, the archive.

The physical id is the archive's location once it passed. A failed update rolls back with an Update back to the
previous key (CloudFormation marks no request as a rollback): that key passed when it was deployed, and its model
still exists, so it passes again even if its archive has been deleted or changed since; otherwise the rollback itself
would fail (UPDATE_ROLLBACK_FAILED).
"""

from __future__ import annotations

import hashlib
import json
import logging
import urllib.request
from typing import Any

LOG = logging.getLogger()
LOG.setLevel(logging.INFO)
PHYSICAL_ID = "model-archive-check"
_MISSING = {"404", "NoSuchKey", "NotFound"}
# S3 answers a HEAD of a missing key with 403, not 404, to a caller without s3:ListBucket on the bucket (S3 API
# reference, HeadObject, "Permissions"); this check's role may read only the one key, so 403 means absent too.
_FORBIDDEN = {"403", "AccessDenied", "Forbidden"}
# The recorded digest's key: the archive's key and this suffix (sha256sum's output: "<hex>  model.tar.gz").
DIGEST_SUFFIX = ".sha256"
CHUNK = 8 * 1024 * 1024


class ArchiveMissing(Exception):
    """The archive is absent; the message is the sentence CloudFormation shows."""


def _s3_client() -> Any:
    """boto3 is imported when the handler runs, not with the module: the construct imports DIGEST_SUFFIX from here at
    synth, which installs only requirements.txt (no boto3: tests/stacks/settings/test_app_errors.py)."""
    import boto3

    return boto3.client("s3")


class ArchiveChanged(Exception):
    """The archive is not the one whose digest was recorded when it was written (or none was recorded): refused."""


def check_archive(s3: Any, bucket: str, key: str, setting: str) -> str:
    """A sentence saying the archive exists and is as it was written, or ArchiveMissing / ArchiveChanged with the one
    sentence that says what to do. The digest is ``<key>.sha256`` beside the archive (sha256sum's line): what the
    training run recorded as it wrote its model.tar.gz (write-once, training_assets/instance/ec2_run.sh) and copied
    with it when promoted, or what ``pytorch-platform package --upload`` recorded."""
    from botocore.exceptions import ClientError  # here, not at the top: see _s3_client

    try:
        head = s3.head_object(Bucket=bucket, Key=key)
    except ClientError as error:
        code = str(error.response.get("Error", {}).get("Code", ""))
        if code in _MISSING | _FORBIDDEN:
            raise ArchiveMissing(
                f"Model archive s3://{bucket}/{key} ({setting}) does not exist: upload it with "
                "`pytorch-platform package --upload` or set the key of an uploaded archive, then deploy again."
            ) from None
        raise
    recorded = recorded_digest(s3, bucket, key, setting)
    digest = hashlib.sha256()
    body = s3.get_object(Bucket=bucket, Key=key)["Body"]
    for chunk in iter(lambda: body.read(CHUNK), b""):
        digest.update(chunk)
    if digest.hexdigest() != recorded:
        raise ArchiveChanged(
            f"Model archive s3://{bucket}/{key} ({setting}) is not the archive that was written: its SHA-256 is "
            f"{digest.hexdigest()}, the digest recorded when it was written ({key}{DIGEST_SUFFIX}) is {recorded}, so "
            "it was replaced since and is not deployed."
        )
    size = head.get("ContentLength", "?")
    return f"Model archive s3://{bucket}/{key} exists ({size} bytes, SHA-256 {recorded} as recorded)."


def recorded_digest(s3: Any, bucket: str, key: str, setting: str) -> str:
    """The hex SHA-256 recorded beside the archive, or ArchiveChanged when there is none to check against."""
    from botocore.exceptions import ClientError  # here, not at the top: see _s3_client

    try:
        line = s3.get_object(Bucket=bucket, Key=key + DIGEST_SUFFIX)["Body"].read().decode("ascii", "replace")
    except ClientError as error:
        if str(error.response.get("Error", {}).get("Code", "")) not in _MISSING | _FORBIDDEN:
            raise
        line = ""
    digest = line.split(" ", 1)[0].strip().lower()
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise ArchiveChanged(
            f"Model archive s3://{bucket}/{key} ({setting}) has no recorded digest ({key}{DIGEST_SUFFIX}): copy a "
            f"run's model.tar.gz together with its model.tar.gz{DIGEST_SUFFIX}, or upload it with "
            "`pytorch-platform package --upload`, then deploy again."
        )
    return digest


def respond(event: dict[str, Any], status: str, reason: str, physical_id: str | None = None) -> None:
    """Answer CloudFormation on the pre-signed S3 URL (cfn-response protocol)."""
    body = json.dumps(
        {
            "Status": status,
            "Reason": reason[:3500],
            "PhysicalResourceId": physical_id or event.get("PhysicalResourceId", PHYSICAL_ID),
            "StackId": event["StackId"],
            "RequestId": event["RequestId"],
            "LogicalResourceId": event["LogicalResourceId"],
        }
    ).encode()
    request = urllib.request.Request(
        event["ResponseURL"], data=body, method="PUT", headers={"Content-Type": "", "Content-Length": str(len(body))}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        LOG.info("CloudFormation answered %s", response.status)


def handler(event: dict[str, Any], context: Any, *, s3: Any = None) -> None:
    status, reason, physical_id = "SUCCESS", f"{event['RequestType']}: nothing to do.", None
    try:
        if event["RequestType"] in ("Create", "Update"):
            properties = event["ResourceProperties"]
            location = f"s3://{properties['Bucket']}/{properties['Key']}"
            try:
                reason = check_archive(
                    s3 or _s3_client(), properties["Bucket"], properties["Key"], properties["Setting"]
                )
            except (ArchiveMissing, ArchiveChanged):
                if event.get("PhysicalResourceId") != location:
                    raise
                reason = f"Model archive {location} passed this check when it was deployed: back to it (rollback)."
            physical_id = location
    except Exception as error:  # CloudFormation must always get an answer
        LOG.exception("check failed")
        status, reason = "FAILED", str(error)
    LOG.info("%s: %s", status, reason)
    respond(event, status, reason, physical_id)
