"""`pytorch-platform preflight -c env=<env>`: what would stop the environment's first run, found before money is spent.

One line per finding, ``BLOCKER``, ``WARNING`` or ``OK``, each with what to do; exit status 1 when a blocker is found.
What the environment needs comes from its synthesized templates (``make synth`` first: ``--cdk-out``), the
deployed state from AWS:

- Service quotas the settings need. New accounts start at 0 for several (Service Quotas user guide; SageMaker answers
  ResourceLimitExceeded at CreateEndpoint or CreateTrainingJob, EC2 VcpuLimitExceeded at RunInstances):
  EC2 On-Demand vCPUs of the training family (nodes x the type's vCPUs; quota codes of the EC2 user guide,
  "Amazon EC2 service quotas", https://docs.aws.amazon.com/ec2/latest/instancetypes/ec2-instance-quotas.html:
  L-417A185B "Running On-Demand P instances", L-DB2E81BA "G and VT", L-1216C47A "Standard (A, C, D, H, I, M, R, T,
  Z)", L-2C3B7624 "Trn", L-1945791B "Inf", L-6E869C2A "DL", L-74FC7D96 "F", L-7295265B "X"); SageMaker instances per
  type, found by their quota names "<type> for training job usage" and "<type> for endpoint usage" (the codes differ
  per type; https://docs.aws.amazon.com/general/latest/gr/sagemaker.html): one training job of
  ``training.remote_instance_type`` (the @remote config the Training stack writes), and for endpoints the sum of the
  autoscaling maxima (scalable targets) of the endpoints on a type.
  Running usage is not subtracted: instances already running count against the same quotas.
- The training type's offering in the training subnet's zone (EC2 DescribeInstanceTypeOfferings): the zone of entry
  ``training.subnet_index`` of the Foundation's private subnets when it is deployed, else the zone the Training
  stack's ``TrainingAvailabilityZone`` output selects from the region's zones in alphabetical order, as
  ``Fn::GetAZs`` lists them (CloudFormation user guide, "Fn::GetAZs").
- The SageMaker types in the private subnets' zones: each endpoint's, and the @remote jobs' (their config.yaml lists
  every private subnet), read as the EC2 offering of the same hardware (SageMaker has no per-zone offering API).
- The capacity reservation the launch template targets (EC2 DescribeCapacityReservations): type, zone, state, free
  instances and market type.
- The model object the Graviton endpoint names (S3 HeadObject in the artifacts bucket).
- The state of the platform key (KMS DescribeKey: Enabled) and buckets (HeadBucket) of a deployed Foundation.
- Names the templates fix: a log group or SSM parameter of a stack not deployed yet that
  already exists makes CloudFormation's create fail ("already exists"): staging and prod keep their endpoint log
  groups when their stacks are destroyed.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
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


@dataclass(frozen=True)
class Needs:
    """What one environment's synthesized templates will ask of the account."""

    environment: str
    region: str
    foundation_stack: str
    training_type: str
    nodes: int  # of the largest run the Training stack prints a command for
    zone_index: int  # of the training subnet, among the private subnets (one per zone, in zone order)
    zones: int  # private subnets
    remote_type: str | None
    endpoint_maxima: dict[str, int]  # endpoint instance type -> sum of its scalable targets' maxima
    model_key: str | None
    stacks: tuple[Any, ...]
    # The launch template's capacity target (training.capacity_reservation_id / _resource_group_arn, market_type).
    reservation_id: str | None = None
    reservation_group_arn: str | None = None
    capacity_block: bool = False
    # Elastic IPs (one per NAT gateway) of every environment of the assembly that shares this account and region:
    # (environment, its Foundation stack's name, EIPs).
    elastic_ips: tuple[tuple[str, str, int], ...] = ()
    # The Foundation's interface endpoints' service names.
    endpoint_services: tuple[str, ...] = ()


