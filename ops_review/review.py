"""Ops review of a synthesized cloud assembly (``cdk.out``): what each stack of each environment would do.

It reads only the templates and manifests (no AWS calls, no CDK import), so it reviews any synthesized app: the
resources, every IAM principal with its actions and resources (wildcards flagged), network exposure, encryption of
each data store, deletion/retention policy of each data-bearing resource, the cdk-nag acknowledgements (the compliance
gates write them into the template metadata), the On-Demand hourly cost of the instances the stack would run, and the
predicted behaviour of a multi-model endpoint (from the sizing inputs its stack writes into the endpoint's metadata;
the same plan as `pytorch-platform mme-plan`).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

from mme_sizing import plan as mme_plan
from ops_review import GATES_REPORT
from platform_facts.images import METADATA_KEY as IMAGES_METADATA_KEY
from platform_facts.instances import lookup as instance_facts

PRICES_FILE = Path(__file__).with_name("prices.json")

# Resource types that hold data (or the key to it): their deletion policy decides what `cdk destroy` takes along.
DATA_BEARING_TYPES = (
    "AWS::S3::Bucket",
    "AWS::KMS::Key",
    "AWS::Logs::LogGroup",
    "AWS::ECR::Repository",
    "AWS::DynamoDB::Table",
    "AWS::EFS::FileSystem",
    "AWS::RDS::DBCluster",
    "AWS::RDS::DBInstance",
    "AWS::SageMaker::ModelPackageGroup",
    "AWS::SageMaker::FeatureGroup",
)
APP_ENVIRONMENT = "(app)"
_INTERNET = ("0.0.0.0/0", "::/0")


@dataclass(frozen=True)
class StackTemplate:
    environment: str  # the Stage path ("dev", "PromotionPipeline/dev") or APP_ENVIRONMENT for top-level stacks
    stack: str  # the construct id of the stack inside its stage
    stack_name: str  # the CloudFormation stack name
    region: str | None
    account: str | None
    template: dict[str, Any]
    tags: dict[str, str]


def load_assembly(cdk_out: Path) -> list[StackTemplate]:
    """Every stack template of the cloud assembly, nested stage assemblies included."""
    manifest_file = Path(cdk_out) / "manifest.json"
    if not manifest_file.is_file():
        raise FileNotFoundError(f"{cdk_out}: not a cloud assembly (no manifest.json); run `make synth` first.")
    stacks: list[StackTemplate] = []
    for artifact_id, artifact in json.loads(manifest_file.read_text())["artifacts"].items():
        properties = artifact.get("properties", {})
        if artifact["type"] == "cdk:cloud-assembly":
            stacks += load_assembly(Path(cdk_out) / properties["directoryName"])
        elif artifact["type"] == "aws:cloudformation:stack":
            display = artifact.get("displayName", artifact_id)
            environment, _, stack = display.rpartition("/")
            account, region = _environment(artifact.get("environment", ""))
            stacks.append(
                StackTemplate(
                    environment=environment or APP_ENVIRONMENT,
                    stack=stack,
                    stack_name=properties.get("stackName", stack),
                    region=region,
                    account=account,
                    template=json.loads((Path(cdk_out) / properties["templateFile"]).read_text()),
                    tags=properties.get("tags", {}),
                )
            )
    return stacks


def _environment(uri: str) -> tuple[str | None, str | None]:
    account, _, region = uri.removeprefix("aws://").partition("/")
    return (None if account.startswith("unknown") else account), (None if region.startswith("unknown") else region)


def load_gates_report(cdk_out: Path) -> dict[str, Any] | None:
    """The gates' report in the assembly (every acknowledged finding with its reason), if `make synth` wrote one."""
    report = Path(cdk_out) / GATES_REPORT
    return json.loads(report.read_text()) if report.is_file() else None


def load_prices(path: Path = PRICES_FILE) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def review_assembly(
    cdk_out: Path, prices: dict[str, Any] | None = None, today: date | None = None
) -> dict[str, dict[str, dict[str, Any]]]:
    """{environment: {stack: review}} for every stack of the assembly; images' days left counted from ``today``."""
    prices = prices or load_prices()
    stacks = load_assembly(cdk_out)
    exports = assembly_exports(stacks)
    reviews: dict[str, dict[str, dict[str, Any]]] = {}
    for stack in stacks:
        reviews.setdefault(stack.environment, {})[stack.stack] = review_stack(stack, prices, today, exports)
    return reviews


def assembly_exports(stacks: list[StackTemplate]) -> dict[str, str]:
    """{export name: what it names} over every stack: ``Foundation/TrainingInstanceProfile`` for the export of its
    ARN, so a policy of another stack that imports it names the resource, not the export."""
    exports: dict[str, str] = {}
    for stack in stacks:
        template = _Template(stack)
        for output in stack.template.get("Outputs", {}).values():
            name = output.get("Export", {}).get("Name")
            if isinstance(name, str):
                exports[name] = f"{stack.stack}/{template.named(output['Value'])}"
    return exports


