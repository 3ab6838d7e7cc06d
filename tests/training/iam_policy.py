"""A small IAM evaluator for identity policies from synthesized templates, and the API-call-to-action map it needs.

Scope (fails closed on anything else): Allow and Deny statements with ``Action`` / ``Resource`` (strings or lists,
``*`` and ``?`` wildcards, which in IAM resource matching also span ``:`` and ``/``), and the condition operators
``StringEquals``, ``StringLike``, ``ArnEquals``, ``ArnLike`` (a key missing from the request context fails the
condition). ``NotAction``, ``NotResource``, other operators or an API operation with no entry in ``OPERATIONS``
raise ``Unsupported``, so a policy or a call this evaluator does not understand can never pass silently.

It answers one question: is every request an identity makes allowed by its own policies? It ignores what a real
account adds on top (SCPs, permission boundaries, resource policies, session policies); the platform uses none that
grant more, so a call this evaluator refuses is one IAM refuses too.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any


class Unsupported(ValueError):
    """A policy element or API operation outside what this evaluator models."""


@dataclass(frozen=True)
class Request:
    """One IAM authorization request: an action on a resource with its condition context."""

    action: str
    resource: str
    context: dict[str, str] = field(default_factory=dict)


def _wildcard(pattern: str, value: str, *, case_sensitive: bool = True) -> bool:
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, 0 if case_sensitive else re.IGNORECASE) is not None


def _as_list(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


_OPERATORS: dict[str, Callable[[str, str], bool]] = {
    "StringEquals": lambda pattern, value: pattern == value,
    "StringLike": _wildcard,
    "ArnEquals": lambda pattern, value: pattern == value,
    "ArnLike": _wildcard,
}


def _conditions_hold(conditions: dict[str, dict[str, Any]], context: dict[str, str]) -> bool:
    for operator, keys in conditions.items():
        if operator not in _OPERATORS:
            raise Unsupported(f"condition operator {operator}")
        for key, patterns in keys.items():
            value = context.get(key)
            if value is None or not any(_OPERATORS[operator](p, value) for p in _as_list(patterns)):
                return False
    return True


def _matches(statement: dict[str, Any], request: Request) -> bool:
    for unsupported in ("NotAction", "NotResource", "NotPrincipal"):
        if unsupported in statement:
            raise Unsupported(unsupported)
    if not any(_wildcard(a, request.action, case_sensitive=False) for a in _as_list(statement["Action"])):
        return False
    if not any(_wildcard(r, request.resource) for r in _as_list(statement["Resource"])):
        return False
    return _conditions_hold(statement.get("Condition", {}), request.context)


def is_allowed(policies: Iterable[dict[str, Any]], request: Request) -> bool:
    """An explicit Deny wins; otherwise an Allow is needed (default deny)."""
    statements = [s for policy in policies for s in _as_list_of_statements(policy)]
    if any(s["Effect"] == "Deny" and _matches(s, request) for s in statements):
        return False
    return any(s["Effect"] == "Allow" and _matches(s, request) for s in statements)


def _as_list_of_statements(policy: dict[str, Any]) -> list[dict[str, Any]]:
    statements = policy["Statement"]
    return [statements] if isinstance(statements, dict) else statements


# ---------------------------------------------------------------------------------------- template intrinsics


def resolve(value: Any, *, refs: dict[str, Any], exports: dict[str, Any] | None = None) -> Any:
    """Resolve the CloudFormation intrinsics a CDK template uses in policies and parameters.

    ``refs`` maps logical ids and pseudo parameters to their ``Ref`` value, and ``"<id>.<attribute>"`` to
    ``Fn::GetAtt`` values; ``exports`` maps export names to values (``Fn::ImportValue``). An unknown name raises
    KeyError, so nothing resolves to a guess.
    """
    exports = exports or {}
    if isinstance(value, list):
        return [resolve(v, refs=refs, exports=exports) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        ((name, argument),) = value.items()
        if name == "Ref":
            return refs[argument]
        if name == "Fn::GetAtt":
            return refs[f"{argument[0]}.{argument[1]}"]
        if name == "Fn::Join":
            separator, parts = argument
            return separator.join(str(resolve(p, refs=refs, exports=exports)) for p in parts)
        if name == "Fn::ImportValue":
            return exports[resolve(argument, refs=refs, exports=exports)]
        if name == "Fn::Sub":
            body, variables = argument if isinstance(argument, list) else (argument, {})
            values = {k: resolve(v, refs=refs, exports=exports) for k, v in variables.items()}
            return re.sub(r"\$\{([^}]+)\}", lambda m: str(values[m[1]] if m[1] in values else refs[m[1]]), body)
        if name.startswith("Fn::"):
            raise Unsupported(name)
    return {k: resolve(v, refs=refs, exports=exports) for k, v in value.items()}


def template_exports(template: dict[str, Any], refs: dict[str, Any]) -> dict[str, Any]:
    """The template's exports whose values ``refs`` can resolve (importing any other one raises KeyError)."""
    exports = {}
    for output in template.get("Outputs", {}).values():
        if "Export" in output:
            with contextlib.suppress(KeyError):
                exports[resolve(output["Export"]["Name"], refs=refs)] = resolve(output["Value"], refs=refs)
    return exports


