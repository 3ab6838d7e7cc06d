"""Rebuild ``instances.json`` from AWS's own published data: ``python -m platform_facts.refresh_instances``.

* EC2 facts: the DescribeInstanceTypes answers that moto ships (``moto/ec2/resources/instance_types.json.gz``, moto
  as pinned in requirements-dev.txt): vCPUs, memory, architecture, accelerators, instance storage, network cards,
  EFA, burstable.
* SageMaker: the instance-type enums of botocore's SageMaker service model (``ProductionVariantInstanceType`` for
  hosting, ``TrainingInstanceType`` for training jobs), botocore as pinned.
* Types DescribeInstanceTypes no longer returns (previous generation) come from ``PREVIOUS_GENERATION`` below, copied
  from AWS's "Previous generation instances" specifications page.
* GPU compute capabilities: NVIDIA's tables, ``COMPUTE_CAPABILITY`` below.

The table holds every size (bare metal aside) of every family that SageMaker hosts or trains on, plus
``EXTRA_FAMILIES``. Only development needs moto and botocore: synth reads the JSON file.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any

from platform_facts.instances import INSTANCES_FILE

# https://developer.nvidia.com/cuda-gpus (RTX PRO 4500/6000 Blackwell Server Edition 12.0, B300 10.3, B200 10.0,
# H100/H200 9.0, L4/L40S 8.9, A10 8.6, A100 8.0) and https://developer.nvidia.com/cuda-legacy-gpus (V100 7.0,
# T4 7.5, K80 3.7). AWS's A10G is NVIDIA's A10; "RTX PRO Server 6000" and "RTX PRO 4500" are AWS's names for the
# Blackwell Server Editions.
COMPUTE_CAPABILITY = {
    "K80": "3.7", "V100": "7.0", "T4": "7.5", "A100": "8.0", "A10G": "8.6", "L4": "8.9",
    "L40S": "8.9", "H100": "9.0", "H200": "9.0", "B200": "10.0", "B300": "10.3", "RTX PRO 4500": "12.0",
    "RTX PRO Server 6000": "12.0",
}  # fmt: skip
# Families whose rules this platform names besides SageMaker's (mme_sizing plans the Graviton 7 and NVMe variants).
EXTRA_FAMILIES = ("c6gd", "c7gd", "m7g", "m7gd", "r7g", "c6gn")
# https://docs.aws.amazon.com/ec2/latest/instancetypes/pg.html (previous generation: accelerated computing, instance
# store and network specifications) and https://aws.amazon.com/ec2/instance-types/dl1/ for dl1.
PREVIOUS_GENERATION: dict[str, dict[str, Any]] = {
    "p2.xlarge": {"vcpus": 4, "memory_mib": 62464, "accelerator": ["NVIDIA", "K80", 1]},
    "p2.8xlarge": {"vcpus": 32, "memory_mib": 499712, "accelerator": ["NVIDIA", "K80", 8]},
    "p2.16xlarge": {"vcpus": 64, "memory_mib": 749568, "accelerator": ["NVIDIA", "K80", 16]},
    "p3.2xlarge": {"vcpus": 8, "memory_mib": 62464, "accelerator": ["NVIDIA", "V100", 1]},
    "p3.8xlarge": {"vcpus": 32, "memory_mib": 249856, "accelerator": ["NVIDIA", "V100", 4]},
    "p3.16xlarge": {"vcpus": 64, "memory_mib": 499712, "accelerator": ["NVIDIA", "V100", 8]},
    "dl1.24xlarge": {
        "vcpus": 96, "memory_mib": 786432, "accelerator": ["Habana", "Gaudi", 8], "local_nvme": True,
        "network_cards": 4, "efa": True,
    },
}  # fmt: skip


def _accelerator(ec2: dict[str, Any]) -> list[Any] | None:
    kinds = (("GpuInfo", "Gpus"), ("NeuronInfo", "NeuronDevices"), ("InferenceAcceleratorInfo", "Accelerators"))
    for info, devices in kinds:
        for device in ec2.get(info, {}).get(devices, []):
            return [device.get("Manufacturer", "AWS"), device["Name"], device["Count"]]
    return None


def _from_ec2(ec2: dict[str, Any]) -> dict[str, Any]:
    network = ec2["NetworkInfo"]
    return {
        "architecture": "arm64" if "arm64" in ec2["ProcessorInfo"]["SupportedArchitectures"] else "x86_64",
        "vcpus": ec2["VCpuInfo"]["DefaultVCpus"],
        "memory_mib": ec2["MemoryInfo"]["SizeInMiB"],
        "accelerator": _accelerator(ec2),
        "local_nvme": bool(ec2.get("InstanceStorageSupported"))
        and ec2.get("InstanceStorageInfo", {}).get("NvmeSupport") in ("required", "supported"),
        "network_cards": network.get("MaximumNetworkCards", 1),
        "efa": bool(network.get("EfaSupported")),
        "burstable": bool(ec2.get("BurstablePerformanceSupported")),
    }


def build() -> dict[str, Any]:
    import botocore.session
    import moto

    with gzip.open(Path(moto.__file__).parent / "ec2" / "resources" / "instance_types.json.gz") as stream:
        described: dict[str, Any] = json.load(stream)
    model = botocore.session.get_session().get_service_model("sagemaker")
    offered = {
        use: {name.removeprefix("ml.") for name in model.shape_for(shape).enum}
        for use, shape in (("hosting", "ProductionVariantInstanceType"), ("training", "TrainingInstanceType"))
    }
    families = {name.split(".")[0] for names in offered.values() for name in names} | set(EXTRA_FAMILIES)
    types: dict[str, dict[str, Any]] = {}
    for name, ec2 in described.items():
        if name.split(".")[0] in families and not name.endswith(".metal") and "metal-" not in name:
            types[name] = _from_ec2(ec2)
    for name, facts in PREVIOUS_GENERATION.items():
        defaults = {"architecture": "x86_64", "local_nvme": False, "network_cards": 1, "efa": False, "burstable": False}
        merged = {**defaults, **facts}
        types[name] = {key: merged[key] for key in _from_ec2(described["c5.large"])}  # the same key order
    for name, facts in types.items():
        facts["sagemaker"] = [use for use in ("hosting", "training") if name in offered[use]]
    gpus = sorted({f["accelerator"][1] for f in types.values() if f["accelerator"] and f["accelerator"][0] == "NVIDIA"})
    if missing := [gpu for gpu in gpus if gpu not in COMPUTE_CAPABILITY]:
        raise SystemExit(f"add the compute capability of {', '.join(missing)} to COMPUTE_CAPABILITY")
    return {
        "_source": (
            "Generated by platform_facts/refresh_instances.py (its docstring says how). EC2: DescribeInstanceTypes "
            "(VCpuInfo.DefaultVCpus, MemoryInfo.SizeInMiB, ProcessorInfo.SupportedArchitectures, GpuInfo/NeuronInfo, "
            "InstanceStorageInfo.NvmeSupport, NetworkInfo.MaximumNetworkCards and EfaSupported, "
            "BurstablePerformanceSupported) as moto 5.2.5 ships it; previous-generation p2, p3 and dl1 from "
            "https://docs.aws.amazon.com/ec2/latest/instancetypes/pg.html and "
            "https://aws.amazon.com/ec2/instance-types/dl1/. "
            "SageMaker: the ProductionVariantInstanceType (hosting) and TrainingInstanceType (training) enums of "
            "botocore 1.44.18's SageMaker service model; an ml.<type> has the hardware of the EC2 <type>. Compute "
            "capability: https://developer.nvidia.com/cuda-gpus and https://developer.nvidia.com/cuda-legacy-gpus."
        ),
        "compute_capability": {gpu: COMPUTE_CAPABILITY[gpu] for gpu in gpus},
        "types": dict(sorted(types.items())),
    }


def render(table: dict[str, Any]) -> str:
    """One type per line, so that a refresh reads as a short diff."""
    lines = ["{", f' "_source": {json.dumps(table["_source"])},']
    lines.append(f' "compute_capability": {json.dumps(table["compute_capability"])},')
    lines.append(' "types": {')
    rows = [f"  {json.dumps(name)}: {json.dumps(facts)}" for name, facts in table["types"].items()]
    lines.append(",\n".join(rows))
    lines += [" }", "}"]
    return "\n".join(lines) + "\n"


def main() -> int:
    INSTANCES_FILE.write_text(render(build()))
    print(f"wrote {INSTANCES_FILE}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
