"""Every AWS call a process makes, recorded and checked against the synthesized policy of the principal making it.

A principal is known by its access key: each one (the training launcher, the training instance's role, the endpoint's
execution role, ...) gets its own key pair, and whoever acts as it holds that pair in its environment, so calls made
by the AWS CLI in a shell script, by a tool's boto3 client or by an SDK's worker threads are all attributed the way
AWS attributes them. ``install`` wraps botocore's ``BaseClient._make_api_call`` (the AWS CLI v1 and boto3 both call
through it): the call is mapped to the IAM requests it needs (``ops_review.iam_policy.requests_for``) and evaluated
against the principal's identity policies; a refused call gets the AccessDenied error IAM would send and never reaches
the emulator. Each call is one JSON line in the gate's log, with the rehearsal step that was running.

A subprocess joins the gate through the environment: ``REHEARSAL_GATE`` names the gate file and
``python -m scripts.aws_calls aws ARGS`` runs the AWS CLI with the gate installed (the ``aws`` shim of the rehearsal's
hosts).

Principals without policies (``policies=None``) are recorded but not checked: AWS services acting on their own (EC2
terminating an instance that powered off) and the administrator who deploys and operates the platform, for whom
the templates define no policy.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any

from ops_review.iam_policy import Call, Request, Unsupported, is_allowed, requests_for

GATE_ENV = "REHEARSAL_GATE"
STEP_ENV = "REHEARSAL_STEP"
UNCHECKED = None


@dataclass
class Principal:
    name: str
    access_key: str
    # Identity policies (resolved JSON documents); None: recorded, not checked (see the module docstring).
    policies: list[dict[str, Any]] | None
    # Global condition keys IAM sets for this principal (aws:userid, aws:PrincipalArn, ...).
    identity: dict[str, str] = field(default_factory=dict)
    secret_key: str = "rehearsal-secret"

    def environment(self) -> dict[str, str]:
        """The variables that make a process act as this principal."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key}


@dataclass
class Record:
    step: str
    principal: str
    service: str
    operation: str
    target: str
    requests: list[tuple[str, str]]
    # True / False: evaluated; None: not checked (principal without policies, or no credentials at all).
    allowed: bool | None
    error: str | None = None
    at: float = 0.0  # time.time() of the call


@dataclass
class Gate:
    account: str
    region: str
    log: Path
    principals: list[Principal]
    # Bucket -> key ARN of its default SSE-KMS encryption (S3 calls KMS as the caller).
    kms_encrypted_buckets: dict[str, str] = field(default_factory=dict)
    # Launch template id -> what RunInstances from it creates (``ops_review.iam_policy.run_instances_requests``).
    launch_templates: dict[str, dict[str, Any]] = field(default_factory=dict)

    def principal(self, name: str) -> Principal:
        (found,) = [p for p in self.principals if p.name == name]
        return found

    def save(self, path: Path) -> Path:
        data = {**asdict(self), "log": str(self.log)}
        path.write_text(json.dumps(data, default=str))
        return path

    @classmethod
    def load(cls, path: Path) -> Gate:
        data = json.loads(Path(path).read_text())
        data["log"] = Path(data["log"])
        data["principals"] = [Principal(**p) for p in data["principals"]]
        return cls(**data)

    def records(self) -> list[Record]:
        if not self.log.exists():
            return []
        return [
            Record(**{**row, "requests": [tuple(r) for r in row["requests"]]})
            for row in map(json.loads, self.log.read_text().splitlines())
        ]


_lock = threading.Lock()


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes | bytearray):
        return f"<{len(value)} bytes>"
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return f"<{type(value).__name__}>"  # streams (upload bodies)


def _target(params: dict[str, Any]) -> str:
    """A short name of what the call touches, for the report."""
    if "Bucket" in params:
        return f"s3://{params['Bucket']}/{params.get('Key', params.get('Prefix', ''))}"
    for name in ("EndpointName", "TrainingJobName", "logGroupName", "Name", "StackName", "ResourceId", "QuotaCode"):
        if name in params:
            return f"{name}={params[name]}"
    if "LaunchTemplate" in params:
        return f"LaunchTemplate={params['LaunchTemplate']}"
    return ""


def _write(gate: Gate, record: Record) -> None:
    line = json.dumps(asdict(record)) + "\n"
    with _lock, gate.log.open("a") as log:
        log.write(line)


