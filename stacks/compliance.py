"""Compliance gates that run on every synth, registered as CDK policy-validation plugins: the cdk-nag 3 rule packs
(AwsSolutions, NIST 800-53 R5) on the whole app, and AWS Control Tower's proactive controls (AWS's CfnGuard validator,
``cdklabs-cdk-validator-cfnguard``, which runs its bundled ``cfn-guard`` binary) on every environment stage.

Any unacknowledged finding fails ``app.synth()`` (``ValidationFailed``) and lands in ``cdk.out/validation-report.json``.
Acknowledgements are scoped to one construct and carry a reason, which is also written into the template metadata
(``cdk_nag.rules_to_suppress``) so the ops review and ``scripts/template_gates.py`` can show it.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path
from typing import Any, cast

import aws_cdk as cdk
import jsii
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from cdk_nag import AwsSolutionsChecks, NIST80053R5Checks, WriteNagSuppressionsToCloudFormationAspect
from cdklabs.cdk_validator_cfnguard import CfnGuardValidator
from constructs import IConstruct

from stacks.control_tower_rules import rules_without_resources

# The plugin name of AWS's CfnGuard validator: acknowledgements of its rules are "<this>::<rule name>".
CONTROL_TOWER = "cdk-validator-cfnguard"
# CT.CLOUDWATCH.PR.2: log groups keep their logs for at least a year (or never expire).
CONTROL_TOWER_MIN_RETENTION_DAYS = 365


def add_compliance_gates(app: cdk.App, *, control_tower_outside_stages: bool = True) -> None:
    """Register the rule packs on the app and the Control Tower controls on each environment stage; call it after
    every Stage exists (aspects do not cross Stage borders). The Control Tower controls cover what deploys into the
    workload accounts, where an organization enables them as CloudFormation hooks, and the promotion pipeline's
    stack in the tooling account (one plugin on the app, for every template no stage plugin sees)."""
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app), NIST80053R5Checks(app))
    stages = [cast(cdk.Stage, child) for child in app.node.children if cdk.Stage.is_stage(child)]
    for stage in stages:
        cdk.Validations.of(stage).add_plugins(control_tower_gate())
    # The rest, on the app: the promotion pipeline's stack and the stages it deploys. CDK validates the stages that
    # are children of stages only (a pipeline's stages are children of its stack), and an app's plugin sees every
    # template of the assembly; the stage directories already gated above are left out.
    # A component's test app (a bare stack, no stage) may leave it out: its subject is cdk-nag.
    if control_tower_outside_stages:
        gated = {stage.artifact_id for stage in stages}  # a stage's nested assembly directory is named so
        cdk.Validations.of(app).add_plugins(control_tower_gate(skip_directories=gated))
    for scope in [app, *stages]:
        add_template_aspects(scope)


def control_tower_gate(skip_directories: Collection[str] = ()) -> cdk.IPolicyValidationPlugin:
    """All of Control Tower's proactive controls that the validator bundles (rules/control-tower/cfn-guard), on the
    templates of the plugin's stage outside the nested assembly directories named in ``skip_directories``."""
    # The validator (0.0.62) implements the deprecated Beta1 plugin interface, which add_plugins still takes: in
    # TypeScript both have the same members and jsii passes the structs by value, but their Python classes differ.
    return cast(cdk.IPolicyValidationPlugin, _ControlTowerGate(frozenset(skip_directories)))


@jsii.implements(cdk.IPolicyValidationContextBeta1)
class _Templates:
    def __init__(self, template_paths: list[str]) -> None:
        self._paths = template_paths

    @property
    def template_paths(self) -> list[str]:
        return self._paths


