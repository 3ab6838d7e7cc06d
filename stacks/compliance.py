"""Compliance gates that run on every synth: cdk-nag 3 rule packs registered as CDK policy-validation plugins.

Any unacknowledged finding fails ``app.synth()`` (``ValidationFailed``) and lands in
``cdk.out/policy-validation-report.json``. Acknowledgements are scoped to one construct and carry a reason, which
cdk-nag also writes into the template metadata so the ops review can show it.
"""

from __future__ import annotations

import json
from typing import Any

import aws_cdk as cdk
import jsii
from aws_cdk import aws_iam as iam
from cdk_nag import AwsSolutionsChecks, NIST80053R5Checks, WriteNagSuppressionsToCloudFormationAspect
from constructs import IConstruct


def add_compliance_gates(app: cdk.App) -> None:
    """Register the rule packs on the app; call it after every Stage exists (aspects do not cross Stage borders)."""
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app), NIST80053R5Checks(app))
    for scope in [app, *(child for child in app.node.children if cdk.Stage.is_stage(child))]:
        add_template_aspects(scope)


def add_template_aspects(stage: cdk.Stage) -> None:
    """What every template of ``stage`` needs before it is synthesized: the acknowledgements written into its metadata
    (the ops review reads them) and lint-clean handlers. CDK Pipelines synthesizes the stages it deploys as they are
    added, before ``add_compliance_gates`` runs, so the pipeline calls this for each of its stages itself."""
    cdk.Aspects.of(stage).add(WriteNagSuppressionsToCloudFormationAspect())
    cdk.Aspects.of(stage).add(_DropRedundantDependsOn())


@jsii.implements(cdk.IAspect)
class _DropRedundantDependsOn:
    """CDK's custom-resource providers declare DependsOn a role their Role property already references (GetAtt);
    cfn-lint warns (W3005). Drop the duplicate so every template lints without warnings, ignores or overrides."""

    def visit(self, node: IConstruct) -> None:
        if node.node.id != "Handler" or not cdk.CfnResource.is_cfn_resource(node):
            return
        role = node.node.scope.node.try_find_child("Role")
        if (
            node.cfn_resource_type == "AWS::Lambda::Function"
            and cdk.CfnResource.is_cfn_resource(role)
            and any(d.node.path == role.node.path for d in node.obtain_dependencies())
        ):
            node.remove_resource_dependency(role)


def acknowledge(construct: IConstruct, reason: str, *rule_ids: str) -> None:
    """Acknowledge cdk-nag findings on ``construct`` (and its children) for one written reason."""
    cdk.Validations.of(construct).acknowledge(*(cdk.Acknowledgment(id=rule_id, reason=reason) for rule_id in rule_ids))


def acknowledge_wildcards(construct: IConstruct, *reasoned: tuple[iam.PolicyStatement, str]) -> None:
    """Acknowledge the AwsSolutions-IAM5 findings of ``construct``'s policy statement by statement.

    cdk-nag names each wildcard finding after the flattened action or resource (``Resource::*``,
    ``Action::s3:List*``), not after the statement, so a plain acknowledgement of ``Resource::*`` would also excuse
    any ``iam:PassRole`` or ``s3:GetObject`` on ``*`` added to the policy later. Here the acknowledgement is decided
    at synth, on the final policy document: a finding is acknowledged only when every (action, resource) grant that
    raises it comes from one of these reasoned statements (conditions may only narrow them). Any other grant leaves
    the finding unacknowledged, and cdk-nag fails synth. A reasoned statement that is not in the policy fails synth
    too, so reasons cannot outlive their statements.
    """
    if not reasoned:
        return
    cdk.Aspects.of(construct).add(_ReasonedWildcards(construct, list(reasoned)), priority=cdk.AspectPriority.MUTATING)


_IAM5 = "AwsSolutions-IAM5"


