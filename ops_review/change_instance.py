"""Change the instance type of an autoscaled endpoint: deregister its scalable target, deploy, wait, re-register.

SageMaker refuses UpdateEndpoint when it would change the instance type of a variant that is an Application Auto
Scaling target ("Update endpoints that use auto scaling", SageMaker developer guide,
https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-scaling-update.html: "If the update would change the
instance type for any model that is a target for auto scaling, the update fails"; delete the scaling policies and
deregister the variant first, then register it again and attach the policies after the update). So a change of
``graviton_endpoint.instance_type`` or ``multi_model_endpoint.instance_type`` followed by a plain ``cdk deploy`` fails
and rolls back. This command wraps that deploy:

    make synth                                                        # with the new instance type in cdk.json
    pytorch-platform change-endpoint-instance --env dev --endpoint graviton
    pytorch-platform change-endpoint-instance --env dev --endpoint graviton --dry-run      # what it would do
    pytorch-platform change-endpoint-instance --env dev --endpoint graviton --print-policy  # what it needs

1. reads the new endpoint config from ``cdk.out`` and the running one from SageMaker; nothing to do when no
   variant's instance type changes (a plain ``cdk deploy`` works);
2. refuses when the deploy would also change the endpoint's scaling (min, max, policies): CloudFormation would
   register the target itself in that deploy; change the instance type in a deploy of its own;
3. saves the registered target and its policies to ``--state-file`` (the restore point), deletes the policies and
   deregisters the target (the update stays blocked while it is registered);
4. runs ``cdk deploy --app cdk.out <stack> --require-approval never`` (CloudFormation creates the new endpoint
   config and updates the endpoint), then waits until the endpoint is InService with the new instance type;
5. registers the target again with the saved capacities and puts the saved policies back, deploy or no deploy (a
   failed deploy rolls the endpoint back to the old type, which the restored scaling fits): ``--restore
   STATE_FILE`` does only this step, after an interruption.

While the target is deregistered the endpoint keeps its instance count but does not scale; SageMaker replaces the
instances of the updated variant with new ones before it moves traffic (a blue/green update), so the endpoint
keeps serving. The caller needs ``--print-policy`` (the endpoint's Describe calls, Application Auto Scaling, and
what Application Auto Scaling does for the caller: update the variant's capacity, the target-tracking alarms),
plus what ``cdk deploy`` needs.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ops_review.review import StackTemplate, load_assembly

ENDPOINT_STACKS = {"graviton": "GravitonEndpoint", "multi-model": "MultiModelEndpoint"}
NAMESPACE, DIMENSION = "sagemaker", "sagemaker:variant:DesiredInstanceCount"
_POLICY_KEYS = (
    "PolicyName",
    "PolicyType",
    "TargetTrackingScalingPolicyConfiguration",
    "StepScalingPolicyConfiguration",
)
_TARGET_KEYS = ("MinCapacity", "MaxCapacity", "SuspendedState")


class ChangeRefused(Exception):
    """The change cannot go ahead as asked; the message says why and what to do."""


@dataclass(frozen=True)
class Planned:
    """What the synthesized endpoint stack will deploy."""

    stack_name: str
    stack_path: str  # <env>/<stack>, what `cdk deploy` selects
    endpoint_name: str
    instance_types: dict[str, str]  # variant -> instance type
    scaling: dict[str, dict[str, Any]]  # resource id -> {"MinCapacity", "MaxCapacity", "policies": {name: config}}


def planned_endpoint(cdk_out: Path, environment: str, endpoint: str) -> Planned:
    """The endpoint stack of ``environment`` in the cloud assembly: endpoint name, variants, scaling."""
    stack_id = ENDPOINT_STACKS[endpoint]
    stacks = [s for s in load_assembly(cdk_out) if s.environment == environment and s.stack == stack_id]
    if not stacks:
        raise ChangeRefused(f"{cdk_out} has no {environment}/{stack_id} stack; run `make synth` first.")
    (stack,) = stacks
    return planned_from_template(stack)


def planned_from_template(stack: StackTemplate) -> Planned:
    """What one synthesized endpoint stack's template deploys: endpoint name, variants, scaling."""
    resources = stack.template["Resources"]

    def of_type(kind: str) -> list[dict[str, Any]]:
        return [r.get("Properties", {}) for r in resources.values() if r["Type"] == kind]

    (endpoint,) = of_type("AWS::SageMaker::Endpoint")
    (config,) = of_type("AWS::SageMaker::EndpointConfig")
    name = endpoint.get("EndpointName")
    if not isinstance(name, str):
        raise ChangeRefused(f"{stack.stack_name}: the endpoint has no fixed name; this command needs one.")
    variants = {v["VariantName"]: v["InstanceType"] for v in config["ProductionVariants"]}
    scaling: dict[str, dict[str, Any]] = {}
    targets = {logical: r["Properties"] for logical, r in resources.items()
               if r["Type"] == "AWS::ApplicationAutoScaling::ScalableTarget"}  # fmt: skip
    for logical, target in targets.items():
        variant = _variant_of(target["ResourceId"])
        resource_id = f"endpoint/{name}/variant/{variant}"
        policies = {
            r["Properties"]["PolicyName"]: {k: v for k, v in r["Properties"].items() if k in _POLICY_KEYS}
            for r in resources.values()
            if r["Type"] == "AWS::ApplicationAutoScaling::ScalingPolicy"
            and r["Properties"].get("ScalingTargetId") == {"Ref": logical}
        }
        scaling[resource_id] = {"MinCapacity": target["MinCapacity"], "MaxCapacity": target["MaxCapacity"],
                                "policies": policies}  # fmt: skip
    return Planned(stack.stack_name, f"{stack.environment}/{stack.stack}", name, variants, scaling)


