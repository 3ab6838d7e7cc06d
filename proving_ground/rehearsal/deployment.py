"""CloudFormation, played: each synthesized template deployed through moto's CloudFormation (CreateStack, then one
UpdateStack per later wave), and the resources of the types it cannot create made by hand through the services' APIs
with every policy the template gives them (proving_ground/rehearsal/hand_made.py), in the order CloudFormation creates
them: a resource waits for every resource it names (Ref, Fn::GetAtt, Fn::Sub, DependsOn). A wave is every resource
moto can create whose dependencies are all created or in the wave; then every hand-made resource whose dependencies
are created; and so on. Refs to hand-made resources are written into the next wave's template as the values they
created (CloudFormation would resolve them the same way). Deleting plays the waves backwards: the hand-made resources
by hand (a retained one kept, as CloudFormation keeps it), each wave by an UpdateStack that removes it, the first by
DeleteStack.

Where moto's CloudFormation differs from CloudFormation, the rehearsal plays CloudFormation's part:
- moto evaluates ``DeletionPolicy: Retain`` only; CDK's ``RetainExceptOnCreate`` (what a stack deletion retains as
  well) is given to it as ``Retain``;
- moto's UpdateStack does not register the exports an update adds: they are registered after each wave;
- moto deletes a bucket that still holds objects by doing nothing: a bucket the template deletes and that is still
  there after its stack is gone is CloudFormation's DELETE_FAILED (BucketNotEmpty), and fails the destroy;
- moto's CloudFormation ignores a template's ``Rules`` (CDK's bootstrap-version check): left out.
The values CloudFormation resolves for moto's resources (physical ids, Fn::GetAtt) are read from moto's stack.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ops_review.iam_policy import resolve
from ops_review.review import StackTemplate
from proving_ground.rehearsal import hand_made
from proving_ground.rehearsal.journey import ACCOUNT, StepFailed

CAPABILITIES = ["CAPABILITY_IAM", "CAPABILITY_NAMED_IAM", "CAPABILITY_AUTO_EXPAND"]
_RETAINED = ("Retain", "RetainExceptOnCreate")
# Fn::GetAtt attributes moto's models lack that equal the resource's Ref (CloudFormation's resource schema: an
# endpoint's EndpointArn is its Ref): moto is given the Ref.
_ATTRIBUTES_AS_REF = {("AWS::SageMaker::Endpoint", "EndpointArn")}
# A VPC endpoint's service (what its ServiceName ends with) -> the botocore service whose API calls pass it.
_ENDPOINT_SERVICES = {"s3": "s3", "ecr.api": "ecr", "sagemaker.api": "sagemaker", "sagemaker.runtime":
                      "sagemaker-runtime", "sts": "sts", "logs": "logs", "ssm": "ssm", "kms": "kms"}  # fmt: skip


def played_types() -> set[str]:
    """The resource types moto's CloudFormation creates (its model map), less those the rehearsal makes itself."""
    from moto.cloudformation.parsing import get_model_map

    return set(get_model_map()) - set(hand_made.NOT_PLAYED)


def dependencies(resource: dict[str, Any], names: set[str]) -> set[str]:
    """The logical ids of ``names`` that ``resource`` names: Ref, Fn::GetAtt, Fn::Sub variables, DependsOn."""
    found: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if isinstance(value.get("Ref"), str):
                found.add(value["Ref"])
            attribute = value.get("Fn::GetAtt")
            if attribute is not None:
                found.add(attribute[0] if isinstance(attribute, list) else str(attribute).split(".")[0])
            if "Fn::Sub" in value:
                body = value["Fn::Sub"] if isinstance(value["Fn::Sub"], str) else value["Fn::Sub"][0]
                found.update(v.split(".")[0] for v in re.findall(r"\$\{([^!}][^}]*)\}", body))
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(resource.get("Properties", {}))
    depends = resource.get("DependsOn", [])
    found.update([depends] if isinstance(depends, str) else depends)
    return found & names


