"""What a SageMaker training instance type implies for a job's request.

The TrainingStack (which writes ``config.yaml``) and ``remote_train`` (which may override the config's instance type
at call time) share one rule, read from the platform's instance facts (platform_facts/instances.json). Those are
imported inside the functions: the ``@remote`` job's workspace holds only ``training_assets/``, and the job imports
this module (through remote_train) without ever calling these functions.
"""

from __future__ import annotations


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
    from platform_facts.instances import has_local_nvme

    family(instance_type)  # refuses what is not an ml. type
    return has_local_nvme(instance_type)


def is_gpu(instance_type: str) -> bool:
    from platform_facts.instances import gpu_fact

    family(instance_type)
    return gpu_fact(instance_type) is not None
