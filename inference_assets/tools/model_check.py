"""Pre-deploy check: the model archive an endpoint will serve exists in S3 and is the archive that was written.

An endpoint over a missing archive fails only when SageMaker starts its instances ("Could not find model data"),
many minutes into CreateEndpoint, and CloudFormation then rolls the stack back. This check takes seconds: HeadObject
on each key, then the archive's SHA-256 against the digest recorded beside it when it was written (``<key>.sha256``,
sha256sum's line: written by the training run into its instance's own folder, which no other run may write, and
copied with the archive when promoted, or by ``pytorch-platform package --upload``), and one sentence and exit status
1 when an archive is absent, has no recorded digest or is not the archive that was written.

    python -m inference_assets.tools.model_check --env dev                   # key and region from cdk.json
    python -m inference_assets.tools.model_check --bucket B --key endpoints/sentiment/model-v2.tar.gz

The bucket is the Foundation stack's ``ArtifactsBucketName`` output (CloudFormation DescribeStacks on
``<env>-Foundation``) unless ``--bucket`` names it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from inference_assets.tools.package_model import DIGEST_SUFFIX

BUCKET_OUTPUT = "ArtifactsBucketName"
DEFAULT_REGION = "us-west-2"
_MISSING = {"404", "NoSuchKey", "NotFound"}
CHUNK = 8 * 1024 * 1024


class CheckFailed(Exception):
    """The check cannot pass; the message is the one sentence to print."""


def settings_of(cdk_json: Path, environment: str) -> tuple[str | None, str]:
    """(graviton_endpoint.model_data_key, region) of ``environment`` in cdk.json's context."""
    try:
        environments = json.loads(cdk_json.read_text())["context"]["environments"]
    except (OSError, ValueError, KeyError) as error:
        raise CheckFailed(f"{cdk_json}: cannot read context.environments ({error}).") from None
    if environment not in environments:
        raise CheckFailed(f"{cdk_json}: no environment {environment!r}; known: {', '.join(environments)}.")
    raw = environments[environment]
    return raw.get("graviton_endpoint", {}).get("model_data_key"), raw.get("region", DEFAULT_REGION)


def artifacts_bucket(cloudformation: Any, stack_name: str) -> str:
    """The ArtifactsBucketName output of the deployed Foundation stack."""
    try:
        (stack,) = cloudformation.describe_stacks(StackName=stack_name)["Stacks"]
    except ClientError as error:
        if "does not exist" in str(error):
            raise CheckFailed(f"Stack {stack_name} does not exist: deploy the Foundation stack first.") from None
        raise CheckFailed(f"Cannot describe stack {stack_name}: {_reason(error)}.") from None
    for output in stack.get("Outputs", []):
        if output["OutputKey"] == BUCKET_OUTPUT:
            return output["OutputValue"]
    raise CheckFailed(f"Stack {stack_name} has no {BUCKET_OUTPUT} output: name the platform's Foundation stack.")


def check_model(s3: Any, bucket: str, key: str) -> None:
    """Raise CheckFailed unless s3://bucket/key exists (HeadObject: needs s3:GetObject on the key, no download)."""
    try:
        s3.head_object(Bucket=bucket, Key=key)
    except ClientError as error:
        code = str(error.response.get("Error", {}).get("Code", ""))
        if code in _MISSING:
            raise CheckFailed(_absent(s3, bucket, key)) from None
        if code in {"403", "AccessDenied", "Forbidden"}:
            # S3 answers a HEAD of a missing key with 403, not 404, to callers without s3:ListBucket.
            raise CheckFailed(
                f"Model s3://{bucket}/{key} is absent or unreadable (403): the caller needs s3:GetObject on the key "
                "and s3:ListBucket on its prefix to tell the two apart."
            ) from None
        raise CheckFailed(f"Cannot look up model s3://{bucket}/{key}: {_reason(error)}.") from None


