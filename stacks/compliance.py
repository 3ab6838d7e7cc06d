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
    """Acknowledge exactly the AwsSolutions-IAM5 findings that these (statement, reason) pairs raise on ``construct``.

    cdk-nag names each wildcard finding after the flattened action or resource (``Resource::<Bucket.Arn>/prefix/*``);
    deriving the ids from the statements keeps the acknowledgement in step with the policy it excuses. Statements
    that share a finding (several ``Resource::*``) share one acknowledgement carrying all their reasons.
    """
    stack = cdk.Stack.of(construct)
    reasons: dict[str, list[str]] = {}
    for statement, reason in reasoned:
        resolved = stack.resolve(statement.to_statement_json())
        findings = [f"Action::{a}" for a in _as_list(resolved.get("Action")) if "*" in a]
        findings += [f"Resource::{r}" for r in map(_flatten, _as_list(resolved.get("Resource"))) if "*" in r]
        for finding in findings:
            reasons.setdefault(f"AwsSolutions-IAM5[{finding}]", []).append(reason)
    for rule_id, texts in reasons.items():
        acknowledge(construct, " ".join(dict.fromkeys(texts)), rule_id)


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
