"""`pytorch-platform preflight -c env=<env>`: what would stop the environment's first run, found before money is spent.

One line per finding, ``BLOCKER``, ``WARNING`` or ``OK``, each with what to do; exit status 1 when a blocker is found.

- Service quotas the settings need. New accounts start at 0 for several (Service Quotas user guide; SageMaker answers
  ResourceLimitExceeded at CreateEndpoint or CreateTrainingJob, EC2 VcpuLimitExceeded at RunInstances):
  EC2 On-Demand vCPUs of the training family (nodes x the type's vCPUs; quota codes of the EC2 user guide,
  "Amazon EC2 service quotas", https://docs.aws.amazon.com/ec2/latest/instancetypes/ec2-instance-quotas.html:
  L-417A185B "Running On-Demand P instances", L-DB2E81BA "G and VT", L-1216C47A "Standard (A, C, D, H, I, M, R, T,
  Z)", L-2C3B7624 "Trn", L-1945791B "Inf", L-6E869C2A "DL", L-74FC7D96 "F", L-7295265B "X"); SageMaker instances per
  type, found by their quota names "<type> for training job usage" and "<type> for endpoint usage" (the codes differ
  per type; https://docs.aws.amazon.com/general/latest/gr/sagemaker.html): one training job of
  ``training.remote_instance_type``, and for endpoints the sum of the autoscaling maxima of the endpoints on a type.
  Running usage is not subtracted: instances already running count against the same quotas.
- The training type's offering in the training subnet's zone (EC2 DescribeInstanceTypeOfferings): the zone of entry
  ``training.subnet_index`` of the Foundation's private subnets when it is deployed, else of the region's zones in
  alphabetical order, as ``Fn::GetAZs`` lists them (CloudFormation user guide, "Fn::GetAZs").
- The model object the Graviton endpoint names (S3 HeadObject in the artifacts bucket).
- The state of the platform key (KMS DescribeKey: Enabled) and buckets (HeadBucket) of a deployed Foundation.
- Names the synthesized templates fix (``--cdk-out``): a log group or SSM parameter of a stack not deployed yet that
  already exists makes CloudFormation's create fail ("already exists"): staging and prod keep their endpoint log
  groups when their stacks are destroyed.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# EC2 On-Demand vCPU quotas by instance family letters (see the module docstring).
EC2_VCPU_QUOTAS: dict[str, tuple[str, str]] = {
    "p": ("L-417A185B", "Running On-Demand P instances"),
    "g": ("L-DB2E81BA", "Running On-Demand G and VT instances"),
    "vt": ("L-DB2E81BA", "Running On-Demand G and VT instances"),
    "trn": ("L-2C3B7624", "Running On-Demand Trn instances"),
    "inf": ("L-1945791B", "Running On-Demand Inf instances"),
    "dl": ("L-6E869C2A", "Running On-Demand DL instances"),
    "f": ("L-74FC7D96", "Running On-Demand F instances"),
    "x": ("L-7295265B", "Running On-Demand X instances"),
}
STANDARD_VCPU_QUOTA = ("L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances")
_MISSING = {"404", "NoSuchKey", "NotFound", "NoSuchBucket"}
_BROKEN_STATES = ("ROLLBACK_COMPLETE", "ROLLBACK_FAILED", "DELETE_FAILED", "UPDATE_ROLLBACK_FAILED")


@dataclass(frozen=True)
class Finding:
    level: str  # BLOCKER, WARNING, OK
    check: str
    message: str

    def line(self) -> str:
        return f"{self.level:<8} {self.check}: {self.message}"


def ec2_vcpu_quota(instance_type: str) -> tuple[str, str]:
    """(quota code, name) of the On-Demand vCPU quota an EC2 instance type counts against."""
    letters = re.match(r"[a-z]+", instance_type.split(".")[0])
    series = letters[0] if letters else ""
    for prefix in sorted(EC2_VCPU_QUOTAS, key=len, reverse=True):
        if series.startswith(prefix) and (prefix != "g" or series == "g"):
            return EC2_VCPU_QUOTAS[prefix]
    return STANDARD_VCPU_QUOTA


def _code(error: Exception) -> str:
    from botocore.exceptions import ClientError

    return str(error.response.get("Error", {}).get("Code", "")) if isinstance(error, ClientError) else ""


def _pages(client: Any, operation: str, key: str, **kwargs: Any) -> Iterator[Any]:
    for page in client.get_paginator(operation).paginate(**kwargs):
        yield from page.get(key, [])


class Preflight:
    def __init__(self, settings: Any, clients: Callable[[str], Any], cdk_out: Path | None = None) -> None:
        self.settings = settings
        self.client = clients
        self.cdk_out = cdk_out
        self.findings: list[Finding] = []
        self.foundation: dict[str, str] | None = None  # the deployed Foundation stack's outputs

    def add(self, level: str, check: str, message: str) -> None:
        self.findings.append(Finding(level, check, message))

    def run(self) -> list[Finding]:
        self.foundation = self._stack_outputs(f"{self.settings.name}-Foundation")
        for check in (self.ec2_quota, self.zone_offering, self.sagemaker_quotas, self.key_and_buckets,
                      self.model_objects, self.fixed_names):  # fmt: skip
            try:
                check()
            except Exception as error:  # a check that cannot run is a finding, not a crash
                self.add("WARNING", check.__name__.replace("_", " "), f"could not check: {error}")
        return self.findings

    # --- deployed state -------------------------------------------------------------------------------------------

    def _stack_outputs(self, stack_name: str) -> dict[str, str] | None:
        try:
            (stack,) = self.client("cloudformation").describe_stacks(StackName=stack_name)["Stacks"]
        except Exception as error:
            if _code(error) == "ValidationError" and "does not exist" in str(error):
                return None
            raise
        if stack["StackStatus"] in _BROKEN_STATES:
            self.add("BLOCKER", f"stack {stack_name}", f"is {stack['StackStatus']}: delete it (or continue the "
                     "rollback) before deploying again.")  # fmt: skip
        return {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}

    # --- quotas -----------------------------------------------------------------------------------------------------

    def _quota_value(self, service: str, code: str) -> float:
        quotas = self.client("service-quotas")
        try:
            return float(quotas.get_service_quota(ServiceCode=service, QuotaCode=code)["Quota"]["Value"])
        except Exception as error:
            if _code(error) != "NoSuchResourceException":
                raise
        return float(quotas.get_aws_default_service_quota(ServiceCode=service, QuotaCode=code)["Quota"]["Value"])

    def ec2_quota(self) -> None:
        training = self.settings.training
        code, name = ec2_vcpu_quota(training.instance_type)
        (described,) = self.client("ec2").describe_instance_types(InstanceTypes=[training.instance_type])[
            "InstanceTypes"
        ]
        needed = training.nodes * int(described["VCpuInfo"]["DefaultVCpus"])
        value = self._quota_value("ec2", code)
        check = f"EC2 quota {code} ({name})"
        run = f"a {training.nodes}-node {training.instance_type} run needs {needed} vCPUs"
        if value < needed:
            self.add("BLOCKER", check, f"{value:g} vCPUs; {run}: request an increase (aws service-quotas "
                     f"request-service-quota-increase --service-code ec2 --quota-code {code} --desired-value {needed}) "
                     "or start fewer nodes, or launch into a capacity reservation.")  # fmt: skip
        else:
            self.add("OK", check, f"{value:g} vCPUs; {run}.")

    def sagemaker_quotas(self) -> None:
        needs: dict[str, int] = {f"{self.settings.training.remote_instance_type} for training job usage": 1}
        for endpoint in (self.settings.graviton_endpoint, self.settings.multi_model_endpoint):
            if endpoint.enabled:
                name = f"{endpoint.instance_type} for endpoint usage"
                needs[name] = needs.get(name, 0) + endpoint.autoscaling.max_capacity
        quotas = self.client("service-quotas")
        found = {q["QuotaName"]: q for q in _pages(quotas, "list_service_quotas", "Quotas", ServiceCode="sagemaker")}
        missing = [name for name in needs if name not in found]
        if missing:
            defaults = _pages(quotas, "list_aws_default_service_quotas", "Quotas", ServiceCode="sagemaker")
            found.update({q["QuotaName"]: q for q in defaults if q["QuotaName"] in missing})
        for name, needed in needs.items():
            check = f"SageMaker quota '{name}'"
            if name not in found:
                self.add("BLOCKER", check, f"no such quota in {self.settings.region}: the type is not offered there "
                         "for this use; choose another instance type.")  # fmt: skip
                continue
            quota = found[name]
            value = float(quota["Value"])
            use = "one training job" if "training job" in name else f"the endpoints' autoscaling maximum of {needed}"
            if value < needed:
                self.add("BLOCKER", check, f"{value:g} instances ({quota['QuotaCode']}); {use} needs {needed}: request "
                         "an increase (aws service-quotas request-service-quota-increase --service-code sagemaker "
                         f"--quota-code {quota['QuotaCode']} --desired-value {needed}).")  # fmt: skip
            else:
                self.add("OK", check, f"{value:g} instances; {use} needs {needed}.")

    # --- capacity in the zone -----------------------------------------------------------------------------------------

    def zone_offering(self) -> None:
        training, ec2 = self.settings.training, self.client("ec2")
        index = training.subnet_index
        if self.foundation and self.foundation.get("PrivateSubnetIds"):
            subnet_ids = self.foundation["PrivateSubnetIds"].split(",")
            described = ec2.describe_subnets(SubnetIds=subnet_ids)["Subnets"]
            subnets = {s["SubnetId"]: s["AvailabilityZone"] for s in described}
            zones = [subnets[s] for s in subnet_ids]
            source = "the Foundation's private subnets"
        else:
            available = ec2.describe_availability_zones(
                Filters=[{"Name": "zone-type", "Values": ["availability-zone"]}]
            )["AvailabilityZones"]
            zones = sorted(z["ZoneName"] for z in available if z.get("State", "available") == "available")
            zones = zones[: self.settings.vpc.max_azs]
            source = "the region's zones, as Fn::GetAZs lists them"
        if index >= len(zones):
            self.add("BLOCKER", "training zone", f"training.subnet_index {index} is beyond {source} ({len(zones)}).")
            return
        offered = {
            o["Location"]
            for o in _pages(ec2, "describe_instance_type_offerings", "InstanceTypeOfferings",
                            LocationType="availability-zone",
                            Filters=[{"Name": "instance-type", "Values": [training.instance_type]}])
        }  # fmt: skip
        zone = zones[index]
        check = f"{training.instance_type} in {zone}"
        if zone in offered:
            self.add("OK", check, f"offered in the training subnet's zone (training.subnet_index {index}).")
            return
        choices = [f"{i} ({z})" for i, z in enumerate(zones) if z in offered]
        advice = (f"set training.subnet_index to {' or '.join(choices)}" if choices else
                  f"none of {source} offers it: use another region or instance type")  # fmt: skip
        self.add("BLOCKER", check, f"not offered in the zone of training.subnet_index {index}: {advice}.")

    # --- deployed data ------------------------------------------------------------------------------------------------

    def key_and_buckets(self) -> None:
        if self.foundation is None:
            self.add("OK", "platform key and buckets", "no Foundation stack yet: its deploy creates them.")
            return
        key = self.client("kms").describe_key(KeyId=self.foundation["PlatformKeyArn"])["KeyMetadata"]
        if key["KeyState"] != "Enabled":
            what = ("cancel the deletion (aws kms cancel-key-deletion, then enable-key)" if key["KeyState"] ==
                    "PendingDeletion" else "enable it (aws kms enable-key)")  # fmt: skip
            self.add("BLOCKER", "platform key", f"{key['Arn']} is {key['KeyState']}: {what}.")
        else:
            self.add("OK", "platform key", f"{key['Arn']} is Enabled.")
        s3 = self.client("s3")
        for output in ("DatasetsBucketName", "ArtifactsBucketName", "RemoteJobsBucketName", "AccessLogsBucketName"):
            bucket = self.foundation.get(output)
            if bucket is None:
                continue
            try:
                s3.head_bucket(Bucket=bucket)
            except Exception as error:
                missing = _code(error) in _MISSING
                self.add("BLOCKER", f"bucket {bucket}", "does not exist: the Foundation stack lost it; update the "
                         "stack or recreate it." if missing else f"cannot be read ({_code(error)}).")  # fmt: skip
            else:
                self.add("OK", f"bucket {bucket}", "exists.")

    def model_objects(self) -> None:
        endpoint = self.settings.graviton_endpoint
        if not endpoint.enabled or endpoint.model_data_key is None:
            self.add("OK", "Graviton endpoint model", "graviton_endpoint.model_data_key names no model yet: the "
                     "endpoint stack is not built.")  # fmt: skip
            return
        if self.foundation is None:
            self.add("WARNING", "Graviton endpoint model", f"{endpoint.model_data_key} cannot be looked up before the "
                     "Foundation stack exists: run preflight again after deploying it.")  # fmt: skip
            return
        bucket = self.foundation["ArtifactsBucketName"]
        try:
            self.client("s3").head_object(Bucket=bucket, Key=endpoint.model_data_key)
        except Exception as error:
            if _code(error) not in _MISSING | {"403"}:
                raise
            self.add("BLOCKER", "Graviton endpoint model", f"s3://{bucket}/{endpoint.model_data_key} does not exist: "
                     "upload it (pytorch-platform package --upload) before deploying the endpoint.")  # fmt: skip
        else:
            self.add("OK", "Graviton endpoint model", f"s3://{bucket}/{endpoint.model_data_key} exists.")

    # --- fixed names --------------------------------------------------------------------------------------------------

    def fixed_names(self) -> None:
        if self.cdk_out is None or not (self.cdk_out / "manifest.json").is_file():
            self.add("WARNING", "fixed names", "no cloud assembly: run `make synth` to check the names it fixes.")
            return
        from ops_review.review import load_assembly

        logs, ssm = self.client("logs"), self.client("ssm")
        for stack in load_assembly(self.cdk_out):
            if stack.environment != self.settings.name or self._stack_exists(stack.stack_name):
                continue
            for resource in stack.template["Resources"].values():
                props = resource.get("Properties", {})
                if resource["Type"] == "AWS::Logs::LogGroup" and isinstance(props.get("LogGroupName"), str):
                    name = props["LogGroupName"]
                    groups = logs.describe_log_groups(logGroupNamePrefix=name)["logGroups"]
                    if any(g["logGroupName"] == name for g in groups):
                        self.add("BLOCKER", f"log group {name}", f"exists, and {stack.stack_name} creates it: "
                                 f"delete it (aws logs delete-log-group --log-group-name {name}), after exporting what "
                                 "you keep.")  # fmt: skip
                if resource["Type"] == "AWS::SSM::Parameter" and isinstance(props.get("Name"), str):
                    try:
                        ssm.get_parameter(Name=props["Name"])
                    except Exception as error:
                        if _code(error) != "ParameterNotFound":
                            raise
                    else:
                        self.add("BLOCKER", f"parameter {props['Name']}", f"exists, and {stack.stack_name} creates it: "
                                 f"delete it (aws ssm delete-parameter --name {props['Name']}).")  # fmt: skip

    def _stack_exists(self, stack_name: str) -> bool:
        try:
            self.client("cloudformation").describe_stacks(StackName=stack_name)
        except Exception as error:
            if _code(error) == "ValidationError":
                return False
            raise
        return True


def _environment(args: argparse.Namespace) -> str:
    for item in args.context:
        key, _, value = item.partition("=")
        if key == "env":
            return value
    if args.env:
        return str(args.env)
    raise SystemExit("name the environment: -c env=dev (or --env dev)")


def main(argv: list[str] | None = None, *, clients: Callable[[str], Any] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pytorch-platform preflight", description=__doc__.split("\n\n")[0])
    parser.add_argument("-c", "--context", action="append", default=[], help="env=<environment>, as cdk takes it")
    parser.add_argument("--env", help="the environment (same as -c env=...)")
    parser.add_argument("--cdk-json", type=Path, default=Path("cdk.json"), help="settings file (default: cdk.json)")
    parser.add_argument("--cdk-out", type=Path, default=Path("cdk.out"), help="cloud assembly (default: cdk.out)")
    args = parser.parse_args(argv)
    from stacks.settings import SettingsError, load_environments

    environment = _environment(args)
    try:
        context = json.loads(args.cdk_json.read_text())["context"]
        (settings,) = load_environments(context.get("environments"), environment)
    except (OSError, ValueError, KeyError, SettingsError) as error:
        print(f"{args.cdk_json}: {error}", file=sys.stderr)
        return 2
    if clients is None:
        import boto3

        clients = boto3.session.Session(region_name=settings.region).client
    findings = Preflight(settings, clients, args.cdk_out).run()
    for finding in findings:
        print(finding.line())
    blockers = [f for f in findings if f.level == "BLOCKER"]
    print(f"{environment}: {len(blockers)} blocker(s), "
          f"{sum(f.level == 'WARNING' for f in findings)} warning(s)")  # fmt: skip
    return 1 if blockers else 0


if __name__ == "__main__":
    sys.exit(main())
