"""Per-environment settings: cdk.json context -> one validated, typed object per environment.

Pydantic (not plain dataclasses) because it gives, from the type hints alone, exact type checks, unknown-key
rejection (``extra="forbid"``) and error locations (the path to the bad key); the few domain rules (GPU types,
Graviton types, min <= max) are validators next to the field they guard. ``SettingsError`` turns the first error
into one sentence that names the key and what is allowed, so a bad cdk.json stops ``cdk synth`` at the door.

This module is data and its validation only: instance rules read the platform's instance facts
(platform_facts/instances.py), training image tags the image table (platform_facts/images.py), serving limits and
names the serving contract (inference_assets/container/contract.py); what the settings turn into (container
environment, resources) is the stacks' business.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from inference_assets.container.contract import (
    INVOKE_TIMEOUT_S,
    STARTUP_TIMEOUT_S,
    DjlModelSettings,
    Limits,
    Precision,
    max_request_tokens_within_timeout,
    validate_model_name,
    worst_call_seconds,
)
from inference_assets.container.ray_settings import replicas_and_threads
from platform_facts.images import ImageFact, training_image
from platform_facts.instances import (
    BF16_MIN_COMPUTE_CAPABILITY,
    CUDA13_MIN_COMPUTE_CAPABILITY,
    InstanceType,
    gpu_families,
    lookup,
    names_where,
)

DEFAULT_REGION = "us-west-2"
# The prefix of the artifacts bucket that the endpoint execution role may read single-model archives from.
ENDPOINT_MODELS_PREFIX = "endpoints/"
ENVIRONMENT_NAMES = ("dev", "staging", "prod")

_ACCOUNT = re.compile(r"^\d{12}$")
_REGION = re.compile(r"^[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-\d$")
_TAG_VALUE = re.compile(r"^[\w .:/=+\-@]{1,256}$")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_S3_KEY = re.compile(r"^[A-Za-z0-9!_.*'()/-]+$")
_CONNECTION_ARN = re.compile(
    r"^arn:aws[a-z-]*:(codeconnections|codestar-connections):[a-z0-9-]+:\d{12}:connection/[0-9a-f-]{36}$"
)
_REPOSITORY = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
# A @remote caller (training_assets/remote_jobs.py): lowercase, as SageMaker ARNs carry job names lowercased; no
# hyphen, so the job-name prefix "<caller>-" of one caller never begins another's ("nlp-" and "nlp-x-...").
_CALLER = re.compile(r"^[a-z][a-z0-9]{0,19}$")
_BRANCH = re.compile(r"^(?!/)(?!.*(\.\.|//|@\{))[A-Za-z0-9._/-]+(?<![/.])$")


def _instance(value: str, ml: bool, rule: Any, message: str) -> InstanceType:
    """The facts of ``value`` when it is an EC2 (``ml=False``) or SageMaker name that ``rule`` accepts; else
    ValueError with ``message`` (which names the allowed types)."""
    facts = lookup(value) if value.startswith("ml.") is ml else None
    if facts is None or not rule(facts):
        raise ValueError(message)
    return facts


def _families(rule: Any) -> str:
    """The families with a type that ``rule`` accepts, for an error message."""
    return ", ".join(dict.fromkeys(name.split(".")[0] for name in names_where(rule)))


def _gpu_training(facts: InstanceType) -> bool:
    return facts.gpu is not None


def _sagemaker_gpu_training(facts: InstanceType) -> bool:
    return facts.gpu is not None and facts.offered("training")


def sagemaker_gpu_training_types() -> list[str]:
    """The ml. types a @remote job may run on: those ``training.remote_instance_type`` accepts (the launcher policy
    allows exactly these; remote_train's --instance-type picks among them)."""
    return names_where(_sagemaker_gpu_training, sagemaker=True)


def _autoscaled_hosting(facts: InstanceType) -> bool:
    return facts.offered("hosting") and not facts.burstable


def _graviton_hosting(facts: InstanceType) -> bool:
    return _autoscaled_hosting(facts) and facts.architecture == "arm64" and facts.accelerator is None


def _gpu_runs_the_image(type_key: str, instance_type: str, tag_key: str, image: ImageFact, bf16: bool) -> None:
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


def _matching(pattern: re.Pattern[str], message: str) -> AfterValidator:
    def check(value: str) -> str:
        if not pattern.match(value):
            raise ValueError(message)
        return value

    return AfterValidator(check)


def _limit(name: str) -> Any:
    """The contract's bounds of a request limit as a pydantic constraint."""
    low, high = Limits.BOUNDS[name]
    return Field(ge=low, le=high)


AccountId = Annotated[str, _matching(_ACCOUNT, "must be a 12-digit AWS account id in quotes")]
Region = Annotated[str, _matching(_REGION, "must be an AWS region code such as us-west-2")]


class SettingsError(ValueError):
    """A setting in cdk.json is wrong; the message names the key and what is allowed."""


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def _s3_key(value: str, *, prefix: bool) -> str:
    if value.startswith("/") or not _S3_KEY.match(value):
        raise ValueError("must be a relative S3 key of letters, digits and !_.*'()/- characters")
    if prefix and not value.endswith("/"):
        raise ValueError("must end with '/' (it is a prefix)")
    return value


class VpcSettings(_Settings):
    """Create a VPC (``cidr``, ``max_azs``) or import one from explicit ids (no lookups at synth time)."""

    # The subnets a created VPC gets in each of its max_azs zones (PlatformNetwork is given these): a private /20,
    # and, with NAT gateways, a public /24 that holds only them. AWS takes a VPC of /16 to /28 (VPC user guide,
    # "VPC CIDR blocks").
    PRIVATE_SUBNET_MASK: ClassVar[int] = 20
    PUBLIC_SUBNET_MASK: ClassVar[int] = 24
    LARGEST_PREFIX: ClassVar[int] = 16
    SMALLEST_PREFIX: ClassVar[int] = 28

    cidr: str = "10.40.0.0/16"
    max_azs: Annotated[int, Field(ge=1, le=3)] = 2
    nat_gateways: Annotated[int, Field(ge=0, le=4)] = 1
    flow_log_retention_days: Literal[7, 14, 30, 60, 90, 180, 365, 731] = 30
    vpc_id: str | None = None
    availability_zones: list[str] = []
    private_subnet_ids: list[str] = []

    @field_validator("cidr")
    @classmethod
    def _cidr(cls, value: str) -> str:
        try:
            network = ipaddress.IPv4Network(value)
        except ValueError:
            raise ValueError("must be an IPv4 CIDR block such as 10.40.0.0/16") from None
        if not VpcSettings.LARGEST_PREFIX <= network.prefixlen <= VpcSettings.SMALLEST_PREFIX:
            raise ValueError(
                f"must have a prefix length from /{VpcSettings.LARGEST_PREFIX} to /{VpcSettings.SMALLEST_PREFIX}"
            )
        return value

    @field_validator("vpc_id")
    @classmethod
    def _vpc_id(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^vpc-[0-9a-f]{8,17}$", value):
            raise ValueError("must look like vpc-0123456789abcdef0")
        return value

    @model_validator(mode="after")
    def _import_is_complete(self) -> VpcSettings:
        if self.vpc_id is None and (self.private_subnet_ids or self.availability_zones):
            raise ValueError("private_subnet_ids and availability_zones are only allowed together with vpc_id")
        if self.vpc_id is not None:
            if not self.private_subnet_ids or len(self.private_subnet_ids) != len(self.availability_zones):
                raise ValueError("an imported VPC needs private_subnet_ids and one availability_zones entry per subnet")
            for subnet in self.private_subnet_ids:
                if not re.match(r"^subnet-[0-9a-f]{8,17}$", subnet):
                    raise ValueError(f"private_subnet_ids entry {subnet!r} must look like subnet-0123456789abcdef0")
        return self

    @property
    def imported(self) -> bool:
        return self.vpc_id is not None

    def subnet_masks(self) -> list[int]:
        """The masks of the subnets a created VPC gets, in the order ec2.Vpc allocates them (public ones first)."""
        public = [self.PUBLIC_SUBNET_MASK] * self.max_azs if self.nat_gateways else []
        return public + [self.PRIVATE_SUBNET_MASK] * self.max_azs

    def largest_prefix_for_subnets(self) -> int:
        """The longest prefix (smallest VPC) that holds ``subnet_masks``, placed as ec2.Vpc places them: one after
        another, each on a boundary of its own size (aws-cdk-lib's NetworkBuilder), so a /20 after /24s starts at
        the next /20 boundary."""
        end = 0
        for mask in self.subnet_masks():
            size = 2 ** (32 - mask)
            end = -(-end // size) * size + size
        return 32 - (end - 1).bit_length()


class AutoscalingSettings(_Settings):
    """Target tracking on SageMakerVariantInvocationsPerInstance (invocations per instance per minute)."""

    min_capacity: Annotated[int, Field(ge=1)] = 1
    max_capacity: Annotated[int, Field(ge=1)] = 2
    target_invocations_per_instance: Annotated[int, Field(ge=1)] = 600
    scale_in_cooldown_seconds: Annotated[int, Field(ge=0, le=3600)] = 300
    scale_out_cooldown_seconds: Annotated[int, Field(ge=0, le=3600)] = 60

    @model_validator(mode="after")
    def _min_le_max(self) -> AutoscalingSettings:
        if self.min_capacity > self.max_capacity:
            raise ValueError(f"min_capacity ({self.min_capacity}) must not exceed max_capacity ({self.max_capacity})")
        return self


def _autoscaled_type(value: str) -> str:
    facts = _instance(value, True, lambda f: f.offered("hosting"),
                      "must be an instance type SageMaker hosts, such as ml.c7g.4xlarge or ml.c5.2xlarge")  # fmt: skip
    if facts.burstable:  # Application Auto Scaling refuses burstable variants
        raise ValueError("burstable ml.t* types cannot be autoscaled; use a c, m or r type")
    return value


class HyperParameters(_Settings):
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


class TrainingSettings(_Settings):
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
        "longest pause of a healthy run (first compilation, evaluation, a checkpoint save).",
    )

    @field_validator("instance_type")
    @classmethod
    def _gpu(cls, value: str) -> str:
        families = ", ".join(gpu_families())
        _instance(
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
        allowed = _families(_sagemaker_gpu_training)
        message = f"must be a SageMaker training type (ml.) with an NVIDIA GPU, of the families {allowed}"
        _instance(value, True, _sagemaker_gpu_training, message)
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


class DataCaptureSettings(_Settings):
    enabled: bool = False
    sampling_percentage: Annotated[int, Field(ge=1, le=100)] = 10


class GravitonEndpointSettings(_Settings):
    """The real-time endpoint on Graviton. Its image is the platform's own (Ray Serve on Amazon Linux 2023, built
    and promoted by the pipeline, read by digest from the environment's SSM parameter): no image setting
    (docs/images.md)."""

    enabled: bool = True
    instance_type: str = "ml.c7g.4xlarge"
    initial_instance_count: Annotated[int, Field(ge=1)] = 1
    # The model version to serve (a key under endpoints/ in the artifacts bucket). None until a model is uploaded:
    # the environment then has no Graviton endpoint stack (first deploy), and synth says what to do.
    model_data_key: str | None = None
    # Request limits of the serving contract (inference_assets/container/contract.py): 413 above them. Texts of any
    # length are cut to the model's window; the byte cap (at most SageMaker's payload cap) protects the server.
    max_request_batch: Annotated[int, _limit("max_request_batch")] = Limits.max_request_batch
    max_request_bytes: Annotated[int, _limit("max_request_bytes")] = Limits.max_request_bytes
    # Tokens per request (its texts cut to the model's window, summed): the forward pass a request may cost. 413 above.
    max_request_tokens: Annotated[int, _limit("max_request_tokens")] = Limits.max_request_tokens
    # Model server workers (Ray Serve replicas) and batching: the delay bounds a batch's wait for its round (serving.md)
    workers_per_model: Annotated[int, Field(ge=1, le=64)] | None = None
    server_batch_size: Annotated[int, Field(ge=1, le=256)] = 8
    server_max_batch_delay_ms: Annotated[int, Field(ge=0, le=10000)] = 50
    # Graviton fast paths (PyTorch's Graviton inference tuning recipe) and the model's precision.
    fast_math: Literal["bf16", "off"] = "bf16"
    lru_cache_capacity: Annotated[int, Field(ge=0, le=65_536)] = 1024
    transparent_huge_pages: bool = True
    precision: Precision = "fp32"
    torch_compile: bool = False
    # SageMaker's wait for the first /ping 200 of a new instance (ProductionVariant
    # ContainerStartupHealthCheckTimeoutInSeconds, 60-3600): Ray, then every replica loading the model. Measured
    # (docs/serving.md, "Start-up"); the default is that with the margin stated there.
    container_startup_timeout_seconds: Annotated[int, Field(ge=60, le=3600)] = STARTUP_TIMEOUT_S
    autoscaling: AutoscalingSettings = AutoscalingSettings()
    data_capture: DataCaptureSettings = DataCaptureSettings()

    @field_validator("instance_type")
    @classmethod
    def _graviton(cls, value: str) -> str:
        _autoscaled_type(value)
        allowed = _families(_graviton_hosting)
        _instance(
            value,
            True,
            _graviton_hosting,
            f"must be a Graviton (arm64) type SageMaker hosts (ml.), of the families {allowed}",
        )
        return value

    @field_validator("torch_compile")
    @classmethod
    def _no_compiler_in_the_image(cls, value: bool) -> bool:
        if value:
            raise ValueError(
                "must be false: the serving image has no C++ compiler, which TorchInductor needs on CPU, so every "
                "replica would fail at start (allowed: false)"
            )
        return value

    @field_validator("model_data_key")
    @classmethod
    def _model_key(cls, value: str | None) -> str | None:
        if value is None:
            return None
        _s3_key(value, prefix=False)
        if not value.endswith(".tar.gz"):
            raise ValueError("must name a model.tar.gz archive (end with .tar.gz)")
        if not value.startswith(ENDPOINT_MODELS_PREFIX):
            raise ValueError(
                f"must start with {ENDPOINT_MODELS_PREFIX!r}, the prefix the endpoint execution role may read"
            )
        return value

    @model_validator(mode="after")
    def _workers_fit_the_instance(self) -> GravitonEndpointSettings:
        vcpus = self.vcpus
        if self.workers_per_model is not None and self.workers_per_model > vcpus:
            raise ValueError(
                f"workers_per_model ({self.workers_per_model}) must not exceed "
                f"the {vcpus} vCPUs of {self.instance_type}"
            )
        return self

    @model_validator(mode="after")
    def _worst_request_within_invoke_timeout(self) -> GravitonEndpointSettings:
        _, threads = replicas_and_threads(self.vcpus, self.workers_per_model)
        if (seconds := worst_call_seconds(self.max_request_tokens, threads)) > INVOKE_TIMEOUT_S:
            allowed = max_request_tokens_within_timeout(threads)
            raise ValueError(
                f"max_request_tokens ({self.max_request_tokens}) would let a request wait about {seconds:.0f} s on "
                f"{threads} thread(s) per replica of {self.instance_type}, over InvokeEndpoint's {INVOKE_TIMEOUT_S} s; "
                f"allowed up to {allowed} here, or fewer workers_per_model"
            )
        return self

    @property
    def vcpus(self) -> int:
        facts = lookup(self.instance_type)
        assert facts is not None, "validated by _graviton"
        return facts.vcpus

    @property
    def limits(self) -> Limits:
        return Limits(
            max_request_batch=self.max_request_batch,
            max_request_bytes=self.max_request_bytes,
            max_request_tokens=self.max_request_tokens,
        )


class MultiModelSizingSettings(_Settings):
    """What the multi-model endpoint is sized for (``pytorch-platform mme-plan`` predicts how it behaves).

    ``warm_latency_ms`` is one request on one core of the instance type: the operator's number to measure with the
    Serving benchmark on the real instance type (100 ms is a planning default; RoBERTa-base measured 63.7 ms at 2
    threads on a local x86 machine, proving_ground/benchmarks/results/serving_latency.md). ``download_mib_per_second``
    (S3 to the
    instance) is an assumption: compare the endpoint's ModelDownloadingTime metric. ``p99_objective_ms`` is what
    "fast" means for the prediction; ``max_idle_time_seconds`` is the DJL worker idle stop the models are published
    with (serving.properties ``max_idle_time``).
    """

    models: Annotated[int, Field(ge=11)] = 16  # the top-10 pattern needs more than ten models
    requests_per_second: Annotated[float, Field(gt=0)] = 5.0  # planned peak, all models together
    model_weights_mib: Annotated[float, Field(gt=0)] = 476.0  # RoBERTa-base fp32, the platform's sentiment model
    warm_latency_ms: Annotated[float, Field(gt=0)] = 100.0
    download_mib_per_second: Annotated[float, Field(gt=0)] = 100.0
    p99_objective_ms: Annotated[float, Field(gt=0)] = 1000.0
    max_idle_time_seconds: Annotated[int, Field(ge=1, le=86_400)] = DjlModelSettings.max_idle_time_seconds


class MultiModelEndpointSettings(_Settings):
    """The multi-model endpoint on DJL Serving (the one multi-model CPU image in AWS's registry)."""

    enabled: bool = True
    instance_type: str = "ml.c5.2xlarge"
    initial_instance_count: Annotated[int, Field(ge=1)] = 1
    djl_image: str = "djl-inference:0.36.0-cpu-full"
    models_prefix: str = "multi-model/"
    invoke_allowed_models: list[str] = []
    autoscaling: AutoscalingSettings = AutoscalingSettings(max_capacity=4)
    sizing: MultiModelSizingSettings = MultiModelSizingSettings()

    @field_validator("instance_type")
    @classmethod
    def _type(cls, value: str) -> str:
        return _autoscaled_type(value)

    @field_validator("models_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        return _s3_key(value, prefix=True)

    @field_validator("invoke_allowed_models")
    @classmethod
    def _model_names(cls, value: list[str]) -> list[str]:
        return [validate_model_name(name) for name in value]


class LogSettings(_Settings):
    """CloudWatch Logs of the platform's workloads (training runs, SageMaker jobs and endpoints)."""

    # CloudWatch's retention values; Control Tower (CT.CLOUDWATCH.PR.2) wants 365 or more, shorter ones are
    # acknowledged per log group with this setting's name.
    retention_days: Literal[7, 14, 30, 60, 90, 180, 365, 400, 545, 731, 1096, 1827, 3653] = 365
    # Set retention_days on /aws/sagemaker/TrainingJobs, the ONE log group SageMaker writes every training job of the
    # account and region into (its name cannot be chosen). Only one environment per account and region may do it.
    manage_training_job_log_group: bool = False


class TagSettings(_Settings):
    project: str = "pytorch-platform"
    cost_centre: str

    @field_validator("project", "cost_centre")
    @classmethod
    def _value(cls, value: str) -> str:
        if not _TAG_VALUE.match(value):
            raise ValueError("must be 1-256 letters, digits, spaces or _.:/=+-@ characters")
        return value


class EnvironmentSettings(_Settings):
    """Everything one environment (dev, staging, prod) of the platform is built from."""

    name: Literal["dev", "staging", "prod"]
    account: AccountId | None = None
    region: Region = DEFAULT_REGION
    removal_policy: Literal["destroy", "retain"]
    alarm_email: str | None = None
    # Who hears the endpoints' alarms, besides alarm_email: e-mail addresses and https:// endpoints (a ChatOps or
    # paging webhook); SNS asks each to confirm. Without any, alarms fire into a topic no one reads (review warns).
    alarm_subscriptions: list[str] = []
    tags: TagSettings
    vpc: VpcSettings = VpcSettings()
    logs: LogSettings = LogSettings()
    training: TrainingSettings = TrainingSettings()
    graviton_endpoint: GravitonEndpointSettings = GravitonEndpointSettings()
    multi_model_endpoint: MultiModelEndpointSettings = MultiModelEndpointSettings()
    # repository:tag -> why this environment runs the image although its publisher no longer patches it
    # (platform_facts/images.json). Synth refuses such an image without an entry; the reason goes into the template
    # metadata and `pytorch-platform review`.
    accept_unpatched_images: dict[str, str] = {}

    @field_validator("accept_unpatched_images")
    @classmethod
    def _reasons(cls, value: dict[str, str]) -> dict[str, str]:
        for image, reason in value.items():
            if not re.match(r"^[a-z0-9][a-z0-9._/-]*:[A-Za-z0-9_.-]+$", image):
                raise ValueError(f"key {image!r} must be an image as repository:tag")
            if len(reason.strip()) < 20:
                raise ValueError(f"{image} needs a reason of at least 20 characters: why the risk is acceptable")
        return value

    @field_validator("alarm_email")
    @classmethod
    def _email(cls, value: str | None) -> str | None:
        if value is not None and not _EMAIL.match(value):
            raise ValueError("must be an e-mail address")
        return value

    @field_validator("alarm_subscriptions")
    @classmethod
    def _subscribers(cls, value: list[str]) -> list[str]:
        for entry in value:
            if not (_EMAIL.match(entry) or re.match(r"^https://[A-Za-z0-9.-]+(:\d+)?(/\S*)?$", entry)):
                raise ValueError(f"{entry!r} must be an e-mail address or an https:// URL")
        if len(set(value)) != len(value):
            raise ValueError("lists an entry twice")
        return value

    @model_validator(mode="after")
    def _training_gpus_run_the_images(self) -> EnvironmentSettings:
        training = self.training
        bf16 = training.hyperparameters.bf16
        _gpu_runs_the_image("training.instance_type", training.instance_type, "training.image_tag",
                            training.image, bf16)  # fmt: skip
        _gpu_runs_the_image("training.remote_instance_type", training.remote_instance_type,
                            "training.remote_image_tag", training.remote_image, bf16)  # fmt: skip
        return self

    @model_validator(mode="after")
    def _subnets_fit_the_vpc(self) -> EnvironmentSettings:
        vpc = self.vpc
        if vpc.imported:
            return self
        prefix, needed = ipaddress.IPv4Network(vpc.cidr).prefixlen, vpc.largest_prefix_for_subnets()
        if prefix > needed:
            private, public = vpc.PRIVATE_SUBNET_MASK, vpc.PUBLIC_SUBNET_MASK
            subnets = f"a private /{private}" + (f" and a public /{public}" if vpc.nat_gateways else "")
            raise ValueError(
                f"vpc.cidr: {vpc.cidr} is too small for the subnets the stacks make ({subnets} per zone, "
                f"vpc.max_azs: {vpc.max_azs}); use a prefix length from /{vpc.LARGEST_PREFIX} to /{needed}"
            )
        return self

    @model_validator(mode="after")
    def _training_fits_the_network(self) -> EnvironmentSettings:
        vpc, training = self.vpc, self.training
        subnets, source = (
            (len(vpc.private_subnet_ids), "vpc.private_subnet_ids") if vpc.imported else (vpc.max_azs, "vpc.max_azs")
        )
        if training.subnet_index >= subnets:
            raise ValueError(
                f"training.subnet_index: must be below {subnets}, the number of private subnets ({source})"
            )
        if not vpc.imported and vpc.nat_gateways == 0:
            # Isolated subnets reach AWS services through the VPC endpoints only: no hub, no PyPI.
            isolated = "vpc.nat_gateways: 0 leaves the private subnets without internet access, but EC2 training"
            from_hub = [name for name in ("base_model", "dataset") if not getattr(training, name).startswith("s3://")]
            if from_hub:
                sources = " and ".join(f"training.{name}" for name in from_hub)
                raise ValueError(
                    f"{isolated} downloads {sources} from the Hugging Face hub; use s3:// folders or a NAT gateway"
                )
            if training.image_registry_account is None:  # a pipeline-built image comes through the ECR endpoints
                raise ValueError(
                    f"{isolated} builds its image on the instance with pip from PyPI "
                    "(training_assets/instance/Dockerfile); use at least 1 NAT gateway or "
                    "training.image_registry_account"
                )
        return self

    @property
    def destroy_on_delete(self) -> bool:
        return self.removal_policy == "destroy"

    @property
    def alarm_endpoints(self) -> list[str]:
        """Everyone the alarm topics notify: alarm_email, then alarm_subscriptions (each once)."""
        return list(dict.fromkeys([*([self.alarm_email] if self.alarm_email else []), *self.alarm_subscriptions]))

    @property
    def resource_tags(self) -> dict[str, str]:
        return {"project": self.tags.project, "environment": self.name, "cost-centre": self.tags.cost_centre}


class PipelineSettings(_Settings):
    """The promotion pipeline (CDK Pipelines) in the tooling account, and the repository it deploys from."""

    account: AccountId
    region: Region = DEFAULT_REGION
    connection_arn: str
    repository: str
    branch: str = "main"

    @field_validator("connection_arn")
    @classmethod
    def _connection(cls, value: str) -> str:
        if not _CONNECTION_ARN.match(value):
            raise ValueError(
                "must be a CodeConnections connection ARN such as "
                "arn:aws:codeconnections:us-west-2:111122223333:connection/<uuid>"
            )
        return value

    @field_validator("repository")
    @classmethod
    def _repository(cls, value: str) -> str:
        if not _REPOSITORY.match(value):
            raise ValueError("must be owner/repository, for example my-org/pytorch-platform")
        return value

    @field_validator("branch")
    @classmethod
    def _branch(cls, value: str) -> str:
        if not _BRANCH.match(value):
            raise ValueError("must be a git branch name such as main or release/1.2")
        return value


def _describe(error: Any, root: str, model: type[BaseModel] = EnvironmentSettings) -> str:
    path = [str(part) for part in error["loc"]]
    key = ".".join([root, *path])
    if error["type"] == "extra_forbidden":
        for part in path[:-1]:
            annotation = model.model_fields[part].annotation
            model = next(
                a
                for a in (annotation, *getattr(annotation, "__args__", ()))
                if isinstance(a, type) and issubclass(a, BaseModel)
            )
        return f"{key}: unknown setting; allowed keys are {', '.join(sorted(model.model_fields))}."
    message = error["msg"].removeprefix("Value error, ").replace("Input should be", "must be")
    # A rule across settings names its key itself ("training.subnet_index: must be ...").
    if cross_setting := re.match(r"^([a-z_]+(?:\.[a-z_]+)+): (.*)$", message, re.DOTALL):
        key, message = f"{key}.{cross_setting[1]}", cross_setting[2]
    if error["type"] == "missing":
        message = "is required"
    return f"{key}: {message[0].lower()}{message[1:].rstrip('.')}."


def parse_environment(name: str, raw: dict[str, Any]) -> EnvironmentSettings:
    """Validate one environment's cdk.json settings; raise SettingsError with one sentence on the first problem."""
    root = f"environments.{name}"
    if name not in ENVIRONMENT_NAMES:
        raise SettingsError(f"{root}: unknown environment; allowed environments are {', '.join(ENVIRONMENT_NAMES)}.")
    if not isinstance(raw, dict):
        raise SettingsError(f"{root}: must be an object of settings.")
    try:
        return EnvironmentSettings.model_validate({**raw, "name": name})
    except ValidationError as error:
        raise SettingsError(_describe(error.errors()[0], root)) from None


def load_environments(environments: Any, selection: str | None) -> list[EnvironmentSettings]:
    """Settings of the environments in ``selection`` (comma-separated names; all when None), in promotion order."""
    if not isinstance(environments, dict) or not environments:
        raise SettingsError("cdk.json context must hold an 'environments' object with dev, staging and prod settings.")
    for name in environments:
        if name not in ENVIRONMENT_NAMES:
            raise SettingsError(
                f"environments.{name}: unknown environment; allowed environments are {', '.join(ENVIRONMENT_NAMES)}."
            )
    names = list(environments) if selection is None else [n.strip() for n in selection.split(",") if n.strip()]
    for name in names:
        if name not in environments:
            raise SettingsError(f"env={name}: unknown environment; allowed values are {', '.join(environments)}.")
    # Every environment is validated whatever the selection: a typo in prod must not pass `cdk synth -c env=dev`.
    parsed = {
        name: parse_environment(name, environments[name]) for name in sorted(environments, key=ENVIRONMENT_NAMES.index)
    }
    _one_training_job_log_group_owner(list(parsed.values()))
    return [settings for name, settings in parsed.items() if name in names]


def _one_training_job_log_group_owner(environments: list[EnvironmentSettings]) -> None:
    """/aws/sagemaker/TrainingJobs is one log group per account and region: two environments setting its retention
    would overwrite each other on every deploy. Environments without an account deploy wherever the CLI points, so
    they count as one account."""
    owners: dict[tuple[str | None, str], str] = {}
    for environment in sorted(environments, key=lambda e: ENVIRONMENT_NAMES.index(e.name)):
        if not environment.logs.manage_training_job_log_group:
            continue
        where = (environment.account, environment.region)
        if where in owners:
            raise SettingsError(
                f"environments.{environment.name}.logs.manage_training_job_log_group: only one environment per "
                f"account and region may manage /aws/sagemaker/TrainingJobs, and {owners[where]} already does "
                "(give the environments different accounts, or set it in one of them)."
            )
        owners[where] = environment.name


def load_pipeline(raw: Any) -> PipelineSettings | None:
    """The ``pipeline`` context object validated, or None when the app has no pipeline settings."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise SettingsError("pipeline: must be an object with account, region, connection_arn, repository and branch.")
    try:
        return PipelineSettings.model_validate(raw)
    except ValidationError as error:
        raise SettingsError(_describe(error.errors()[0], "pipeline", PipelineSettings)) from None