def needs_of(cdk_out: Path, environment: str) -> Needs:
    """``environment``'s needs, read from the cloud assembly (``make synth``)."""
    from ops_review.review import load_assembly

    stacks = {s.stack: s for s in load_assembly(cdk_out) if s.environment == environment}
    if "Foundation" not in stacks or "Training" not in stacks:
        raise ValueError(f"{cdk_out} has no Foundation and Training stacks of {environment!r}; run `make synth` first.")
    foundation, training = stacks["Foundation"].template, stacks["Training"].template

    def of_type(template: dict[str, Any], kind: str) -> list[dict[str, Any]]:
        return [r.get("Properties", {}) for r in template["Resources"].values() if r["Type"] == kind]

    (launch,) = of_type(training, "AWS::EC2::LaunchTemplate")
    # The nodes of each run command the stack prints: the launcher's payload ({"nodes": N}, stacks/training.py).
    counts = [int(m) for name, output in training["Outputs"].items() if name.startswith("Run")
              for m in re.findall(r'\\"nodes\\": (\d+)', json.dumps(output["Value"]))]  # fmt: skip
    zone = training["Outputs"]["TrainingAvailabilityZone"]["Value"]["Fn::Select"][0]
    subnets = foundation["Outputs"]["PrivateSubnetIds"]["Value"]["Fn::Join"][1]
    remote = re.findall(r"InstanceType: (ml\.[\w.]+)", json.dumps(of_type(training, "AWS::SSM::Parameter")))
    maxima: dict[str, int] = {}
    for stack_id in ("GravitonEndpoint", "MultiModelEndpoint"):
        if stack_id not in stacks:
            continue
        template = stacks[stack_id].template
        (config,) = of_type(template, "AWS::SageMaker::EndpointConfig")
        (instance_type,) = {v["InstanceType"] for v in config["ProductionVariants"]}
        targets = of_type(template, "AWS::ApplicationAutoScaling::ScalableTarget")
        count = sum(int(t["MaxCapacity"]) for t in targets) or sum(
            int(v["InitialInstanceCount"]) for v in config["ProductionVariants"]
        )
        maxima[instance_type] = maxima.get(instance_type, 0) + count
    graviton = stacks.get("GravitonEndpoint")
    model_key = graviton.template["Outputs"]["ModelDataKey"]["Value"] if graviton else None
    services = tuple(
        sorted(
            {
                p["ServiceName"]
                for p in of_type(foundation, "AWS::EC2::VPCEndpoint")
                if p.get("VpcEndpointType") == "Interface" and isinstance(p.get("ServiceName"), str)
            }
        )
    )
    return Needs(environment=environment, region=stacks["Foundation"].region or "us-west-2",
                 foundation_stack=stacks["Foundation"].stack_name, training_type=launch["LaunchTemplateData"]
                 ["InstanceType"], nodes=max(counts or [1]), zone_index=int(zone), zones=len(subnets),
                 remote_type=remote[0] if remote else None, endpoint_maxima=maxima, model_key=model_key,
                 stacks=tuple(stacks.values()), elastic_ips=sharing_elastic_ips(cdk_out, stacks["Foundation"]),
                 endpoint_services=services, **capacity_target(launch["LaunchTemplateData"]))  # fmt: skip


def sharing_elastic_ips(cdk_out: Path, foundation: Any) -> tuple[tuple[str, str, int], ...]:
    """(environment, Foundation stack name, Elastic IPs) of every environment stage of the assembly that deploys
    into the same account and region as ``foundation`` (no account: wherever the CLI's credentials point, so every
    other environment without one shares it). The pipeline's copies of the stages are not counted twice."""
    from ops_review.review import load_assembly

    found = []
    for stack in load_assembly(cdk_out):
        if stack.stack != "Foundation" or "/" in stack.environment:
            continue
        if (stack.account, stack.region or "us-west-2") != (foundation.account, foundation.region or "us-west-2"):
            continue
        eips = sum(r["Type"] == "AWS::EC2::EIP" for r in stack.template["Resources"].values())
        found.append((stack.environment, stack.stack_name, eips))
    return tuple(found)