class Refs(dict[str, Any]):
    """Ref / GetAtt values of one stack: hand-made resources' as they were created, moto's read from its stack, else a
    placeholder that no real call matches (a policy naming a resource never made can only refuse). A template
    parameter of an SSM type (a ``BuiltImage``'s digest) is read from SSM, as CloudFormation reads it."""

    def __init__(
        self, stack: StackTemplate, pseudo: dict[str, Any], parameter: Callable[[str], str], moto: Callable[[], Any]
    ) -> None:
        super().__init__(pseudo)
        self.stack = stack
        self.parameter = parameter
        self.moto = moto  # moto's stack, once created

    def __missing__(self, key: str) -> Any:
        logical, _, attribute = key.partition(".")
        if logical in self.stack.template.get("Resources", {}):
            stack = self.moto()
            model = stack.resource_map._parsed_resources.get(logical) if stack is not None else None
            if model is None:
                return f"rehearsal-not-created-{self.stack.stack_name}-{key}"
            # moto's Ref: the model's physical id; models that have none (an ingress rule) answer with their own id.
            physical = getattr(model, "physical_resource_id", None) or getattr(model, "id", logical)
            kind = self.stack.template["Resources"][logical]["Type"]
            as_ref = not attribute or (kind, attribute) in _ATTRIBUTES_AS_REF
            value = physical if as_ref else model.get_cfn_attribute(attribute)
            if kind.startswith("AWS::SageMaker::") and as_ref:
                value = hand_made.sagemaker_arn(str(value))
            self[key] = value
            return value
        declared = self.stack.template.get("Parameters", {}).get(key)
        if declared and declared["Type"] == "AWS::SSM::Parameter::Value<String>":
            self[key] = self.parameter(declared["Default"])
            return self[key]
        raise KeyError(key)


@dataclass
class DeployedStack:
    stack: StackTemplate
    refs: Refs
    outputs: dict[str, str] = field(default_factory=dict)
    resources: list[tuple[str, str, str]] = field(default_factory=list)  # (logical id, type, physical id)
    # In creation order: ("cloudformation", logical ids of one wave) or ("hand", [logical id]).
    steps: list[tuple[str, list[str]]] = field(default_factory=list)
    status: str = "CREATE_COMPLETE"

    def physical(self, resource_type: str) -> list[str]:
        return [physical for _, kind, physical in self.resources if kind == resource_type]


@dataclass
class Coverage:
    """Per resource type of the deployed templates: how many moto's CloudFormation created, how many the rehearsal
    made by hand, how many nothing emulates."""

    played: dict[str, int] = field(default_factory=dict)
    by_hand: dict[str, int] = field(default_factory=dict)
    not_emulated: dict[str, int] = field(default_factory=dict)

    def lines(self) -> list[str]:
        kinds = sorted({*self.played, *self.by_hand, *self.not_emulated})
        width = max((len(k) for k in kinds), default=10)
        lines = [f"  {'resource type':<{width}}  played  by hand  not emulated"]
        for kind in kinds:
            counts = (self.played.get(kind, 0), self.by_hand.get(kind, 0), self.not_emulated.get(kind, 0))
            lines.append(f"  {kind:<{width}}  {counts[0]:>6}  {counts[1]:>7}  {counts[2]:>12}")
        return lines


