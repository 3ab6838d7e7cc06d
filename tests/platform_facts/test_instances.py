"""Instance facts against the publishers' own pages, written here from the pages (not from instances.json).

EC2 specifications: https://docs.aws.amazon.com/ec2/latest/instancetypes/ac.html (accelerated computing: instance
type, vCPUs, memory GiB, accelerators; "Instance store specifications"; "Network specifications": network cards,
EFA), gp.html (general purpose), co.html (compute optimized), mo.html (memory optimized), pg.html (previous
generation: p3). GPU compute capability: https://developer.nvidia.com/cuda-gpus and
https://developer.nvidia.com/cuda-legacy-gpus (V100). SageMaker's offer: https://aws.amazon.com/sagemaker/pricing/
(On-Demand tables "Real-Time Inference" and "Training").
"""

from __future__ import annotations

import pytest

from platform_facts import refresh_instances
from platform_facts.instances import (
    INSTANCES_FILE,
    UnknownInstanceType,
    has_local_nvme,
    instance_type,
)

GIB = 1024  # MiB
# type: (architecture, vCPUs, memory GiB, accelerator (name, count) or None, NVMe instance store, network cards, EFA)
AWS_SPECIFICATIONS = {
    "p4d.24xlarge": ("x86_64", 96, 1152, ("A100", 8), True, 4, True),
    "p5.48xlarge": ("x86_64", 192, 2048, ("H100", 8), True, 32, True),
    "p5en.48xlarge": ("x86_64", 192, 2048, ("H200", 8), True, 16, True),
    "p6-b200.48xlarge": ("x86_64", 192, 2048, ("B200", 8), True, 8, True),
    "p3dn.24xlarge": ("x86_64", 96, 768, ("V100", 8), True, 1, True),
    "p3.2xlarge": ("x86_64", 8, 61, ("V100", 1), False, 1, False),  # "EBS only"
    "p3.16xlarge": ("x86_64", 64, 488, ("V100", 8), False, 1, False),
    "g4dn.xlarge": ("x86_64", 4, 16, ("T4", 1), True, 1, False),
    "g5.xlarge": ("x86_64", 4, 16, ("A10G", 1), True, 1, False),
    "g5.12xlarge": ("x86_64", 48, 192, ("A10G", 4), True, 1, True),
    "g6e.xlarge": ("x86_64", 4, 32, ("L40S", 1), True, 1, False),
    "g6e.48xlarge": ("x86_64", 192, 1536, ("L40S", 8), True, 4, True),
    "trn1.32xlarge": ("x86_64", 128, 512, ("Trainium", 16), True, 8, True),
    "inf2.xlarge": ("x86_64", 4, 16, ("Inferentia2", 1), False, 1, False),
    "c5.2xlarge": ("x86_64", 8, 16, None, False, 1, False),
    "c5d.large": ("x86_64", 2, 4, None, True, 1, False),
    "c6gd.large": ("arm64", 2, 4, None, True, 1, False),
    "c7g.4xlarge": ("arm64", 16, 32, None, False, 1, False),
    "m5.xlarge": ("x86_64", 4, 16, None, False, 1, False),
    "m5d.large": ("x86_64", 2, 8, None, True, 1, False),
    "r5d.large": ("x86_64", 2, 16, None, True, 1, False),
    "r6g.xlarge": ("arm64", 4, 32, None, False, 1, False),
}
# NVIDIA's compute capability of each GPU (A10G is AWS's A10).
CAPABILITY = {"V100": (7, 0), "T4": (7, 5), "A100": (8, 0), "A10G": (8, 6), "L40S": (8, 9), "H100": (9, 0),
              "H200": (9, 0), "B200": (10, 0)}  # fmt: skip
# (ml. type, hosting, training) as the SageMaker pricing page lists them.
SAGEMAKER_OFFER = [
    ("ml.c7g.4xlarge", True, False),
    ("ml.c5.2xlarge", True, True),
    ("ml.p4d.24xlarge", True, True),
    ("ml.g5.2xlarge", True, True),
    ("ml.p3dn.24xlarge", False, True),
]


@pytest.mark.parametrize("name", AWS_SPECIFICATIONS)
def test_each_type_has_aws_specifications(name: str) -> None:
    architecture, vcpus, memory_gib, accelerator, nvme, cards, efa = AWS_SPECIFICATIONS[name]
    for spelled in (name, f"ml.{name}"):
        facts = instance_type(spelled)
        assert (facts.name, facts.family) == (name, name.split(".")[0])
        assert (facts.architecture, facts.vcpus, facts.memory_mib) == (architecture, vcpus, memory_gib * GIB)
        assert (facts.accelerator and (facts.accelerator.name, facts.accelerator.count)) == (accelerator or None)
        assert (facts.local_nvme, facts.network_cards, facts.efa) == (nvme, cards, efa)
        assert has_local_nvme(spelled) is nvme


@pytest.mark.parametrize("name", [n for n, spec in AWS_SPECIFICATIONS.items() if spec[3]])
def test_nvidia_gpus_carry_their_compute_capability(name: str) -> None:
    gpu_name = AWS_SPECIFICATIONS[name][3][0]
    gpu = instance_type(name).gpu
    if gpu_name in CAPABILITY:
        assert gpu is not None and gpu.maker == "NVIDIA" and gpu.compute_capability == CAPABILITY[gpu_name]
    else:  # Trainium and Inferentia are accelerators, not CUDA GPUs
        assert gpu is None and instance_type(name).accelerator is not None


@pytest.mark.parametrize(("name", "hosting", "training"), SAGEMAKER_OFFER)
def test_where_sagemaker_offers_the_type(name: str, hosting: bool, training: bool) -> None:
    facts = instance_type(name)
    assert (facts.offered("hosting"), facts.offered("training")) == (hosting, training)


def test_burstable_types_are_marked() -> None:
    # gp.html: T2 and T3 are "burstable performance instances".
    assert instance_type("ml.t2.medium").burstable and not instance_type("ml.m5.large").burstable


def test_an_unknown_type_is_refused_with_the_file_to_extend() -> None:
    with pytest.raises(UnknownInstanceType, match=r"'ml\.x9\.large' is not in .*platform_facts/instances\.json"):
        instance_type("ml.x9.large")


def test_the_table_is_what_the_refresh_builds_from_aws_data() -> None:
    """The file equals what refresh_instances builds from DescribeInstanceTypes (moto's copy) and botocore's enums:
    nobody edited a fact by hand, and a moto or botocore upgrade that changes a fact shows up here."""
    assert INSTANCES_FILE.read_text() == refresh_instances.render(refresh_instances.build())
