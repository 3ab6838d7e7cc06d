"""CloudFormation, played: each template's resources created in moto from their resolved properties, the
stack's outputs and resource list kept for the stand-ins that answer DescribeStacks and its kin.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ops_review.review import StackTemplate
from proving_ground.iam_policy import resolve
from proving_ground.rehearsal.journey import ACCOUNT, StepFailed


def _physical(stack_name: str, logical: str, limit: int = 63) -> str:
    """A CloudFormation-style generated name: stack name, logical id, lower-case for buckets."""
    return f"{stack_name}-{logical}"[:limit]


def _sagemaker_arn(arn: str) -> str:
    """SageMaker lower-cases resource names in its ARNs (moto keeps their case)."""
    prefix, _, name = arn.rpartition("/")
    return f"{prefix}/{name.lower()}"


class Refs(dict[str, Any]):
    """Ref / GetAtt values of one stack: what the rehearsal created, else a placeholder that no real call matches
    (a policy naming a resource the rehearsal never made can only refuse). A template parameter of an SSM type (a
    ``BuiltImage``'s digest) is read from SSM, as CloudFormation reads it when the stack deploys."""

    def __init__(
        self, stack: StackTemplate, pseudo: dict[str, Any], parameter: Callable[[str], str] | None = None
    ) -> None:
        super().__init__(pseudo)
        self.stack = stack
        self.parameter = parameter

    def __missing__(self, key: str) -> Any:
        logical = key.partition(".")[0]
        if logical in self.stack.template.get("Resources", {}):
            return f"rehearsal-not-created-{self.stack.stack_name}-{key}"
        declared = self.stack.template.get("Parameters", {}).get(key)
        if self.parameter and declared and declared["Type"] == "AWS::SSM::Parameter::Value<String>":
            self[key] = self.parameter(declared["Default"])
            return self[key]
        raise KeyError(key)


@dataclass
class DeployedStack:
    stack: StackTemplate
    refs: Refs
    outputs: dict[str, str] = field(default_factory=dict)
    resources: list[tuple[str, str, str]] = field(default_factory=list)  # (logical id, type, physical id)
    status: str = "CREATE_COMPLETE"

    def physical(self, resource_type: str) -> list[str]:
        return [physical for _, kind, physical in self.resources if kind == resource_type]


class Deployment:
    """What `cdk deploy` would have created, created in moto from the templates' resolved properties."""

    def __init__(self, stacks: dict[str, StackTemplate], client: Callable[[str], Any], region: str) -> None:
        self.stacks = stacks
        self.client = client
        self.region = region
        self.exports: dict[str, Any] = {}
        self.deployed: dict[str, DeployedStack] = {}
        self.launch_templates: dict[str, dict[str, Any]] = {}
        self.encrypted_buckets: dict[str, str] = {}
        zones = client("ec2").describe_availability_zones()["AvailabilityZones"]
        self.zones = sorted(zone["ZoneName"] for zone in zones)

    def resolve(self, stack_id: str, value: Any) -> Any:
        return resolve(value, refs=self.deployed[stack_id].refs, exports=self.exports)

    def deploy(self, stack_id: str) -> DeployedStack:
        stack = self.stacks[stack_id]
        pseudo = {"AWS::AccountId": ACCOUNT, "AWS::Region": self.region, "AWS::Partition": "aws",
                  "AWS::URLSuffix": "amazonaws.com", "AWS::StackName": stack.stack_name,
                  "AWS::NoValue": None, "Fn::GetAZs": self.zones}  # fmt: skip
        deployed = self.deployed[stack_id] = DeployedStack(stack, Refs(stack, pseudo, self._ssm_parameter))
        resources = stack.template["Resources"]
        for kind, create in self._creators():
            for logical, resource in resources.items():
                if resource["Type"] == kind:
                    physical = create(stack_id, logical, resource.get("Properties", {}))
                    deployed.resources.append((logical, kind, str(physical)))
        for name, output in stack.template.get("Outputs", {}).items():
            try:
                value = self.resolve(stack_id, output["Value"])
            except KeyError:
                continue
            deployed.outputs[name] = str(value)
            if "Export" in output:
                self.exports[self.resolve(stack_id, output["Export"]["Name"])] = value
        return deployed

    def _ssm_parameter(self, name: str) -> str:
        value: str = self.client("ssm").get_parameter(Name=name)["Parameter"]["Value"]
        return value

    def destroy(self, stack_id: str) -> None:
        """Delete what the stack created that outlives nothing else: endpoints, targets, instances' templates."""
        deployed = self.deployed[stack_id]
        sagemaker, autoscaling = self.client("sagemaker"), self.client("application-autoscaling")
        for logical, kind, physical in reversed(deployed.resources):
            resource = deployed.stack.template["Resources"][logical]
            retained = resource.get("DeletionPolicy") in ("Retain", "RetainExceptOnCreate")
            if kind == "AWS::ApplicationAutoScaling::ScalableTarget":
                resource_id, dimension, namespace = physical.split("|")
                autoscaling.deregister_scalable_target(
                    ServiceNamespace=namespace, ResourceId=resource_id, ScalableDimension=dimension
                )
            elif kind == "AWS::SageMaker::Endpoint":
                sagemaker.delete_endpoint(EndpointName=physical)
            elif kind == "AWS::SageMaker::EndpointConfig":
                sagemaker.delete_endpoint_config(EndpointConfigName=physical)
            elif kind == "AWS::SageMaker::Model":
                sagemaker.delete_model(ModelName=physical)
            elif kind == "AWS::Logs::LogGroup" and not retained:
                self.client("logs").delete_log_group(logGroupName=physical)
            elif kind == "AWS::EC2::LaunchTemplate":
                self.client("ec2").delete_launch_template(LaunchTemplateId=physical)
        deployed.status = "DELETE_COMPLETE"

    # --- one creator per resource type, in dependency order -----------------------------------------------------------

    def _creators(self) -> list[tuple[str, Callable[[str, str, dict[str, Any]], str]]]:
        return [
            ("AWS::KMS::Key", self._key),
            ("AWS::EC2::VPC", self._vpc),
            ("AWS::EC2::Subnet", self._subnet),
            ("AWS::EC2::SecurityGroup", self._security_group),
            ("AWS::S3::Bucket", self._bucket),
            ("AWS::IAM::Role", self._role),
            ("AWS::IAM::InstanceProfile", self._instance_profile),
            ("AWS::IAM::ManagedPolicy", self._managed_policy),
            ("AWS::Logs::LogGroup", self._log_group),
            ("AWS::EC2::PlacementGroup", self._placement_group),
            ("AWS::EC2::LaunchTemplate", self._launch_template),
            ("AWS::SSM::Parameter", self._parameter),
            ("AWS::SageMaker::Model", self._model),
            ("AWS::SageMaker::EndpointConfig", self._endpoint_config),
            ("AWS::SageMaker::Endpoint", self._endpoint),
            ("AWS::ApplicationAutoScaling::ScalableTarget", self._scalable_target),
            ("AWS::ApplicationAutoScaling::ScalingPolicy", self._scaling_policy),
        ]

    def _set(self, stack_id: str, logical: str, ref: Any, **attributes: Any) -> Any:
        refs = self.deployed[stack_id].refs
        refs[logical] = ref
        refs.update({f"{logical}.{name}": value for name, value in attributes.items()})
        return ref

    def _key(self, stack_id: str, logical: str, props: dict[str, Any]) -> str:
        key = self.client("kms").create_key(Description=str(props.get("Description", logical)))["KeyMetadata"]
        return self._set(stack_id, logical, key["KeyId"], Arn=key["Arn"])

    def _vpc(self, stack_id: str, logical: str, props: dict[str, Any]) -> str:
        vpc = self.client("ec2").create_vpc(CidrBlock=self.resolve(stack_id, props["CidrBlock"]))["Vpc"]["VpcId"]
        return self._set(stack_id, logical, vpc, VpcId=vpc)

    def _subnet(self, stack_id: str, logical: str, props: dict[str, Any]) -> str:
        subnet = self.client("ec2").create_subnet(
            VpcId=self.resolve(stack_id, props["VpcId"]),
            CidrBlock=self.resolve(stack_id, props["CidrBlock"]),
            AvailabilityZone=self.resolve(stack_id, props["AvailabilityZone"]),
        )["Subnet"]
        return self._set(stack_id, logical, subnet["SubnetId"], SubnetId=subnet["SubnetId"])

    def _security_group(self, stack_id: str, logical: str, props: dict[str, Any]) -> str:
        stack = self.stacks[stack_id].stack_name
        group = self.client("ec2").create_security_group(
            GroupName=_physical(stack, logical, 255),
            Description=str(self.resolve(stack_id, props.get("GroupDescription", logical)))[:255],
            VpcId=self.resolve(stack_id, props["VpcId"]),
        )["GroupId"]
        return self._set(stack_id, logical, group, GroupId=group)

    def _bucket(self, stack_id: str, logical: str, props: dict[str, Any]) -> str:
        name = re.sub(r"[^a-z0-9-]", "-", _physical(self.stacks[stack_id].stack_name, logical).lower())
        s3 = self.client("s3")
        s3.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": self.region})
        encryption = self.resolve(stack_id, props.get("BucketEncryption", {}))
        for rule in encryption.get("ServerSideEncryptionConfiguration", []):
            default = rule["ServerSideEncryptionByDefault"]
            if default["SSEAlgorithm"] == "aws:kms":
                self.encrypted_buckets[name] = default["KMSMasterKeyID"]
            api_rule = {
                "ApplyServerSideEncryptionByDefault": default,
                "BucketKeyEnabled": bool(rule.get("BucketKeyEnabled")),
            }
            s3.put_bucket_encryption(Bucket=name, ServerSideEncryptionConfiguration={"Rules": [api_rule]})
        return self._set(stack_id, logical, name, Arn=f"arn:aws:s3:::{name}")

    def _role(self, stack_id: str, logical: str, props: dict[str, Any]) -> str:
        name = props.get("RoleName") or _physical(self.stacks[stack_id].stack_name, logical, 64)
        trust = json.dumps(self.resolve(stack_id, props["AssumeRolePolicyDocument"]))
        role = self.client("iam").create_role(RoleName=name, AssumeRolePolicyDocument=trust)["Role"]
        return self._set(stack_id, logical, name, Arn=role["Arn"], RoleId=role["RoleId"])

    def _instance_profile(self, stack_id: str, logical: str, props: dict[str, Any]) -> str:
        name = _physical(self.stacks[stack_id].stack_name, logical, 128)
        iam = self.client("iam")
        profile = iam.create_instance_profile(InstanceProfileName=name)["InstanceProfile"]
        for role in self.resolve(stack_id, props["Roles"]):
            iam.add_role_to_instance_profile(InstanceProfileName=name, RoleName=role)
        return self._set(stack_id, logical, name, Arn=profile["Arn"])

    def _managed_policy(self, stack_id: str, logical: str, props: dict[str, Any]) -> str:
        # Not created: the call gate holds the policies (moto enforces none).
        arn = f"arn:aws:iam::{ACCOUNT}:policy/{_physical(self.stacks[stack_id].stack_name, logical, 128)}"
        return self._set(stack_id, logical, arn)

    def _log_group(self, stack_id: str, logical: str, props: dict[str, Any]) -> str:
        name = self.resolve(stack_id, props.get("LogGroupName")) or _physical(
            self.stacks[stack_id].stack_name, logical, 512
        )
        self.client("logs").create_log_group(logGroupName=name)
        arn = f"arn:aws:logs:{self.region}:{ACCOUNT}:log-group:{name}:*"
        return self._set(stack_id, logical, name, Arn=arn)

    def _placement_group(self, stack_id: str, logical: str, props: dict[str, Any]) -> str:
        # moto 5.2.5 has no placement groups: the name only (RunInstances is still checked against it).
        name = _physical(self.stacks[stack_id].stack_name, logical, 255)
        return self._set(stack_id, logical, name, GroupName=name)

    def _launch_template(self, stack_id: str, logical: str, props: dict[str, Any]) -> str:
        data = dict(props["LaunchTemplateData"])
        user_data = self.resolve(stack_id, data.pop("UserData")["Fn::Base64"])
        resolved = self.resolve(stack_id, data)
        ec2 = self.client("ec2")
        # moto's Amazon-owned Deep Learning AMI (by name: all 1,300 of moto's images cost seconds to list and parse).
        dlami = [{"Name": "name", "Values": ["Deep Learning AMI Amazon Linux*"]}]
        image = ec2.describe_images(Owners=["amazon"], Filters=dlami)["Images"][0]["ImageId"]
        # moto refuses /aws/service SSM parameters and has no placement groups.
        emulated = {k: v for k, v in resolved.items() if k != "Placement"}
        emulated["ImageId"] = image
        emulated["UserData"] = base64.b64encode(user_data.encode()).decode()
        name = _physical(self.stacks[stack_id].stack_name, logical, 128)
        template = ec2.create_launch_template(LaunchTemplateName=name, LaunchTemplateData=emulated)["LaunchTemplate"]
        template_id = template["LaunchTemplateId"]
        profile = resolved["IamInstanceProfile"]["Arn"].rsplit("/", 1)[-1]
        (role,) = self.client("iam").get_instance_profile(InstanceProfileName=profile)["InstanceProfile"]["Roles"]
        self.launch_templates[template_id] = {
            "arn": f"arn:aws:ec2:{self.region}:{ACCOUNT}:launch-template/{template_id}",
            "data": resolved,
            "image_id": image,
            "image_owner": "amazon",
            "instance_role_arn": role["Arn"],
            "user_data": user_data,
        }
        return self._set(stack_id, logical, template_id, LatestVersionNumber="1", DefaultVersionNumber="1")

    def _parameter(self, stack_id: str, logical: str, props: dict[str, Any]) -> str:
        name = self.resolve(stack_id, props["Name"])
        value = self.resolve(stack_id, props["Value"])
        self.client("ssm").put_parameter(Name=name, Value=value, Type=props.get("Type", "String"))
        return self._set(stack_id, logical, name)

    def _model(self, stack_id: str, logical: str, props: dict[str, Any]) -> str:
        name = _physical(self.stacks[stack_id].stack_name, logical, 63)
        resolved = self.resolve(stack_id, props)
        options = {k: resolved[k] for k in ("VpcConfig", "EnableNetworkIsolation") if k in resolved}
        arn = self.client("sagemaker").create_model(
            ModelName=name,
            ExecutionRoleArn=resolved["ExecutionRoleArn"],
            PrimaryContainer=resolved["PrimaryContainer"],
            **options,
        )["ModelArn"]
        self._set(stack_id, logical, _sagemaker_arn(arn), ModelName=name)
        return name

    def _endpoint_config(self, stack_id: str, logical: str, props: dict[str, Any]) -> str:
        name = _physical(self.stacks[stack_id].stack_name, logical, 63)
        resolved = self.resolve(stack_id, props)
        options = {k: resolved[k] for k in ("KmsKeyId", "DataCaptureConfig") if k in resolved}
        self.client("sagemaker").create_endpoint_config(
            EndpointConfigName=name, ProductionVariants=resolved["ProductionVariants"], **options
        )
        return self._set(stack_id, logical, name, EndpointConfigName=name)

    def _endpoint(self, stack_id: str, logical: str, props: dict[str, Any]) -> str:
        resolved = self.resolve(stack_id, props)
        name = resolved["EndpointName"]
        arn = self.client("sagemaker").create_endpoint(
            EndpointName=name, EndpointConfigName=resolved["EndpointConfigName"]
        )["EndpointArn"]
        arn = _sagemaker_arn(arn)
        self._set(stack_id, logical, arn, EndpointName=name, EndpointArn=arn)
        return str(name)

    def _scalable_target(self, stack_id: str, logical: str, props: dict[str, Any]) -> str:
        resolved = self.resolve(stack_id, props)
        keys = ("ServiceNamespace", "ResourceId", "ScalableDimension", "MinCapacity", "MaxCapacity")
        self.client("application-autoscaling").register_scalable_target(**{k: resolved[k] for k in keys})
        ref = f"{resolved['ResourceId']}|{resolved['ScalableDimension']}|{resolved['ServiceNamespace']}"
        return self._set(stack_id, logical, ref)

    def _scaling_policy(self, stack_id: str, logical: str, props: dict[str, Any]) -> str:
        resolved = self.resolve(stack_id, props)
        resource_id, dimension, namespace = resolved.pop("ScalingTargetId").split("|")
        arn = self.client("application-autoscaling").put_scaling_policy(
            ServiceNamespace=namespace, ResourceId=resource_id, ScalableDimension=dimension, **resolved
        )["PolicyARN"]
        return self._set(stack_id, logical, arn)

    # --- policies -----------------------------------------------------------------------------------------------------

    def role_policies(self, role_name: str) -> list[dict[str, Any]]:
        """Every identity policy of a role, from every deployed stack (a stack may attach policies to another's)."""
        policies = []
        for stack_id, deployed in self.deployed.items():
            for logical, resource in deployed.stack.template["Resources"].items():
                props = resource.get("Properties", {})
                if resource["Type"] == "AWS::IAM::Role" and deployed.refs.get(logical) == role_name:
                    policies += [self.resolve(stack_id, p["PolicyDocument"]) for p in props.get("Policies", [])]
                    if props.get("ManagedPolicyArns"):
                        raise StepFailed(f"role {logical} has managed policies attached by ARN: not modelled")
                attached = resource["Type"] in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy")
                if attached and role_name in self.resolve(stack_id, props.get("Roles", [])):
                    policies.append(self.resolve(stack_id, props["PolicyDocument"]))
        return policies

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