class _DeployedPolicies:
    """What the deployed templates say, resolved: the principals' identity policies, the resources' own policies
    (Deployment's base: one class of both would be over the repository's size rule)."""

    stacks: dict[str, StackTemplate]
    deployed: dict[str, DeployedStack]
    exports: dict[str, Any]
    region: str

    def resolve(self, stack_id: str, value: Any) -> Any:
        return resolve(value, refs=self.deployed[stack_id].refs, exports=self.exports)

    # --- policies -----------------------------------------------------------------------------------------------------

    def role_policies(self, role_name: str) -> list[dict[str, Any]]:
        """Every identity policy of a role, from every deployed stack (a stack may attach policies to another's)."""
        policies = []
        for stack_id, deployed in self.deployed.items():
            for logical, resource in deployed.stack.template["Resources"].items():
                props = resource.get("Properties", {})
                if resource["Type"] == "AWS::IAM::Role" and deployed.refs.get(logical) == role_name:
                    policies += [self.resolve(stack_id, p["PolicyDocument"]) for p in props.get("Policies", [])]
                    for arn in self.resolve(stack_id, props.get("ManagedPolicyArns", [])):
                        policies.append(self._managed_policy_by_arn(logical, str(arn)))
                attached = resource["Type"] in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy")
                if attached and role_name in self.resolve(stack_id, props.get("Roles", [])):
                    policies.append(self.resolve(stack_id, props["PolicyDocument"]))
        return policies

    def _managed_policy_by_arn(self, role: str, arn: str) -> dict[str, Any]:
        """The document of a customer-managed policy of a deployed stack that a role attaches by ARN (a Training
        role attaching a Foundation policy); an AWS managed policy is not modelled."""
        for stack_id, deployed in self.deployed.items():
            for logical, resource in deployed.stack.template["Resources"].items():
                if resource["Type"] == "AWS::IAM::ManagedPolicy" and str(deployed.refs.get(logical)) == arn:
                    return self.resolve(stack_id, resource["Properties"]["PolicyDocument"])
        raise StepFailed(f"role {role} attaches {arn}, which no deployed stack defines: not modelled")

    def role_tags(self, role_name: str) -> dict[str, str]:
        """The tags a deployed role carries (its template's Tags, resolved)."""
        for stack_id, deployed in self.deployed.items():
            for logical, resource in deployed.stack.template["Resources"].items():
                if resource["Type"] == "AWS::IAM::Role" and deployed.refs.get(logical) == role_name:
                    tags = self.resolve(stack_id, resource.get("Properties", {}).get("Tags", []))
                    return {t["Key"]: str(t["Value"]) for t in tags}
        return {}

    def resource_policies(self) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
        """The deployed buckets' policies by bucket name and the keys' policies by key ARN, resolved (the call gate
        evaluates them with every request on those resources)."""
        buckets: dict[str, dict[str, Any]] = {}
        keys: dict[str, dict[str, Any]] = {}
        for stack_id, deployed in self.deployed.items():
            for logical, resource in deployed.stack.template["Resources"].items():
                props = resource.get("Properties", {})
                if resource["Type"] == "AWS::S3::BucketPolicy":
                    buckets[str(self.resolve(stack_id, props["Bucket"]))] = self.resolve(
                        stack_id, props["PolicyDocument"]
                    )
                elif resource["Type"] == "AWS::KMS::Key":
                    keys[str(deployed.refs[f"{logical}.Arn"])] = self.resolve(stack_id, props["KeyPolicy"])
        return buckets, keys

    def topic_and_endpoint_policies(self) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
        """The deployed topics' policies by topic ARN, and the VPC endpoints' policies by the botocore service name
        whose calls pass them (``aws_calls.Gate.endpoint_policies``), resolved."""
        topics: dict[str, dict[str, Any]] = {}
        endpoints: dict[str, dict[str, Any]] = {}
        for stack_id, deployed in self.deployed.items():
            for logical, resource in deployed.stack.template["Resources"].items():
                props = resource.get("Properties", {})
                if resource["Type"] == "AWS::SNS::TopicPolicy":
                    policy = self.resolve(stack_id, props["PolicyDocument"])
                    topics.update({topic: policy for topic in self.resolve(stack_id, props["Topics"])})
                elif resource["Type"] == "AWS::EC2::VPCEndpoint" and "PolicyDocument" in props:
                    suffix = str(self.resolve(stack_id, props["ServiceName"])).split(f".{self.region}.", 1)[-1]
                    service = _ENDPOINT_SERVICES.get(suffix)
                    if service is not None:
                        endpoints[service] = {
                            "id": deployed.refs[logical],
                            "policy": self.resolve(stack_id, props["PolicyDocument"]),
                            "vpc": self.resolve(stack_id, props["VpcId"]),
                        }
        return topics, endpoints

    def managed_policy(self, stack_id: str, prefix: str) -> dict[str, Any]:
        template = self.stacks[stack_id].template["Resources"]
        (logical,) = [
            name
            for name, resource in template.items()
            if resource["Type"] == "AWS::IAM::ManagedPolicy" and re.fullmatch(rf"{prefix}[0-9A-F]{{8}}", name)
        ]
        return dict(self.resolve(stack_id, template[logical]["Properties"]["PolicyDocument"]))

    def role_name(self, stack_id: str, prefix: str) -> str:
        template = self.stacks[stack_id].template["Resources"]
        (logical,) = [
            name
            for name, resource in template.items()
            if resource["Type"] == "AWS::IAM::Role" and re.fullmatch(rf"{prefix}[0-9A-F]{{8}}", name)
        ]
        return str(self.deployed[stack_id].refs[logical])