def _variant_of(resource_id: Any) -> str:
    """The variant of a scalable target's ResourceId (``endpoint/<name>/variant/<variant>``, maybe an Fn::Join)."""
    text = resource_id if isinstance(resource_id, str) else "".join(
        part for part in resource_id["Fn::Join"][1] if isinstance(part, str)
    )  # fmt: skip
    return text.rsplit("/variant/", 1)[1]


def running_instance_types(sagemaker: Any, endpoint_name: str) -> tuple[str, dict[str, str]]:
    """(status, variant -> instance type) of the running endpoint."""
    endpoint = sagemaker.describe_endpoint(EndpointName=endpoint_name)
    config = sagemaker.describe_endpoint_config(EndpointConfigName=endpoint["EndpointConfigName"])
    return endpoint["EndpointStatus"], {v["VariantName"]: v["InstanceType"] for v in config["ProductionVariants"]}


def registered_scaling(autoscaling: Any, resource_ids: list[str]) -> dict[str, dict[str, Any]]:
    """The registered targets among ``resource_ids`` with their policies (the restore point)."""
    targets = autoscaling.describe_scalable_targets(ServiceNamespace=NAMESPACE, ResourceIds=resource_ids)
    saved: dict[str, dict[str, Any]] = {}
    for target in targets["ScalableTargets"]:
        policies = autoscaling.describe_scaling_policies(ServiceNamespace=NAMESPACE, ResourceId=target["ResourceId"],
                                                         ScalableDimension=DIMENSION)["ScalingPolicies"]  # fmt: skip
        saved[target["ResourceId"]] = {
            **{k: target[k] for k in _TARGET_KEYS if k in target},
            "policies": {p["PolicyName"]: {k: p[k] for k in _POLICY_KEYS if k in p} for p in policies},
        }
    return saved


