"""What each principal of a synthesized assembly can reach: requests evaluated, not statements read.

For every IAM role the templates create, and every managed policy they leave for people to hold, the review asks the
platform's policy evaluator (``ops_review.iam_policy``) about each action on each of the platform's own resources:
buckets and every prefix a policy names in them, KMS keys, ECR repositories, SageMaker endpoints, log groups and their
streams, SSM parameters (those the templates create and those their policies name, such as the image parameters). Each
request is decided against the principal's identity policies, the resource's own policy (bucket policy, key policy,
repository policy) and the VPC endpoint it passes through, together, as AWS decides it (a request from another
account needs both sides). The templates' references resolve to placeholder names of the right shape, consistently
across stacks (an import resolves to what its stack exports), so a bucket policy that names a role matches the role.

Each request is asked over the ways a request arrives, with the condition keys AWS sets on each: from inside the
platform's VPC (``aws:SourceVpc``/``aws:SourceVpce`` where the VPC has an endpoint of the service, else through the
NAT with neither), from outside it, and on the principal's behalf through each AWS service the policies name in
``kms:ViaService`` (``aws:ViaAWSService``). A reach that holds only on some of them says so ("only from the platform
VPC", "only through s3.us-west-2.amazonaws.com"); a write allowed only as a create says "only as a create
(If-None-Match: *)". Conditions on what a request carries that the review cannot know (instance types, tags, the KMS
key a job names, a launch template's settings) are assumed to hold and listed with the reach they open ("and: ...").
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ops_review.iam_policy import ContextValue, Request, Unsupported, allowing_statements, is_allowed, resolve
from ops_review.review import APP_ENVIRONMENT, StackTemplate, construct_name

# The account and region of a stack synthesized without them (environment-agnostic).
PLACEHOLDER_ACCOUNT = "123456789012"
PLACEHOLDER_REGION = "us-east-1"
PROBE = "x"  # what a wildcard of a policy's resource stands for in the request that probes it
NOT_EVALUATED = "(reach not evaluated)"  # the one entry of an environment whose policies the review cannot resolve

# Condition keys the review sets from the way a request arrives and who makes it; a condition on any other key of an
# Allow is assumed to hold and shown with the reach.
MODELLED_KEYS = {
    "aws:PrincipalArn", "aws:PrincipalAccount", "aws:userid", "aws:PrincipalIsAWSService", "aws:SecureTransport",
    "aws:SourceVpc", "aws:SourceVpce", "aws:ViaAWSService", "aws:ResourceAccount", "kms:ViaService", "s3:prefix",
    "s3:if-none-match", "s3:x-amz-server-side-encryption", "s3:x-amz-server-side-encryption-aws-kms-key-id",
    "s3:x-amz-server-side-encryption-customer-algorithm",
}  # fmt: skip
PRINCIPAL_TAG = "aws:PrincipalTag/"
# A resource's tags, as the template gives them (aws:ResourceTag/<key>; IAM's own iam:ResourceTag/<key> for roles).
RESOURCE_TAGS = ("aws:ResourceTag/", "iam:ResourceTag/")

# The actions asked of each kind of resource, besides every action of its service that a policy in scope names.
ACTIONS = {
    "bucket": ["s3:ListBucket", "s3:GetBucketLocation", "s3:PutBucketPolicy", "s3:DeleteBucket"],
    "object": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
    "key": ["kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey", "kms:ReEncryptFrom", "kms:CreateGrant",
            "kms:DescribeKey", "kms:PutKeyPolicy", "kms:ScheduleKeyDeletion"],
    "repository": ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability",
                   "ecr:PutImage", "ecr:InitiateLayerUpload", "ecr:UploadLayerPart", "ecr:CompleteLayerUpload",
                   "ecr:SetRepositoryPolicy", "ecr:DeleteRepository"],
    "endpoint": ["sagemaker:InvokeEndpoint", "sagemaker:DescribeEndpoint", "sagemaker:UpdateEndpoint",
                 "sagemaker:DeleteEndpoint"],
    "log-group": ["logs:CreateLogStream", "logs:DescribeLogStreams", "logs:PutLogEvents", "logs:GetLogEvents",
                  "logs:FilterLogEvents", "logs:PutRetentionPolicy", "logs:DeleteLogGroup"],
    "parameter": ["ssm:GetParameter", "ssm:GetParameters", "ssm:PutParameter", "ssm:DeleteParameter"],
    "function": ["lambda:InvokeFunction", "lambda:UpdateFunctionCode", "lambda:UpdateFunctionConfiguration"],
    "role": ["sts:AssumeRole", "iam:PassRole", "iam:PutRolePolicy", "iam:AttachRolePolicy",
             "iam:UpdateAssumeRolePolicy"],
}  # fmt: skip
# The VPC endpoint services a request of each IAM service prefix goes through (com.amazonaws.<region>.<service>).
ENDPOINT_SERVICES = {"s3": ("s3",), "kms": ("kms",), "ecr": ("ecr.api", "ecr.dkr"), "logs": ("logs",),
                     "ssm": ("ssm",), "sagemaker": ("sagemaker.runtime", "sagemaker.api")}  # fmt: skip

# The resource types the review reaches for: kind, service, and the ARN of a resource from its Ref name.
RESOURCE_TYPES = {
    "AWS::S3::Bucket": ("bucket", "arn:aws:s3:::{name}"),
    "AWS::KMS::Key": ("key", "arn:aws:kms:{region}:{account}:key/{name}"),
    "AWS::ECR::Repository": ("repository", "arn:aws:ecr:{region}:{account}:repository/{name}"),
    "AWS::SageMaker::Endpoint": ("endpoint", "arn:aws:sagemaker:{region}:{account}:endpoint/{name}"),
    "AWS::Logs::LogGroup": ("log-group", "arn:aws:logs:{region}:{account}:log-group:{name}"),
    "AWS::SSM::Parameter": ("parameter", "arn:aws:ssm:{region}:{account}:parameter/{name}"),
    "AWS::Lambda::Function": ("function", "arn:aws:lambda:{region}:{account}:function:{name}"),
    "AWS::IAM::Role": ("role", "arn:aws:iam::{account}:role/{name}"),
}
# The ARN of other resources the policies name (a role, an instance profile, ...), for their attributes.
OTHER_ARNS = {
    "AWS::IAM::InstanceProfile": "arn:aws:iam::{account}:instance-profile/{name}",
    "AWS::IAM::ManagedPolicy": "arn:aws:iam::{account}:policy/{name}",
    "AWS::SNS::Topic": "arn:aws:sns:{region}:{account}:{name}",
    "AWS::EC2::LaunchTemplate": "arn:aws:ec2:{region}:{account}:launch-template/{name}",
    "AWS::CodeBuild::Project": "arn:aws:codebuild:{region}:{account}:project/{name}",
}
# Types whose Ref is their ARN (CloudFormation return values).
REF_IS_ARN = ("AWS::SNS::Topic", "AWS::IAM::ManagedPolicy", "AWS::SageMaker::Endpoint")
_NAME_PROPERTIES = ("BucketName", "RoleName", "RepositoryName", "LogGroupName", "EndpointName", "Name",
                    "FunctionName", "ManagedPolicyName")  # fmt: skip
_POLICY_RESOURCE_PATTERNS = {
    "log-group": re.compile(r"arn:aws:logs:[^:]+:[^:]+:log-group:([^:*?]+)(?::.*)?"),
    "parameter": re.compile(r"arn:aws:ssm:[^:]+:[^:]+:parameter/([^*?]+)"),
}


class NotEvaluated(Exception):
    """A template holds a policy the review cannot resolve, so an environment's reach would be a guess."""


