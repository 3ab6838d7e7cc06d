"""A small IAM evaluator for the policies of synthesized templates: the review's reach of each principal
(``ops_review.reach``), the security tests and the rehearsal's call gate decide requests with it (the proving ground's
``iam_requests`` turns templates and API calls into requests).

Scope (fails closed on anything else): Allow and Deny statements with ``Action``/``NotAction`` and
``Resource``/``NotResource`` (strings or lists, ``*`` and ``?`` wildcards, which in IAM resource matching also span
``:`` and ``/``), policy variables (``${aws:userid}``: a variable missing from the request context makes the element
match nothing), ``Principal`` in resource policies, and the condition operators ``String(Not)Equals``,
``String(Not)Like``, ``Arn(Not)Equals``, ``Arn(Not)Like``, ``Bool``, ``Numeric*``, ``Null``, each with ``...IfExists``
and the ``ForAllValues:`` / ``ForAnyValue:`` set qualifiers. Semantics follow the IAM User Guide, "IAM JSON policy
elements: Condition operators" (a key missing from the context fails a positive operator and satisfies a negated one;
``...IfExists`` is true without the key; ``ForAllValues`` is true for an empty set, ``ForAnyValue`` false) and
"Policy evaluation logic" (an explicit Deny in any policy wins; a same-account request is allowed by an Allow in the
identity policy or in a resource policy naming the principal; a KMS key policy must allow, itself or by delegating to
the account's IAM policies; a VPC endpoint policy must also allow what passes through it). ``NotPrincipal``, other
operators raise ``Unsupported``, so a policy this evaluator does not understand can never pass silently.

It does not model SCPs, permission boundaries or session policies: the platform uses none.
"""

from __future__ import annotations

import base64
import functools
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


class Unsupported(ValueError):
    """A policy element or API operation outside what this evaluator models."""


ContextValue = str | list[str]


@dataclass(frozen=True)
class Request:
    """One IAM authorization request: an action on a resource with its condition context."""

    action: str
    resource: str
    context: Mapping[str, ContextValue] = field(default_factory=dict)


@functools.lru_cache(maxsize=8192)
def _compiled(pattern: str, case_sensitive: bool) -> re.Pattern[str]:
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile(regex, 0 if case_sensitive else re.IGNORECASE)


def _wildcard(pattern: str, value: str, *, case_sensitive: bool = True) -> bool:
    return _compiled(pattern, case_sensitive).fullmatch(value) is not None


def _as_list(value: Any) -> list[Any]:
    return [value] if isinstance(value, str | bool | int | float) else list(value)


def _substitute(pattern: str, context: Mapping[str, ContextValue]) -> str | None:
    """``pattern`` with its policy variables replaced from ``context`` (None when one is missing or multivalued)."""
    missing = False

    def value(match: re.Match[str]) -> str:
        nonlocal missing
        name = match[1]
        if name in ("*", "?", "$"):  # IAM's escapes for literal characters
            return name
        found = context.get(name)
        if not isinstance(found, str):
            missing = True
            return ""
        return found

    result = re.sub(r"\$\{([^}]+)\}", value, pattern)
    return None if missing else result


def _number(value: str) -> float:
    return float(value)


_BASE_OPERATORS: dict[str, Callable[[str, str], bool]] = {
    "StringEquals": lambda pattern, value: pattern == value,
    "StringEqualsIgnoreCase": lambda pattern, value: pattern.lower() == value.lower(),
    "StringLike": _wildcard,
    "ArnEquals": lambda pattern, value: pattern == value,
    "ArnLike": _wildcard,
    "Bool": lambda pattern, value: pattern.lower() == value.lower(),
    "NumericEquals": lambda pattern, value: _number(value) == _number(pattern),
    "NumericLessThan": lambda pattern, value: _number(value) < _number(pattern),
    "NumericLessThanEquals": lambda pattern, value: _number(value) <= _number(pattern),
    "NumericGreaterThan": lambda pattern, value: _number(value) > _number(pattern),
    "NumericGreaterThanEquals": lambda pattern, value: _number(value) >= _number(pattern),
}
_NEGATED = {"StringNotEquals": "StringEquals", "StringNotLike": "StringLike", "ArnNotEquals": "ArnEquals",
            "ArnNotLike": "ArnLike", "NumericNotEquals": "NumericEquals"}  # fmt: skip


def _condition_holds(operator: str, key: str, patterns: list[str], context: Mapping[str, ContextValue]) -> bool:
    qualifier, _, operator = operator.rpartition(":")
    if qualifier not in ("", "ForAllValues", "ForAnyValue"):
        raise Unsupported(f"condition qualifier {qualifier}")
    value = context.get(key)
    if operator == "Null":
        if qualifier:
            raise Unsupported("Null with a set qualifier")
        return any(str(p).lower() == ("false" if value not in (None, []) else "true") for p in patterns)
    if_exists = operator.endswith("IfExists")
    operator = operator.removesuffix("IfExists")
    negated = operator in _NEGATED
    base = _NEGATED.get(operator, operator)
    if base not in _BASE_OPERATORS:
        raise Unsupported(f"condition operator {operator}")
    test = _BASE_OPERATORS[base]
    resolved = [_substitute(str(p), context) for p in patterns]
    usable = [p for p in resolved if p is not None]

    def one(item: str) -> bool:
        matched = any(test(p, item) for p in usable)
        return not matched if negated else matched

    if qualifier == "ForAllValues":
        return all(one(item) for item in _as_list(value or []))
    if qualifier == "ForAnyValue":
        return any(one(item) for item in _as_list(value or []))
    if value is None:
        return if_exists or negated
    if isinstance(value, list):
        raise Unsupported(f"multivalued key {key} without ForAllValues/ForAnyValue")
    return one(value)


