"""Rules AWS documents for these templates' properties that no other gate checks: each would pass cdk-nag, Control
Tower, cfn-lint and checkov and fail only when CloudFormation calls the service, minutes into a deploy. A gate of
`make synth` (scripts/template_gates.py) runs them over every template; each finding names its rule and source.

No CDK here: the rules read synthesized templates (plain JSON), so they hold for an assembly made elsewhere too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from platform_facts.instances import lookup as instance_facts


@dataclass(frozen=True)
class Rule:
    name: str
    source: str  # the AWS documentation that states it
    check: Callable[[dict[str, Any]], Iterator[tuple[str, str]]]  # template -> (logical id, what is wrong)


def _resources(template: dict[str, Any], kind: str) -> Iterator[tuple[str, dict[str, Any]]]:
    for logical_id, resource in template.get("Resources", {}).items():
        if resource.get("Type") == kind:
            yield logical_id, resource.get("Properties", {})


def _literal_int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | str) and str(value).lstrip("-").isdigit() else None


def _no_key_on_local_storage(template: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for logical_id, properties in _resources(template, "AWS::SageMaker::EndpointConfig"):
        if "KmsKeyId" not in properties:
            continue
        for variant in properties.get("ProductionVariants", []):
            facts = instance_facts(str(variant.get("InstanceType", "")))
            if facts is not None and facts.local_nvme:
                yield (
                    logical_id,
                    (
                        f"KmsKeyId with {variant['InstanceType']}, which has local NVMe storage: SageMaker refuses the "
                        "endpoint config; leave the key out for this type"
                    ),
                )


def _scalable_target_bounds(template: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for logical_id, properties in _resources(template, "AWS::ApplicationAutoScaling::ScalableTarget"):
        low, high = _literal_int(properties.get("MinCapacity")), _literal_int(properties.get("MaxCapacity"))
        if low is not None and high is not None and low > high:
            yield logical_id, f"MinCapacity {low} above MaxCapacity {high}"
        if properties.get("ServiceNamespace") == "sagemaker" and low is not None and low < 1:
            yield logical_id, f"MinCapacity {low}: a SageMaker variant's scalable target needs at least 1"


def _no_autoscaling_on_burstable(template: dict[str, Any]) -> Iterator[tuple[str, str]]:
    scaled = any(True for _ in _resources(template, "AWS::ApplicationAutoScaling::ScalableTarget"))
    if not scaled:
        return
    for logical_id, properties in _resources(template, "AWS::SageMaker::EndpointConfig"):
        for variant in properties.get("ProductionVariants", []):
            facts = instance_facts(str(variant.get("InstanceType", "")))
            if facts is not None and facts.burstable:
                yield logical_id, f"{variant['InstanceType']} is burstable and the stack autoscales it"


def _no_public_ip_with_several_cards(template: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for logical_id, properties in _resources(template, "AWS::EC2::LaunchTemplate"):
        interfaces = properties.get("LaunchTemplateData", {}).get("NetworkInterfaces", [])
        if len(interfaces) > 1 and any(i.get("AssociatePublicIpAddress") in (True, "true") for i in interfaces):
            yield logical_id, f"{len(interfaces)} network interfaces, one with AssociatePublicIpAddress"


RULES: tuple[Rule, ...] = (
    Rule(
        "sagemaker-endpoint-config-key-on-local-storage",
        "SageMaker API Reference, CreateEndpointConfig, KmsKeyId: an instance type with local (NVMe) storage "
        "cannot take a KmsKeyId (platform_facts/instances.json: local_nvme)",
        _no_key_on_local_storage,
    ),
    Rule(
        "autoscaling-target-bounds",
        "Application Auto Scaling API Reference, RegisterScalableTarget, MinCapacity and MaxCapacity: the minimum "
        "to scale in to and the maximum to scale out to; the minimum allowed is 0 only for the resources it lists "
        "(SageMaker inference components, not endpoint variants), 1 for all others",
        _scalable_target_bounds,
    ),
    Rule(
        "sagemaker-autoscaling-burstable",
        "SageMaker developer guide, 'Configure model auto scaling with the console': registering a variant checks "
        "that its instance type is not burstable (such as T2); SageMaker does not autoscale burstable instances",
        _no_autoscaling_on_burstable,
    ),
    Rule(
        "ec2-public-ip-several-network-cards",
        "EC2 API Reference, InstanceNetworkInterfaceSpecification, AssociatePublicIpAddress: a public IPv4 address "
        "goes to eth0 of a new interface, and not when the request specifies more than one network interface",
        _no_public_ip_with_several_cards,
    ),
)


def findings(template: dict[str, Any]) -> list[str]:
    """One line per rule a template breaks: '<logical id>: <what> (<rule>; <source>)'."""
    return [
        f"{logical_id}: {problem} ({rule.name}; {rule.source})"
        for rule in RULES
        for logical_id, problem in rule.check(template)
    ]