class Deployment(_DeployedPolicies):
    """What `cdk deploy` would have created: moto's CloudFormation and the hand-made rest (the module docstring)."""

    def __init__(self, stacks: dict[str, StackTemplate], client: Callable[[str], Any], region: str) -> None:
        self.stacks = stacks
        self.client = client
        self.region = region
        self.exports: dict[str, Any] = {}
        self.deployed: dict[str, DeployedStack] = {}
        self.launch_templates: dict[str, dict[str, Any]] = {}
        self.encrypted_buckets: dict[str, str] = {}
        self.coverage = Coverage()
        self.played = played_types()
        # Custom resources whose handler the steps run (the model archive check), and what deleting one runs.
        self.custom_creators: dict[str, hand_made.Creator] = {}
        self.custom_deleters: dict[str, hand_made.Deleter] = {}
        # What the service does when CloudFormation has created a resource of that type (an endpoint's interfaces).
        self.after_created: dict[str, hand_made.Deleter] = {}
        zones = client("ec2").describe_availability_zones()["AvailabilityZones"]
        self.zones = sorted(zone["ZoneName"] for zone in zones)

    def set_ref(self, stack_id: str, logical: str, ref: Any, **attributes: Any) -> Any:
        refs = self.deployed[stack_id].refs
        refs[logical] = ref
        refs.update({f"{logical}.{name}": value for name, value in attributes.items()})
        return ref

    def moto_stack(self, stack_name: str) -> Any:
        """moto's stack of that name (this process's moto server holds the backends), or None."""
        from moto.cloudformation.models import cloudformation_backends

        backend = cloudformation_backends[ACCOUNT][self.region]
        return next((s for s in backend.stacks.values() if s.name == stack_name), None)

    # Long: the waves of one stack (the module docstring), each recorded for the destroy and the coverage table
    def deploy(self, stack_id: str) -> DeployedStack:
        stack = self.stacks[stack_id]
        pseudo = {"AWS::AccountId": ACCOUNT, "AWS::Region": self.region, "AWS::Partition": "aws",
                  "AWS::URLSuffix": "amazonaws.com", "AWS::StackName": stack.stack_name,
                  "AWS::NoValue": None, "Fn::GetAZs": self.zones}  # fmt: skip
        refs = Refs(stack, pseudo, self._ssm_parameter, lambda: self.moto_stack(stack.stack_name))
        deployed = self.deployed[stack_id] = DeployedStack(stack, refs)
        resources = stack.template["Resources"]
        names = set(resources)
        needs = {logical: dependencies(resource, names) for logical, resource in resources.items()}
        played = {logical for logical, r in resources.items() if r["Type"] in self.played}
        created: set[str] = set()
        while len(created) < len(resources):
            by_hand = sorted(k for k in names - created - played if needs[k] <= created)
            for logical in by_hand:
                kind = resources[logical]["Type"]
                create = self.custom_creators.get(kind) or hand_made.creator(kind)
                physical = create(self, stack_id, logical, resources[logical].get("Properties", {}))
                deployed.resources.append((logical, kind, str(physical)))
                deployed.steps.append(("hand", [logical]))
                target = self.coverage.not_emulated if kind in hand_made.NOT_EMULATED else self.coverage.by_hand
                target[kind] = target.get(kind, 0) + 1
                created.add(logical)
            wave = self._wave(played - created, needs, created)
            if wave:
                self._cloudformation(stack_id, created & played, wave, created)
                created |= wave
                deployed.steps.append(("cloudformation", sorted(wave)))
                for logical in sorted(wave):
                    kind = resources[logical]["Type"]
                    deployed.resources.append((logical, kind, str(refs[logical])))
                    self.coverage.played[kind] = self.coverage.played.get(kind, 0) + 1
                    if kind in self.after_created:
                        self.after_created[kind](self, stack_id, logical)
            if not by_hand and not wave:
                raise StepFailed(f"{stack.stack_name}: cannot order {sorted(names - created)}")
        for logical, resource in resources.items():
            properties = resource.get("Properties", {})
            if resource["Type"] == "AWS::S3::Bucket":
                for rule in properties.get("BucketEncryption", {}).get("ServerSideEncryptionConfiguration", []):
                    default = self.resolve(stack_id, rule["ServerSideEncryptionByDefault"])
                    if default["SSEAlgorithm"] == "aws:kms":
                        self.encrypted_buckets[str(refs[logical])] = default["KMSMasterKeyID"]
        for name, output in stack.template.get("Outputs", {}).items():
            value = self.resolve(stack_id, output["Value"])
            deployed.outputs[name] = str(value)
            if "Export" in output:
                self.exports[self.resolve(stack_id, output["Export"]["Name"])] = value
        return deployed

    def update(self, stack_id: str, template: dict[str, Any]) -> None:
        """`cdk deploy` of a changed template: one UpdateStack (the hand-made resources as they are)."""
        deployed = self.deployed[stack_id]
        stack = dataclasses.replace(self.stacks[stack_id], template=template)
        self.stacks[stack_id] = deployed.stack = deployed.refs.stack = stack
        created = {k for _, wave in deployed.steps for k in wave}
        played = {k for k in created if template["Resources"][k]["Type"] in self.played}
        before = {k: deployed.refs[k] for k in played}

        def forget() -> None:  # read again from moto: a replaced resource has new values
            known = {k: v for k, v in deployed.refs.items() if k.partition(".")[0] in played}
            for key in known:
                del deployed.refs[key]
            for key, value in known.items():  # what moto's updated stack no longer parses keeps its value
                if str(deployed.refs[key]).startswith("rehearsal-not-created-"):
                    deployed.refs[key] = value

        cloudformation = self.client("cloudformation")
        body = json.dumps(self._template(stack_id, played, created))
        cloudformation.update_stack(StackName=stack.stack_name, TemplateBody=body, Capabilities=CAPABILITIES)
        forget()
        # CloudFormation then updates the resources that name a replaced one (an endpoint naming its replaced
        # config); moto's diff sees their unchanged text and leaves them: the new values are written into them.
        replaced = {k for k in played if deployed.refs[k] != before[k]}
        if replaced:
            body = json.dumps(self._template(stack_id, played, created, literal=replaced))
            try:
                cloudformation.update_stack(StackName=stack.stack_name, TemplateBody=body, Capabilities=CAPABILITIES)
            finally:
                forget()

    @staticmethod
    def _wave(candidates: set[str], needs: dict[str, set[str]], created: set[str]) -> set[str]:
        """The candidates whose dependencies are created or candidates of the wave themselves, transitively."""
        wave = set(candidates)
        while True:
            blocked = {k for k in wave if not needs[k] <= created | wave}
            if not blocked:
                return wave
            wave -= blocked

    def _template(
        self,
        stack_id: str,
        included: set[str],
        created: set[str],
        literal: set[str] = frozenset(),  # type: ignore[assignment]
    ) -> dict[str, Any]:
        """The template moto gets: the included resources, the names of hand-made ones (and of ``literal``) written as
        their values, the outputs whose resources exist."""
        template = self.stacks[stack_id].template
        refs = self.deployed[stack_id].refs
        hand = {k for k in created if k not in included} | set(literal)
        resources = {}
        for logical in included:
            resource = copy.deepcopy(template["Resources"][logical])
            if resource.get("DeletionPolicy") in _RETAINED:
                resource["DeletionPolicy"] = "Retain"
            depends = resource.get("DependsOn", [])
            depends = [d for d in ([depends] if isinstance(depends, str) else depends) if d in included]
            resource.pop("DependsOn", None)
            if depends:
                resource["DependsOn"] = depends
            resources[logical] = _written(resource, hand, refs)
        names = set(template["Resources"])
        kinds = {logical: resource["Type"] for logical, resource in template["Resources"].items()}
        resources = _as_refs(resources, kinds)
        outputs = {
            name: _as_refs(_written(output, hand, refs), kinds)
            for name, output in template.get("Outputs", {}).items()
            if dependencies({"Properties": output}, names) <= included | hand
        }
        body = {k: v for k, v in template.items() if k not in ("Resources", "Outputs", "Rules")}
        return {**body, "Resources": resources, **({"Outputs": outputs} if outputs else {})}

    def _cloudformation(self, stack_id: str, before: set[str], wave: set[str], created: set[str]) -> None:
        name = self.stacks[stack_id].stack_name
        body = json.dumps(self._template(stack_id, before | wave, created | wave))
        cloudformation = self.client("cloudformation")
        if before or self.moto_stack(name) is not None:
            cloudformation.update_stack(StackName=name, TemplateBody=body, Capabilities=CAPABILITIES)
        else:
            cloudformation.create_stack(StackName=name, TemplateBody=body, Capabilities=CAPABILITIES)
        self._register_exports(name)
        (described,) = cloudformation.describe_stacks(StackName=name)["Stacks"]
        if not described["StackStatus"].endswith("_COMPLETE"):
            raise StepFailed(f"{name}: {described['StackStatus']} {described.get('StackStatusReason', '')}")

    def _register_exports(self, stack_name: str) -> None:
        from moto.cloudformation.models import cloudformation_backends

        backend = cloudformation_backends[ACCOUNT][self.region]
        stack = self.moto_stack(stack_name)
        for export in stack.exports if stack is not None else []:
            backend.exports[export.name] = export

    def _detach_managed_policies(self, stack_id: str, logicals: set[str]) -> None:
        """CloudFormation detaches a managed policy from its roles before deleting it; moto's CloudFormation deletes
        the role first and fails with DeleteConflict: the rehearsal detaches them (IAM DetachRolePolicy)."""
        iam = self.client("iam")
        resources = self.stacks[stack_id].template["Resources"]
        for logical in sorted(logicals):
            if resources[logical]["Type"] != "AWS::IAM::ManagedPolicy":
                continue
            arn = self.deployed[stack_id].refs[logical]
            for role in iam.list_entities_for_policy(PolicyArn=arn, EntityFilter="Role")["PolicyRoles"]:
                iam.detach_role_policy(RoleName=role["RoleName"], PolicyArn=arn)

    def _ssm_parameter(self, name: str) -> str:
        value: str = self.client("ssm").get_parameter(Name=name)["Parameter"]["Value"]
        return value

    # Long: the waves backwards, each hand-made resource's deletion as CloudFormation or its handler makes it
    def destroy(self, stack_id: str) -> list[str]:
        """Delete the stack as CloudFormation does; returns what it retains (DeletionPolicy Retain)."""
        deployed = self.deployed[stack_id]
        resources = deployed.stack.template["Resources"]
        name = deployed.stack.stack_name
        retained = [k for k, r in resources.items() if r.get("DeletionPolicy") in _RETAINED]
        remaining = {k for _, wave in deployed.steps for k in wave}
        for step, logicals in reversed(deployed.steps):
            remaining -= set(logicals)
            if step == "hand":
                (logical,) = logicals
                kind = resources[logical]["Type"]
                delete = self.custom_deleters.get(kind) or hand_made.DELETERS.get(kind)
                if delete is not None and logical not in retained:
                    delete(self, stack_id, logical)
                continue
            self._detach_managed_policies(stack_id, set(logicals))
            for kind in hand_made.NETWORK_DELETION_ORDER:
                for logical in sorted(k for k in logicals if resources[k]["Type"] == kind and k not in retained):
                    hand_made.NETWORK_DELETERS[kind](self, stack_id, logical)
            played_left = {k for k in remaining if resources[k]["Type"] in self.played}
            if played_left:
                body = json.dumps(self._template(stack_id, played_left, remaining))
                self.client("cloudformation").update_stack(StackName=name, TemplateBody=body,
                                                           Capabilities=CAPABILITIES)  # fmt: skip
            else:
                self.client("cloudformation").delete_stack(StackName=name)
        s3 = self.client("s3")
        for logical, resource in resources.items():
            if resource["Type"] == "AWS::S3::Bucket" and logical not in retained:
                bucket = str(deployed.refs[logical])
                if bucket in {b["Name"] for b in s3.list_buckets()["Buckets"]}:
                    raise StepFailed(
                        f"{name}: DELETE_FAILED, bucket {bucket} ({logical}) is not empty (BucketNotEmpty)"
                    )
        deployed.status = "DELETE_COMPLETE"
        return [f"{resources[k]['Type'].rsplit('::', 1)[-1]} {deployed.refs[k]}" for k in retained]