def _comparable(scaling: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Scaling without what only one side holds (SuspendedState), numbers as floats (the API returns 600.0)."""

    def normal(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: normal(v) for k, v in value.items()}
        if isinstance(value, list):
            return [normal(v) for v in value]
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else value

    return {rid: normal({k: v for k, v in s.items() if k != "SuspendedState"}) for rid, s in scaling.items()}


def deregister(autoscaling: Any, saved: dict[str, dict[str, Any]]) -> None:
    """Delete the policies, then the targets (the order of the SageMaker guide)."""
    for resource_id, target in saved.items():
        for name in target["policies"]:
            autoscaling.delete_scaling_policy(PolicyName=name, ServiceNamespace=NAMESPACE, ResourceId=resource_id,
                                              ScalableDimension=DIMENSION)  # fmt: skip
        autoscaling.deregister_scalable_target(ServiceNamespace=NAMESPACE, ResourceId=resource_id,
                                               ScalableDimension=DIMENSION)  # fmt: skip


def register(autoscaling: Any, saved: dict[str, dict[str, Any]]) -> None:
    """Register the targets with their saved capacities and put their saved policies back."""
    for resource_id, target in saved.items():
        autoscaling.register_scalable_target(
            ServiceNamespace=NAMESPACE,
            ResourceId=resource_id,
            ScalableDimension=DIMENSION,
            **{k: target[k] for k in _TARGET_KEYS if k in target},
        )
        for policy in target["policies"].values():
            autoscaling.put_scaling_policy(ServiceNamespace=NAMESPACE, ResourceId=resource_id,
                                           ScalableDimension=DIMENSION, **policy)  # fmt: skip


def wait_in_service(
    sagemaker: Any, planned: Planned, *, timeout_s: float, poll_s: float, sleep: Callable[[float], None] = time.sleep
) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        status, types = running_instance_types(sagemaker, planned.endpoint_name)
        if status == "InService" and types == planned.instance_types:
            return
        if status == "Failed" or (status == "InService" and time.monotonic() > deadline):
            raise ChangeRefused(f"endpoint {planned.endpoint_name} is {status} with {types} after the deploy.")
        if time.monotonic() > deadline:
            raise ChangeRefused(f"endpoint {planned.endpoint_name} still {status} after {timeout_s:.0f} s.")
        sleep(poll_s)


def required_policy(endpoint_name: str, region: str, account: str) -> dict[str, Any]:
    """The identity policy this command needs (besides `cdk deploy`'s), for one endpoint.

    Application Auto Scaling checks, with the caller's permissions, what it will do on the caller's behalf
    (Application Auto Scaling user guide, "Identity-based policy examples": "Permissions required for API actions on
    target services and CloudWatch"): read and update the variant's capacity, and create and delete the
    target-tracking alarms (named ``TargetTracking-<resource id>-...``). Registering needs the service-linked role
    AWSServiceRoleForApplicationAutoScaling_SageMakerEndpoint, which exists once the stack has registered a target.
    """
    arn = f"arn:aws:sagemaker:{region}:{account}"
    endpoint = f"{arn}:endpoint/{endpoint_name.lower()}"
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "ReadTheEndpoint", "Effect": "Allow",
             "Action": ["sagemaker:DescribeEndpoint", "sagemaker:DescribeEndpointConfig"],
             "Resource": [endpoint, f"{arn}:endpoint-config/*"]},
            {"Sid": "ReadAndChangeItsScaling", "Effect": "Allow",
             "Action": [f"application-autoscaling:{action}" for action in (
                 "DescribeScalableTargets", "DescribeScalingPolicies", "RegisterScalableTarget",
                 "DeregisterScalableTarget", "PutScalingPolicy", "DeleteScalingPolicy")],
             "Resource": "*"},
            {"Sid": "WhatAutoScalingDoesForTheCaller", "Effect": "Allow",
             "Action": "sagemaker:UpdateEndpointWeightsAndCapacities", "Resource": endpoint},
            {"Sid": "TargetTrackingAlarms", "Effect": "Allow",
             "Action": ["cloudwatch:PutMetricAlarm", "cloudwatch:DeleteAlarms"],
             "Resource": f"arn:aws:cloudwatch:{region}:{account}:alarm:TargetTracking-endpoint/{endpoint_name}/*"},
            {"Sid": "DescribeAlarms", "Effect": "Allow", "Action": "cloudwatch:DescribeAlarms", "Resource": "*"},
        ],
    }  # fmt: skip


def change_instance_type(
    planned: Planned,
    clients: Callable[[str], Any],
    deploy: Callable[[Planned], int],
    *,
    state_file: Path,
    timeout_s: float = 3600.0,
    poll_s: float = 30.0,
    log: Callable[[str], None] = print,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Steps 1-5 of the module docstring; 0 when the endpoint runs the new type with its scaling back."""
    sagemaker, autoscaling = clients("sagemaker"), clients("application-autoscaling")
    status, running = running_instance_types(sagemaker, planned.endpoint_name)
    if running == planned.instance_types:
        log(f"{planned.endpoint_name} already runs {running}: nothing to change (a plain `cdk deploy` works).")
        return 0
    if status != "InService":
        raise ChangeRefused(f"endpoint {planned.endpoint_name} is {status}: wait until it is InService.")
    saved = registered_scaling(autoscaling, list(planned.scaling))
    if _comparable(saved) != _comparable(planned.scaling):
        raise ChangeRefused(
            f"the deploy would also change the scaling of {planned.endpoint_name} (registered {saved}, synthesized "
            f"{planned.scaling}): deploy the scaling change first, then the instance type in a deploy of its own."
        )
    state_file.write_text(json.dumps(saved, indent=2))
    log(f"{planned.endpoint_name}: {running} -> {planned.instance_types}; scaling saved to {state_file}")
    deregister(autoscaling, saved)
    log(f"deregistered {', '.join(saved) or 'no scalable target'}; deploying {planned.stack_path}")
    try:
        code = deploy(planned)
        if code != 0:
            raise ChangeRefused(f"the deploy of {planned.stack_path} exited {code}; the endpoint keeps its old type.")
        wait_in_service(sagemaker, planned, timeout_s=timeout_s, poll_s=poll_s, sleep=sleep)
    finally:
        register(autoscaling, saved)
        log(f"registered {', '.join(saved) or 'no scalable target'} again with its policies")
    log(f"{planned.endpoint_name} runs {planned.instance_types}, autoscaled as before.")
    return 0


def cdk_deploy(cdk_out: Path) -> Callable[[Planned], int]:
    def deploy(planned: Planned) -> int:
        command = ["cdk", "deploy", "--app", str(cdk_out), planned.stack_path, "--require-approval", "never"]
        print("$ " + shlex.join(command), flush=True)
        return subprocess.run(command, check=False).returncode

    return deploy


def main(argv: list[str] | None = None, *, session: Any = None) -> int:
    parser = argparse.ArgumentParser(prog="pytorch-platform change-endpoint-instance",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument("--env", required=True, help="environment (a stage of the cloud assembly), e.g. dev")
    parser.add_argument("--endpoint", choices=sorted(ENDPOINT_STACKS), default="graviton")
    parser.add_argument("--cdk-out", type=Path, default=Path("cdk.out"), help="cloud assembly with the new type")
    parser.add_argument("--region", help="AWS region (default: the environment's in the cloud assembly)")
    parser.add_argument("--state-file", type=Path, help="restore point (default: <endpoint name>-scaling.json)")
    parser.add_argument("--restore", type=Path, metavar="STATE_FILE", help="only register the saved scaling again")
    parser.add_argument("--dry-run", action="store_true", help="say what would change, change nothing")
    parser.add_argument("--print-policy", action="store_true", help="print the IAM policy this command needs")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait for InService")
    args = parser.parse_args(argv)
    try:
        planned = planned_endpoint(args.cdk_out, args.env, args.endpoint)
        stack = next(s for s in load_assembly(args.cdk_out) if s.stack_name == planned.stack_name)
        region = args.region or stack.region
        if session is None:
            import boto3

            session = boto3.session.Session(region_name=region)
        if args.print_policy:
            account = session.client("sts").get_caller_identity()["Account"]
            print(json.dumps(required_policy(planned.endpoint_name, session.region_name, account), indent=2))
            return 0
        if args.restore:
            register(session.client("application-autoscaling"), json.loads(args.restore.read_text()))
            print(f"registered the scaling of {args.restore} again")
            return 0
        if args.dry_run:
            status, running = running_instance_types(session.client("sagemaker"), planned.endpoint_name)
            print(f"{planned.endpoint_name} ({status}): {running} -> {planned.instance_types}")
            return 0
        state_file = args.state_file or Path(f"{planned.endpoint_name}-scaling.json")
        return change_instance_type(planned, session.client, cdk_deploy(args.cdk_out), state_file=state_file,
                                    timeout_s=args.timeout)  # fmt: skip
    except ChangeRefused as refused:
        print(f"error: {refused}", file=sys.stderr)
        return 1
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