def review_stack(
    stack: StackTemplate, prices: dict[str, Any], today: date | None = None, exports: dict[str, str] | None = None
) -> dict[str, Any]:
    template = _Template(stack, exports)
    return {
        "stack_name": stack.stack_name,
        "account": stack.account,
        "region": stack.region,
        "resources_by_type": dict(sorted(Counter(r["Type"] for r in template.resources.values()).items())),
        "iam": template.iam(),
        "resource_policies": template.resource_policies(),
        "network": template.network(),
        "encryption": template.encryption(),
        "guardrails": template.guardrails(),
        "retention": template.retention(),
        "acknowledgements": template.acknowledgements(),
        "cost": template.cost(prices),
        "multi_model_sizing": template.multi_model_sizing(),
        "images": images(stack.template, today or date.today()),
        "warnings": template.warnings(),
    }


def images(template: dict[str, Any], today: date) -> list[dict[str, Any]]:
    """The images a stack runs, from its metadata, with the days of patching left on ``today`` (None: no end
    declared; negative: ended) and the reason an environment gave for running an ended one."""
    entries = []
    for image in template.get("Metadata", {}).get(IMAGES_METADATA_KEY, []):
        end = image.get("end_of_patching")  # CDK drops null values from metadata
        entries.append(
            {
                "image": image["image"],
                "setting": image["setting"],
                "architecture": image.get("architecture"),
                "end_of_patching": end,
                "days_left": None if end is None else (date.fromisoformat(end) - today).days,
                "accepted_risk": image.get("accepted_risk"),
                "replacement": image.get("replacement"),
                "source": image.get("source"),
                "checked": image.get("checked"),
            }
        )
    return entries


def describe(value: Any) -> str:
    """A CloudFormation value as a readable string: references as ${Logical} / ${Logical.Attribute}."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool | int | float):
        return json.dumps(value)
    if isinstance(value, list):
        return ", ".join(describe(item) for item in value)
    if isinstance(value, dict) and len(value) == 1:
        ((function, argument),) = value.items()
        if function == "Ref":
            return f"${{{argument}}}"
        if function == "Fn::GetAtt":
            return "${" + ".".join(argument if isinstance(argument, list) else [argument]) + "}"
        if function == "Fn::Join":
            return argument[0].join(describe(item) for item in argument[1])
        if function == "Fn::Sub":
            return argument if isinstance(argument, str) else argument[0]
        if function == "Fn::ImportValue":
            return f"import({describe(argument)})"
        if function == "Fn::Select":
            return f"select({argument[0]}, {describe(argument[1])})"
        if function == "Fn::GetAZs":
            return "${AZs}"
    return json.dumps(value, sort_keys=True)


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [] if value is None else [value]


NOT_PREFIX = "NOT "


def is_wildcard(value: str) -> bool:
    """A wildcard, or a NotAction/NotResource entry (an Allow of everything except it)."""
    return "*" in value or value.startswith(NOT_PREFIX)


def is_public_principal(principal: str) -> bool:
    """'*' (Principal "*" or {"AWS": "*"}): anyone, in any account."""
    return principal == "*"


class _Names:
    """A template's resources and how the review names them (construct paths, resolved references)."""

    def __init__(self, stack: StackTemplate, exports: dict[str, str] | None = None) -> None:
        self.stack = stack
        self.resources: dict[str, dict[str, Any]] = stack.template.get("Resources", {})
        self.exports = exports or {}

    def _of_type(self, *types: str) -> list[tuple[str, dict[str, Any]]]:
        return [(lid, r) for lid, r in self.resources.items() if r["Type"] in types]

    def name(self, logical_id: str) -> str:
        """The construct path inside the stack (EndpointExecutionRole), or the logical id when there is none."""
        path = self.resources.get(logical_id, {}).get("Metadata", {}).get("aws:cdk:path")
        if not path:
            return logical_id
        prefix = f"{self.stack.environment}/{self.stack.stack}/" if self.stack.environment != APP_ENVIRONMENT else ""
        path = path.removeprefix(prefix or f"{self.stack.stack}/")
        for suffix in ("/Resource", "/Default"):
            path = path.removesuffix(suffix)
        return path

    def _reference(self, value: Any) -> str:
        """Name a referenced resource of this template, or describe a value from elsewhere."""
        if isinstance(value, dict) and "Ref" in value and value["Ref"] in self.resources:
            return self.name(value["Ref"])
        if isinstance(value, dict) and "Fn::GetAtt" in value and value["Fn::GetAtt"][0] in self.resources:
            return self.name(value["Fn::GetAtt"][0])
        return describe(value)

    def named(self, value: Any) -> str:
        """A policy value with its references resolved to names: a resource of this template (its ``Ref`` or any
        attribute, an ARN mostly) as its construct path, an import as the exporting stack's resource, the stack's
        account and region as themselves where the stack names them."""
        if isinstance(value, list):
            return ", ".join(self.named(item) for item in value)
        if not isinstance(value, dict) or len(value) != 1:
            return describe(value)
        ((function, argument),) = value.items()
        if function == "Ref":
            pseudo = {"AWS::Partition": "aws", "AWS::AccountId": self.stack.account, "AWS::Region": self.stack.region}
            if argument in self.resources:
                return self._short_name(argument)
            return pseudo.get(argument) or f"${{{argument}}}"
        if function == "Fn::GetAtt":
            logical_id, attribute = argument if isinstance(argument, list) else argument.split(".", 1)
            if logical_id not in self.resources:
                return describe(value)
            # An ARN or id names the resource itself; other attributes (a queue's URL) stay visible.
            plain = attribute.endswith(("Arn", "Id", "Name")) or attribute in ("Arn", "GroupId")
            return self._short_name(logical_id) if plain else f"{self._short_name(logical_id)}.{attribute}"
        if function == "Fn::Join":
            separator, parts = argument
            return separator.join(self.named(part) for part in parts)
        if function == "Fn::ImportValue" and isinstance(argument, str):
            return self.exports.get(argument, f"import({argument})")
        return describe(value)

    def _short_name(self, logical_id: str) -> str:
        """The construct path without CDK's Default and Resource levels (Vpc/PrivateSubnet1/Subnet)."""
        return "/".join(part for part in self.name(logical_id).split("/") if part not in ("Default", "Resource"))

    def _referenced_ids(self, value: Any) -> set[str]:
        text = json.dumps(value)
        return {lid for lid in self.resources if f'"{lid}"' in text}