@dataclass
class _Stack:
    """One stack with its placeholder names: every reference of its template resolves to a value of the right shape."""

    template: StackTemplate
    exports: dict[str, Any]
    deployer: StackTemplate | None = None  # the app stack (a pipeline) that deploys this stack's stage, if any
    account: str = field(init=False)
    region: str = field(init=False)

    def __post_init__(self) -> None:
        # CDK Pipelines deploys a stage that names no account into the pipeline's own account.
        deployer = self.deployer.account if self.deployer else None
        self.account = self.template.account or deployer or PLACEHOLDER_ACCOUNT
        self.region = self.template.region or PLACEHOLDER_REGION
        self.resources: dict[str, dict[str, Any]] = self.template.template.get("Resources", {})

    def resolve(self, value: Any) -> Any:
        try:
            return resolve(value, refs=_Refs(self), exports=self.exports)
        except Unsupported as error:  # a value the review cannot read: no reach of this environment is shown
            raise NotEvaluated(f"{self.template.stack} uses {error}, which the review does not resolve") from error

    def name_of(self, logical_id: str) -> str:
        properties = self.resources[logical_id].get("Properties", {})
        for key in _NAME_PROPERTIES:
            if isinstance(properties.get(key), str):
                return str(properties[key])
        # Generated names: unique per stack, lower case (buckets and endpoints allow nothing else).
        return f"{self.template.stack_name}-{logical_id}".lower()

    def arn_of(self, logical_id: str) -> str:
        resource_type = self.resources[logical_id]["Type"]
        pattern = RESOURCE_TYPES[resource_type][1] if resource_type in RESOURCE_TYPES else OTHER_ARNS.get(resource_type)
        name = self.name_of(logical_id).lstrip("/")  # a parameter's ARN drops its name's leading slash
        if pattern is None:
            service = resource_type.split("::")[1].lower()
            return f"arn:aws:{service}:{self.region}:{self.account}:{name}"
        return pattern.format(name=name, region=self.region, account=self.account)


