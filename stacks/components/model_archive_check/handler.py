"""Custom-resource handler: on Create and Update, stop the deploy at once when the model archive is not in S3.

An endpoint over a missing archive fails only when SageMaker starts its instances ("Could not find model data"),
many minutes into CreateEndpoint, and CloudFormation then rolls the stack back. The SageMaker model depends on this
resource, so CloudFormation runs the check first and, when it fails, rolls back before the model, endpoint config
or endpoint exist, with this handler's one sentence as the reason.

Runs in Lambda (stdlib + boto3). HeadObject needs s3:GetObject on the key and no KMS permission (it reads metadata,
not data). Delete does nothing: `cdk destroy` and rollbacks must never wait on, or fail because of, the archive.

The physical id is the archive's location once it passed. A failed update rolls back with an Update back to the
previous key (CloudFormation marks no request as a rollback): that key passed when it was deployed, and its model
still exists, so it passes again even if its archive has been deleted since; otherwise the rollback itself would fail
(UPDATE_ROLLBACK_FAILED).
"""

from __future__ import annotations

import json
import logging
import urllib.request
from typing import Any

import boto3
from botocore.exceptions import ClientError

LOG = logging.getLogger()
LOG.setLevel(logging.INFO)
PHYSICAL_ID = "model-archive-check"
_MISSING = {"404", "NoSuchKey", "NotFound"}
# S3 answers a HEAD of a missing key with 403, not 404, to a caller without s3:ListBucket on the bucket (S3 API
# reference, HeadObject, "Permissions"); this check's role may read only the one key, so 403 means absent too.
_FORBIDDEN = {"403", "AccessDenied", "Forbidden"}


class ArchiveMissing(Exception):
    """The archive is absent; the message is the sentence CloudFormation shows."""


def check_archive(s3: Any, bucket: str, key: str, setting: str) -> str:
    """A sentence saying the archive exists, or ArchiveMissing with the one sentence that says what to do."""
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
    return f"Model archive s3://{bucket}/{key} exists ({head.get('ContentLength', '?')} bytes)."


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
                    s3 or boto3.client("s3"), properties["Bucket"], properties["Key"], properties["Setting"]
                )
            except ArchiveMissing:
                if event.get("PhysicalResourceId") != location:
                    raise
                reason = f"Model archive {location} passed this check when it was deployed: back to it (rollback)."
            physical_id = location
    except Exception as error:  # CloudFormation must always get an answer
        LOG.exception("check failed")
        status, reason = "FAILED", str(error)
    LOG.info("%s: %s", status, reason)
    respond(event, status, reason, physical_id)
