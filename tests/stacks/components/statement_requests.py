"""Requests derived from a synthesized policy's grants, evaluated with the project's evaluator: what a policy test
needs so that it looks at EVERY action a statement grants, not the one the test author thought of.

``granted_actions`` lists the actions (and the resource patterns) the Allow statements of synthesized policies name;
``allowed_without_context`` evaluates each of them on a concrete resource with an empty request context: the
requests any caller could make without meeting a condition. A test states which of those are meant to be
unconditional; a condition removed from any statement adds its actions to the set, and the test fails.
``each_key_matters`` drops each key of an allowed request's context in turn: every drop must be refused."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ops_review.iam_policy import ContextValue, Request, is_allowed


def _as_list(value: Any) -> list[Any]:
    return [value] if isinstance(value, str) else list(value)


def granted_actions(policies: Iterable[dict[str, Any]]) -> list[tuple[str, str]]:
    """(action, resource pattern) for each action and resource of each Allow statement, in order."""
    grants = []
    for policy in policies:
        statements = policy["Statement"]
        for statement in [statements] if isinstance(statements, dict) else statements:
            if statement["Effect"] != "Allow" or "Action" not in statement or "Resource" not in statement:
                continue
            for action in _as_list(statement["Action"]):
                grants += [(action, resource) for resource in _as_list(statement["Resource"])]
    return grants


def concrete(pattern: str) -> str:
    """A resource (or action) that the pattern matches: each wildcard filled with a made-up value."""
    return pattern.replace("*", "x1").replace("?", "x")


def allowed_without_context(policies: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """The (action, resource pattern) grants a request with no condition keys at all is allowed."""
    return {
        (action, resource)
        for action, resource in granted_actions(policies)
        if is_allowed(policies, Request(concrete(action), concrete(resource)))
    }


def each_key_matters(policies: list[dict[str, Any]], action: str, resource: str,
                     context: Mapping[str, ContextValue]) -> dict[str, bool]:  # fmt: skip
    """``{key: allowed without it}`` for every key of ``context`` (the request itself must be allowed)."""
    assert is_allowed(policies, Request(action, resource, context)), (action, resource, context)
    return {
        key: is_allowed(policies, Request(action, resource, {k: v for k, v in context.items() if k != key}))
        for key in context
    }


# An identity policy that allows everything: beside it, what a resource policy refuses is what that policy decides.
ALLOW_EVERYTHING = {"Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}


def bucket_requests(bucket_arn: str) -> list[tuple[str, str]]:
    """Reads, writes, deletes and listing of objects, and a change of the bucket itself."""
    objects = f"{bucket_arn}/prefix/object"
    return [("s3:GetObject", objects), ("s3:PutObject", objects), ("s3:DeleteObject", objects),
            ("s3:ListBucket", bucket_arn), ("s3:PutBucketPolicy", bucket_arn)]  # fmt: skip


def over_tls_and_plain_http(
    resource_policy: dict[str, Any],
    requests: Iterable[tuple[str, str]],
    context: Mapping[str, ContextValue] | None = None,
) -> dict[tuple[str, str], tuple[bool, bool]]:
    """``{(action, resource): (allowed over TLS, allowed over plain HTTP)}`` for a caller of the resource's account
    whose identity policy allows everything (``context``: more keys of each request)."""
    decisions = {}
    for action, resource in requests:
        allowed = [
            is_allowed([ALLOW_EVERYTHING], Request(action, resource, {**(context or {}), "aws:SecureTransport": tls}),
                       resource_policies=[resource_policy])
            for tls in ("true", "false")
        ]  # fmt: skip
        decisions[(action, resource)] = (allowed[0], allowed[1])
    return decisions