def denied(operation: str, principal: Principal, request: Request) -> Exception:
    from botocore.exceptions import ClientError

    arn = principal.identity.get("aws:PrincipalArn", principal.name)
    message = f"User: {arn} is not authorized to perform: {request.action} on resource: {request.resource}"
    error = {"Error": {"Code": "AccessDenied", "Message": message}, "ResponseMetadata": {"HTTPStatusCode": 403}}
    return ClientError(error, operation)


StandIn = Callable[[dict[str, Any]], dict[str, Any]]


def install(
    gate: Gate,
    *,
    stand_ins: dict[tuple[str, str], StandIn] | None = None,
    resource_tags: Callable[[str], dict[str, str]] | None = None,
) -> Callable[[], None]:
    """Check every botocore call of this process; return the function that removes the check.

    ``stand_ins``: (service, operation) -> answer, for an API the emulator lacks (the call is still checked);
    ``resource_tags``: the tags of an existing resource by ARN (for aws:ResourceTag conditions).
    """
    import botocore.client

    original = botocore.client.BaseClient._make_api_call
    answers = stand_ins or {}

    def checked(client: Any, operation: str, params: dict[str, Any]) -> Any:
        service = client.meta.service_model.service_name
        step = os.environ.get(STEP_ENV, "")
        credentials = client._request_signer._credentials
        key = credentials.get_frozen_credentials().access_key if credentials is not None else None
        principal = next((p for p in gate.principals if p.access_key == key), None)  # principals may join later
        target = _target(params)

        def record(name: str, requests: list[Request], allowed: bool | None, error: str | None = None) -> None:
            pairs = [(r.action, r.resource) for r in requests]
            _write(gate, Record(step, name, service, operation, target, pairs, allowed, error, time.time()))

        if key is None:
            record("(no credentials)", [], None, "no credentials")
            return original(client, operation, params)  # botocore raises NoCredentialsError, as on AWS
        if principal is None:
            from botocore.exceptions import ClientError

            record(f"(unknown key {key})", [], False, "unknown access key")
            error = {"Error": {"Code": "InvalidClientTokenId", "Message": "The security token is not valid."}}
            raise ClientError(error, operation)
        if principal.policies is not None:
            call = Call(service, operation, _jsonable(dict(params)), gate.region, gate.account)
            try:
                requests = requests_for(
                    call,
                    kms_encrypted_buckets=gate.kms_encrypted_buckets,
                    principal={**principal.identity, "aws:PrincipalAccount": gate.account},
                    resource_tags=resource_tags,
                    launch_templates=gate.launch_templates,
                )
            except Unsupported as gap:
                record(principal.name, [], False, f"unmapped: {gap}")
                raise
            refused = [r for r in requests if not is_allowed(principal.policies, r)]
            record(principal.name, requests, not refused, None if not refused else "AccessDenied")
            if refused:
                raise denied(operation, principal, refused[0])
        else:
            record(principal.name, [], None)
        if (service, operation) in answers:
            return answers[(service, operation)](dict(params))
        if (service, operation) == ("sts", "GetCallerIdentity"):
            return {
                "UserId": principal.identity.get("aws:userid", principal.name),
                "Account": gate.account,
                "Arn": principal.identity.get("aws:PrincipalArn", principal.name),
            }
        return original(client, operation, params)

    botocore.client.BaseClient._make_api_call = checked

    def uninstall() -> None:
        botocore.client.BaseClient._make_api_call = original

    return uninstall


def refusals(records: list[Record], step: str | None = None) -> Iterator[Record]:
    """Calls a checked principal was refused (or that had no IAM mapping), in the order they were made."""
    return (r for r in records if r.allowed is False and step in (None, r.step))


def _run_aws_cli(argv: list[str]) -> int:
    """The AWS CLI v1 with the gate of ``REHEARSAL_GATE`` installed (its own botocore comes first on PYTHONPATH)."""
    install(Gate.load(Path(os.environ[GATE_ENV])))
    from awscli.clidriver import main as aws_main  # type: ignore[import-not-found]

    sys.argv = ["aws", *argv]
    return int(aws_main())


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] != "aws":
        sys.exit("usage: python -m scripts.aws_calls aws ARGS (with REHEARSAL_GATE naming the gate file)")
    sys.exit(_run_aws_cli(sys.argv[2:]))
