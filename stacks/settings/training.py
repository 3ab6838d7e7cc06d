"""The training area: the EC2 launch template's runs and the SageMaker ``@remote`` jobs, their hyperparameters, and
the rule that a GPU must run the training image (instance facts: platform_facts/instances.py; image facts:
platform_facts/images.py)."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from platform_facts.images import ImageFact, training_image
from platform_facts.instances import (
    BF16_MIN_COMPUTE_CAPABILITY,
    CUDA13_MIN_COMPUTE_CAPABILITY,
    InstanceType,
    gpu_families,
    lookup,
    names_where,
)
from stacks.settings.base import AccountId, StrictModel, families_where, instance_facts

# A @remote caller (training_assets/remote_jobs.py): lowercase, as SageMaker ARNs carry job names lowercased; no
# hyphen, so the job-name prefix "<caller>-" of one caller never begins another's ("nlp-" and "nlp-x-...").
_CALLER = re.compile(r"^[a-z][a-z0-9]{0,19}$")


def _gpu_training(facts: InstanceType) -> bool:
    return facts.gpu is not None


def _sagemaker_gpu_training(facts: InstanceType) -> bool:
    return facts.gpu is not None and facts.offered("training")


def sagemaker_gpu_training_types() -> list[str]:
    """The ml. types a @remote job may run on: those ``training.remote_instance_type`` accepts (the launcher policy
    allows exactly these; remote_train's --instance-type picks among them)."""
    return names_where(_sagemaker_gpu_training, sagemaker=True)


def gpu_runs_the_image(type_key: str, instance_type: str, tag_key: str, image: ImageFact, bf16: bool) -> None:
    """Refuse a GPU the training image or bf16 cannot use, naming the key and the families that can. The image's CUDA
    version is a fact of the image table (platform_facts/images.json), not read from its tag: the Amazon Linux 2023
    images' ``cu133`` is CUDA 13.3, and every CUDA 13 release runs on Turing (7.5) and newer, not on Volta (the V100 of
    p3): NVIDIA's CUDA 13.0 features ("all NVIDIA architectures from Turing through Grace Blackwell"); the torch of
    the 2.13 images is PyTorch's cu130 build (aws/deep-learning-containers docker/pytorch/2.13/cuda/pyproject.toml),
    whose wheels target 7.5 and newer (pytorch/pytorch#157517)."""
    facts = lookup(instance_type)
    gpu = facts.gpu if facts else None
    if facts is None or gpu is None or gpu.compute_capability is None:
        return
    capability = gpu.compute_capability
    cuda_major = image.training.cuda_major if image.training else None
    needs = [
        (minimum, why)
        for minimum, why, applies in (
            (CUDA13_MIN_COMPUTE_CAPABILITY, f"the CUDA {cuda_major} image of {tag_key}",
             cuda_major is not None and cuda_major >= 13),
            (BF16_MIN_COMPUTE_CAPABILITY, "training.hyperparameters.bf16", bf16),
        )
        if applies and capability < minimum
    ]  # fmt: skip
    if needs:
        minimum = max(need[0] for need in needs)
        allowed = ", ".join(
            family for family, gpu_of_family in gpu_families().items()
            if gpu_of_family.compute_capability and gpu_of_family.compute_capability >= minimum
        )  # fmt: skip
        bf16_only = [why for _, why in needs] == ["training.hyperparameters.bf16"]
        raise ValueError(
            f"{type_key}: {instance_type} has an NVIDIA {gpu.name} (compute capability {gpu.capability_text}), which "
            f"{' and '.join(why for _, why in needs)} cannot use; use a type of the families {allowed}"
            + (" or set training.hyperparameters.bf16 to false" if bf16_only else "")
        )


class HyperParameters(StrictModel):
    epochs: Annotated[int, Field(ge=1, le=100)] = 3
    per_device_batch_size: Annotated[int, Field(ge=1, le=1024)] = 32
    learning_rate: Annotated[float, Field(gt=0, lt=1)] = 2e-5
    max_seq_length: Annotated[int, Field(ge=8, le=512)] = 128
    seed: int = 42
    torch_compile: bool = True
    bf16: bool = True
    fused_adamw: bool = True
    global_batch_size: Annotated[int, Field(ge=1, le=65536)] | None = Field(
        default=None,
        description="Samples per optimizer step over every GPU of every node; each GPU takes an equal share, so the "
        "same settings take the same steps at the same learning rate on one node or several (batch_scaling.py). "
        "None: per_device_batch_size x the GPUs of one node, the global batch of a single-node run. Must be a "
        "multiple of training.nodes x GPUs per instance.",
    )


class TrainingSettings(StrictModel):
    """The p4d launch template (EC2) and the SageMaker ``@remote`` jobs (the SDK's remote function)."""

    instance_type: str = "p4d.24xlarge"
    nodes: Annotated[int, Field(ge=1, le=16)] = 1
    efa: bool = False
    root_volume_gib: Annotated[int, Field(ge=100, le=16384)] = 200
    dlami_ssm_parameter: str = (
        "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
    )
    image_tag: str = Field(
        default="2.13.0-cu133-amzn2023",
        description="The tag of the PyTorch GPU training DLC (EC2 flavour) the nodes' image extends: a training image "
        "of platform_facts/images.json, which says its repository, Python, CUDA and end of patching.",
    )
    # A hub id or an s3:// folder (save_pretrained output) in the datasets bucket.
    base_model: str = "cardiffnlp/twitter-roberta-base-sentiment-latest"
    # A hub dataset as NAME:CONFIG (or NAME), or an s3:// folder with train/validation files in the datasets bucket.
    dataset: str = "tweet_eval:sentiment"
    # Hard stop of an EC2 training run: the instance powers off (and terminates) after this many hours at most.
    max_run_hours: Annotated[int, Field(ge=1, le=168)] = 24
    # Launch EC2 runs into capacity bought ahead (p4d and p5 are often only available this way): an On-Demand Capacity
    # Reservation or a Capacity Block for ML by its id (cr-...), or any matching reservation of a Capacity Reservation
    # resource group (its ARN). The reservation's type, zone (training.subnet_index) and size must fit the run;
    # `pytorch-platform preflight` checks them.
    capacity_reservation_id: str | None = None
    capacity_reservation_resource_group_arn: str | None = None
    # capacity-block: the reservation is a Capacity Block for ML (EC2 launches into it only with this market type).
    market_type: Literal["on-demand", "capacity-block"] = "on-demand"
    hyperparameters: HyperParameters = HyperParameters()
    # The private subnet EC2 runs start in, by position in the Foundation's PrivateSubnetIds output (0 = first): pick
    # the one in a zone that offers instance_type (p4d is offered only in some zones). A position, not a zone id:
    # the VPC places its subnets by zone name at deploy and names map to zone ids differently per account, so only
    # a position can be checked at synth (README: GPU capacity).
    subnet_index: Annotated[int, Field(ge=0, le=15)] = 0
    remote_callers: Annotated[list[str], Field(min_length=1, max_length=20)] = Field(
        default=["mlteam"],
        description="The users or teams that run @remote jobs, each with its own job role, launcher policy, security "
        "group, S3 prefix (jobs/<caller>/), job names (<caller>-...) and config.yaml (training_assets/remote_jobs.py): "
        "no caller's jobs reach another's objects, jobs or logs. Each name: 1-20 lowercase letters and digits, "
        "starting with a letter.",
    )
    remote_instance_type: str = "ml.p4d.24xlarge"
    remote_image_tag: str = Field(
        default="2.13.0-cu133-amzn2023-sagemaker",
        description="The tag of the PyTorch GPU training DLC (SageMaker flavour) the @remote jobs run: a training "
        "image of platform_facts/images.json; the caller's Python must be the image's (remote_train checks it).",
    )
    image_registry_account: AccountId | None = Field(
        default=None,
        description="The tooling account whose promotion pipeline builds the training image "
        "(training_assets/image/Dockerfile): every EC2 node then pulls the digest the pipeline promoted to this "
        "environment (SSM parameter /<project>/images/training, read when the stack deploys). None: each node "
        "builds training_assets/instance/Dockerfile itself, with pip from PyPI.",
    )
    rendezvous_timeout_seconds: Annotated[int, Field(ge=30, le=3600)] = Field(
        default=600,
        description="How far apart the nodes of a multi-node EC2 run may start (image pull, data sync): the bound of "
        "the barrier before torchrun and of torchrun's c10d rendezvous. A node missing after it stops every node "
        "with one line naming it.",
    )
    max_restarts: Annotated[int, Field(ge=0, le=10)] = Field(
        default=2,
        description="torchrun --max-restarts: after a worker fails, every worker of the run restarts (at most this "
        "many times) and resumes from the newest complete checkpoint.",
    )
    checkpoint_steps: Annotated[int, Field(ge=0, le=1_000_000)] = Field(
        default=5000,
        description="A checkpoint every N optimizer steps (0: none), uploaded KMS-encrypted under the run's prefix "
        "of the artifacts bucket; a run launched again with the same run id resumes from the newest complete one. "
        "A p4d.24xlarge step of the default model takes 20-45 ms, so 5000 steps are a few minutes of work.",
    )
    collective_timeout_seconds: Annotated[int, Field(ge=60, le=3600)] = Field(
        default=300,
        description="Seconds a process waits in a collective (NCCL all-reduce, barrier) before the run fails: the "
        "survivors of a lost node stop after this instead of the Trainer's default 30 minutes. Must exceed the "
        "longest pause of a healthy run between two collectives (an evaluation, a checkpoint save); a step that "
        "compiles a new batch shape waits for the training script's own compile bound instead.",
    )

    @field_validator("instance_type")
    @classmethod
    def _gpu(cls, value: str) -> str:
        families = ", ".join(gpu_families())
        instance_facts(
            value, False, _gpu_training, f"must be an EC2 instance type with an NVIDIA GPU, of the families {families}"
        )
        return value

    @field_validator("remote_callers")
    @classmethod
    def _remote_callers(cls, value: list[str]) -> list[str]:
        for caller in value:
            if not _CALLER.fullmatch(caller):
                raise ValueError(f"{caller!r} must be 1-20 lowercase letters and digits, starting with a letter")
        if len(set(value)) != len(value):
            raise ValueError("each caller must be named once")
        return value

    @field_validator("remote_instance_type")
    @classmethod
    def _remote_gpu(cls, value: str) -> str:
        allowed = families_where(_sagemaker_gpu_training)
        message = f"must be a SageMaker training type (ml.) with an NVIDIA GPU, of the families {allowed}"
        instance_facts(value, True, _sagemaker_gpu_training, message)
        return value

    @field_validator("image_tag", "remote_image_tag")
    @classmethod
    def _training_image(cls, value: str, info: ValidationInfo) -> str:
        training_image(value, "ec2" if info.field_name == "image_tag" else "sagemaker")
        return value

    @property
    def image(self) -> ImageFact:
        """The EC2 nodes' training DLC (image_tag), from the image table: repository, Python, CUDA, patch window."""
        return training_image(self.image_tag, "ec2")

    @property
    def remote_image(self) -> ImageFact:
        """The @remote jobs' training DLC (remote_image_tag), from the image table."""
        return training_image(self.remote_image_tag, "sagemaker")

    @field_validator("base_model", "dataset")
    @classmethod
    def _source(cls, value: str, info: ValidationInfo) -> str:
        if value.startswith("s3://"):
            if not re.match(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[A-Za-z0-9!_.*'()/-]*)?$", value):
                raise ValueError("must be an s3://bucket/prefix/ folder URI")
            return value
        hub = r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?" + (r"(:[\w.-]+)?$" if info.field_name == "dataset" else "$")
        if not re.match(hub, value):
            example = "tweet_eval:sentiment" if info.field_name == "dataset" else "cardiffnlp/twitter-roberta-base"
            raise ValueError(f"must be an s3:// folder URI or a Hugging Face hub id such as {example}")
        return value

    @field_validator("dlami_ssm_parameter")
    @classmethod
    def _dlami(cls, value: str) -> str:
        if not value.startswith("/aws/service/deeplearning/ami/"):
            raise ValueError("must be a public DLAMI SSM parameter under /aws/service/deeplearning/ami/")
        return value

    @model_validator(mode="after")
    def _global_batch_divides(self) -> TrainingSettings:
        facts = lookup(self.instance_type)
        global_batch = self.hyperparameters.global_batch_size
        if global_batch is not None and facts is not None and facts.gpu is not None:
            devices = self.nodes * facts.gpu.count
            if global_batch % devices:
                raise ValueError(
                    f"hyperparameters.global_batch_size: {global_batch} must be a multiple of the {devices} "
                    f"GPUs of the run ({self.nodes} x {self.instance_type}), e.g. "
                    f"{max(1, global_batch // devices) * devices}"
                )
        return self

    @model_validator(mode="after")
    def _efa(self) -> TrainingSettings:
        facts = lookup(self.instance_type)
        if self.efa and facts is not None and not facts.efa:
            allowed = ", ".join(names_where(lambda f: f.efa and f.gpu is not None))
            raise ValueError(f"efa needs a GPU instance type with EFA ({allowed}), not {self.instance_type}")
        return self

    @field_validator("capacity_reservation_id")
    @classmethod
    def _reservation_id(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^cr-[0-9a-f]{17}$", value):
            raise ValueError("must be a Capacity Reservation id: cr- and 17 hexadecimal digits")
        return value

    @field_validator("capacity_reservation_resource_group_arn")
    @classmethod
    def _reservation_group(cls, value: str | None) -> str | None:
        pattern = r"^arn:aws(-[a-z]+)*:resource-groups:[a-z0-9-]+:\d{12}:group/[A-Za-z0-9_.-]{1,300}$"
        if value is not None and not re.match(pattern, value):
            raise ValueError("must be a resource group ARN, arn:aws:resource-groups:<region>:<account>:group/<name>")
        return value

    @model_validator(mode="after")
    def _capacity(self) -> TrainingSettings:
        if self.capacity_reservation_id and self.capacity_reservation_resource_group_arn:
            raise ValueError(
                "capacity_reservation_id and capacity_reservation_resource_group_arn: set one of them, not both"
            )
        if self.market_type == "capacity-block" and not self.capacity_reservation_id:
            raise ValueError(
                "market_type: capacity-block launches into one Capacity Block, so capacity_reservation_id must name it"
            )
        return self