def logical_id(template: dict[str, Any], resource_type: str, prefix: str) -> str:
    """The one logical id of ``resource_type`` whose CDK id starts with ``prefix``."""
    (found,) = [
        name
        for name, resource in template["Resources"].items()
        if resource["Type"] == resource_type and re.fullmatch(rf"{re.escape(prefix)}[0-9A-F]{{8}}", name)
    ]
    return found


def role_policies(template: dict[str, Any], role_id: str, refs: dict[str, Any]) -> list[dict[str, Any]]:
    """Every identity policy of a role in the template: inline, and managed policies naming the role."""
    policies = [resolve(p["PolicyDocument"], refs=refs)
                for p in template["Resources"][role_id]["Properties"].get("Policies", [])]  # fmt: skip
    for resource in template["Resources"].values():
        if resource["Type"] in ("AWS::IAM::ManagedPolicy", "AWS::IAM::Policy") and {"Ref": role_id} in resource[
            "Properties"
        ].get("Roles", []):
            policies.append(resolve(resource["Properties"]["PolicyDocument"], refs=refs))
    if template["Resources"][role_id]["Properties"].get("ManagedPolicyArns"):
        raise Unsupported("managed policies attached by ARN")
    return policies


# ------------------------------------------------------------------------------------ API calls -> IAM requests


@dataclass(frozen=True)
class Call:
    """One API call as botocore makes it."""

    service: str  # botocore service name: s3, sagemaker, logs, sts, ...
    operation: str  # CreateTrainingJob, PutObject, ...
    params: dict[str, Any]
    region: str
    account: str


def _s3_object(call: Call) -> str:
    return f"arn:aws:s3:::{call.params['Bucket']}/{call.params['Key']}"


def _s3_bucket(call: Call) -> str:
    return f"arn:aws:s3:::{call.params['Bucket']}"


def _arn(call: Call, service: str, resource: str) -> str:
    return f"arn:aws:{service}:{call.region}:{call.account}:{resource}"


def _log_group(call: Call) -> str:
    return _arn(call, "logs", f"log-group:{call.params['logGroupName']}")


