"""Instance facts against the publishers' own tables, written here from the pages (not from instances.json).

Local NVMe: the "Instance store specifications" tables of the EC2 instance-type guide,
https://docs.aws.amazon.com/ec2/latest/instancetypes/ac.html (accelerated computing), gp.html (general purpose),
co.html (compute optimized), mo.html (memory optimized). GPUs: the same accelerated-computing page; compute
capability: https://developer.nvidia.com/cuda-gpus and https://developer.nvidia.com/cuda-legacy-gpus (V100).
"""

from __future__ import annotations

import pytest

from platform_facts.instances import gpu_fact, gpu_families, has_local_nvme
from training_assets.instance_types import has_instance_storage, is_gpu

# Instance store: "NVMe SSD" rows of AWS's tables, one size per family.
NVME = ["p3dn.24xlarge", "p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge",
        "p6-b200.48xlarge", "g4dn.xlarge", "g5.xlarge", "g6.xlarge", "g6e.xlarge", "trn1.2xlarge", "trn1n.32xlarge",
        "m5dn.large", "r5dn.large", "c6gdn.large", "c5d.large", "c6gd.large", "m5d.large"]  # fmt: skip
# Instance store: "EBS only" rows.
EBS_ONLY = ["p3.2xlarge", "p3.16xlarge", "p2.xlarge", "inf2.xlarge", "c5.large", "c6g.large", "c7g.large",
            "m5.large", "m5n.large", "r5n.large", "c6gn.large", "g5g.xlarge"]  # fmt: skip
# The NVIDIA GPU of each family (AWS) and its compute capability (NVIDIA; A10G is AWS's A10).
GPU = {"p3": "V100", "p3dn": "V100", "g4dn": "T4", "p4d": "A100", "p4de": "A100", "g5": "A10G", "g6": "L4",
       "g6e": "L40S", "p5": "H100", "p5e": "H200", "p5en": "H200", "p6-b200": "B200"}  # fmt: skip
CAPABILITY = {"V100": (7, 0), "T4": (7, 5), "A100": (8, 0), "A10G": (8, 6), "L4": (8, 9), "L40S": (8, 9),
              "H100": (9, 0), "H200": (9, 0), "B200": (10, 0)}  # fmt: skip


@pytest.mark.parametrize("instance_type", NVME)
def test_types_with_instance_store_nvme(instance_type: str) -> None:
    assert has_local_nvme(instance_type) and has_local_nvme(f"ml.{instance_type}")
    assert has_instance_storage(f"ml.{instance_type}")  # the training jobs' VolumeKmsKeyId rule reads the same fact


@pytest.mark.parametrize("instance_type", EBS_ONLY)
def test_ebs_only_types(instance_type: str) -> None:
    assert not has_local_nvme(instance_type) and not has_local_nvme(f"ml.{instance_type}")
    assert not has_instance_storage(f"ml.{instance_type}")


@pytest.mark.parametrize(("family", "gpu"), GPU.items())
def test_gpu_and_compute_capability_of_each_family(family: str, gpu: str) -> None:
    fact = gpu_fact(f"ml.{family}.xlarge")
    assert fact is not None and (fact.gpu, fact.compute_capability) == (gpu, CAPABILITY[gpu])
    assert is_gpu(f"ml.{family}.xlarge")


def test_every_gpu_family_in_the_table_is_checked_here() -> None:
    assert set(gpu_families()) == set(GPU)
    assert gpu_fact("c5.large") is None and not is_gpu("ml.inf2.xlarge")