class _Refs(dict[str, Any]):
    """``Ref`` and ``Fn::GetAtt`` values of one stack, made on first use."""

    def __init__(self, stack: _Stack) -> None:
        super().__init__()
        self.stack = stack

    def __missing__(self, key: str) -> Any:
        stack, account, region = self.stack, self.stack.account, self.stack.region
        pseudo = {"AWS::AccountId": account, "AWS::Region": region, "AWS::Partition": "aws",
                  "AWS::URLSuffix": "amazonaws.com", "AWS::StackName": stack.template.stack_name,
                  "Fn::GetAZs": [f"{region}a", f"{region}b", f"{region}c"]}  # fmt: skip
        if key in pseudo:
            return pseudo[key]
        logical_id, _, attribute = key.partition(".")
        parameter = stack.template.template.get("Parameters", {}).get(logical_id)
        if parameter is not None:
            return parameter.get("Default", logical_id.lower())
        resource = stack.resources.get(logical_id)
        if resource is None:
            return key.lower()
        if resource["Type"] == "AWS::KMS::Key" and not attribute:
            return stack.name_of(logical_id)
        if attribute.endswith("Arn") or (not attribute and resource["Type"] in REF_IS_ARN):
            return stack.arn_of(logical_id)
        if attribute == "RoleId":
            return f"AROA{logical_id.upper()}"
        if attribute in ("GroupId", "VpcId") or resource["Type"].startswith("AWS::EC2::"):
            return f"{resource['Type'].rsplit('::', 1)[1].lower()}-{logical_id.lower()}"
        return stack.name_of(logical_id) if not attribute or attribute.endswith("Name") else key.lower()


@dataclass
class _Target:
    """A resource the review reaches for, with its policy and the prefixes or streams the policies name in it."""

    name: str  # the construct path (Foundation/RemoteJobs), or the ARN's name for one only the policies name
    kind: str
    arn: str
    account: str
    policy: dict[str, Any] | None = None
    tags: dict[str, str] = field(default_factory=dict)
    scopes: dict[str, str] = field(default_factory=dict)  # label -> the ARN pattern its requests are probed inside


@dataclass
class _Principal:
    name: str
    kind: str  # role | people holding this policy
    arn: str
    account: str
    trusted_by: list[str]
    policies: list[dict[str, Any]]
    tags: dict[str, str]
    not_evaluated: list[str]


@dataclass(frozen=True)
class _Channel:
    """One way a request arrives, with the condition keys AWS sets on it."""

    label: str
    context: dict[str, ContextValue]
    vpc: str | None = None  # the platform's VPC, for requests from inside it
    via: bool = False  # made by an AWS service on the principal's behalf (kms:ViaService)


def _documents_of(stack: _Stack) -> Iterable[tuple[str, str, dict[str, Any]]]:
    """(logical id, kind, resolved document) of every policy the stack holds: identity, bucket, key, repository."""
    for logical_id, resource in stack.resources.items():
        yield from _documents_of_resource(stack, logical_id, resource)