def capacity_target(data: dict[str, Any]) -> dict[str, Any]:
    """The capacity a launch template's data targets: a reservation, a reservation group, a capacity block."""
    target = (data.get("CapacityReservationSpecification") or {}).get("CapacityReservationTarget") or {}
    return {
        "reservation_id": target.get("CapacityReservationId"),
        "reservation_group_arn": target.get("CapacityReservationResourceGroupArn"),
        "capacity_block": (data.get("InstanceMarketOptions") or {}).get("MarketType") == "capacity-block",
    }


class _AccountChecks:
    """What a new account may lack around the environment's network and images, and the helpers every check shares
    (Preflight's base: one class of every check would be over the repository's size rule)."""

    needs: Needs
    client: Callable[[str], Any]
    findings: list[Finding]
    foundation: dict[str, str] | None

    def add(self, level: str, check: str, message: str) -> None:
        self.findings.append(Finding(level, check, message))

    def _stack_exists(self, stack_name: str) -> bool:
        try:
            self.client("cloudformation").describe_stacks(StackName=stack_name)
        except Exception as error:
            if _code(error) == "ValidationError":
                return False
            raise
        return True

    def _zones(self) -> tuple[list[str], str]:
        """The private subnets' zones, in subnet order, and where they were read."""
        ec2 = self.client("ec2")
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
            zones = zones[: self.needs.zones]
            source = "the region's zones, as Fn::GetAZs lists them"
        return zones, source

    def endpoint_services(self) -> None:
        """Each interface endpoint's service must be offered in every zone of the private subnets it is placed in,
        or CloudFormation fails the Foundation's create (EC2 DescribeVpcEndpointServices: ServiceDetails
        .AvailabilityZones)."""
        names = list(self.needs.endpoint_services)
        if not names:
            return
        zones, source = self._zones()
        described = self.client("ec2").describe_vpc_endpoint_services(ServiceNames=names)["ServiceDetails"]
        offered = {d["ServiceName"]: set(d.get("AvailabilityZones", [])) for d in described}
        for name in names:
            missing = [zone for zone in zones if zone not in offered.get(name, set())]
            check = f"interface endpoint {name}"
            if missing:
                advice = "deploy to a region whose first zones offer it, or lower vpc.max_azs"
                self.add("BLOCKER", check, f"not offered in {', '.join(missing)} ({source}): the Foundation's "
                         f"create fails; {advice}.")  # fmt: skip
            else:
                self.add("OK", check, f"offered in {', '.join(zones)}.")

    def endpoint_instance_zones(self) -> None:
        """SageMaker runs an endpoint in VPC mode on instances in its subnets' zones; an endpoint type none of them
        offers cannot start."""
        for instance_type in sorted(self.needs.endpoint_maxima):
            self._sagemaker_type_zones(instance_type, "endpoint", "choose another instance type for the endpoint")

    def remote_instance_zones(self) -> None:
        """The @remote jobs run in VPC mode in the private subnets the Training stack's config.yaml lists (all of
        them): SageMaker places the job's instances in one of those subnets, so a type none of their zones offers
        cannot start (the job fails at CreateTrainingJob or waits for capacity)."""
        if self.needs.remote_type:
            advice = "set training.remote_instance_type to a type the zones offer"
            self._sagemaker_type_zones(self.needs.remote_type, "@remote job", advice)

    def _sagemaker_type_zones(self, instance_type: str, what: str, advice: str) -> None:
        """A SageMaker type read as the EC2 offering of its hardware (ml.c7g.4xlarge: c7g.4xlarge; EC2
        DescribeInstanceTypeOfferings): SageMaker has no per-zone offering API (its ListTrainingJobs, DescribeEndpoint
        and Service Quotas answer per region), so this is the nearest account answer, and a zone that lacks it is a
        warning while another zone has it."""
        zones, source = self._zones()
        hardware = instance_type.removeprefix("ml.")
        offered = {
            o["Location"]
            for o in _pages(self.client("ec2"), "describe_instance_type_offerings", "InstanceTypeOfferings",
                            LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": [hardware]}])
        }  # fmt: skip
        have = [zone for zone in zones if zone in offered]
        check = f"{instance_type} in the {what} subnets' zones"
        if not have:
            self.add("BLOCKER", check, f"none of {', '.join(zones)} ({source}) offers {hardware}: {advice}, or "
                     "another region.")  # fmt: skip
        elif len(have) < len(zones):
            self.add("WARNING", check, f"only {', '.join(have)} of {', '.join(zones)} offer {hardware}: "
                     "SageMaker places every instance there.")  # fmt: skip
        else:
            self.add("OK", check, f"offered in {', '.join(zones)}.")

    def elastic_ips(self) -> None:
        """Each NAT gateway holds an Elastic IP, and every environment deployed into this account and region draws on
        one quota (EC2 DescribeAccountAttributes vpc-max-elastic-ips; Service Quotas L-0263D0A3, 5 by default):
        those of environments whose Foundation is not deployed yet must fit into what is free."""
        sharing = self.needs.elastic_ips
        if not sharing:
            return
        ec2 = self.client("ec2")
        attributes = ec2.describe_account_attributes(AttributeNames=["vpc-max-elastic-ips"])["AccountAttributes"]
        limit = int(attributes[0]["AttributeValues"][0]["AttributeValue"])
        in_use = len(ec2.describe_addresses()["Addresses"])
        pending = [(env, eips) for env, stack, eips in sharing if eips and not self._stack_exists(stack)]
        needed = sum(eips for _, eips in pending)
        check = "Elastic IPs (NAT gateways)"
        who = ", ".join(f"{env} {eips}" for env, eips in pending) or "none"
        if in_use + needed > limit:
            self.add("BLOCKER", check, f"{limit} allowed, {in_use} in use; the NAT gateways of the environments "
                     f"sharing this account and region, not deployed yet, need {needed} ({who}): request an increase "
                     "(aws service-quotas request-service-quota-increase --service-code ec2 --quota-code L-0263D0A3 "
                     f"--desired-value {in_use + needed}), release unused addresses, or lower "
                     "vpc.nat_gateways.")  # fmt: skip
        else:
            self.add("OK", check, f"{limit} allowed, {in_use} in use, {needed} more needed ({who}).")

    # --- images -------------------------------------------------------------------------------------------------------

    def images(self) -> None:
        """Each image a stack resolves from SSM when it deploys (ops_review/image_check.py, also
        `pytorch-platform check-images`): present, of its instances' architecture, pullable by this account."""
        from ops_review.image_check import ImageCheck, image_needs

        # ECR in the region the digest URI names: the pipeline publishes within its own region, the environment's.
        checker = ImageCheck(lambda service, region: self.client(service), self.needs.region)
        for need in image_needs(list(self.needs.stacks)):
            result = checker.check(need)
            self.add("OK" if result.ok else "BLOCKER", f"image {need.parameter}", f"{result.message}")


class Preflight(_AccountChecks):
    def __init__(self, needs: Needs, clients: Callable[[str], Any]) -> None:
        self.needs = needs
        self.client = clients
        self.findings: list[Finding] = []
        self.foundation: dict[str, str] | None = None  # the deployed Foundation stack's outputs
        self.training_zone: str | None = None  # the training subnet's zone, once zone_offering found it

    def run(self) -> list[Finding]:
        self.foundation = self._stack_outputs(self.needs.foundation_stack)
        for check in (self.ec2_quota, self.zone_offering, self.capacity_reservation, self.sagemaker_quotas,
                      self.endpoint_services, self.endpoint_instance_zones, self.remote_instance_zones,
                      self.key_and_buckets,
                      self.model_objects, self.images, self.fixed_names, self.elastic_ips):  # fmt: skip
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
        instance_type, nodes = self.needs.training_type, self.needs.nodes
        code, name = ec2_vcpu_quota(instance_type)
        (described,) = self.client("ec2").describe_instance_types(InstanceTypes=[instance_type])["InstanceTypes"]
        needed = nodes * int(described["VCpuInfo"]["DefaultVCpus"])
        value = self._quota_value("ec2", code)
        check = f"EC2 quota {code} ({name})"
        run = f"a {nodes}-node {instance_type} run needs {needed} vCPUs"
        if value < needed:
            self.add("BLOCKER", check, f"{value:g} vCPUs; {run}: request an increase (aws service-quotas "
                     f"request-service-quota-increase --service-code ec2 --quota-code {code} --desired-value {needed}) "
                     "or start fewer nodes, or launch into a capacity reservation.")  # fmt: skip
        else:
            self.add("OK", check, f"{value:g} vCPUs; {run}.")

    def sagemaker_quotas(self) -> None:
        needs = {f"{t} for endpoint usage": count for t, count in self.needs.endpoint_maxima.items()}
        if self.needs.remote_type:
            needs[f"{self.needs.remote_type} for training job usage"] = 1
        quotas = self.client("service-quotas")
        found = {q["QuotaName"]: q for q in _pages(quotas, "list_service_quotas", "Quotas", ServiceCode="sagemaker")}
        missing = [name for name in needs if name not in found]
        if missing:
            defaults = _pages(quotas, "list_aws_default_service_quotas", "Quotas", ServiceCode="sagemaker")
            found.update({q["QuotaName"]: q for q in defaults if q["QuotaName"] in missing})
        for name, needed in needs.items():
            check = f"SageMaker quota '{name}'"
            if name not in found:
                self.add("BLOCKER", check, f"no such quota in {self.needs.region}: the type is not offered there "
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
        instance_type, ec2 = self.needs.training_type, self.client("ec2")
        index = self.needs.zone_index
        zones, source = self._zones()
        if index >= len(zones):
            self.add("BLOCKER", "training zone", f"training.subnet_index {index} is beyond {source} ({len(zones)}).")
            return
        offered = {
            o["Location"]
            for o in _pages(ec2, "describe_instance_type_offerings", "InstanceTypeOfferings",
                            LocationType="availability-zone",
                            Filters=[{"Name": "instance-type", "Values": [instance_type]}])
        }  # fmt: skip
        zone = self.training_zone = zones[index]
        check = f"{instance_type} in {zone}"
        if zone in offered:
            self.add("OK", check, f"offered in the training subnet's zone (training.subnet_index {index}).")
            return
        choices = [f"{i} ({z})" for i, z in enumerate(zones) if z in offered]
        advice = (f"set training.subnet_index to {' or '.join(choices)}" if choices else
                  f"none of {source} offers it: use another region or instance type")  # fmt: skip
        self.add("BLOCKER", check, f"not offered in the zone of training.subnet_index {index}: {advice}.")

    # --- capacity bought ahead ------------------------------------------------------------------------------------

    # Long: one check per thing EC2 documents about a reservation (existence, type, zone, state, room, market type),
    # each with its blocker sentence
    def capacity_reservation(self) -> None:
        """The reservation the launch template targets: it must exist, be of the training type, in the training
        subnet's zone, active (a Capacity Block is "scheduled" until its start) with room for the run's nodes, and a
        Capacity Block needs the capacity-block market type (EC2 API reference, DescribeCapacityReservations:
        CapacityReservation.State, ReservationType, AvailableInstanceCount; EC2 user guide, "Capacity Blocks for
        ML")."""
        needs = self.needs
        if needs.reservation_group_arn:
            self.add(
                "WARNING",
                "capacity reservation group",
                f"{needs.reservation_group_arn}: EC2 chooses one of its "
                "reservations at launch; preflight does not check them (aws ec2 describe-capacity-reservations).",
            )
            return  # fmt: skip
        if needs.reservation_id is None:
            return
        check = f"capacity reservation {needs.reservation_id}"
        try:
            (found,) = self.client("ec2").describe_capacity_reservations(CapacityReservationIds=[needs.reservation_id])[
                "CapacityReservations"
            ]
        except Exception as error:
            if _code(error) not in ("InvalidCapacityReservationId.NotFound", "InvalidCapacityReservationId.Malformed"):
                raise
            self.add(
                "BLOCKER",
                check,
                f"does not exist in {needs.region} for this account: set "
                "training.capacity_reservation_id to a reservation of this region (or share it with the account).",
            )
            return  # fmt: skip
        problems = []
        if found["InstanceType"] != needs.training_type:
            problems.append(f"it reserves {found['InstanceType']}, the run launches {needs.training_type}")
        if self.training_zone and found["AvailabilityZone"] != self.training_zone:
            problems.append(f"it is in {found['AvailabilityZone']}, the training subnet in {self.training_zone} (set "
                            "training.subnet_index to the subnet of its zone)")  # fmt: skip
        block = found.get("ReservationType") == "capacity-block"
        if block != needs.capacity_block:
            problems.append("it is a Capacity Block: set training.market_type to capacity-block" if block else
                            "it is not a Capacity Block: set training.market_type to on-demand")  # fmt: skip
        state = found["State"]
        if state in ("expired", "cancelled", "cancelling", "failed", "payment-failed", "unsupported", "unavailable"):
            problems.append(f"it is {state}: reserve capacity again and set its id")
        if problems:
            self.add("BLOCKER", check, "; ".join(problems) + ".")
            return
        if state != "active":
            start = found.get("StartDate")
            self.add(
                "WARNING",
                check,
                f"is {state}"
                + (f" until {start:%Y-%m-%d %H:%M} UTC" if start else "")
                + ": a run launched before it is active fails (ReservationCapacityExceeded); start it then.",
            )
            return  # fmt: skip
        available = int(found.get("AvailableInstanceCount", 0))
        if available < needs.nodes:
            self.add(
                "BLOCKER",
                check,
                f"has {available} of {found.get('TotalInstanceCount', '?')} instances free; a "
                f"{needs.nodes}-node run needs {needs.nodes}: wait for running instances to end or reserve more.",
            )
            return  # fmt: skip
        end = found.get("EndDate")
        self.add("OK", check, f"active, {available} {found['InstanceType']} free in {found['AvailabilityZone']}" +
                 (f", until {end:%Y-%m-%d %H:%M} UTC" if end else "") + ".")  # fmt: skip

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
        key = self.needs.model_key
        if key is None:
            self.add("OK", "Graviton endpoint model", "graviton_endpoint.model_data_key names no model yet: the "
                     "endpoint stack is not built.")  # fmt: skip
            return
        if self.foundation is None:
            self.add("WARNING", "Graviton endpoint model", f"{key} cannot be looked up before the "
                     "Foundation stack exists: run preflight again after deploying it.")  # fmt: skip
            return
        bucket = self.foundation["ArtifactsBucketName"]
        try:
            self.client("s3").head_object(Bucket=bucket, Key=key)
        except Exception as error:
            if _code(error) not in _MISSING | {"403"}:
                raise
            self.add("BLOCKER", "Graviton endpoint model", f"s3://{bucket}/{key} does not exist: "
                     "upload it (pytorch-platform package --upload) before deploying the endpoint.")  # fmt: skip
        else:
            self.add("OK", "Graviton endpoint model", f"s3://{bucket}/{key} exists.")

    # --- fixed names --------------------------------------------------------------------------------------------------

    def fixed_names(self) -> None:
        logs, ssm = self.client("logs"), self.client("ssm")
        for stack in self.needs.stacks:
            if self._stack_exists(stack.stack_name):
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


def codebuild_quotas(cdk_out: Path, clients: Callable[[str], Any]) -> list[Finding]:
    """The promotion pipeline's account: CodeBuild runs no more builds at once per environment type and compute type
    than its "Concurrently running builds for <OS>/<size> environment" quota, and a new account's may start at 0 (no
    build runs at all until it is raised). Quotas found by name, as for SageMaker (the codes are per type); each type
    the pipeline's projects use needs at least one, and as many as its projects to run a wave's builds side by side.

    Names as the CodeBuild user guide's "Quotas for AWS CodeBuild" lists them
    (https://docs.aws.amazon.com/codebuild/latest/userguide/limits.html, checked 2026-12-06): "Concurrently running
    builds for ARM/Large environment", "... for Linux/Medium environment", one per platform and size; GPU builds are
    "Linux GPU/<size>". Over a limit, builds queue (up to five times the limit), "Builds in AWS CodeBuild"."""
    from ops_review.review import load_assembly

    stacks = [s for s in load_assembly(cdk_out) if s.stack == "PromotionPipeline" and "/" not in s.environment]
    if not stacks:
        raise ValueError(f"{cdk_out} has no PromotionPipeline stack; run `make synth` first.")
    wanted: dict[str, int] = {}
    for resource in stacks[0].template["Resources"].values():
        if resource["Type"] != "AWS::CodeBuild::Project":
            continue
        environment = resource["Properties"]["Environment"]
        kind = str(environment["Type"])
        system = "linux gpu" if kind == "LINUX_GPU_CONTAINER" else "arm" if kind.startswith("ARM") else "linux"
        size = str(environment["ComputeType"]).removeprefix("BUILD_GENERAL1_").lower()
        key = f"{system}/{size} environment"
        wanted[key] = wanted.get(key, 0) + 1
    quotas = clients("service-quotas")
    applied = _pages(quotas, "list_service_quotas", "Quotas", ServiceCode="codebuild")
    found = {q["QuotaName"].lower(): q for q in applied}
    defaults = _pages(quotas, "list_aws_default_service_quotas", "Quotas", ServiceCode="codebuild")
    for quota in defaults:
        found.setdefault(quota["QuotaName"].lower(), quota)
    findings = []
    for key, projects in sorted(wanted.items()):
        matches = [q for name, q in found.items() if "concurrently running builds" in name and name.endswith(key)]
        check = f"CodeBuild quota for {key.removesuffix(' environment')} builds"
        if not matches:
            findings.append(Finding("WARNING", check, f"no quota named '...{key}' in Service Quotas: check the "
                                    "account's concurrent-build quota for this type in the console."))  # fmt: skip
            continue
        quota = matches[0]
        value = float(quota["Value"])
        request = ("request an increase (aws service-quotas request-service-quota-increase --service-code codebuild "
                   f"--quota-code {quota['QuotaCode']} --desired-value {projects})")  # fmt: skip
        if value < 1:
            findings.append(Finding("BLOCKER", check, f"{value:g}: no {key.split(' ')[0]} build can run, so the "
                                    f"pipeline cannot start; {request}."))  # fmt: skip
        elif value < projects:
            findings.append(Finding("WARNING", check, f"{value:g} at once for the pipeline's {projects} projects of "
                                    f"this type: builds of one wave queue; {request}."))  # fmt: skip
        else:
            findings.append(Finding("OK", check, f"{value:g} at once; the pipeline has {projects} projects of it."))
    return findings


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
    parser.add_argument("--cdk-out", type=Path, default=Path("cdk.out"), help="cloud assembly (default: cdk.out)")
    parser.add_argument("--region", help="AWS region (default: the environment's in the cloud assembly)")
    parser.add_argument("--pipeline", action="store_true", help="check the pipeline's account instead (CodeBuild)")
    args = parser.parse_args(argv)
    if args.pipeline:
        if clients is None:
            import boto3

            clients = boto3.session.Session(region_name=args.region).client
        try:
            pipeline_findings = codebuild_quotas(args.cdk_out, clients)
        except (OSError, ValueError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        for finding in pipeline_findings:
            print(finding.line())
        return 1 if any(f.level == "BLOCKER" for f in pipeline_findings) else 0
    environment = _environment(args)
    try:
        needs = needs_of(args.cdk_out, environment)
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.region:
        needs = replace(needs, region=args.region)
    if clients is None:
        import boto3

        clients = boto3.session.Session(region_name=needs.region).client
    findings = Preflight(needs, clients).run()
    for finding in findings:
        print(finding.line())
    blockers = [f for f in findings if f.level == "BLOCKER"]
    print(f"{environment}: {len(blockers)} blocker(s), "
          f"{sum(f.level == 'WARNING' for f in findings)} warning(s)")  # fmt: skip
    return 1 if blockers else 0


if __name__ == "__main__":
    sys.exit(main())