def _conditions_hold(conditions: dict[str, dict[str, Any]], context: Mapping[str, ContextValue]) -> bool:
    return all(
        _condition_holds(operator, key, [str(p) for p in _as_list(patterns)], context)
        for operator, keys in conditions.items()
        for key, patterns in keys.items()
    )


def _element_matches(patterns: Any, value: str, context: Mapping[str, ContextValue], *, action: bool) -> bool:
    for pattern in _as_list(patterns):
        resolved = pattern if action else _substitute(pattern, context)
        if resolved is not None and _wildcard(resolved, value, case_sensitive=not action):
            return True
    return False


def _principal_matches(principal: Any, context: Mapping[str, ContextValue]) -> str | None:
    """How a resource policy's ``Principal`` names the caller: "direct", "account" (the account root, which only
    delegates to the account's IAM policies), or None."""
    if principal == "*" or principal == {"AWS": "*"}:
        return "direct"
    if not isinstance(principal, dict):
        raise Unsupported(f"principal {principal!r}")
    for arn in _as_list(principal.get("AWS", [])):
        if arn in (context.get("aws:PrincipalArn"), context.get("aws:userid")):
            return "direct"
        account = context.get("aws:PrincipalAccount")
        if arn in (f"arn:aws:iam::{account}:root", account):
            return "account"
    for service in _as_list(principal.get("Service", [])):
        if context.get("aws:PrincipalServiceName") == service:
            return "direct"
    return None


def _matches(statement: dict[str, Any], request: Request, *, resource_policy: bool = False) -> str | None:
    """None if ``statement`` does not apply to ``request``; else how it names the principal ("identity" for
    identity policies)."""
    if "NotPrincipal" in statement:
        raise Unsupported("NotPrincipal")
    context = request.context
    if "Action" in statement:
        if not _element_matches(statement["Action"], request.action, context, action=True):
            return None
    elif "NotAction" in statement:
        if _element_matches(statement["NotAction"], request.action, context, action=True):
            return None
    else:
        raise Unsupported("statement without Action or NotAction")
    if "Resource" in statement:
        if not _element_matches(statement["Resource"], request.resource, context, action=False):
            return None
    elif "NotResource" in statement:
        if _element_matches(statement["NotResource"], request.resource, context, action=False):
            return None
    elif not resource_policy:
        raise Unsupported("identity statement without Resource or NotResource")
    if not _conditions_hold(statement.get("Condition", {}), context):
        return None
    if not resource_policy:
        return "identity"
    return _principal_matches(statement.get("Principal"), context)


def _statements(policies: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [s for policy in policies for s in _as_list_of_statements(policy)]


def is_allowed(
    policies: Iterable[dict[str, Any]],
    request: Request,
    *,
    resource_policies: Sequence[dict[str, Any]] = (),
    key_policy: dict[str, Any] | None = None,
    endpoint_policies: Sequence[dict[str, Any]] = (),
    same_account: bool = True,
) -> bool:
    """The decision for ``request`` made by a principal of the resource's account (``same_account``), or of another.

    ``policies``: the principal's identity policies; ``resource_policies``: the resource's own (bucket policy, ...);
    ``key_policy``: for KMS requests, the key's policy (required: KMS refuses without one); ``endpoint_policies``:
    the VPC endpoints the request passes through, each of which must allow it. A request from another account needs
    both an Allow of the principal's identity policies and one of the resource's policy naming the principal or its
    account (IAM User Guide, "Cross-account policy evaluation logic").
    """
    identity = _statements(policies)
    resource = _statements(resource_policies) + (_statements([key_policy]) if key_policy else [])
    boundaries = [_statements([policy]) for policy in endpoint_policies]
    every = [(s, False) for s in identity] + [(s, True) for s in resource]
    every += [(s, True) for boundary in boundaries for s in boundary]
    if any(s["Effect"] == "Deny" and _matches(s, request, resource_policy=rp) for s, rp in every):
        return False
    for boundary in boundaries:
        if not any(s["Effect"] == "Allow" and _matches(s, request, resource_policy=True) for s in boundary):
            return False
    identity_allows = any(s["Effect"] == "Allow" and _matches(s, request) for s in identity)
    grants = {_matches(s, request, resource_policy=True) for s in resource if s["Effect"] == "Allow"}
    if not same_account:
        return identity_allows and bool(grants & {"direct", "account"})
    if key_policy is not None:
        return "direct" in grants or ("account" in grants and identity_allows)
    return identity_allows or "direct" in grants


def allowing_statements(
    policies: Iterable[dict[str, Any]], request: Request, *, resource_policy: bool = False
) -> list[dict[str, Any]]:
    """The Allow statements of ``policies`` that apply to ``request`` (identity policies, or resource policies whose
    ``Principal`` names the caller or its account)."""
    return [
        s
        for s in _statements(policies)
        if s["Effect"] == "Allow" and _matches(s, request, resource_policy=resource_policy)
    ]


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
        if name == "Fn::Base64":
            return base64.b64encode(str(resolve(argument, refs=refs, exports=exports)).encode()).decode()
        if name == "Fn::Select":
            index, items = argument
            return resolve(items, refs=refs, exports=exports)[int(resolve(index, refs=refs, exports=exports))]
        if name == "Fn::Split":
            separator, text = argument
            return str(resolve(text, refs=refs, exports=exports)).split(separator)
        if name == "Fn::GetAZs":  # the region's zones, as refs["Fn::GetAZs"] lists them
            return refs["Fn::GetAZs"]
        if name.startswith("Fn::"):
            raise Unsupported(name)
    return {k: resolve(v, refs=refs, exports=exports) for k, v in value.items()}