def _documents_of_resource(
    stack: _Stack, logical_id: str, resource: dict[str, Any]
) -> Iterable[tuple[str, str, dict[str, Any]]]:
    """The policies of one resource (a role's inline ones, a policy, a bucket's, a key's, a repository's)."""
    properties = resource.get("Properties", {})
    kind = resource["Type"]
    if kind == "AWS::IAM::Role":
        for policy in properties.get("Policies", []):
            yield logical_id, "inline", stack.resolve(policy["PolicyDocument"])
    elif kind in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
        yield logical_id, "identity", stack.resolve(properties["PolicyDocument"])
    elif kind == "AWS::S3::BucketPolicy":
        yield logical_id, "bucket", stack.resolve(properties["PolicyDocument"])
    elif kind == "AWS::KMS::Key" and "KeyPolicy" in properties:
        yield logical_id, "key", stack.resolve(properties["KeyPolicy"])
    elif kind == "AWS::ECR::Repository" and "RepositoryPolicyText" in properties:
        yield logical_id, "repository", stack.resolve(properties["RepositoryPolicyText"])


def _statements(document: dict[str, Any]) -> list[dict[str, Any]]:
    statements = document.get("Statement", [])
    return [statements] if isinstance(statements, dict) else list(statements)


def _strings(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else [v for v in value if isinstance(v, str)] if value else []


def _relaxed(document: dict[str, Any]) -> dict[str, Any]:
    """The document with each Allow's conditions on keys the review does not set taken out and kept as ``_assumed``
    (text), so the reach they open can be shown with them."""
    statements = []
    for statement in _statements(document):
        if statement.get("Effect") != "Allow" or "Condition" not in statement:
            statements.append(statement)
            continue
        kept: dict[str, dict[str, Any]] = {}
        assumed: list[str] = []
        for operator, keys in statement["Condition"].items():
            for key, values in keys.items():
                if key in MODELLED_KEYS or key.startswith((PRINCIPAL_TAG, *RESOURCE_TAGS)):
                    kept.setdefault(operator, {})[key] = values
                else:
                    assumed.append(f"{operator} {key}: {', '.join(map(str, _strings(values) or [values]))}")
        statements.append({**statement, "Condition": kept, "_assumed": assumed})
    return {**document, "Statement": statements}


def _without_conditions(document: dict[str, Any]) -> dict[str, Any]:
    """The document's Allow statements with no conditions: what could apply at all (a cheap first filter)."""
    allows = [{k: v for k, v in s.items() if k != "Condition"} for s in _statements(document) if s["Effect"] == "Allow"]
    return {"Statement": allows}


def _about(documents: list[dict[str, Any]], arn: str) -> list[dict[str, Any]]:
    """The statements of ``documents`` that may concern ``arn`` or what lies inside it (a bucket's objects, a log
    group's streams), as one document: a statement whose every resource pattern begins with other text than the ARN
    cannot match it or anything under it (a policy variable counts as a wildcard; NotResource may match anything)."""

    def literal(pattern: str) -> str:
        return re.split(r"[*?]|\$\{", pattern, maxsplit=1)[0]

    kept = [
        statement
        for document in documents
        for statement in _statements(document)
        if "NotResource" in statement
        or any(arn.startswith(literal(p)) or literal(p).startswith(arn) for p in _strings(statement.get("Resource")))
    ]
    return [{"Statement": kept}] if kept else []


def _probe(pattern: str, context: dict[str, ContextValue]) -> str:
    """The ARN of a request inside ``pattern``: its policy variables as the principal's own (``${aws:userid}``: the
    caller's own prefix), each wildcard as one name."""
    own = re.sub(r"\$\{([^}]+)\}", lambda m: str(context.get(m[1], PROBE)), pattern)
    return own.replace("*", PROBE).replace("?", PROBE[0])


class _Scope:
    """One environment: its principals, the resources they may reach (its own and the app's shared ones), the
    channels requests arrive through, and the evaluation of each request."""

    def __init__(self, own: list[_Stack], shared: list[_Stack]) -> None:
        self.own, self.stacks = own, own + [s for s in shared if s not in own]
        self.documents = [(stack, lid, kind, doc) for stack in self.stacks for lid, kind, doc in _documents_of(stack)]
        self.statements = [s for _, _, _, doc in self.documents for s in _statements(doc)]
        self.targets = self._targets()
        self.channels = self._channels()
        # Each service's actions that a policy grants or refuses on something other than "*" (an action granted on
        # "*" alone acts on no resource of the platform's).
        self.named_actions: dict[str, set[str]] = {}
        for statement in self.statements:
            if _strings(statement.get("Resource")) == ["*"]:
                continue
            for action in _strings(statement.get("Action")):
                if "*" not in action and "?" not in action:
                    self.named_actions.setdefault(action.split(":", 1)[0], set()).add(action)

    # --- what there is to reach

    def _targets(self) -> dict[str, _Target]:
        """The platform's resources by ARN, with their policies and the scopes the policies name inside them."""
        targets: dict[str, _Target] = {}
        for stack in self.stacks:
            for lid, resource in stack.resources.items():
                if resource["Type"] in RESOURCE_TYPES:
                    arn = stack.arn_of(lid)
                    name = f"{stack.template.stack}/{construct_name(stack.template, lid)}"
                    if stack not in self.own and stack.template.environment != APP_ENVIRONMENT:
                        name = f"{stack.template.environment}/{name}"  # another stage's, seen from the pipeline
                    tags = {
                        str(tag["Key"]): tag["Value"]
                        for tag in resource.get("Properties", {}).get("Tags", [])
                        if isinstance(tag, dict) and isinstance(tag.get("Value"), str)
                    }
                    targets[arn] = _Target(name, RESOURCE_TYPES[resource["Type"]][0], arn, stack.account, tags=tags)
        for stack in self.stacks:  # a role's trust policy is the resource policy of sts:AssumeRole on it
            for lid, resource in stack.resources.items():
                if resource["Type"] == "AWS::IAM::Role" and stack.arn_of(lid) in targets:
                    trust = resource["Properties"].get("AssumeRolePolicyDocument")
                    targets[stack.arn_of(lid)].policy = stack.resolve(trust) if trust else None
        for stack, lid, kind, document in self.documents:
            if kind == "bucket":
                bucket = stack.resolve(stack.resources[lid]["Properties"]["Bucket"])
                arn = f"arn:aws:s3:::{bucket}"
            elif kind in ("key", "repository"):
                arn = stack.arn_of(lid)
            else:
                continue
            if arn in targets:
                targets[arn].policy = document
        patterns = {p for s in self.statements for k in ("Resource", "NotResource") for p in _strings(s.get(k))}
        for pattern in sorted(patterns):  # log groups and parameters the policies name without creating them
            for kind, found in _POLICY_RESOURCE_PATTERNS.items():
                match = found.fullmatch(pattern)
                if match and kind == "log-group":
                    arn = pattern[: match.end(1)]
                    targets.setdefault(arn, _Target(match[1], kind, arn, arn.split(":")[4]))
                elif match:
                    targets.setdefault(pattern, _Target(f"/{match[1]}", kind, pattern, pattern.split(":")[4]))
        for target in targets.values():
            target.scopes[""] = target.arn
            separator = {"bucket": "/", "log-group": ":log-stream:"}.get(target.kind)
            if separator is None:
                continue
            target.scopes["*"] = f"{target.arn}{separator}*"
            for pattern in sorted(patterns):
                if pattern.startswith(f"{target.arn}{separator}"):
                    target.scopes[pattern.removeprefix(f"{target.arn}{separator}")] = pattern
        return targets

    def _channels(self) -> list[_Channel]:
        """From the platform's VPC, from outside it, and through each service the policies name in kms:ViaService."""
        direct: dict[str, ContextValue] = {"aws:ViaAWSService": "false"}
        channels = [_Channel("from outside the platform VPC", direct)]
        vpcs = [
            (stack, lid) for stack in self.own for lid, r in stack.resources.items() if r["Type"] == "AWS::EC2::VPC"
        ]
        if vpcs:
            stack, lid = vpcs[0]
            channels.insert(0, _Channel("from the platform VPC", direct, vpc=stack.resolve({"Ref": lid})))
        services = {
            value
            for s in self.statements
            for operator, keys in s.get("Condition", {}).items()
            if "String" in operator
            for value in _strings(keys.get("kms:ViaService"))
        }
        channels += [
            _Channel(f"through {service}", {"aws:ViaAWSService": "true", "kms:ViaService": service}, via=True)
            for service in sorted(services)
        ]
        return channels

    def endpoint(self, service: str) -> tuple[dict[str, ContextValue], tuple[dict[str, Any], ...]]:
        """The keys and policy of the platform VPC's endpoint for an IAM service prefix (none: through the NAT)."""
        for stack in self.own:
            for lid, resource in stack.resources.items():
                if resource["Type"] != "AWS::EC2::VPCEndpoint":
                    continue
                properties = resource["Properties"]
                name = str(stack.resolve(properties["ServiceName"]))
                if name.split(f".{stack.region}.", 1)[-1] in ENDPOINT_SERVICES.get(service, ()):
                    keys: dict[str, ContextValue] = {"aws:SourceVpce": stack.resolve({"Ref": lid})}
                    policy = properties.get("PolicyDocument")
                    return keys, ((stack.resolve(policy),) if policy else ())
        return {}, ()

    # --- who reaches

    def principals(self) -> list[_Principal]:
        """Every role of the environment's own stacks with the policies attached to it anywhere in scope, and each
        managed policy attached to no one (people hold it) as a principal of its own."""
        attached: dict[str, list[dict[str, Any]]] = {}
        holders: list[_Principal] = []
        for stack, lid, kind, document in self.documents:
            if kind != "identity":
                continue
            properties = stack.resources[lid]["Properties"]
            roles = [str(stack.resolve(r)) for r in properties.get("Roles", [])]
            for role in roles:
                attached.setdefault(f"{stack.account}/{role}", []).append(document)
            if not roles and stack in self.own and stack.resources[lid]["Type"] == "AWS::IAM::ManagedPolicy":
                name = f"{stack.template.stack}/{construct_name(stack.template, lid)}"
                arn = f"arn:aws:iam::{stack.account}:role/holder-of-{lid}"
                holders.append(
                    _Principal(name, "people holding this policy", arn, stack.account, [], [document], {}, [])
                )
        names = {t.arn: t.name for t in self.targets.values() if t.kind == "role"}
        found = []
        for stack in self.own:
            for lid, resource in stack.resources.items():
                if resource["Type"] != "AWS::IAM::Role":
                    continue
                properties = resource["Properties"]
                documents = [stack.resolve(p["PolicyDocument"]) for p in properties.get("Policies", [])]
                documents += attached.get(f"{stack.account}/{stack.resolve({'Ref': lid})}", [])
                managed = [str(stack.resolve(arn)) for arn in properties.get("ManagedPolicyArns", [])]
                by_arn = {stack.arn_of(m): d for s, m, k, d in self.documents if k == "identity" and s is stack}
                documents += [by_arn[arn] for arn in managed if arn in by_arn]
                trust = properties.get("AssumeRolePolicyDocument", {})
                found.append(
                    _Principal(
                        name=f"{stack.template.stack}/{construct_name(stack.template, lid)}",
                        kind="role",
                        arn=str(stack.resolve({"Fn::GetAtt": [lid, "Arn"]})),
                        account=stack.account,
                        trusted_by=sorted(
                            {
                                names.get(p, p)
                                for s in _statements(stack.resolve(trust))
                                for p in _principal_names(s.get("Principal"))
                            }
                        ),
                        policies=documents,
                        tags={
                            t["Key"]: str(t["Value"]) for t in properties.get("Tags", []) if isinstance(t["Value"], str)
                        },
                        not_evaluated=[
                            f"managed policy {arn} (AWS's, not in the templates)"
                            for arn in managed
                            if arn not in by_arn
                        ],
                    )
                )
        return found + holders

    # --- what it reaches

    def context_of(self, principal: _Principal) -> dict[str, ContextValue]:
        session = principal.arn.rsplit("/", 1)[-1]
        context: dict[str, ContextValue] = {
            "aws:PrincipalArn": principal.arn,
            "aws:PrincipalAccount": principal.account,
            "aws:userid": f"AROA{session.upper()}:session",
            "aws:PrincipalIsAWSService": "false",
            "aws:SecureTransport": "true",
        }
        context.update({f"{PRINCIPAL_TAG}{key}": value for key, value in principal.tags.items()})
        return context

    def reach_of(self, principal: _Principal) -> list[dict[str, Any]]:
        """Each resource and scope the principal reaches: the actions allowed, by the conditions that must hold."""
        base = self.context_of(principal)
        rows: dict[tuple[str, str, str, tuple[str, ...]], set[str]] = {}
        for target in self.targets.values():
            identity = _about(principal.policies, target.arn)
            if not any(s["Effect"] == "Allow" for d in identity for s in _statements(d)) and target.policy is None:
                continue
            loose = [_without_conditions(d) for d in identity]
            context = {**base, "aws:ResourceAccount": target.account}
            context.update({f"{prefix}{key}": value for prefix in RESOURCE_TAGS for key, value in target.tags.items()})
            loose_resource = [_without_conditions(target.policy)] if target.policy else []
            for label, pattern in target.scopes.items():
                for action, arn, extra in self._requests(target, label, pattern, context):
                    request = Request(action, arn, {**context, **extra})
                    if not (allowing_statements(loose, request)
                            or allowing_statements(loose_resource, request, resource_policy=True)):  # fmt: skip
                        continue
                    conditions = self._decide(principal, identity, target, request)
                    if conditions is not None:
                        rows.setdefault((target.name, target.kind, label, tuple(conditions)), set()).add(action)
        return [
            {"resource": name, "type": kind, "scope": label, "actions": sorted(actions), "conditions": list(conditions)}
            for (name, kind, label, conditions), actions in sorted(rows.items())
        ]

    def _requests(
        self, target: _Target, label: str, pattern: str, context: dict[str, ContextValue]
    ) -> Iterable[tuple[str, str, dict[str, ContextValue]]]:
        """(action, resource ARN, request keys) of every request that probes one scope of a resource: a bucket's own
        actions on the bucket, object actions inside each prefix, and the listing of that prefix (s3:prefix)."""
        named = self.named_actions.get(target.arn.split(":")[2], set())
        if target.kind != "bucket":
            actions = sorted(set(ACTIONS[target.kind]) | named)
            return [(action, _probe(pattern, context), {}) for action in actions]
        bucket_level = set(ACTIONS["bucket"]) | {a for a in named if "Bucket" in a}
        if label == "":
            return [(action, target.arn, {}) for action in sorted(bucket_level)]
        prefix = label.split("*", 1)[0].split("?", 1)[0]
        listing: dict[str, ContextValue] = {"s3:prefix": prefix} if prefix else {}
        objects = sorted((set(ACTIONS["object"]) | named) - bucket_level)
        return [*((a, _probe(pattern, context), {}) for a in objects), ("s3:ListBucket", target.arn, listing)]

    def _allowed(
        self,
        principal: _Principal,
        policies: list[dict[str, Any]],
        target: _Target,
        request: Request,
        *,
        relaxed: bool = False,
    ) -> list[_Channel]:
        """The channels through which AWS would allow the request (``policies``: the principal's identity policies
        about the target)."""
        service = request.action.split(":", 1)[0]
        identity = [_relaxed(d) for d in policies] if relaxed else policies
        policy = target.policy
        if target.kind == "key" and policy is None:  # AWS's default key policy: the account's IAM policies decide
            policy = {"Statement": [{"Effect": "Allow", "Principal": {"AWS": f"arn:aws:iam::{target.account}:root"},
                                     "Action": "kms:*", "Resource": "*"}]}  # fmt: skip
        if policy is not None and relaxed:
            policy = _relaxed(policy)
        allowed = []
        for channel in self.channels:
            if channel.via and service != "kms":
                continue
            context = {**request.context, **channel.context}
            endpoint_policies: tuple[dict[str, Any], ...] = ()
            if channel.vpc is not None:
                keys, endpoint_policies = self.endpoint(service)
                if keys:  # through the VPC's endpoint of the service; else through the NAT, as from outside
                    context.update({**keys, "aws:SourceVpc": channel.vpc})
            if is_allowed(
                identity,
                Request(request.action, request.resource, context),
                resource_policies=[policy] if policy is not None and target.kind != "key" else [],
                key_policy=policy if target.kind == "key" else None,
                endpoint_policies=endpoint_policies,
                same_account=principal.account == target.account,
            ):
                allowed.append(channel)
        return allowed

    def _decide(
        self, principal: _Principal, policies: list[dict[str, Any]], target: _Target, request: Request
    ) -> list[str] | None:
        """None if AWS refuses the request however it arrives; else the conditions under which it allows it."""
        conditions: list[str] = []
        allowed = self._allowed(principal, policies, target, request)
        if not allowed and request.action == "s3:PutObject":
            create = Request(request.action, request.resource, {**request.context, "s3:if-none-match": "*"})
            allowed = self._allowed(principal, policies, target, create)
            conditions = ["only as a create (If-None-Match: *)"] if allowed else []
        if not allowed:
            allowed = self._allowed(principal, policies, target, request, relaxed=True)
            identity = [_relaxed(d) for d in policies]
            resource = [_relaxed(target.policy)] if target.policy else []
            statements = allowing_statements(identity, request) + allowing_statements(
                resource, request, resource_policy=True
            )
            conditions = sorted({f"and: {c}" for s in statements for c in s.get("_assumed", [])})
        if not allowed:
            return None
        return [*self._channel_condition(request, allowed), *conditions]

    def _channel_condition(self, request: Request, allowed: list[_Channel]) -> list[str]:
        applicable = [c for c in self.channels if not c.via or request.action.startswith("kms:")]
        if len(allowed) == len(applicable):
            return []
        direct = [c for c in applicable if not c.via]
        parts = ["directly"] if all(c in allowed for c in direct) else [c.label for c in allowed if not c.via]
        services = [str(c.context["kms:ViaService"]).split(".", 1)[0] for c in allowed if c.via]
        if services:
            parts.append(f"through {', '.join(services)} (kms:ViaService)")
        return ["only " + " or ".join(parts)]


def _principal_names(principal: Any) -> list[str]:
    if principal is None:
        return []
    if isinstance(principal, str):
        return [principal]
    return [str(p) for values in principal.values() for p in ([values] if isinstance(values, str | dict) else values)]


class _Exports(dict[str, Any]):
    """The assembly's exports; an import of something no stack here exports stays a name of its own."""

    def __missing__(self, name: str) -> str:
        return f"import-{name}"


def reach_assembly(stacks: list[StackTemplate]) -> dict[str, dict[str, dict[str, Any]]]:
    """{environment: {principal: its reach}} for every environment of the assembly. An environment reaches its own
    stacks' resources and the app's shared ones (the pipeline's repositories); the app's own principals reach the
    stages the app deploys as well."""
    exports = _Exports()
    app_stacks = [s for s in stacks if s.environment == APP_ENVIRONMENT]

    def deployer(stack: StackTemplate) -> StackTemplate | None:
        return next((a for a in app_stacks if stack.environment.startswith(f"{a.stack}/")), None)

    resolved = [_Stack(stack, exports, deployer(stack)) for stack in stacks]
    for stack in resolved:
        for output in stack.template.template.get("Outputs", {}).values():
            with contextlib.suppress(NotEvaluated):  # an import of it stays a name of its own
                if "Export" in output:
                    exports[str(stack.resolve(output["Export"]["Name"]))] = stack.resolve(output["Value"])
    app = [s for s in resolved if s.template.environment == APP_ENVIRONMENT]
    reach: dict[str, dict[str, dict[str, Any]]] = {}
    for environment in sorted({s.template.environment for s in resolved}):
        own = [s for s in resolved if s.template.environment == environment]
        if environment == APP_ENVIRONMENT:
            deployed = {f"{s.template.stack}/" for s in own}
            shared = [s for s in resolved if s.template.environment.startswith(tuple(deployed))]
        else:
            shared = app
        try:
            scope = _Scope(own, shared)
            reach[environment] = {
                principal.name: {
                    "kind": principal.kind,
                    "trusted_by": principal.trusted_by,
                    "not_evaluated": principal.not_evaluated,
                    "reach": scope.reach_of(principal),
                }
                for principal in sorted(scope.principals(), key=lambda p: p.name)
            }
        except (NotEvaluated, Unsupported) as error:  # Unsupported: a policy element the evaluator does not model
            entry = {"kind": "-", "trusted_by": [], "not_evaluated": [str(error)], "reach": []}
            reach[environment] = {NOT_EVALUATED: entry}
    return reach
