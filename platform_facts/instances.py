"""The one table of EC2 and SageMaker instance facts that every instance rule reads (``instances.json``, sources
cited there, rebuilt by ``refresh_instances.py``).

What the rules take from it:

* local NVMe: SageMaker refuses a KMS key for the instance's volume (``VolumeKmsKeyId`` of a training job,
  ``KmsKeyId`` of an endpoint config: "You can't request a VolumeKmsKeyId when using an instance type with local
  storage"), so the endpoints and ``@remote`` jobs leave it out for those types;
* the GPU and its compute capability: which CUDA images and precisions a training type can run;
* network cards and EFA: how many EFA interfaces a multi-node launch template attaches;
* vCPUs and memory: serving workers and threads, alarm thresholds, the multi-model sizing;
* architecture and SageMaker's offer (hosting, training) and burstable: which types settings accept where.

Names are EC2's (``p4d.24xlarge``) or SageMaker's (``ml.p4d.24xlarge``): an ``ml.`` type has the EC2 type's hardware.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

INSTANCES_FILE = Path(__file__).with_name("instances.json")
SAGEMAKER_PREFIX = "ml."
# bf16 tensor cores start with Ampere (compute capability 8.0): https://developer.nvidia.com/cuda-gpus
BF16_MIN_COMPUTE_CAPABILITY = (8, 0)
# "CUDA 13.0 supports all NVIDIA architectures from Turing through Grace Blackwell" (Volta, 7.0, is dropped):
# https://docs.nvidia.com/cuda/cuda-features-archive/index.html (CUDA 13.0 Features, General CUDA)
CUDA13_MIN_COMPUTE_CAPABILITY = (7, 5)

SageMakerUse = Literal["hosting", "training"]


class UnknownInstanceType(ValueError):
    """A type the table does not hold; the message names the file to extend."""


@dataclass(frozen=True)
class Accelerator:
    maker: str  # NVIDIA, AWS (Trainium, Inferentia), Habana
    name: str  # A100, H100, Trainium, ...
    count: int  # per instance
    compute_capability: tuple[int, int] | None  # NVIDIA GPUs only

    @property
    def capability_text(self) -> str:
        return "" if self.compute_capability is None else "{}.{}".format(*self.compute_capability)


@dataclass(frozen=True)
class InstanceType:
    name: str  # the EC2 name, p4d.24xlarge
    family: str  # p4d
    architecture: Literal["x86_64", "arm64"]
    vcpus: int
    memory_mib: int
    accelerator: Accelerator | None
    local_nvme: bool
    network_cards: int
    efa: bool
    burstable: bool
    sagemaker: frozenset[SageMakerUse]  # where SageMaker offers ml.<name>

    @property
    def gpu(self) -> Accelerator | None:
        """The NVIDIA GPU (the one CUDA runs on), None for other accelerators or none."""
        return self.accelerator if self.accelerator and self.accelerator.maker == "NVIDIA" else None

    @property
    def sagemaker_name(self) -> str:
        return SAGEMAKER_PREFIX + self.name

    def offered(self, use: SageMakerUse) -> bool:
        return use in self.sagemaker


def family_of(instance_type: str) -> str:
    """``ml.p4d.24xlarge`` or ``p4d.24xlarge`` -> ``p4d``."""
    return instance_type.removeprefix(SAGEMAKER_PREFIX).split(".")[0]


@cache
def _raw(path: Path = INSTANCES_FILE) -> dict[str, Any]:
    raw: dict[str, Any] = json.loads(path.read_text())
    return raw


@cache
def instance_types() -> dict[str, InstanceType]:
    """Every type of the table by EC2 name."""
    raw = _raw()
    capabilities = raw["compute_capability"]
    table = {}
    for name, facts in raw["types"].items():
        accelerator = None
        if facts["accelerator"]:
            maker, model, count = facts["accelerator"]
            capability = capabilities.get(model) if maker == "NVIDIA" else None
            major, _, minor = (capability or "").partition(".")
            accelerator = Accelerator(maker, model, count, (int(major), int(minor)) if capability else None)
        table[name] = InstanceType(
            name=name,
            family=family_of(name),
            architecture=facts["architecture"],
            vcpus=facts["vcpus"],
            memory_mib=facts["memory_mib"],
            accelerator=accelerator,
            local_nvme=facts["local_nvme"],
            network_cards=facts["network_cards"],
            efa=facts["efa"],
            burstable=facts["burstable"],
            sagemaker=frozenset(facts["sagemaker"]),
        )
    return table


def lookup(instance_type: str) -> InstanceType | None:
    """The facts of an EC2 or ``ml.`` type, None when the table does not hold it."""
    return instance_types().get(instance_type.removeprefix(SAGEMAKER_PREFIX))


def instance_type(name: str) -> InstanceType:
    """The facts of an EC2 or ``ml.`` type; :class:`UnknownInstanceType` when the table does not hold it."""
    facts = lookup(name)
    if facts is None:
        raise UnknownInstanceType(
            f"{name!r} is not in the platform's instance facts (platform_facts/{INSTANCES_FILE.name}); "
            "add it with python -m platform_facts.refresh_instances"
        )
    return facts


def has_local_nvme(name: str) -> bool:
    """True when the type has NVMe instance storage, so SageMaker refuses a KMS key for its volume."""
    return instance_type(name).local_nvme


def gpu_families() -> dict[str, Accelerator]:
    """Each family with an NVIDIA GPU and that GPU (one model per family), in the table's order."""
    families: dict[str, Accelerator] = {}
    for facts in instance_types().values():
        if facts.gpu is not None:
            families.setdefault(facts.family, facts.gpu)
    return families


def names_where(predicate: Any, *, sagemaker: bool = False) -> list[str]:
    """Type names (``ml.`` names with ``sagemaker``) whose facts satisfy ``predicate``, in the table's order."""
    return [f.sagemaker_name if sagemaker else f.name for f in instance_types().values() if predicate(f)]
