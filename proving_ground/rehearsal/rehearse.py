"""`make rehearse`: the README's journey, in order, against one moto server, every AWS call checked.

    python -m proving_ground.rehearsal.rehearse                    # synthesize dev (model key set), rehearse it
    python -m proving_ground.rehearsal.rehearse --assembly cdk.out --env staging

Steps, as the README ("First deploy"), docs/training.md, docs/multi-model.md and docs/operations.md tell them:

 1. synth             the environment's cloud assembly: the one given, or dev synthesized with
                      ``graviton_endpoint.model_data_key`` set (the README's step 3, so its endpoint can deploy);
 2. preflight         ``pytorch-platform preflight -c env=<env>``: no blocker (quotas answer 1000, see below);
 3. deploy            Foundation, Training and MultiModelEndpoint: each template's resources created in moto from its
                      resolved properties (``cdk deploy``'s part), code assets published from the assembly;
 4. EC2 training run  the Training stack's run command (a stack output) as the training launcher; every instance runs
                      the launch template's user data for real with bash (so ec2_run.sh), as the instance role, with
                      the host shims of proving_ground/rehearsal/ec2_host.py; the instances power off;
 5. package, upload   the operator fetches the run's model.tar.gz, checks that ``pytorch-platform package`` builds the
                      same bytes from the trained model, and uploads it to the endpoint's model key;
 6. check-model       ``pytorch-platform check-model --env <env>`` (bucket from the Foundation stack's outputs);
 7. publish (MME)     ``pytorch-platform publish package`` + ``publish publish`` under the endpoint's models prefix,
                      then a client holding the stack's InvokePolicy invokes the model by name (the AWS CLI);
 8. serve locally     the archive on Ray Serve, as the endpoint serves it, one prediction;
 9. smoke test        the operator writes the serving image's digest parameter, GravitonEndpoint deployed (its
                      model archive check run as the check's role);
                      ``pytorch-platform smoke-test`` against it;
10. @remote           ``python -m training_assets.remote_train ... train`` with the config the stack writes to SSM;
11. destroy, cleanup  the stacks' resources deleted, then ``pytorch-platform cleanup --env <env>``.

Principals: each acts with its own access key, and proving_ground/rehearsal/aws_calls.py checks every call against the
synthesized
policies of the key's principal (the training launcher, the training instance role, the endpoint execution role, the
multi-model endpoint's client, the @remote launcher and job role). Recorded but not checked: CloudFormation creating
the stacks' resources, the operator (an administrator: the templates give people no policy for uploading models or
running the cleanup), and AWS services acting on their own (EC2 terminating an instance that powered off).

What moto or this machine lacks, the rehearsal plays, and says so here (none of it changes product code):
- CloudFormation: moto's needs every moto extra; the rehearsal creates the templates' resources itself and answers
  DescribeStacks / ListStacks / ListStackResources from what it deployed (calls still checked). Service Quotas:
  moto knows only the vpc service's; the rehearsal's account has every quota the templates use raised to 1000.
- moto has no placement groups (the launch template is created without one; RunInstances is still checked against
  it), and refuses ``/aws/service/...`` SSM parameters (the image is moto's Amazon-owned Deep Learning AMI) and
  ``ml.c7g`` types.
- SageMaker runs nothing in moto: when an endpoint starts, the rehearsal loads its model as the endpoint's execution
  role, and InvokeEndpoint answers through the local Ray Serve server over the same archive (DJL Serving, the
  multi-model endpoint's server, cannot run here: the played multi-model endpoint reads the archive as the role
  would, checks its layout and answers through the same local server). A training job is played as in
  tests/training/test_remote_sdk_moto.py (the SDK's own invoke_function as the job role, train() stubbed).
- The training container plays torchrun's rank 0 (tests/training/test_container.py trains for real); the model it
  "trains" is the tiny offline RoBERTa.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ops_review.review import StackTemplate, load_assembly
from proving_ground.iam_policy import resolve
from proving_ground.rehearsal.aws_calls import (
    GATE_ENV,
    STEP_ENV,
    Gate,
    Principal,
    Record,
    install,
    parse_json_data_once,
    refusals,
    start_server,
)
from proving_ground.rehearsal.ec2_host import install_host_tools, patch_moto_reservation_filter, shared_aws_cli
from stacks.image_names import image_parameter_name
from stacks.settings import EnvironmentSettings, TrainingSettings, parse_environment

ROOT = Path(__file__).resolve().parents[2]
ACCOUNT = "123456789012"  # moto's default account
MODEL_KEY = "endpoints/sentiment/rehearsal.tar.gz"
TEXT = "Covid cases are increasing fast!"
MME_MODEL = "sentiment-rehearsal.tar.gz"
# The @remote job runs this machine's Python here while the default job image (the image table's entry for
# training.remote_image_tag) runs its own, and remote_train refuses a mismatch, as it must: the rehearsal names a
# stand-in tag of the same repository (so the job role's pull grant is the real one) that spells this Python.
REMOTE_IMAGE = "763104351884.dkr.ecr.{region}.amazonaws.com/" + (
    f"{TrainingSettings().remote_image.image}-py{sys.version_info.major}{sys.version_info.minor}"
)

# The one refusal a tool is built to meet: boto3's Bucket.creation_date lists all buckets and treats AccessDenied as
# "unknown" (boto3/s3/inject.py bucket_load); sagemaker-core then checks its bucket with ListObjectsV2. Any other
# refusal fails its step, even when the tool that met it carried on.
TOLERATED_REFUSALS = {("s3", "ListBuckets")}

DEPLOYER, OPERATOR, AWS_SERVICE = "cloudformation (deploy)", "operator (administrator)", "aws service"
# The Graviton serving image the operator publishes before deploying the endpoint (a digest from the tooling account).
SERVING_IMAGE = "graviton-serving"
SERVING_DIGEST = f"999999999999.dkr.ecr.us-west-2.amazonaws.com/pytorch-platform/{SERVING_IMAGE}@sha256:{'ab' * 32}"
LAUNCHER, INSTANCE, ENDPOINT_ROLE = "training launcher", "training instance role", "endpoint execution role"
MME_CLIENT, REMOTE_LAUNCHER, REMOTE_JOB = "multi-model client", "@remote launcher", "@remote job role"
MODEL_CHECK = "model archive check"
# Each principal's access key (AKIA + this): the gate knows a principal by its key.
KEYS = {DEPLOYER: "deployer0000", OPERATOR: "operator0000", AWS_SERVICE: "awsservice00", LAUNCHER: "launcher0000",
        INSTANCE: "instance0000", ENDPOINT_ROLE: "endpointrole", MME_CLIENT: "mmeclient000",
        REMOTE_LAUNCHER: "remotelaunch", REMOTE_JOB: "remotejob000", MODEL_CHECK: "modelcheck00"}  # fmt: skip

# The services the hosts' and the operator's AWS CLI calls reach (the call server loads their models ahead).
HOST_CLI_SERVICES = ("s3", "ec2", "logs", "ecr", "ssm", "sts", "sagemaker-runtime")

STEPS = (
    "synth",
    "preflight",
    "deploy",
    "EC2 training run",
    "package and upload",
    "check-model",
    "publish to the multi-model endpoint",
    "serve and invoke locally",
    "deploy the endpoint and smoke-test it",
    "@remote",
    "destroy and clean up",
)


class StepFailed(Exception):
    """A step of the journey did not do what the docs say; the message says what was seen."""


@dataclass
class StepResult:
    step: str
    seconds: float
    ok: bool
    detail: str


@dataclass
class Report:
    environment: str
    results: list[StepResult]
    records: list[Record]

    @property
    def ok(self) -> bool:
        return len(self.results) == len(STEPS) and all(r.ok for r in self.results)

    @property
    def failed_step(self) -> str | None:
        return next((r.step for r in self.results if not r.ok), None)

    def lines(self) -> list[str]:
        lines = [f"rehearsal of {self.environment}:"]
        for number, result in enumerate(self.results, start=1):
            mark = "ok  " if result.ok else "FAIL"
            lines.append(f"  {mark} {number:2}. {result.step} ({result.seconds:.1f} s): {result.detail}")
        by_principal: dict[str, list[Record]] = {}
        for record in self.records:
            by_principal.setdefault(record.principal, []).append(record)
        lines.append("AWS calls (checked against the principal's synthesized policies, or recorded only):")
        for principal, records in sorted(by_principal.items()):
            checked = [r for r in records if r.allowed is not None]
            refused = [r for r in checked if r.allowed is False]
            tolerated = [r for r in refused if (r.service, r.operation) in TOLERATED_REFUSALS]
            verdict = f"{len(checked)} checked, {len(refused)} refused" if checked else "recorded, not checked"
            if tolerated:
                verdict += f" ({len(tolerated)} tolerated: {', '.join(sorted({r.operation for r in tolerated}))})"
            lines.append(f"  {principal}: {len(records)} calls ({verdict})")
        return lines


# ------------------------------------------------------------------------------------------------- deployment


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


# ------------------------------------------------------------------------------------------------ the rehearsal

_sessions: dict[str, Any] = {}  # region -> this process's boto3 session for the rehearsal's own clients
_sessions_lock = threading.Lock()


def _session(region: str) -> Any:
    """One boto3 session per region and process: a session keeps the service models and endpoint rules its clients
    loaded, so a new session per client loaded them again (50 times in a rehearsal), and a new one per rehearsal
    once more in each rehearsal of a process. Its clients bring their own endpoint and keys."""
    import boto3

    with _sessions_lock:
        if region not in _sessions:
            _sessions[region] = boto3.session.Session(region_name=region)
        return _sessions[region]


def _principal(name: str, key: str, policies: list[dict[str, Any]] | None, arn: str, session: str) -> Principal:
    identity = {"aws:PrincipalArn": arn, "aws:userid": f"AROA{key[-12:].upper()}:{session}"}
    return Principal(name=name, access_key=f"AKIA{key.upper()}", policies=policies, identity=identity)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Rehearsal:
    def __init__(self, assembly: Path, environment: str, work: Path, trained_model: Path) -> None:
        self.assembly = Path(assembly)
        self.environment = environment
        self.work = Path(work)
        self.trained_model = Path(trained_model)
        self.results: list[StepResult] = []
        self.endpoint_url = ""
        self.gate: Gate | None = None
        self.deployment: Deployment | None = None
        self.local_server: Any = None
        self._stopping: list[threading.Thread] = []
        self.facts: dict[str, Any] = {}
        self.stacks: dict[str, StackTemplate] = {}
        self.bin_dir = self.work / "bin"
        self.gate_file = self.work / "gate.json"
        self.uninstall: Callable[[], None] = lambda: None
        self._clients: dict[tuple[str, str], Any] = {}
        self._clients_lock = threading.Lock()

    # --- plumbing -----------------------------------------------------------------------------------------------------

    def client(self, service: str, principal: str = DEPLOYER) -> Any:
        """A client of the moto server acting as ``principal`` (its keys; the gate knows it by them). One per service
        and principal, all from the process's session of the region (``_session``). The gate asks for clients from
        the SDK's threads too: the lock."""
        assert self.gate is not None
        with self._clients_lock:
            key = (service, principal)
            if key not in self._clients:
                credentials = self.gate.principal(principal)
                self._clients[key] = _session(self.region).client(
                    service,
                    endpoint_url=self.endpoint_url,
                    aws_access_key_id=credentials.access_key,
                    aws_secret_access_key=credentials.secret_key,
                )
            return self._clients[key]

    @contextlib.contextmanager
    def acting_as(self, principal: str) -> Iterator[None]:
        """This process's default credentials (boto3 sessions created now) are the principal's."""
        assert self.gate is not None
        saved = {name: os.environ.get(name) for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
        os.environ.update(self.gate.principal(principal).environment())
        try:
            yield
        finally:
            for name, value in saved.items():
                os.environ.pop(name, None) if value is None else os.environ.__setitem__(name, value)

    def shell(self, principal: str, command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """A command on the operator's (or a launcher's) machine: the gated AWS CLI first on PATH."""
        assert self.gate is not None
        env = {**self._base_environment(), **self.gate.principal(principal).environment(), **kwargs.pop("env", {})}
        return subprocess.run(command, env=env, capture_output=True, text=True, check=False, **kwargs)

    def _base_environment(self) -> dict[str, str]:
        return {
            "PATH": f"{self.bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin",
            "HOME": str(self.work),
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_CONFIG_FILE": "/nonexistent",
            "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
            "AWS_EC2_METADATA_DISABLED": "true",
            GATE_ENV: str(self.gate_file),
            STEP_ENV: os.environ.get(STEP_ENV, ""),
            "PYTHONPATH": str(ROOT),
        }

    @property
    def region(self) -> str:
        return self.stacks["Foundation"].region or "us-west-2"

    def stack_output(self, stack_id: str, name: str) -> str:
        assert self.deployment is not None
        return self.deployment.deployed[stack_id].outputs[name]

    # --- the run ------------------------------------------------------------------------------------------------------

    def run(self) -> Report:
        self.work.mkdir(parents=True, exist_ok=True)
        # The @remote step's imports (the SDK, torch and transformers through the training code) take half a minute:
        # made while the first steps wait on moto and on the nodes' shell scripts.
        threading.Thread(target=_import_late_steps, daemon=True).start()
        _quiet()
        undo_parsing = parse_json_data_once()
        undo = _patch_moto()
        server = _moto_server()
        server.start()
        host, port = server.get_host_and_port()
        self.endpoint_url = f"http://{host}:{port}"
        _reset_moto(self.endpoint_url)  # the server shares moto's in-process state: an earlier rehearsal's is gone
        # This process's own tools (check-model, publish, smoke-test, @remote, cleanup) reach moto as a real
        # account would be reached: the endpoint, no profile files, no instance metadata.
        environment = {"AWS_ENDPOINT_URL": self.endpoint_url, "AWS_CONFIG_FILE": "/nonexistent",
                       "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_EC2_METADATA_DISABLED": "true"}  # fmt: skip
        cleared = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                   "SAGEMAKER_USER_CONFIG_OVERRIDE", "SAGEMAKER_ADMIN_CONFIG_OVERRIDE")  # fmt: skip
        saved_env = {name: os.environ.get(name) for name in (STEP_ENV, "AWS_DEFAULT_REGION", *environment, *cleared)}
        for name in cleared:
            os.environ.pop(name, None)
        os.environ.update(environment)
        try:
            steps: list[Callable[[], str]] = [
                self.synth,
                self.preflight,
                self.deploy,
                self.ec2_run,
                self.package_and_upload,
                self.check_model,
                self.publish_multi_model,
                self.serve_locally,
                self.deploy_endpoint_and_smoke_test,
                self.remote,
                self.destroy_and_clean_up,
            ]
            for name, step in zip(STEPS, steps, strict=True):
                os.environ[STEP_ENV] = name
                started = time.monotonic()
                try:
                    detail = step()
                    ok = True
                    if self._refused(name):
                        raise StepFailed("a call was refused, and the step carried on without it")
                except Exception as error:  # the report names the step and what went wrong
                    if os.environ.get("REHEARSAL_TRACEBACK"):
                        import traceback

                        traceback.print_exc()
                    ok, detail = False, self._failure(name, error)
                self.results.append(StepResult(name, time.monotonic() - started, ok, detail))
                if not ok:
                    break
        finally:
            self.uninstall()
            self._stop_local_server(wait=True)
            _reset_moto(self.endpoint_url)
            server.stop()
            undo()
            undo_parsing()
            for name, value in saved_env.items():
                os.environ.pop(name, None) if value is None else os.environ.__setitem__(name, value)
        return Report(self.environment, self.results, self.gate.records() if self.gate else [])

    def _refused(self, step: str) -> list[Record]:
        if self.gate is None:
            return []
        return [r for r in refusals(self.gate.records(), step) if (r.service, r.operation) not in TOLERATED_REFUSALS]

    def gate_or_fail(self) -> Gate:
        assert self.gate is not None
        return self.gate

    def _failure(self, step: str, error: BaseException) -> str:
        reason = str(error).strip().splitlines()
        text = f"{type(error).__name__}: {reason[0] if reason else ''}"
        if isinstance(error, StepFailed):
            text = "\n".join(reason)
        if self.gate is not None:
            refused = self._refused(step)
            if refused:
                first = refused[0]
                what = first.error if first.error and first.error.startswith("unmapped") else "refused"
                actions = ", ".join(f"{a} on {r}" for a, r in first.requests[:3])
                call = f"{first.service}:{first.operation} {first.target}"
                text += f"\n      {what}: {first.principal} {call} [{actions}]"
        return text

    # --- 1. synth -----------------------------------------------------------------------------------------------------

    def synth(self) -> str:
        stacks = [s for s in load_assembly(self.assembly) if s.environment == self.environment]
        if not stacks:
            raise StepFailed(f"{self.assembly} has no stacks of environment {self.environment!r}")
        self.stacks = {s.stack: s for s in stacks}
        missing = {"Foundation", "Training"} - set(self.stacks)
        if missing:
            raise StepFailed(f"{self.environment} has no {', '.join(sorted(missing))} stack in {self.assembly}")
        return f"{len(stacks)} stacks: {', '.join(sorted(self.stacks))}"

    # --- the call gate ------------------------------------------------------------------------------------------------

    def _open_gate(self) -> None:
        """The call gate, with the principals that have no synthesized policy; deploy adds the others."""
        aws_cli = shared_aws_cli()
        # The nodes' and the operator's `aws` calls, forked from one server that imported the CLI once.
        server = _call_server(aws_cli, self._base_environment())
        self.bin_dir = install_host_tools(self.work / "bin", aws_cli, gated=True, aws_server=server)
        unchecked = [_principal(name, KEYS[name], None, f"arn:aws:iam::{ACCOUNT}:role/{name.split()[0]}", "rehearsal")
                     for name in (DEPLOYER, OPERATOR, AWS_SERVICE)]  # fmt: skip
        self.gate = Gate(ACCOUNT, self.region, self.work / "calls.jsonl", unchecked)
        self.gate.save(self.gate_file)
        os.environ["AWS_DEFAULT_REGION"] = self.region
        stand_ins = {**self._cloudformation_stand_ins(), **self._quota_stand_ins()}
        self.uninstall = install(self.gate, stand_ins=stand_ins, resource_tags=self._tags)

    # --- 2. preflight -------------------------------------------------------------------------------------------------

    def preflight(self) -> str:
        from ops_review import preflight

        self._open_gate()
        out, err = io.StringIO(), io.StringIO()
        with self.acting_as(OPERATOR), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = preflight.main(["-c", f"env={self.environment}", "--cdk-out", str(self.assembly)])
        lines = out.getvalue().strip().splitlines()
        if code != 0:
            blockers = [line for line in lines if line.startswith("BLOCKER")]
            raise StepFailed("; ".join(blockers) or err.getvalue().strip())
        warnings = [line.split(":", 1)[0].removeprefix("WARNING").strip() for line in lines if line.startswith("WARN")]
        return f"{lines[-1]}" + (f" ({'; '.join(warnings)})" if warnings else "")

    def _quota_stand_ins(self) -> dict[tuple[str, str], Callable[[dict[str, Any]], dict[str, Any]]]:
        """Service Quotas (moto knows only the vpc service's): the rehearsal's account has raised every quota the
        templates use to 1000 (SageMaker quotas by name, the EC2 vCPU quotas by code)."""
        names = set()
        for stack in self.stacks.values():
            for resource in stack.template["Resources"].values():
                props = resource.get("Properties", {})
                if resource["Type"] == "AWS::SageMaker::EndpointConfig":
                    names |= {f"{v['InstanceType']} for endpoint usage" for v in props["ProductionVariants"]}
                if resource["Type"] == "AWS::SSM::Parameter":
                    found = re.findall(r"InstanceType: (ml\.[\w.]+)", json.dumps(props))
                    names |= {f"{t} for training job usage" for t in found}

        def quota(service: str, code: str, name: str) -> dict[str, Any]:
            return {"ServiceCode": service, "QuotaCode": code, "QuotaName": name, "Value": 1000.0}

        def one(params: dict[str, Any]) -> dict[str, Any]:
            return {"Quota": quota(params["ServiceCode"], params["QuotaCode"], params["QuotaCode"])}

        def listed(params: dict[str, Any]) -> dict[str, Any]:
            ordered = sorted(names) if params["ServiceCode"] == "sagemaker" else []
            return {"Quotas": [quota("sagemaker", f"L-{i:08X}", name) for i, name in enumerate(ordered)]}

        return {("service-quotas", "GetServiceQuota"): one, ("service-quotas", "ListServiceQuotas"): listed}

    # --- 3. deploy ----------------------------------------------------------------------------------------------------

    def deploy(self) -> str:
        assert self.gate is not None
        region = self.region
        self.deployment = deployment = Deployment(self.stacks, self.client, region)
        for stack_id in ("Foundation", "Training", "MultiModelEndpoint"):
            if stack_id in self.stacks:
                deployment.deploy(stack_id)
        self._publish_assets()

        keys = KEYS

        def role(stack_id: str, prefix: str, name: str, session: str) -> Principal:
            role_name = deployment.role_name(stack_id, prefix)
            arn = f"arn:aws:iam::{ACCOUNT}:role/{role_name}"
            return _principal(name, keys[name], deployment.role_policies(role_name), arn, session)

        def person(stack_id: str, prefix: str, name: str, session: str) -> Principal:
            arn = f"arn:aws:iam::{ACCOUNT}:role/{name.replace(' ', '-').replace('@', '')}"
            return _principal(name, keys[name], [deployment.managed_policy(stack_id, prefix)], arn, session)

        checked = [
            person("Training", "TrainingLauncherPolicy", LAUNCHER, "alice@example.com"),
            role("Foundation", "TrainingInstanceRole", INSTANCE, "i-instance"),
            role("Foundation", "EndpointExecutionRole", ENDPOINT_ROLE, "SageMaker"),
            # The environment's first @remote caller (training.remote_callers): its launcher policy and job role.
            person(
                "Foundation",
                f"RemoteJobLauncherPolicy{self.remote_caller_suffix()}",
                REMOTE_LAUNCHER,
                "alice@example.com",
            ),
            role("Foundation", f"RemoteJobRole{self.remote_caller_suffix()}", REMOTE_JOB, "SageMaker"),
        ]
        if "MultiModelEndpoint" in self.stacks:
            checked.append(person("MultiModelEndpoint", "InvokePolicy", MME_CLIENT, "app"))
        self.gate.principals += checked
        self.gate.kms_encrypted_buckets = dict(deployment.encrypted_buckets)
        self.gate.bucket_policies, self.gate.key_policies = deployment.resource_policies()
        self.gate.launch_templates = {k: {n: v for n, v in t.items() if n != "user_data"}
                                      for k, t in deployment.launch_templates.items()}  # fmt: skip
        self.gate.save(self.gate_file)
        stacks = ", ".join(d.stack.stack_name for d in deployment.deployed.values())
        return f"{stacks}; code assets published; {len(checked)} principals with synthesized policies"

    def _tags(self, arn: str) -> dict[str, str]:
        """A resource's tags as the service holds them (IAM's own lookup for aws:ResourceTag; not checked)."""
        from botocore.exceptions import ClientError

        try:
            tags = self.client("sagemaker", AWS_SERVICE).list_tags(ResourceArn=arn)["Tags"]
        except ClientError:
            return {}
        return {t["Key"]: t["Value"] for t in tags}

    def refresh_role_policies(self) -> None:
        """A stack deployed later may attach policies to a role (the endpoint stacks' image pull policies)."""
        assert self.gate is not None and self.deployment is not None
        for principal in self.gate.principals:
            arn = principal.identity["aws:PrincipalArn"]
            if principal.policies is not None and principal.name in (INSTANCE, ENDPOINT_ROLE, REMOTE_JOB):
                principal.policies = self.deployment.role_policies(arn.rsplit("/", 1)[-1])
        self.gate.save(self.gate_file)

    def _publish_assets(self) -> None:
        """Zip the assembly's file assets into the bootstrap bucket, as `cdk deploy` publishes them."""
        s3 = self.client("s3")
        bucket = f"cdk-hnb659fds-assets-{ACCOUNT}-{self.region}"
        s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": self.region})
        for manifest in (self.assembly / f"assembly-{self.environment}").glob("*.assets.json"):
            for asset_hash, asset in json.loads(manifest.read_text())["files"].items():
                if asset["source"].get("packaging") != "zip":
                    continue
                source = (manifest.parent / asset["source"]["path"]).resolve()
                buffer = io.BytesIO()
                with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
                    for path in sorted(source.rglob("*")):
                        if path.is_file():
                            archive.write(path, path.relative_to(source).as_posix())
                s3.put_object(Bucket=bucket, Key=f"{asset_hash}.zip", Body=buffer.getvalue())

    def _cloudformation_stand_ins(self) -> dict[tuple[str, str], Callable[[dict[str, Any]], dict[str, Any]]]:
        """DescribeStacks, ListStacks and ListStackResources from what the rehearsal deployed."""

        def deployed() -> dict[str, DeployedStack]:
            return self.deployment.deployed if self.deployment is not None else {}

        def stack_id(name: str) -> str:
            return f"arn:aws:cloudformation:{self.region}:{ACCOUNT}:stack/{name}/rehearsal"

        def by_name(name: str) -> DeployedStack:
            for stack in deployed().values():
                if name in (stack.stack.stack_name, stack_id(stack.stack.stack_name)):
                    if stack.status == "DELETE_COMPLETE" and not name.startswith("arn:"):
                        break
                    return stack
            from botocore.exceptions import ClientError

            error = {"Error": {"Code": "ValidationError", "Message": f"Stack with id {name} does not exist"}}
            raise ClientError(error, "DescribeStacks")

        def describe(params: dict[str, Any]) -> dict[str, Any]:
            stack = by_name(params["StackName"])
            outputs = [{"OutputKey": k, "OutputValue": v} for k, v in stack.outputs.items()]
            return {"Stacks": [{"StackName": stack.stack.stack_name, "StackId": stack_id(stack.stack.stack_name),
                                "CreationTime": "2026-12-01T00:00:00Z", "StackStatus": stack.status,
                                "Outputs": outputs}]}  # fmt: skip

        def list_stacks(params: dict[str, Any]) -> dict[str, Any]:
            return {"StackSummaries": [{"StackName": s.stack.stack_name, "StackId": stack_id(s.stack.stack_name),
                                        "CreationTime": "2026-12-01T00:00:00Z", "StackStatus": s.status}
                                       for s in deployed().values()]}  # fmt: skip

        def list_resources(params: dict[str, Any]) -> dict[str, Any]:
            stack = by_name(params["StackName"])
            return {"StackResourceSummaries": [
                {"LogicalResourceId": logical, "PhysicalResourceId": physical, "ResourceType": kind,
                 "LastUpdatedTimestamp": "2026-12-01T00:00:00Z",
                 "ResourceStatus": "DELETE_COMPLETE" if stack.status == "DELETE_COMPLETE" else "CREATE_COMPLETE"}
                for logical, kind, physical in stack.resources]}  # fmt: skip

        return {
            ("cloudformation", "DescribeStacks"): describe,
            ("cloudformation", "ListStacks"): list_stacks,
            ("cloudformation", "ListStackResources"): list_resources,
        }

    # --- 4. EC2 training run ------------------------------------------------------------------------------------------

    def ec2_run(self) -> str:
        assert self.deployment is not None
        outputs = self.deployment.deployed["Training"].outputs
        command = outputs.get("RunMultiNodeTrainingCommand") or outputs["RunSingleNodeTrainingCommand"]
        launched = self.shell(LAUNCHER, ["bash", "-c", f"{command} --output json"])
        if launched.returncode != 0:
            raise StepFailed(f"`{command}` failed: {launched.stderr.strip()}")
        reservation = json.loads(launched.stdout)
        instances = reservation["Instances"]
        template_id = instances[0].get("Tags") and next(
            (t["Value"] for t in instances[0]["Tags"] if t["Key"] == "aws:ec2launchtemplate:id"), None
        )
        template = self.deployment.launch_templates[template_id or next(iter(self.deployment.launch_templates))]
        # The nodes boot together: each finds the others through the reservation while they run.
        nodes = [self._start_user_data(template["user_data"], reservation["ReservationId"], instance)
                 for instance in instances]  # fmt: skip
        failed = []
        for node, (instance, process) in enumerate(zip(instances, nodes, strict=True)):
            if process.wait(timeout=600) != 0:
                output = (self.work / "instances" / instance["InstanceId"] / "user-data.out").read_text()
                tail = "\n".join(output.strip().splitlines()[-6:])
                failed.append(f"node {node} ({instance['InstanceId']}): user data exited {process.returncode}:\n{tail}")
        if failed:
            raise StepFailed("\n".join(failed))
        artifacts = self.stack_output("Foundation", "ArtifactsBucketName")
        prefix = f"training-output/{reservation['ReservationId']}/"
        s3 = self.client("s3", OPERATOR)
        listed = {o["Key"] for o in s3.list_objects_v2(Bucket=artifacts, Prefix=prefix).get("Contents", [])}
        if {prefix + "model.tar.gz", prefix + "metrics.json"} - listed:
            raise StepFailed(f"the run left {sorted(listed) or 'nothing'} under s3://{artifacts}/{prefix}")
        states = {
            i["InstanceId"]: i["State"]["Name"]
            for r in self.client("ec2", OPERATOR).describe_instances(InstanceIds=[i["InstanceId"] for i in instances])[
                "Reservations"
            ]
            for i in r["Instances"]
        }
        if set(states.values()) != {"terminated"}:
            raise StepFailed(f"instances still alive after the run: {states}")
        self.facts["run_model"] = f"s3://{artifacts}/{prefix}model.tar.gz"
        return f"{len(instances)} node(s); {self.facts['run_model']}; instances terminated"

    def _start_user_data(self, user_data: str, reservation: str, instance: dict[str, Any]) -> subprocess.Popen[bytes]:
        """The instance boots: its user data runs with bash, as its role, in a folder of its own."""
        assert self.gate is not None
        host = self.work / "instances" / instance["InstanceId"]
        host.mkdir(parents=True)
        # The instance's fixed paths, moved under this node's folder.
        script = user_data.replace("/opt/sentiment-training", str(host / "opt" / "sentiment-training")).replace(
            "/var/log/", f"{host}/var-log-"
        )
        (host / "user-data.sh").write_text(script)
        service = self.gate.principal(AWS_SERVICE)
        env = {
            **self._base_environment(),
            **self.gate.principal(INSTANCE).environment(),
            "IMDS_instance_id": instance["InstanceId"],
            "IMDS_reservation_id": reservation,
            "IMDS_local_ipv4": instance["PrivateIpAddress"],
            "EC2_SERVICE_ACCESS_KEY_ID": service.access_key,
            "EC2_SERVICE_SECRET_ACCESS_KEY": service.secret_key,
            "REHEARSAL_TRAINED_MODEL": str(self.trained_model),
        }
        env.pop("PYTHONPATH")  # the host's python3 knows only what the user data unpacked
        with (host / "user-data.out").open("wb") as output:
            return subprocess.Popen(["bash", str(host / "user-data.sh")], cwd=host, env=env, stdout=output,
                                    stderr=subprocess.STDOUT)  # fmt: skip

    # --- 5. package and upload ----------------------------------------------------------------------------------------

    def package_and_upload(self) -> str:
        from inference_assets.tools import package_model

        downloaded = self.work / "operator" / "run-model.tar.gz"
        downloaded.parent.mkdir(parents=True, exist_ok=True)
        fetched = self.shell(OPERATOR, ["aws", "s3", "cp", "--only-show-errors", self.facts["run_model"],
                                        str(downloaded)])  # fmt: skip
        if fetched.returncode != 0:
            raise StepFailed(f"aws s3 cp {self.facts['run_model']}: {fetched.stderr.strip()}")
        archive = self.work / "operator" / "model.tar.gz"
        key = self.stack_output_of_template("GravitonEndpoint", "ModelDataKey")
        artifacts = self.stack_output("Foundation", "ArtifactsBucketName")
        key_arn = self.stack_output("Foundation", "PlatformKeyArn")
        with self.acting_as(OPERATOR), contextlib.redirect_stdout(io.StringIO()):
            code = package_model.main(["--model-dir", str(self.trained_model), "--output", str(archive),
                                       "--upload", f"s3://{artifacts}/{key}", "--kms-key-id", key_arn])  # fmt: skip
        if code != 0:
            raise StepFailed(f"pytorch-platform package exited {code}")
        if _sha256(archive) != _sha256(downloaded):
            raise StepFailed("the EC2 run's model.tar.gz differs from what `pytorch-platform package` builds")
        self.facts["archive"] = archive
        return f"run archive == `pytorch-platform package` output; uploaded s3://{artifacts}/{key}"

    def stack_output_of_template(self, stack_id: str, name: str) -> str:
        """An output of a stack not deployed yet whose value is a literal (the model key)."""
        if stack_id not in self.stacks:
            raise StepFailed(
                f"{self.environment} has no {stack_id} stack in {self.assembly}: set "
                f"environments.{self.environment}.graviton_endpoint.model_data_key (README, First deploy, step 3)"
            )
        value = self.stacks[stack_id].template["Outputs"][name]["Value"]
        if not isinstance(value, str):
            raise StepFailed(f"{stack_id} output {name} is not a literal")
        return value

    # --- 6. check-model -----------------------------------------------------------------------------------------------

    def check_model(self) -> str:
        from inference_assets.tools import model_check

        cdk_json = self.work / "cdk.json"
        key = self.stack_output_of_template("GravitonEndpoint", "ModelDataKey")
        cdk_json.write_text(json.dumps({"context": {"environments": {self.environment: {
            "region": self.region, "graviton_endpoint": {"model_data_key": key}}}}}))  # fmt: skip
        out, err = io.StringIO(), io.StringIO()
        with self.acting_as(OPERATOR), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = model_check.main(["--env", self.environment, "--cdk-json", str(cdk_json)])
        if code != 0:
            raise StepFailed(f"check-model exited {code}: {err.getvalue().strip()}")
        return out.getvalue().strip()

    # --- 7. publish to the multi-model endpoint -----------------------------------------------------------------------

    def publish_multi_model(self) -> str:
        if "MultiModelEndpoint" not in self.stacks:
            return "skipped: the environment has no multi-model endpoint"
        from inference_assets.tools import publish_models

        archive = self.work / "operator" / "mme.tar.gz"
        artifacts = self.stack_output("Foundation", "ArtifactsBucketName")
        key_arn = self.stack_output("Foundation", "PlatformKeyArn")
        prefix = self.stack_output("MultiModelEndpoint", "ModelsPrefix")
        endpoint = self.stack_output("MultiModelEndpoint", "EndpointName")
        self.local_model_server()  # started before the first invocation reaches it (Ray Serve takes a while)
        with self.acting_as(OPERATOR), contextlib.redirect_stdout(io.StringIO()):
            publish_models.main(["package", "--model-dir", str(self.trained_model), "--output", str(archive)])
            publish_models.main(["publish", "--archive", str(archive), "--name", MME_MODEL, "--bucket", artifacts,
                                 "--prefix", prefix, "--kms-key", key_arn, "--region", self.region])  # fmt: skip
        self._serve_endpoint(endpoint, multi_model_prefix=f"s3://{artifacts}/{prefix}")
        out = self.work / "operator" / "mme-answer.json"
        # docs/multi-model.md's command, less --cli-binary-format (an AWS CLI v2 option; this CLI is v1).
        invoked = self.shell(MME_CLIENT, ["aws", "sagemaker-runtime", "invoke-endpoint", "--region", self.region,
                                          "--endpoint-name", endpoint, "--target-model", MME_MODEL,
                                          "--content-type", "application/json",
                                          "--body", json.dumps({"inputs": [TEXT]}), str(out)])  # fmt: skip
        if invoked.returncode != 0:
            raise StepFailed(f"invoke-endpoint --target-model {MME_MODEL}: {invoked.stderr.strip()}")
        answer = json.loads(out.read_text())
        return f"published {prefix}{MME_MODEL}; the client's invocation by name answered {answer[0]['label']}"

    # --- SageMaker, played --------------------------------------------------------------------------------------------

    def _serve_endpoint(self, endpoint: str, *, model_data_url: str = "", multi_model_prefix: str = "") -> None:
        """What SageMaker does for an endpoint: read the model with the execution role; answer invocations."""
        s3 = self.client("s3", ENDPOINT_ROLE)

        def load(url: str) -> bytes:
            bucket, _, key = url.removeprefix("s3://").partition("/")
            body: bytes = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
            return body

        if model_data_url:
            loaded = load(model_data_url)
            if hashlib.sha256(loaded).hexdigest() != _sha256(self.facts["archive"]):
                raise StepFailed(f"{model_data_url} is not the archive that was packaged")
        handlers = _ENDPOINT_HANDLERS

        def answer(body: str, target_model: str | None) -> tuple[str, str]:
            if multi_model_prefix:
                if not target_model:
                    raise StepFailed("a multi-model endpoint needs a TargetModel")
                with tarfile.open(fileobj=io.BytesIO(load(multi_model_prefix + target_model))) as archive:
                    names = set(archive.getnames())
                if not {"model.py", "serving.properties"} <= names and "MAR-INF/MANIFEST.json" not in names:
                    raise StepFailed(f"{target_model} is no archive for the endpoint's model server: {sorted(names)}")
            status, _, reply = self.local_model_server().invoke(body.encode())
            if status != 200:
                raise StepFailed(f"the model server answered {status}: {reply[:200]!r}")
            return reply.decode(), "application/json"

        handlers[endpoint.lower()] = answer

    def _stop_local_server(self, *, wait: bool) -> None:
        """Stop the local Ray Serve server in the background; ``wait``: and wait for every stop begun."""
        server, self.local_server = self.local_server, None
        if server is not None:
            self._stopping.append(threading.Thread(target=server.stop, name="stop local server"))
            self._stopping[-1].start()
        if wait:
            for thread in self._stopping:
                thread.join()

    def local_model_server(self) -> Any:
        if self.local_server is None:
            from inference_assets.local.local_server import LocalRayServer

            archive = self.facts.get("archive") or self.work / "operator" / "model.tar.gz"
            self.local_server = LocalRayServer(archive, workers=1).start()
        return self.local_server

    # --- 8. serve and invoke locally ----------------------------------------------------------------------------------

    def serve_locally(self) -> str:
        server = self.local_model_server()
        status, _, reply = server.invoke(json.dumps({"inputs": TEXT}).encode())
        if status != 200:
            raise StepFailed(f"the local server answered {status}: {reply[:200]!r}")
        prediction = json.loads(reply)
        prediction = prediction[0] if isinstance(prediction, list) else prediction
        return f"Ray Serve on {server.url}: {prediction['label']}"

    def remote_caller_suffix(self) -> str:
        """The construct-id suffix of the rehearsed @remote caller: the environment's first (stacks/foundation.py,
        caller_construct_suffix)."""
        return self.settings().training.remote_callers[0].capitalize()

    def settings(self) -> EnvironmentSettings:
        """The rehearsed environment's settings, as cdk.json gives them."""
        context = json.loads((ROOT / "cdk.json").read_text())["context"]
        return parse_environment(self.environment, context["environments"][self.environment])

    # --- 9. deploy the endpoint and smoke-test it ---------------------------------------------------------------------

    def deploy_endpoint_and_smoke_test(self) -> str:
        from inference_assets.tools import endpoint_client

        assert self.deployment is not None
        # The image digest, as the pipeline would publish it (docs/images.md, "Deploying by hand").
        self.client("ssm", OPERATOR).put_parameter(
            Name=image_parameter_name(self.settings().tags.project, SERVING_IMAGE),
            Type="String",
            Value=SERVING_DIGEST,
            Overwrite=True,
        )
        deployed = self.deployment.deploy("GravitonEndpoint")
        self.refresh_role_policies()
        checked = self._model_archive_check()
        endpoint = deployed.outputs["EndpointName"]
        model = self.deployment.resolve(
            "GravitonEndpoint",
            next(r for r in self.stacks["GravitonEndpoint"].template["Resources"].values()
                 if r["Type"] == "AWS::SageMaker::Model")["Properties"]["PrimaryContainer"]["ModelDataUrl"],
        )  # fmt: skip
        self._serve_endpoint(endpoint, model_data_url=model)
        out, err = io.StringIO(), io.StringIO()
        with self.acting_as(OPERATOR), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = endpoint_client.main(["smoke-test", "--endpoint-name", endpoint, "--region", self.region,
                                         "--poll", "0"])  # fmt: skip
        if code != 0:
            raise StepFailed(f"smoke test exited {code}: {err.getvalue().strip()}")
        # That was the last invocation (the later steps invoke no endpoint): Ray stops now, not idle till the end,
        # and while the next steps run (its shutdown takes seconds, mostly waiting).
        self._stop_local_server(wait=False)
        return f"{checked} {out.getvalue().strip()}"

    def _model_archive_check(self) -> str:
        """CloudFormation runs the stack's model archive check (Custom::ModelArchiveCheck) before its model: the
        handler's check runs here as the check's role, every call checked against that role's policy."""
        import boto3

        from stacks.components.model_archive_check import handler

        assert self.gate is not None and self.deployment is not None
        resources = self.stacks["GravitonEndpoint"].template["Resources"].values()
        (properties,) = [r["Properties"] for r in resources if r["Type"] == "Custom::ModelArchiveCheck"]
        check = self.deployment.resolve("GravitonEndpoint", {k: properties[k] for k in ("Bucket", "Key", "Setting")})
        role_name = self.deployment.role_name("GravitonEndpoint", "ModelArchiveCheckRole")
        self.gate.principals.append(
            _principal(
                MODEL_CHECK,
                KEYS[MODEL_CHECK],
                self.deployment.role_policies(role_name),
                f"arn:aws:iam::{ACCOUNT}:role/{role_name}",
                "model-archive-check",
            )
        )
        self.gate.save(self.gate_file)  # fmt: skip
        with self.acting_as(MODEL_CHECK):
            try:
                return handler.check_archive(
                    boto3.client("s3", region_name=self.region), check["Bucket"], check["Key"], check["Setting"]
                )
            except handler.ArchiveMissing as error:
                raise StepFailed(str(error)) from None

    # --- 10. @remote --------------------------------------------------------------------------------------------------

    def remote(self) -> str:
        from proving_ground.rehearsal.remote_job_player import played_remote_jobs

        assert self.deployment is not None
        config = self.work / "remote" / "config.yaml"
        config.parent.mkdir(parents=True, exist_ok=True)
        fetch = self.stack_output("Training", f"FetchRemoteFunctionConfigCommand{self.remote_caller_suffix()}")
        fetched = self.shell(REMOTE_LAUNCHER, ["bash", "-c", f"{fetch} > {config}"], cwd=self.work)
        if fetched.returncode != 0 or not config.read_text().strip():
            raise StepFailed(f"`{fetch}` failed: {fetched.stderr.strip()}")
        datasets = self.stack_output("Foundation", "DatasetsBucketName")
        s3 = self.client("s3", OPERATOR)
        for split in ("train", "validation"):
            s3.put_object(Bucket=datasets, Key=f"tweets/{split}.csv", Body=b"text,label\nhi,1\n")
        from training_assets import remote_train

        image = REMOTE_IMAGE.format(region=self.region)
        out, err = io.StringIO(), io.StringIO()
        with (
            played_remote_jobs(self, self.work / "remote") as jobs,
            self.acting_as(REMOTE_LAUNCHER),
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):
            code = remote_train.main(["--config", str(config), "--image-uri", image, "train", "--",
                                      "--dataset", f"s3://{datasets}/tweets/"])  # fmt: skip
        if code != 0 or jobs.exit_codes != [0]:
            raise StepFailed(f"remote_train exited {code}, job exit codes {jobs.exit_codes}: {err.getvalue()[-400:]}")
        return f"job {jobs.names[0]} ran as the job role; its log stream followed; metrics read back"

    # --- 11. destroy and clean up -------------------------------------------------------------------------------------

    def destroy_and_clean_up(self) -> str:
        from ops_review import cleanup

        assert self.deployment is not None
        for stack_id in ("GravitonEndpoint", "MultiModelEndpoint", "Training", "Foundation"):
            if stack_id in self.deployment.deployed:
                self.deployment.destroy(stack_id)
        arguments = ["--env", self.environment, "--cdk-out", str(self.assembly), "--region", self.region]
        outputs = []
        for dry_run in (["--dry-run"], []):  # docs/operations.md: list first, then delete
            out, err = io.StringIO(), io.StringIO()
            with self.acting_as(OPERATOR), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = cleanup.main([*arguments, *dry_run])
            if code != 0:
                raise StepFailed(f"cleanup {' '.join(dry_run)} exited {code}: {err.getvalue().strip()}")
            outputs.append(out.getvalue().strip().splitlines())
        listed, done = outputs
        alive = [line for line in listed if "still" in line]
        if alive:
            raise StepFailed("; ".join(alive))
        return f"listed {len(listed)}: {'; '.join(listed)}; {done[-1] if done else ''}"


# ------------------------------------------------------------------------------------------------ aws call server

_call_servers: dict[Path, Path] = {}  # unpacked AWS CLI -> the socket of this process's call server
_call_servers_lock = threading.Lock()


def _call_server(aws_cli: Path, environment: dict[str, str]) -> Path:
    """The socket of this process's aws call server (proving_ground/rehearsal/aws_calls.py ``serve``), started by the
    first rehearsal
    and stopped when the process ends (or, killed, by itself): the rehearsals of one process share it, since each
    call brings its caller's environment (gate file, step, credentials, endpoint) and working folder, and each
    rehearsal after the first saves the server's start (the CLI imported, its data parsed: ~0.9 CPU-s)."""
    import atexit

    with _call_servers_lock:
        if aws_cli not in _call_servers:
            folder = Path(tempfile.mkdtemp(prefix="rehearsal-aws-"))  # short: a socket's path has 107 bytes at most
            socket = folder / "aws.sock"
            stop = start_server(socket, aws_cli, environment, folder / "aws.log", services=HOST_CLI_SERVICES)
            atexit.register(shutil.rmtree, folder, ignore_errors=True)
            atexit.register(stop)  # atexit runs the last registered first: the server stops, then its folder goes
            _call_servers[aws_cli] = socket
        return _call_servers[aws_cli]


# --------------------------------------------------------------------------------------------------- moto patches


def _import_late_steps() -> None:
    import importlib

    for module in ("sagemaker.core.remote_function", "training_assets.remote_train", "ops_review.cleanup"):
        importlib.import_module(module)
    _quiet()


def _quiet() -> None:
    """The SDK's import turns the root logger to INFO: botocore's and the server's chatter stays out of the report."""
    import logging

    for name in ("botocore", "werkzeug", "sagemaker"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _moto_server() -> Any:
    """moto's threaded server on a free port of 127.0.0.1 that stops at once: its serve_forever looks for the
    shutdown every 50 ms, not every 0.5 s (moto's ThreadedMotoServer, otherwise as it is)."""
    from moto.moto_server.threaded_moto_server import ThreadedMotoServer
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    class Server(ThreadedMotoServer):
        def _server_entry(self) -> None:
            app = DomainDispatcherApplication(create_backend_app)
            self._server = make_server(self._ip_address, self._port, app, True, request_handler=MotoRequestHandler)
            self._server_ready_event.set()
            self._server.serve_forever(poll_interval=0.05)

    return Server(ip_address="127.0.0.1", port=0, verbose=False)


def _reset_moto(endpoint_url: str) -> None:
    """Every moto backend back to empty (moto's own reset API)."""
    import urllib.request

    urllib.request.urlopen(urllib.request.Request(f"{endpoint_url}/moto-api/reset", method="POST"), timeout=60).read()


# Endpoint name (lower case) -> the played endpoint: (request body, TargetModel) -> (answer, content type).
_ENDPOINT_HANDLERS: dict[str, Callable[[str, str | None], tuple[str, str]]] = {}


def _patch_moto() -> Callable[[], None]:
    """Workarounds in the in-process moto server (see the module docstring); returns the undo."""
    from urllib.parse import unquote

    from moto.sagemaker import models as sagemaker_models
    from moto.sagemakerruntime import responses as runtime_responses

    undo_filter = patch_moto_reservation_filter()
    validate = sagemaker_models.FakeEndpointConfig.validate_instance_type
    invoke = runtime_responses.SageMakerRuntimeResponse.invoke_endpoint

    def any_ml_type(self: Any, instance_type: str) -> None:
        if not instance_type.startswith("ml."):
            validate(self, instance_type)

    def played_invoke(self: Any) -> tuple[int, dict[str, str], str]:
        # POST /endpoints/<name>/invocations (SageMaker Runtime API reference, InvokeEndpoint).
        name = unquote(self.path.split("/")[2])
        handler = _ENDPOINT_HANDLERS.get(name.lower())
        error = {"x-amzn-errortype": "ValidationError", "Content-Type": "application/json"}
        if handler is None:
            return 400, error, json.dumps({"message": f"Endpoint {name} of account {ACCOUNT} not found."})
        headers = {k.lower(): v for k, v in self.headers.items()}
        body = self.body.decode() if isinstance(self.body, bytes) else self.body
        try:
            answer, content_type = handler(body, headers.get("x-amzn-sagemaker-target-model"))
        except StepFailed as failure:
            model_error = {**error, "x-amzn-errortype": "ModelError"}
            return 424, model_error, json.dumps({"message": str(failure), "OriginalStatusCode": 500})
        return 200, {"Content-Type": content_type, "x-Amzn-Invoked-Production-Variant": "AllTraffic"}, answer

    sagemaker_models.FakeEndpointConfig.validate_instance_type = any_ml_type  # type: ignore[method-assign]
    runtime_responses.SageMakerRuntimeResponse.invoke_endpoint = played_invoke  # type: ignore[method-assign]

    def undo() -> None:
        sagemaker_models.FakeEndpointConfig.validate_instance_type = validate  # type: ignore[method-assign]
        runtime_responses.SageMakerRuntimeResponse.invoke_endpoint = invoke  # type: ignore[method-assign]
        _ENDPOINT_HANDLERS.clear()
        undo_filter()

    return undo


# ----------------------------------------------------------------------------------------------------- entry point


def synthesize(environment: str, outdir: Path) -> Path:
    """The environment synthesized from cdk.json, with a model key set when it names none (README step 3)."""
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    from app import build_app

    context = json.loads((ROOT / "cdk.json").read_text())["context"]
    context.pop("pipeline", None)
    graviton = context["environments"][environment].setdefault("graviton_endpoint", {})
    graviton.setdefault("model_data_key", MODEL_KEY)
    build_app(context={**context, "env": environment}, outdir=str(outdir)).synth()
    return outdir


def rehearse(assembly: Path, environment: str, work: Path, trained_model: Path | None = None) -> Report:
    if trained_model is None:
        from training_assets.tiny_model import build_tiny_model

        trained_model = build_tiny_model(work / "tiny-model" / "model")
    return Rehearsal(assembly, environment, work, trained_model).run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m proving_ground.rehearsal.rehearse", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--env", default="dev", help="environment to rehearse (default: dev)")
    parser.add_argument("--assembly", type=Path, help="a synthesized cloud assembly (default: synthesize --env)")
    parser.add_argument("--work", type=Path, help="work folder (default: a temporary one, removed afterwards)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        work = args.work or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rehearsal-")))
        assembly = args.assembly
        if assembly is None:
            assembly = synthesize(args.env, work / "cdk.out")
            print(f"synthesized {args.env} into {assembly} ({time.monotonic() - started:.0f} s)")
        report = rehearse(assembly, args.env, work)
        print("\n".join(report.lines()))
    print(f"rehearsal {'passed' if report.ok else 'FAILED at ' + str(report.failed_step)} "
          f"in {time.monotonic() - started:.0f} s")  # fmt: skip
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