@jsii.implements(cdk.IPolicyValidationPluginBeta1)
class _ControlTowerGate:
    """The validator on each template of a stage, without the controls whose resource types the template does not have
    (on those, every rule would skip: stacks/control_tower_rules.py), and with every violation marked as an error.

    The validator (0.0.62) leaves a violation's severity unset. When any finding of a stage is acknowledged,
    aws-cdk-lib (2.275, private/synthesis-validation) recomputes the plugin's success as "no violation has severity
    error or fatal", so a single acknowledgement would let every other Control Tower finding of the stage pass
    synth unnoticed (seen here: the report said 'success' next to ten open findings).
    """

    def __init__(self, skip_directories: frozenset[str] = frozenset()) -> None:
        self._plugin = CfnGuardValidator(control_tower_rules_enabled=True)
        self._skip = skip_directories

    @property
    def name(self) -> str:
        return self._plugin.name

    @property
    def version(self) -> str | None:
        return self._plugin.version

    @property
    def rule_ids(self) -> list[str] | None:
        return self._plugin.rule_ids

    def validate(self, context: cdk.IPolicyValidationContextBeta1) -> cdk.PolicyValidationPluginReportBeta1:
        paths = [path for path in context.template_paths if Path(path).parent.name not in self._skip]
        if not paths:
            return cdk.PolicyValidationPluginReportBeta1(success=True, violations=[])
        # One cfn-guard run per template, each without the controls its own resource types rule out: cfn-guard
        # reports each template's violations apart either way, and the large Foundation template no longer meets the
        # controls of the other templates' types (dev's stage: 1.37 -> 1.14 CPU-s, the same violations in order).
        reports = [
            CfnGuardValidator(
                control_tower_rules_enabled=True, disabled_rules=rules_without_resources([path])
            ).validate(_Templates([path]))
            for path in paths
        ]
        return cdk.PolicyValidationPluginReportBeta1(
            success=all(report.success for report in reports),
            violations=[
                cdk.PolicyViolationBeta1(
                    rule_name=violation.rule_name,
                    description=violation.description,
                    violating_resources=violation.violating_resources,
                    fix=violation.fix,
                    rule_metadata=violation.rule_metadata,
                    severity=violation.severity or "error",
                )
                for report in reports
                for violation in report.violations
            ],
            metadata=reports[0].metadata,
            plugin_version=reports[0].plugin_version,
        )


def add_template_aspects(stage: cdk.Stage) -> None:
    """What every template of ``stage`` needs before it is synthesized: the acknowledgements written into its metadata
    (the ops review reads them) and lint-clean handlers. CDK Pipelines synthesizes the stages it deploys as they are
    added, before ``add_compliance_gates`` runs, so the pipeline calls this for each of its stages itself."""
    cdk.Aspects.of(stage).add(_AcknowledgeWhatControlTowerCannotSee(), priority=cdk.AspectPriority.MUTATING)
    cdk.Aspects.of(stage).add(WriteNagSuppressionsToCloudFormationAspect())
    cdk.Aspects.of(stage).add(_DropRedundantDependsOn())


def acknowledge_control(construct: IConstruct, reason: str, *rule_names: str) -> None:
    """Acknowledge Control Tower proactive controls (by the validator's rule name) for a reason, on the CloudFormation
    resource of ``construct`` only (not on the bucket policy or custom resources an L2 construct also holds)."""
    target = construct.node.default_child or construct
    acknowledge(target, reason, *(f"{CONTROL_TOWER}::{name}" for name in rule_names))


def log_retention(days: int) -> logs.RetentionDays:
    """The RetentionDays member for a number of days (settings validate the number against this table)."""
    return logs.RetentionDays[_RETENTION_NAMES[days]]


def acknowledge_short_retention(log_group: IConstruct, days: int, setting: str) -> None:
    """Log groups kept shorter than Control Tower's year (CT.CLOUDWATCH.PR.2) by an environment's setting: the
    acknowledgement names the setting, so the choice stays visible and only where it is made."""
    if days < CONTROL_TOWER_MIN_RETENTION_DAYS:
        acknowledge_control(
            log_group,
            f"Retention is the environment's {setting} ({days} days), chosen per environment for cost; set it to 365 "
            "or more where an audit needs a year of these logs.",
            "cloudwatch_log_group_retention_period_check",
        )


_RETENTION_NAMES = {
    1: "ONE_DAY",
    3: "THREE_DAYS",
    5: "FIVE_DAYS",
    7: "ONE_WEEK",
    14: "TWO_WEEKS",
    30: "ONE_MONTH",
    60: "TWO_MONTHS",
    90: "THREE_MONTHS",
    120: "FOUR_MONTHS",
    150: "FIVE_MONTHS",
    180: "SIX_MONTHS",
    365: "ONE_YEAR",
    400: "THIRTEEN_MONTHS",
    545: "EIGHTEEN_MONTHS",
    731: "TWO_YEARS",
    1096: "THREE_YEARS",
    1827: "FIVE_YEARS",
    2192: "SIX_YEARS",
    2557: "SEVEN_YEARS",
    2922: "EIGHT_YEARS",
    3288: "NINE_YEARS",
    3653: "TEN_YEARS",
}