# operation -> (IAM action, resource ARN builder). Documented in the Service Authorization Reference.
OPERATIONS: dict[tuple[str, str], list[tuple[str, Callable[[Call], str]]]] = {
    ("s3", "PutObject"): [("s3:PutObject", _s3_object)],
    ("s3", "CreateMultipartUpload"): [("s3:PutObject", _s3_object)],
    ("s3", "UploadPart"): [("s3:PutObject", _s3_object)],
    ("s3", "CompleteMultipartUpload"): [("s3:PutObject", _s3_object)],
    ("s3", "AbortMultipartUpload"): [("s3:AbortMultipartUpload", _s3_object)],
    ("s3", "GetObject"): [("s3:GetObject", _s3_object)],
    ("s3", "HeadObject"): [("s3:GetObject", _s3_object)],
    ("s3", "ListObjectsV2"): [("s3:ListBucket", _s3_bucket)],
    ("s3", "ListObjects"): [("s3:ListBucket", _s3_bucket)],
    ("s3", "HeadBucket"): [("s3:ListBucket", _s3_bucket)],
    ("s3", "GetBucketLocation"): [("s3:GetBucketLocation", _s3_bucket)],
    ("s3", "CreateBucket"): [("s3:CreateBucket", _s3_bucket)],
    ("s3", "ListBuckets"): [("s3:ListAllMyBuckets", lambda call: "*")],
    ("sagemaker", "CreateTrainingJob"): [
        ("sagemaker:CreateTrainingJob", lambda c: _arn(c, "sagemaker", f"training-job/{c.params['TrainingJobName']}"))
    ],
    ("sagemaker", "DescribeTrainingJob"): [
        ("sagemaker:DescribeTrainingJob", lambda c: _arn(c, "sagemaker", f"training-job/{c.params['TrainingJobName']}"))
    ],
    ("sagemaker", "StopTrainingJob"): [
        ("sagemaker:StopTrainingJob", lambda c: _arn(c, "sagemaker", f"training-job/{c.params['TrainingJobName']}"))
    ],
    # CloudWatch Logs evaluates log-group actions against the group ARN with and without ":*" depending on the
    # action; both forms are checked, so a policy that grants one of them only fails here.
    ("logs", "DescribeLogStreams"): [
        ("logs:DescribeLogStreams", _log_group),
        ("logs:DescribeLogStreams", lambda c: f"{_log_group(c)}:*"),
    ],
    ("logs", "GetLogEvents"): [
        ("logs:GetLogEvents", lambda c: f"{_log_group(c)}:log-stream:{c.params['logStreamName']}")
    ],
    # Parameter ARNs drop the name's leading slash: arn:aws:ssm:<region>:<account>:parameter/a/b.
    ("ssm", "GetParameter"): [
        ("ssm:GetParameter", lambda c: _arn(c, "ssm", f"parameter/{c.params['Name'].lstrip('/')}"))
    ],
    # "No permissions are required to perform this operation" (STS API reference, GetCallerIdentity).
    ("sts", "GetCallerIdentity"): [],
}


def requests_for(call: Call, *, kms_encrypted_buckets: dict[str, str]) -> list[Request]:
    """The IAM requests one API call needs, including the ones a service makes with the caller's permissions.

    ``kms_encrypted_buckets`` maps bucket names to the KMS key ARN of their default SSE-KMS encryption: S3 calls
    KMS as the caller (kms:GenerateDataKey to write, kms:Decrypt to read; S3 user guide, "Using SSE-KMS").
    CreateTrainingJob also needs iam:PassRole on its role (passed to sagemaker.amazonaws.com) and, with tags,
    sagemaker:AddTags (SageMaker developer guide, "Tag-based access control").
    """
    key = (call.service, call.operation)
    if key not in OPERATIONS:
        raise Unsupported(f"no IAM mapping for {call.service}:{call.operation}")
    requests = [Request(action, arn(call)) for action, arn in OPERATIONS[key]]
    if call.service == "s3" and "Key" in call.params and call.params.get("Bucket") in kms_encrypted_buckets:
        kms_key = call.params.get("SSEKMSKeyId") or kms_encrypted_buckets[call.params["Bucket"]]
        via = {"kms:ViaService": f"s3.{call.region}.amazonaws.com"}
        writes = call.operation in ("PutObject", "CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload")
        requests.append(Request("kms:GenerateDataKey" if writes else "kms:Decrypt", kms_key, via))
    if key == ("sagemaker", "CreateTrainingJob"):
        requests.append(
            Request("iam:PassRole", call.params["RoleArn"], {"iam:PassedToService": "sagemaker.amazonaws.com"})
        )
        if call.params.get("Tags"):
            requests.append(Request("sagemaker:AddTags", requests[0].resource))
    return requests
