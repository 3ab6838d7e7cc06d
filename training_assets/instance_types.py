"""What a SageMaker training instance type implies for a job's request.

No dependencies, so the TrainingStack (which writes ``config.yaml``) and ``remote_train`` (which may override the
config's instance type at call time) share one rule.
"""

from __future__ import annotations

import re

# GPU families SageMaker trains on: a job on one of them runs one process per GPU under torchrun.
GPU_FAMILIES = ("p3", "p3dn", "p4d", "p4de", "p5", "p5e", "p5en", "p6-b200", "g4dn", "g5", "g6", "g6e")
# Families whose instances carry NVMe instance-store volumes although their name has no "d" attribute letter
# (EC2 User Guide, "Instance store volumes": g5, g6, g6e, p5, p5e, p5en, p6-b200; trn1/trn2 likewise).
_NVME_WITHOUT_D = ("g5", "g6", "g6e", "p5", "p5e", "p5en", "p6-b200", "trn1", "trn1n", "trn2")
# <letters><generation>[attribute letters]: the "d" attribute marks instance storage (c5d, m5dn, g4dn, p3dn, p4d).
_FAMILY = re.compile(r"^(?P<series>[a-z]+)(?P<generation>\d+)(?P<attributes>[a-z-]*)")


def family(instance_type: str) -> str:
    """``ml.p4d.24xlarge`` -> ``p4d``."""
    parts = instance_type.split(".")
    if len(parts) != 3 or parts[0] != "ml":
        raise ValueError(f"{instance_type!r} is not a SageMaker instance type such as ml.g5.2xlarge")
    return parts[1]


def has_instance_storage(instance_type: str) -> bool:
    """True when the type has local NVMe storage, so SageMaker refuses a ``VolumeKmsKeyId`` for it.

    CreateTrainingJob, ``ResourceConfig.VolumeKmsKeyId``: "Certain Nitro-based instances include local storage
    ... encrypted using a hardware module on the instance. You can't request a VolumeKmsKeyId when using an
    instance type with local storage." p3 (EBS only) takes a key; p3dn, p4d, g4dn, g5, ... do not.
    """
    name = family(instance_type)
    if name in _NVME_WITHOUT_D:
        return True
    match = _FAMILY.match(name)
    return bool(match and "d" in match["attributes"].split("-")[0])


def is_gpu(instance_type: str) -> bool:
    return family(instance_type) in GPU_FAMILIES
