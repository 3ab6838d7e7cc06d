"""Facts of EC2 and SageMaker instance families that rules depend on (``instances.json``, sources cited there).

Local NVMe decides whether SageMaker takes a KMS key for the instance's volume (``VolumeKmsKeyId`` of a training job,
``KmsKeyId`` of an endpoint config: "You can't request a VolumeKmsKeyId when using an instance type with local
storage"); a GPU's compute capability decides which CUDA images and precisions can run on it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

INSTANCES_FILE = Path(__file__).with_name("instances.json")
# bf16 tensor cores start with Ampere (compute capability 8.0): https://developer.nvidia.com/cuda-gpus
BF16_MIN_COMPUTE_CAPABILITY = (8, 0)
# "CUDA 13.0 supports all NVIDIA architectures from Turing through Grace Blackwell" (Volta, 7.0, is dropped):
# https://docs.nvidia.com/cuda/cuda-features-archive/index.html (CUDA 13.0 Features, General CUDA)
CUDA13_MIN_COMPUTE_CAPABILITY = (7, 5)
# <letters><generation>[attribute letters]: the "d" attribute marks instance storage (c5d, m5dn, c6gdn, g4dn, p3dn).
_FAMILY = re.compile(r"^(?P<series>[a-z]+)(?P<generation>\d+)(?P<attributes>[a-z-]*)")


@dataclass(frozen=True)
class GpuFact:
    family: str
    gpu: str
    compute_capability: tuple[int, int]

    @property
    def capability_text(self) -> str:
        return f"{self.compute_capability[0]}.{self.compute_capability[1]}"


@cache
def _raw(path: Path = INSTANCES_FILE) -> dict[str, Any]:
    raw: dict[str, Any] = json.loads(path.read_text())
    return raw


def instance_family(instance_type: str) -> str:
    """``ml.p4d.24xlarge`` or ``p4d.24xlarge`` -> ``p4d``."""
    return instance_type.removeprefix("ml.").split(".")[0]


def has_local_nvme(instance_type: str) -> bool:
    """True when the type (EC2 or ``ml.`` SageMaker name) has NVMe instance-store volumes."""
    family = instance_family(instance_type)
    if family in _raw()["nvme_without_d_letter"]:
        return True
    match = _FAMILY.match(family)
    return bool(match and "d" in match["attributes"].split("-")[0])


@cache
def gpu_families() -> dict[str, GpuFact]:
    facts = {}
    for family, entry in _raw()["gpu_families"].items():
        major, _, minor = entry["compute_capability"].partition(".")
        facts[family] = GpuFact(family, entry["gpu"], (int(major), int(minor)))
    return facts


def gpu_fact(instance_type: str) -> GpuFact | None:
    """The GPU of the type's family, None for a family without an NVIDIA GPU in the table."""
    return gpu_families().get(instance_family(instance_type))