class _AccessReview(_Names):
    """IAM: every principal with what it may do to which resource, and the resource policies."""

    def access(self, documents: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
        """What a principal can do to which resource: one row per statement and service, Allow before Deny, by
        service; resources and conditions with their references resolved to names."""
        rows = []
        for source, document in documents:
            for statement in _as_list(document.get("Statement")):
                not_action, not_resource = "NotAction" in statement, "NotResource" in statement
                actions = [describe(a) for a in _as_list(statement.get("NotAction" if not_action else "Action"))]
                by_service: dict[str, list[str]] = {}
                for action in actions:
                    service = action.split(":", 1)[0] if ":" in action else action
                    by_service.setdefault(service, []).append(f"{NOT_PREFIX if not_action else ''}{action}")
                resources = [
                    f"{NOT_PREFIX if not_resource else ''}{self.named(r)}"
                    for r in _as_list(statement.get("NotResource" if not_resource else "Resource"))
                ]
                conditions = {
                    f"{operator} {key}": self.named(values)
                    for operator, keys in statement.get("Condition", {}).items()
                    for key, values in keys.items()
                }
                for service, service_actions in by_service.items():
                    rows.append(
                        {
                            "service": service,
                            "effect": statement.get("Effect"),
                            "actions": sorted(a.removeprefix(f"{service}:") for a in service_actions),
                            "resources": resources,
                            "conditions": [f"{key}: {value}" for key, value in conditions.items()],
                            "source": source,
                            "sid": statement.get("Sid"),
                        }
                    )
        return sorted(rows, key=lambda row: (row["effect"] != "Allow", row["service"]))

    def iam(self) -> dict[str, dict[str, Any]]:
        principals: dict[str, dict[str, Any]] = {}
        for lid, role in self._of_type("AWS::IAM::Role", "AWS::IAM::User", "AWS::IAM::Group"):
            properties = role.get("Properties", {})
            trust = properties.get("AssumeRolePolicyDocument", {}).get("Statement", [])
            principals[self.name(lid)] = {
                "type": role["Type"].rsplit("::", 1)[1].lower(),
                "trusted_by": sorted({describe(p) for s in trust for p in _principals(s.get("Principal"))}),
                # Who may assume the role, statement by statement, with the conditions that narrow it.
                "trust": [
                    {
                        "effect": s.get("Effect"),
                        "principals": sorted(describe(p) for p in _principals(s.get("Principal"))),
                        "actions": [describe(a) for a in _as_list(s.get("Action"))],
                        "conditions": describe(s["Condition"]) if "Condition" in s else None,
                    }
                    for s in _as_list(trust)
                ],
                "managed_policies": [self._reference(arn) for arn in properties.get("ManagedPolicyArns", [])],
                "statements": [
                    statement
                    for policy in properties.get("Policies", [])
                    for statement in self._statements(policy["PolicyDocument"], policy.get("PolicyName", "inline"))
                ],
                "access": self.access(
                    [
                        (policy.get("PolicyName", "inline"), policy["PolicyDocument"])
                        for policy in properties.get("Policies", [])
                    ]
                ),
            }
        for lid, policy in self._of_type("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
            properties = policy.get("Properties", {})
            holders = [self._reference(h) for key in ("Roles", "Users", "Groups") for h in properties.get(key, [])]
            if not holders:
                holders = [f"{self.name(lid)} (managed policy, attached outside this stack)"]
            for holder in holders:
                entry = principals.setdefault(
                    holder,
                    {"type": "external", "trusted_by": [], "managed_policies": [], "statements": [], "access": []},
                )
                entry["statements"] += self._statements(properties["PolicyDocument"], self.name(lid))
                entry["access"] = sorted(
                    entry["access"] + self.access([(self.name(lid), properties["PolicyDocument"])]),
                    key=lambda row: (row["effect"] != "Allow", row["service"]),
                )
        return dict(sorted(principals.items()))

    def _statements(self, document: dict[str, Any], source: str) -> list[dict[str, Any]]:
        statements = []
        for statement in _as_list(document.get("Statement")):
            # NotAction / NotResource name what is EXCLUDED: an Allow with them grants everything else. Each entry
            # carries a "NOT " prefix so no listing or diff can mistake it for the action or resource itself.
            not_action, not_resource = "NotAction" in statement, "NotResource" in statement
            actions = [
                f"{NOT_PREFIX if not_action else ''}{describe(a)}"
                for a in _as_list(statement.get("NotAction" if not_action else "Action"))
            ]
            resources = [
                f"{NOT_PREFIX if not_resource else ''}{describe(r)}"
                for r in _as_list(statement.get("NotResource" if not_resource else "Resource"))
            ]
            allow = statement.get("Effect") == "Allow"
            statements.append(
                {
                    "source": source,
                    "sid": statement.get("Sid"),
                    "effect": statement.get("Effect"),
                    "actions": actions,
                    "resources": resources,
                    "not_action": not_action,
                    "not_resource": not_resource,
                    "conditions": describe(statement["Condition"]) if "Condition" in statement else None,
                    "wildcard_actions": allow and (not_action or any(map(is_wildcard, actions))),
                    "wildcard_resources": allow and (not_resource or any(map(is_wildcard, resources))),
                }
            )
        return statements

    def resource_policies(self) -> list[dict[str, Any]]:
        documents = {
            "AWS::S3::BucketPolicy": ("Bucket", "PolicyDocument"),
            "AWS::KMS::Key": (None, "KeyPolicy"),
            "AWS::SNS::TopicPolicy": ("Topics", "PolicyDocument"),
            "AWS::SQS::QueuePolicy": ("Queues", "PolicyDocument"),
            "AWS::ECR::Repository": (None, "RepositoryPolicyText"),
            "AWS::EC2::VPCEndpoint": (None, "PolicyDocument"),
        }
        entries = []
        for lid, resource in self._of_type(*documents):
            target_key, document_key = documents[resource["Type"]]
            properties = resource.get("Properties", {})
            if document_key not in properties:
                continue
            target = self._reference(properties[target_key]) if target_key else self.name(lid)
            for raw, statement in zip(
                _as_list(properties[document_key].get("Statement")),
                self._statements(properties[document_key], self.name(lid)),
                strict=True,
            ):
                principals = sorted(describe(p) for p in _principals(raw.get("Principal")))
                # A VPC endpoint policy names "*" as its principal by design: only callers inside the VPC reach it.
                public = (
                    statement["effect"] == "Allow"
                    and "*" in principals
                    and "Condition" not in raw
                    and resource["Type"] != "AWS::EC2::VPCEndpoint"
                )
                entries.append(
                    {
                        "resource": target,
                        "policy_type": resource["Type"],
                        "principals": principals,
                        "public": public,
                        **statement,
                    }
                )
        return entries


class _NetworkReview(_Names):
    """Network exposure: security group rules, public subnets and what sits in them."""

    def network(self) -> dict[str, Any]:
        groups: dict[str, list[dict[str, Any]]] = {}
        for lid, group in self._of_type("AWS::EC2::SecurityGroup"):
            properties = group.get("Properties", {})
            groups[self.name(lid)] = [
                *(self._rule("ingress", rule) for rule in properties.get("SecurityGroupIngress", [])),
                *(self._rule("egress", rule) for rule in properties.get("SecurityGroupEgress", [])),
            ]
        for _, rule in self._of_type("AWS::EC2::SecurityGroupIngress", "AWS::EC2::SecurityGroupEgress"):
            direction = "ingress" if rule["Type"].endswith("Ingress") else "egress"
            properties = rule.get("Properties", {})
            groups.setdefault(self._reference(properties.get("GroupId")), []).append(self._rule(direction, properties))
        models = [
            {
                "model": self.name(lid),
                "in_vpc": "VpcConfig" in model.get("Properties", {}),
                "network_isolation": bool(model.get("Properties", {}).get("EnableNetworkIsolation", False)),
            }
            for lid, model in self._of_type("AWS::SageMaker::Model")
        ]
        return {
            "security_groups": dict(sorted(groups.items())),
            "open_ingress": [
                f"{group}: {rule['summary']}"
                for group, rules in groups.items()
                for rule in rules
                if rule["direction"] == "ingress" and rule["peer"] in _INTERNET
            ],
            # Egress to the internet on every protocol or every port: nothing left for the group to restrict.
            "open_egress": [
                f"{group}: {rule['summary']}"
                for group, rules in groups.items()
                for rule in rules
                if rule["direction"] == "egress" and rule["peer"] in _INTERNET and rule["all_traffic"]
            ],
            "public_subnets": self._public_subnets(),
            "internet_gateways": len(self._of_type("AWS::EC2::InternetGateway")),
            "nat_gateways": len(self._of_type("AWS::EC2::NatGateway")),
            "vpc_endpoints": [
                {
                    "endpoint": self.name(lid),
                    "service": describe(endpoint["Properties"]["ServiceName"]),
                    "type": endpoint["Properties"].get("VpcEndpointType", "Gateway"),
                    "private_dns": endpoint["Properties"].get("PrivateDnsEnabled", False),
                    "subnets": len(endpoint["Properties"].get("SubnetIds", [])),
                    # Without a policy an endpoint lets any principal reach any resource of its service.
                    "policy": "PolicyDocument" in endpoint["Properties"],
                }
                for lid, endpoint in self._of_type("AWS::EC2::VPCEndpoint")
            ],
            "sagemaker_models": models,
        }

    def _rule(self, direction: str, rule: dict[str, Any]) -> dict[str, Any]:
        peer = next(
            (
                self._reference(rule[key])
                for key in (
                    "CidrIp",
                    "CidrIpv6",
                    "SourceSecurityGroupId",
                    "DestinationSecurityGroupId",
                    "SourcePrefixListId",
                    "DestinationPrefixListId",
                )
                if key in rule
            ),
            "?",
        )
        protocol = str(rule.get("IpProtocol", "-1"))
        ports = "all" if protocol == "-1" else f"{rule.get('FromPort')}-{rule.get('ToPort')}"
        towards = "from" if direction == "ingress" else "to"
        summary = f"{direction} {'all' if protocol == '-1' else protocol} {ports} {towards} {peer}"
        all_ports = str(rule.get("FromPort")) in ("0", "-1") and str(rule.get("ToPort")) in ("65535", "-1")
        return {
            "direction": direction,
            "protocol": protocol,
            "all_traffic": protocol == "-1" or all_ports,
            "ports": ports,
            "peer": peer,
            "description": rule.get("Description"),
            "summary": summary,
        }

    def _public_subnets(self) -> list[str]:
        """Subnets of this template whose route table routes to an internet gateway, or that auto-assign public IPs."""
        gateways = {lid for lid, _ in self._of_type("AWS::EC2::InternetGateway")}
        public_tables = {
            _ref(route["Properties"].get("RouteTableId"))
            for _, route in self._of_type("AWS::EC2::Route")
            if _ref(route["Properties"].get("GatewayId")) in gateways
        }
        subnets = {
            _ref(association["Properties"].get("SubnetId"))
            for _, association in self._of_type("AWS::EC2::SubnetRouteTableAssociation")
            if _ref(association["Properties"].get("RouteTableId")) in public_tables
        }
        subnets |= {
            lid for lid, subnet in self._of_type("AWS::EC2::Subnet") if subnet["Properties"].get("MapPublicIpOnLaunch")
        }
        return sorted(self.name(lid) for lid in subnets if lid)


class _GuardrailReview(_Names):
    """Encryption, guardrails, retention, unheard alarms and the cdk-nag acknowledgements."""

    def encryption(self) -> list[dict[str, Any]]:
        stores = []
        for lid, resource in self.resources.items():
            status = _encryption_of(resource["Type"], resource.get("Properties", {}))
            if status is not None:
                stores.append({"resource": self.name(lid), "type": resource["Type"], **status})
        return stores

    def guardrails(self) -> dict[str, dict[str, Any]]:
        """The settings whose removal opens data or credentials, per resource: S3 public-access blocks, TLS-only
        resource policies, and the instance-metadata (IMDS) options of launch templates and instances."""
        return {
            "public_access_block": {
                self.name(lid): _public_access_block(bucket.get("Properties", {}))
                for lid, bucket in self._of_type("AWS::S3::Bucket")
            },
            "tls_only": self._tls_only(),
            "instance_metadata": {
                self.name(lid): _metadata_options(resource)
                for lid, resource in self._of_type("AWS::EC2::LaunchTemplate", "AWS::EC2::Instance")
            },
        }

    def _tls_only(self) -> dict[str, bool]:
        """Every bucket, topic and queue of the template (and any other its policies name): whether a resource policy
        denies requests without TLS (Deny, everyone, aws:SecureTransport false)."""
        policies = {
            "AWS::S3::BucketPolicy": ("Bucket", "PolicyDocument"),
            "AWS::SNS::TopicPolicy": ("Topics", "PolicyDocument"),
            "AWS::SQS::QueuePolicy": ("Queues", "PolicyDocument"),
        }
        result = {
            self.name(lid): False for lid, _ in self._of_type("AWS::S3::Bucket", "AWS::SNS::Topic", "AWS::SQS::Queue")
        }
        for _, policy in self._of_type(*policies):
            target_key, document_key = policies[policy["Type"]]
            properties = policy.get("Properties", {})
            denies_plain_http = any(
                statement.get("Effect") == "Deny"
                and any(is_public_principal(describe(p)) for p in _principals(statement.get("Principal")))
                and str(statement.get("Condition", {}).get("Bool", {}).get("aws:SecureTransport")).lower() == "false"
                for statement in _as_list(properties.get(document_key, {}).get("Statement"))
            )
            for target in _as_list(properties.get(target_key)):
                name = self._reference(target)
                result[name] = result.get(name, False) or denies_plain_http
        return dict(sorted(result.items()))

    def retention(self) -> list[dict[str, Any]]:
        emptied = {
            ref
            for _, custom in self._of_type("Custom::S3AutoDeleteObjects")
            for ref in self._referenced_ids(custom.get("Properties", {}).get("BucketName"))
        }
        return [
            {
                "resource": self.name(lid),
                "type": resource["Type"],
                # CloudFormation deletes a resource that names no policy.
                "deletion_policy": resource.get("DeletionPolicy", "Delete"),
                "update_replace_policy": resource.get("UpdateReplacePolicy", "Delete"),
                "retention_days": resource.get("Properties", {}).get("RetentionInDays")
                if resource["Type"] == "AWS::Logs::LogGroup"
                else None,
                "emptied_on_delete": lid in emptied if resource["Type"] == "AWS::S3::Bucket" else None,
            }
            for lid, resource in self._of_type(*DATA_BEARING_TYPES)
        ]

    def warnings(self) -> list[str]:
        """What the template deploys but no one will hear: alarm topics without a subscription."""
        alarm_targets = {
            ref
            for _, alarm in self._of_type("AWS::CloudWatch::Alarm")
            for ref in self._referenced_ids(alarm.get("Properties", {}).get("AlarmActions", []))
        }
        subscribed = {
            ref
            for _, subscription in self._of_type("AWS::SNS::Subscription")
            for ref in self._referenced_ids(subscription.get("Properties", {}).get("TopicArn"))
        }
        environment = self.stack.environment
        return [
            f"alarm topic {self.name(lid)} has no subscription: its alarms reach no one; set "
            f"environments.{environment}.alarm_subscriptions (e-mail addresses or https:// URLs), or subscribe "
            "to the stack's AlarmTopicArn output (e.g. from AWS Chatbot)."
            for lid, _ in self._of_type("AWS::SNS::Topic")
            if lid in alarm_targets and lid not in subscribed
        ]

    def acknowledgements(self) -> list[dict[str, Any]]:
        grouped: dict[tuple[str, str], list[str]] = {}
        for lid, resource in self.resources.items():
            for rule in resource.get("Metadata", {}).get("cdk_nag", {}).get("rules_to_suppress", []):
                grouped.setdefault((rule["id"], rule.get("reason", "")), []).append(self.name(lid))
        return [
            {"rule": rule, "reason": reason, "resources": sorted(resources)}
            for (rule, reason), resources in sorted(grouped.items())
        ]


class _CostReview(_Names):
    """What the stack would cost per hour, and the predicted behaviour of a multi-model endpoint."""

    def multi_model_sizing(self) -> list[dict[str, Any]]:
        """The plan of every endpoint that carries sizing inputs: the table, parity count and advice of mme-plan."""
        entries = []
        for lid, endpoint in self._of_type("AWS::SageMaker::Endpoint"):
            metadata = endpoint.get("Metadata", {}).get(mme_plan.METADATA_KEY)
            if metadata is None:
                continue
            entry: dict[str, Any] = {"endpoint": self.name(lid)}
            try:
                plan = mme_plan.predict(mme_plan.SizingInputs.from_metadata(metadata))
            except (KeyError, TypeError, ValueError) as error:  # inputs of another version, a type without facts
                entries.append({**entry, "error": f"cannot predict: {error}"})
                continue
            entries.append(
                {
                    **entry,
                    "summary": mme_plan.summary(plan),
                    "headers": list(mme_plan.TABLE_HEADERS),
                    "rows": mme_plan.table_rows(plan),
                    "parity": mme_plan.parity_line(plan),
                    "advice": list(plan.advice),
                    "plan": plan.as_dict(),
                }
            )
        return entries

    def _max_capacity(self, endpoint_id: str, variant_name: str) -> int | None:
        """MaxCapacity of the scalable target of endpoint/<endpoint>/variant/<variant>, if this stack has one."""
        for _, target in self._of_type("AWS::ApplicationAutoScaling::ScalableTarget"):
            resource_id = describe(target["Properties"].get("ResourceId", ""))
            names_endpoint = f"${{{endpoint_id}." in resource_id or f"${{{endpoint_id}}}" in resource_id
            if names_endpoint and resource_id.endswith(f"/variant/{variant_name}"):
                return int(target["Properties"]["MaxCapacity"])
        return None

    # Long: the hourly price of each resource kind that runs instances (endpoints with their autoscaling bounds, NAT
    # gateways, interface endpoints, launch templates per run), one short branch each
    def cost(self, prices: dict[str, Any]) -> dict[str, Any]:
        table = prices["regions"].get(self.stack.region or "", {})
        always_on: list[dict[str, Any]] = []
        per_training_run: list[dict[str, Any]] = []

        def item(resource: str, kind: str, unit: str, count: int, section: str, key: str) -> dict[str, Any]:
            price = table.get(section, {}).get(key)
            return {
                "resource": resource,
                "kind": kind,
                "instance_type": unit,
                "hardware": hardware(unit),
                "count": count,
                "unit_hourly_usd": price,
                "hourly_usd": None if price is None else round(price * count, 4),
            }

        endpoint_of_config = {
            ref: endpoint_id
            for endpoint_id, endpoint in self._of_type("AWS::SageMaker::Endpoint")
            for ref in self._referenced_ids(endpoint["Properties"].get("EndpointConfigName"))
        }
        for lid, config in self._of_type("AWS::SageMaker::EndpointConfig"):
            if lid not in endpoint_of_config:
                continue
            for variant in config["Properties"].get("ProductionVariants", []):
                if "InstanceType" not in variant:  # serverless variants bill per request
                    continue
                entry = item(
                    f"{self.name(lid)}/{variant.get('VariantName', '')}",
                    "SageMaker endpoint variant (initial instance count)",
                    variant["InstanceType"],
                    int(variant.get("InitialInstanceCount", 1)),
                    "sagemaker_hosting",
                    variant["InstanceType"],
                )
                entry["max_count"] = self._max_capacity(endpoint_of_config[lid], variant.get("VariantName", ""))
                if entry["max_count"] is not None and entry["unit_hourly_usd"] is not None:
                    entry["max_hourly_usd"] = round(entry["unit_hourly_usd"] * entry["max_count"], 4)
                always_on.append(entry)
        for lid, _ in self._of_type("AWS::EC2::NatGateway"):
            always_on.append(item(self.name(lid), "NAT gateway", "-", 1, "network", "nat_gateway"))
        for lid, endpoint in self._of_type("AWS::EC2::VPCEndpoint"):
            if endpoint["Properties"].get("VpcEndpointType") == "Interface":
                azs = len(endpoint["Properties"].get("SubnetIds", [])) or 1
                always_on.append(
                    item(
                        self.name(lid),
                        "interface VPC endpoint (per AZ)",
                        "-",
                        azs,
                        "network",
                        "interface_endpoint_per_az",
                    )
                )
        for lid, template in self._of_type("AWS::EC2::LaunchTemplate"):
            instance_type = template["Properties"].get("LaunchTemplateData", {}).get("InstanceType")
            if isinstance(instance_type, str):
                per_training_run.append(
                    item(
                        self.name(lid),
                        "EC2 launch template (not running until a training run launches it)",
                        instance_type,
                        1,
                        "ec2",
                        instance_type,
                    )
                )
        unpriced = sorted(
            {f"{i['kind']}: {i['instance_type']}" for i in always_on + per_training_run if i["hourly_usd"] is None}
        )
        return {
            "region": self.stack.region,
            "prices_as_of": prices.get("as_of"),
            "always_on": always_on,
            "always_on_hourly_usd": round(sum(i["hourly_usd"] or 0 for i in always_on), 4),
            # Autoscaling at its maximum (variants without a scalable target stay at their initial count).
            "always_on_max_hourly_usd": round(sum(i.get("max_hourly_usd", i["hourly_usd"] or 0) for i in always_on), 4),
            "per_training_run": per_training_run,
            "per_training_run_hourly_usd_per_node": round(sum(i["hourly_usd"] or 0 for i in per_training_run), 4),
            "unpriced": unpriced,
        }


class _Template(_AccessReview, _NetworkReview, _GuardrailReview, _CostReview):
    """One stack's template as the review reads it, each concern in its own class above."""


def hardware(instance_type: str) -> str | None:
    """What one instance of the type is (the platform's instance facts), None for a type they do not hold."""
    facts = instance_facts(instance_type)
    if facts is None:
        return None
    text = f"{facts.vcpus} vCPUs, {facts.memory_mib // 1024} GiB"
    if facts.accelerator is not None:
        text += f", {facts.accelerator.count} x {facts.accelerator.name}"
    return text


def _ref(value: Any) -> str | None:
    """The logical id a {"Ref": ...} names; None for literals and other intrinsics."""
    return value.get("Ref") if isinstance(value, dict) else None


def _principals(principal: Any) -> list[Any]:
    if principal is None:
        return []
    if isinstance(principal, str):
        return [principal]
    return [p for values in principal.values() for p in _as_list(values)]


def _public_access_block(properties: dict[str, Any]) -> dict[str, Any]:
    config = properties.get("PublicAccessBlockConfiguration", {})
    flags = {
        name: str(config.get(name, False)).lower() == "true"
        for name in ("BlockPublicAcls", "BlockPublicPolicy", "IgnorePublicAcls", "RestrictPublicBuckets")
    }
    return {**flags, "all_blocked": all(flags.values())}


def _metadata_options(resource: dict[str, Any]) -> dict[str, Any]:
    """IMDS options as EC2 applies them: HttpTokens 'optional' (IMDSv1 allowed) unless a template says 'required'."""
    properties = resource.get("Properties", {})
    if resource["Type"] == "AWS::EC2::LaunchTemplate":
        properties = properties.get("LaunchTemplateData", {})
    options = properties.get("MetadataOptions", {})
    return {
        "http_tokens": options.get("HttpTokens", "optional"),
        "imdsv2_required": options.get("HttpTokens") == "required",
        "hop_limit": options.get("HttpPutResponseHopLimit"),
        "endpoint": options.get("HttpEndpoint", "enabled"),
    }


def _encryption_of(resource_type: str, properties: dict[str, Any]) -> dict[str, Any] | None:
    """{'encrypted_with': 'kms' | 'sse-s3' | 'service-default' | 'none', 'key': ...} of a data store, else None."""

    def kms(key: Any) -> dict[str, Any]:
        return {"encrypted_with": "kms", "key": describe(key)}

    if resource_type == "AWS::S3::Bucket":
        rules = properties.get("BucketEncryption", {}).get("ServerSideEncryptionConfiguration", [])
        default = rules[0].get("ServerSideEncryptionByDefault", {}) if rules else {}
        if default.get("SSEAlgorithm", "").startswith("aws:kms"):
            return kms(default.get("KMSMasterKeyID", "aws/s3"))
        # S3 encrypts new objects with SSE-S3 even when the template says nothing.
        return {"encrypted_with": "sse-s3" if default else "service-default", "key": None}
    if resource_type == "AWS::KMS::Key":
        return {"encrypted_with": "kms", "key": "self", "rotation": bool(properties.get("EnableKeyRotation"))}
    keyed = {
        "AWS::Logs::LogGroup": "KmsKeyId",
        "AWS::SageMaker::EndpointConfig": "KmsKeyId",
        "AWS::SNS::Topic": "KmsMasterKeyId",
        "AWS::SQS::Queue": "KmsMasterKeyId",
        "AWS::CodeBuild::Project": "EncryptionKey",
        "AWS::Kinesis::Stream": "StreamEncryption",
    }
    if resource_type in keyed:
        key = properties.get(keyed[resource_type])
        return kms(key) if key else {"encrypted_with": "service-default", "key": None}
    if resource_type == "AWS::EC2::LaunchTemplate":
        mappings = properties.get("LaunchTemplateData", {}).get("BlockDeviceMappings", [])
        volumes = [m["Ebs"] for m in mappings if "Ebs" in m]  # instance-store and NoDevice mappings hold no EBS data
        if not volumes:
            return {"encrypted_with": "service-default", "key": None}
        if all(v.get("KmsKeyId") for v in volumes):
            return kms([v["KmsKeyId"] for v in volumes])
        return {"encrypted_with": "ebs-default" if all(v.get("Encrypted") for v in volumes) else "none", "key": None}
    if resource_type in ("AWS::EC2::Volume", "AWS::EFS::FileSystem"):
        if properties.get("KmsKeyId"):
            return kms(properties["KmsKeyId"])
        return {"encrypted_with": "ebs-default" if properties.get("Encrypted") else "none", "key": None}
    if resource_type == "AWS::DynamoDB::Table":
        sse = properties.get("SSESpecification", {})
        if sse.get("KMSMasterKeyId"):
            return kms(sse["KMSMasterKeyId"])
        return {"encrypted_with": "service-default", "key": None}
    return None


# Weaker encryption ranks lower; the diff flags any step down.
ENCRYPTION_RANK = {"kms": 3, "sse-s3": 2, "ebs-default": 2, "service-default": 1, "none": 0}


def construct_name(stack: StackTemplate, logical_id: str) -> str:
    """How the review names a resource of a stack: its construct path inside the stack, without CDK's Default and
    Resource levels (RemoteJobRoleNlp, Vpc/FlowLogs)."""
    return _Names(stack)._short_name(logical_id)