def _written(value: Any, hand: set[str], refs: dict[str, Any]) -> Any:
    """``value`` with every name of a hand-made resource (Ref, Fn::GetAtt, Fn::Sub variable) replaced by its value."""
    if isinstance(value, list):
        return [_written(v, hand, refs) for v in value]
    if not isinstance(value, dict):
        return value
    if isinstance(value.get("Ref"), str) and value["Ref"] in hand:
        return refs[value["Ref"]]
    attribute = value.get("Fn::GetAtt")
    if isinstance(attribute, list) and attribute[0] in hand:
        return refs[f"{attribute[0]}.{attribute[1]}"]
    if "Fn::Sub" in value:
        body, variables = (value["Fn::Sub"], {}) if isinstance(value["Fn::Sub"], str) else value["Fn::Sub"]

        def literal(match: re.Match[str]) -> str:
            name = match[1]
            if name.split(".")[0] in hand and name not in variables:
                return str(refs[name])
            return match[0]

        body = re.sub(r"\$\{([^!}][^}]*)\}", literal, body)
        variables = _written(variables, hand, refs)
        return {"Fn::Sub": [body, variables] if variables else body}
    return {k: _written(v, hand, refs) for k, v in value.items()}


def _as_refs(value: Any, kinds: dict[str, str]) -> Any:
    """``value`` with each Fn::GetAtt of ``_ATTRIBUTES_AS_REF`` given as the Ref it equals."""
    if isinstance(value, list):
        return [_as_refs(v, kinds) for v in value]
    if not isinstance(value, dict):
        return value
    attribute = value.get("Fn::GetAtt")
    if isinstance(attribute, list) and (kinds.get(attribute[0]), attribute[1]) in _ATTRIBUTES_AS_REF:
        return {"Ref": attribute[0]}
    return {k: _as_refs(v, kinds) for k, v in value.items()}