@jsii.implements(cdk.IAspect)
class _ReasonedWildcards:
    """Acknowledges, per finding, the IAM5 wildcards of the policy resources under ``scope`` that reasoned
    statements fully explain (runs before the aspect that writes acknowledgements into template metadata)."""

    def __init__(self, scope: IConstruct, reasoned: list[tuple[iam.PolicyStatement, str]]) -> None:
        self.scope = scope
        self.reasoned = reasoned

    def visit(self, node: IConstruct) -> None:
        documents = _policy_documents(node)
        if documents is None:
            return
        stack = cdk.Stack.of(node)
        granted = [grant for document in documents for grant in _grants(stack.resolve(document))]
        explained: list[tuple[tuple[str, str, str], str, str]] = []  # (action, resource, effect), conditions, reason
        for statement, reason in self.reasoned:
            resolved = stack.resolve(statement.to_statement_json())
            grants = _grants({"Statement": [resolved]})
            if any(g[:3] not in {g2[:3] for g2 in granted} for g in grants):
                raise ValueError(
                    f"{node.node.path}: the reasoned statement {resolved.get('Sid') or resolved} is not in the "
                    "policy (or was changed); keep acknowledge_wildcards() in step with the policy."
                )
            label = f"{resolved['Sid']}: " if resolved.get("Sid") else ""
            explained += [(g[:3], g[3], f"{label}{reason}") for g in grants]
        reasons: dict[str, list[str]] = {}
        unexplained: set[str] = set()
        for grant in granted:
            findings = _findings(grant)
            if not findings:
                continue
            matches = [reason for key, conditions, reason in explained if _covers(key, conditions, grant)]
            for finding in findings:
                if matches:
                    reasons.setdefault(finding, []).extend(matches)
                else:
                    unexplained.add(finding)
        for finding, texts in reasons.items():
            if finding not in unexplained:
                acknowledge(node, " ".join(dict.fromkeys(texts)), f"{_IAM5}[{finding}]")


def _policy_documents(node: IConstruct) -> list[Any] | None:
    """The policy documents of an IAM L1 resource (None for anything else)."""
    if isinstance(node, iam.CfnManagedPolicy | iam.CfnPolicy):
        return [node.policy_document]
    if isinstance(node, iam.CfnRole):
        policies = cdk.Stack.of(node).resolve(node.policies) or []
        return [policy["PolicyDocument"] for policy in policies]
    return None


# One grant: (action, resource as JSON, effect, conditions as JSON).
_Grant = tuple[str, str, str, str]


def _grants(document: dict[str, Any]) -> list[_Grant]:
    """Every Allow of ``document`` as (action, resource, effect, conditions); NotAction/NotResource are kept whole."""
    grants = []
    for statement in _as_list(document.get("Statement")):
        if statement.get("Effect") != "Allow":
            continue
        conditions = json.dumps(statement.get("Condition", {}), sort_keys=True)
        actions = _as_list(statement.get("Action")) or [f"NotAction:{json.dumps(statement.get('NotAction'))}"]
        resources = _as_list(statement.get("Resource")) or [{"NotResource": statement.get("NotResource")}]
        grants += [
            (action, json.dumps(resource, sort_keys=True), "Allow", conditions)
            for action in actions
            for resource in resources
        ]
    return grants


def _findings(grant: _Grant) -> list[str]:
    """The IAM5 findings cdk-nag raises for one grant (rules/iam/IAMNoWildcardPermissions)."""
    action, resource, _, _ = grant
    findings = [f"Action::{action}"] if "*" in action else []
    flat = _flatten(json.loads(resource))
    return findings + ([f"Resource::{flat}"] if "*" in flat else [])


def _covers(key: tuple[str, str, str], conditions: str, grant: _Grant) -> bool:
    """A reasoned (action, resource, effect) explains a granted one with the same or narrower conditions."""
    return key == grant[:3] and conditions in (grant[3], json.dumps({}))


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [] if value is None else [value]


def _flatten(node: Any) -> str:
    """cdk-nag's flattening of a CloudFormation reference (utils/flatten-cfn-reference)."""
    if isinstance(node, str):
        return node.replace("${", "<").replace("}", ">")
    if "Fn::Join" in node:
        delimiter, items = node["Fn::Join"]
        return delimiter.join(_flatten(item) for item in items)
    if "Fn::Sub" in node:
        return _flatten(node["Fn::Sub"])
    if "Fn::GetAtt" in node:
        resource, attribute = node["Fn::GetAtt"]
        return f"<{_flatten(resource)}.{_flatten(attribute)}>"
    if "Fn::ImportValue" in node:
        return _flatten(node["Fn::ImportValue"])
    if "Ref" in node:
        return f"<{_flatten(node['Ref'])}>"
    return json.dumps(node)