def check_digest(s3: Any, bucket: str, key: str) -> str:
    """The archive's SHA-256 when it is the one whose digest was recorded beside it; CheckFailed (one sentence)
    when no digest was recorded or the archive's differs (it was replaced since it was written)."""
    try:
        line = s3.get_object(Bucket=bucket, Key=key + DIGEST_SUFFIX)["Body"].read().decode("ascii", "replace")
    except ClientError as error:
        if str(error.response.get("Error", {}).get("Code", "")) not in _MISSING | {"403", "AccessDenied"}:
            raise CheckFailed(f"Cannot read the digest of model s3://{bucket}/{key}: {_reason(error)}.") from None
        line = ""
    recorded = line.split(" ", 1)[0].strip().lower()
    if len(recorded) != 64 or any(c not in "0123456789abcdef" for c in recorded):
        raise CheckFailed(
            f"Model s3://{bucket}/{key} has no recorded digest ({key}{DIGEST_SUFFIX}): copy a run's model.tar.gz "
            f"together with its model.tar.gz{DIGEST_SUFFIX}, or upload it with `pytorch-platform package --upload`."
        )
    digest = hashlib.sha256()
    body = s3.get_object(Bucket=bucket, Key=key)["Body"]
    for chunk in iter(lambda: body.read(CHUNK), b""):
        digest.update(chunk)
    if digest.hexdigest() != recorded:
        raise CheckFailed(
            f"Model s3://{bucket}/{key} is not the archive that was written: its SHA-256 is {digest.hexdigest()}, "
            f"the digest recorded when it was written ({key}{DIGEST_SUFFIX}) is {recorded}, so it was replaced "
            "since and must not be deployed."
        )
    return recorded


def _absent(s3: Any, bucket: str, key: str) -> str:
    """The sentence for a missing archive; names the archives that do exist next to it, when they can be listed."""
    folder = key.rsplit("/", 1)[0] + "/" if "/" in key else ""
    try:
        listed = s3.list_objects_v2(Bucket=bucket, Prefix=folder, MaxKeys=20).get("Contents", [])
        nearby = [item["Key"] for item in listed if item["Key"].endswith(".tar.gz")]
    except (ClientError, BotoCoreError):
        nearby = []  # listing is a courtesy; the answer stays "absent"
    found = f" (archives under {folder or 'the bucket root'}: {', '.join(nearby)})" if nearby else ""
    return (
        f"Model s3://{bucket}/{key} does not exist{found}: upload the archive there or set "
        "graviton_endpoint.model_data_key to an uploaded key before deploying the endpoint."
    )


def _reason(error: Exception) -> str:
    if isinstance(error, ClientError):
        detail = error.response.get("Error", {})
        return f"{detail.get('Code', 'error')} {detail.get('Message', '')}".strip()
    return str(error)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m inference_assets.tools.model_check",
        description="Stop before deploying an endpoint whose model archive is not in S3 or not the one written.",
    )
    parser.add_argument("--env", help="environment in cdk.json: its graviton_endpoint.model_data_key and region")
    parser.add_argument("--key", action="append", default=[], help="object key to check (repeatable)")
    parser.add_argument("--bucket", help=f"artifacts bucket (default: the Foundation stack's {BUCKET_OUTPUT})")
    parser.add_argument("--stack-name", help="Foundation stack to read the bucket from (default: <env>-Foundation)")
    parser.add_argument("--region", help="AWS region (default: the environment's region, else the SDK's)")
    parser.add_argument("--cdk-json", type=Path, default=Path("cdk.json"), help="settings file (default: cdk.json)")
    return parser


def main(argv: list[str] | None = None, *, session: Any = None) -> int:
    args = _parser().parse_args(argv)
    try:
        keys, region = list(args.key), args.region
        if args.env:
            model_key, env_region = settings_of(args.cdk_json, args.env)
            region = region or env_region
            if not keys and model_key is None:
                print(f"{args.env}: graviton_endpoint.model_data_key names no model, so no endpoint needs one yet.")
                return 0
            keys = keys or [model_key]
        if not keys:
            raise CheckFailed("Name the model with --key, or an environment of cdk.json with --env.")
        if not args.bucket and not (args.stack_name or args.env):
            raise CheckFailed("Name the bucket with --bucket, or its Foundation stack with --stack-name or --env.")
        session = session or boto3.session.Session(region_name=region)
        bucket = args.bucket or artifacts_bucket(
            session.client("cloudformation"), args.stack_name or f"{args.env}-Foundation"
        )
        s3 = session.client("s3")
        digests = {}
        for key in keys:
            check_model(s3, bucket, key)
            digests[key] = check_digest(s3, bucket, key)
    except CheckFailed as failure:
        print(failure, file=sys.stderr)
        return 1
    except BotoCoreError as error:  # no credentials, no network, no region
        print(f"Cannot check the model: {error}.", file=sys.stderr)
        return 1
    for key in keys:
        print(f"Model s3://{bucket}/{key} exists and is the archive that was written (SHA-256 {digests[key]}).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