@jsii.implements(cdk.IAspect)
class _AcknowledgeWhatControlTowerCannotSee:
    """Control Tower findings that are facts of how CDK builds templates, checked here resource by resource:

    - CT.CLOUDWATCH.PR.3 (log group encrypted): a log group encrypted with a key of another stack refers to it with
      Fn::ImportValue, which the rule cannot follow (it accepts a string or a reference inside the template).
    - CT.LAMBDA.PR.3 (Lambda in a VPC): the handlers of CDK's own singleton custom-resource providers (S3 auto-delete,
      default security group restriction) have no VPC option; they run once per deployment and call only AWS APIs.
    """

    def visit(self, node: IConstruct) -> None:
        if not isinstance(node, cdk.CfnResource):
            return  # a Python check: each query of a node below is a round trip to jsii's Node.js process
        if isinstance(node, logs.CfnLogGroup) and node.kms_key_id is not None:
            key = cdk.Tokenization.reverse(node.kms_key_id)
            if isinstance(key, cdk.Reference) and cdk.Stack.of(key.target) is not cdk.Stack.of(node):
                acknowledge_control(
                    node,
                    f"Encrypted with {key.target.node.path} of another stack; the reference is an Fn::ImportValue, "
                    "which the rule cannot follow.",
                    "cloudwatch_log_group_encrypted_check",
                )
        scope = node.node.scope if node.cfn_resource_type == "AWS::Lambda::Function" else None
        provider = scope.node.id if scope is not None else ""
        if provider.startswith("Custom::") and provider.endswith("CustomResourceProvider"):
            acknowledge_control(
                node,
                f"The handler of CDK's singleton {provider} has no VPC option; it runs once per deployment and "
                "calls only AWS APIs.",
                "lambda_inside_vpc_check",
            )


@jsii.implements(cdk.IAspect)
class _DropRedundantDependsOn:
    """CDK's custom-resource providers declare DependsOn a role their Role property already references (GetAtt);
    cfn-lint warns (W3005). Drop the duplicate so every template lints without warnings, ignores or overrides."""

    def visit(self, node: IConstruct) -> None:
        if not isinstance(node, cdk.CfnResource):
            return  # a Python check: each query of a node below is a round trip to jsii's Node.js process
        if node.node.id != "Handler" or node.cfn_resource_type != "AWS::Lambda::Function" or node.node.scope is None:
            return
        role = node.node.scope.node.try_find_child("Role")
        if isinstance(role, cdk.CfnResource) and any(d.node.path == role.node.path for d in node.obtain_dependencies()):
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
        if node is self.scope:
            self._check_reasons_are_in_the_policies()
        documents = _policy_documents(node)
        if not documents:  # not a policy, or a role whose grants live in its separate (default) policy
            return
        stack = cdk.Stack.of(node)
        granted = [grant for document in documents for grant in _grants(stack.resolve(document))]
        explained: list[tuple[tuple[str, str, str], str, str]] = []  # (action, resource, effect), conditions, reason
        for statement, reason in self.reasoned:
            resolved = stack.resolve(statement.to_statement_json())
            label = f"{resolved['Sid']}: " if resolved.get("Sid") else ""
            explained += [(g[:3], g[3], f"{label}{reason}") for g in _grants({"Statement": [resolved]})]
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

    def _check_reasons_are_in_the_policies(self) -> None:
        """Every reasoned statement must be granted by some IAM resource under the scope (a role's statements live
        in its default policy, a child of the role)."""
        stack = cdk.Stack.of(self.scope)
        granted = {
            grant[:3]
            for node in self.scope.node.find_all()
            for document in _policy_documents(node) or []
            for grant in _grants(stack.resolve(document))
        }
        if not granted:  # no policy under the scope (statements that went nowhere): nothing to excuse
            return
        for statement, _ in self.reasoned:
            resolved = stack.resolve(statement.to_statement_json())
            if any(g[:3] not in granted for g in _grants({"Statement": [resolved]})):
                raise ValueError(
                    f"{self.scope.node.path}: the reasoned statement {resolved.get('Sid') or resolved} is not in the "
                    "policy (or was changed); keep acknowledge_wildcards() in step with the policy."
                )


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
