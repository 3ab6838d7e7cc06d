"""The serving area: the Graviton real-time endpoint (Ray Serve), the multi-model endpoint (DJL Serving), their
autoscaling and request limits (the serving contract: inference_assets/container/contract.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

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
from inference_assets.container.ray_settings import (
    DEFAULT_BATCH_WAIT_TIMEOUT_S,
    DEFAULT_MAX_BATCH_SIZE,
    Topology,
    default_topology,
)
from platform_facts.instances import InstanceType, lookup
from stacks.settings.base import StrictModel, families_where, instance_facts, s3_key

# The prefix of the artifacts bucket that the endpoint execution role may read single-model archives from.
ENDPOINT_MODELS_PREFIX = "endpoints/"


def _autoscaled_hosting(facts: InstanceType) -> bool:
    return facts.offered("hosting") and not facts.burstable


def _graviton_hosting(facts: InstanceType) -> bool:
    return _autoscaled_hosting(facts) and facts.architecture == "arm64" and facts.accelerator is None


def _limit(name: str) -> Any:
    """The contract's bounds of a request limit as a pydantic constraint."""
    low, high = Limits.BOUNDS[name]
    return Field(ge=low, le=high)


class AutoscalingSettings(StrictModel):
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
    facts = instance_facts(value, True, lambda f: f.offered("hosting"),
                      "must be an instance type SageMaker hosts, such as ml.c7g.4xlarge or ml.c5.2xlarge")  # fmt: skip
    if facts.burstable:  # Application Auto Scaling refuses burstable variants
        raise ValueError("burstable ml.t* types cannot be autoscaled; use a c, m or r type")
    return value


class DataCaptureSettings(StrictModel):
    enabled: bool = False
    sampling_percentage: Annotated[int, Field(ge=1, le=100)] = 10


class GravitonEndpointSettings(StrictModel):
    """The real-time endpoint on Graviton. Its image is the platform's own (Ray Serve on Amazon Linux 2023, built
    and promoted by the pipeline, read by digest from the environment's SSM parameter): no image setting
    (docs/images.md)."""

    enabled: bool = True
    instance_type: str = "ml.c7g.xlarge"
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
    server_batch_size: Annotated[int, Field(ge=1, le=256)] = DEFAULT_MAX_BATCH_SIZE
    server_max_batch_delay_ms: Annotated[int, Field(ge=0, le=10000)] = round(DEFAULT_BATCH_WAIT_TIMEOUT_S * 1000)
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
        allowed = families_where(_graviton_hosting)
        instance_facts(
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
        s3_key(value, prefix=False)
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
        threads = self.topology.threads
        if (seconds := worst_call_seconds(self.max_request_tokens, threads)) > INVOKE_TIMEOUT_S:
            allowed = max_request_tokens_within_timeout(threads)
            raise ValueError(
                f"max_request_tokens ({self.max_request_tokens}) would let a request wait about {seconds:.0f} s on "
                f"{threads} thread(s) per replica of {self.instance_type}, over InvokeEndpoint's {INVOKE_TIMEOUT_S} s; "
                f"allowed up to {allowed} here, or fewer workers_per_model"
            )
        return self

    @property
    def topology(self) -> Topology:
        """Replicas, threads and ingress of each instance: workers_per_model, else the measured default
        (``ray_settings.default_topology``; docs/serving.md, "Topology")."""
        return default_topology(self.vcpus, self.workers_per_model)

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


class MultiModelSizingSettings(StrictModel):
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


class MultiModelEndpointSettings(StrictModel):
    """The multi-model endpoint on DJL Serving (the one multi-model CPU image in AWS's registry)."""

    enabled: bool = True
    instance_type: str = "ml.c5.2xlarge"
    initial_instance_count: Annotated[int, Field(ge=1)] = 1
    djl_image: str = "djl-inference:0.36.0-cpu-full"
    models_prefix: str = "multi-model/"
    invoke_allowed_models: list[str] = Field(default=[])
    autoscaling: AutoscalingSettings = AutoscalingSettings(max_capacity=4)
    sizing: MultiModelSizingSettings = MultiModelSizingSettings()

    @field_validator("instance_type")
    @classmethod
    def _type(cls, value: str) -> str:
        return _autoscaled_type(value)

    @field_validator("models_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        return s3_key(value, prefix=True)

    @field_validator("invoke_allowed_models")
    @classmethod
    def _model_names(cls, value: list[str]) -> list[str]:
        return [validate_model_name(name) for name in value]
