"""The serving contract: what the model container reads, in one module that everyone who configures it imports.

The container (``protocol.py``, ``predictor.py``, the Ray Serve deployment and the DJL adapter) reads it; the operator
tools (package, publish, the endpoint environment), the settings, the endpoint stacks and the multi-model sizing
write or check against it. It imports nothing (no torch, no CDK): package_model ships it inside every model.tar.gz,
and synth imports it without the serving stack installed.

* model names (``TargetModel``: an S3 key under the models prefix);
* the request limits, their bounds and how they reach the container: environment variables (the Graviton endpoint's
  Ray Serve deployment) or ``serving.properties`` options (DJL);
* the run-time options of the predictor (precision, torch.compile) as environment variables;
* the per-model ``serving.properties`` of DJL Serving.

Limits: a request carries at most ``max_request_batch`` texts (the forward pass's batch) in at most
``max_request_bytes`` bytes. A text of any length is accepted and cut to the model's window by the predictor (as the
Hugging Face inference toolkit's ``truncation=True`` does), so a long review is classified, not refused. The byte cap
protects the server (parsing and holding the body), and defaults to what SageMaker itself lets through.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import ClassVar, Literal, get_args

# --- model names ------------------------------------------------------------------------------------------------

ARCHIVE_SUFFIX = ".tar.gz"
MAX_KEY_BYTES = 1024  # S3 keys and InvokeEndpoint's TargetModel both stop at 1,024
# Path segments of letters, digits, '.', '_' and '-' that start with a letter or digit; no spaces, no '..'.
_NAME = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9._-]*/)*[A-Za-z0-9][A-Za-z0-9._-]*\.tar\.gz$")
_PREFIX = re.compile(r"^[A-Za-z0-9._/-]+/$")


def validate_model_name(name: str, prefix: str = "") -> str:
    """Return ``name`` if it is a valid ``TargetModel`` (a ``.tar.gz`` key under ``prefix``); else raise ValueError."""
    if not isinstance(name, str) or not _NAME.match(name) or "/../" in f"/{name}" or "/./" in f"/{name}":
        raise ValueError(
            f"model name {name!r} is not valid: use letters, digits, '.', '_', '-' (and '/' between parts), "
            f"start each part with a letter or digit, and end with {ARCHIVE_SUFFIX}, e.g. sentiment-0001.tar.gz"
        )
    if len((prefix + name).encode()) > MAX_KEY_BYTES:
        raise ValueError(f"model name {name!r} makes the S3 key longer than {MAX_KEY_BYTES} bytes")
    return name


def validate_prefix(prefix: str) -> str:
    """Return ``prefix`` if it is empty or a relative S3 prefix ending in '/'; else raise ValueError."""
    if prefix and (prefix.startswith("/") or not _PREFIX.match(prefix)):
        raise ValueError(f"prefix {prefix!r} must be a relative S3 prefix of letters, digits and ._/- ending in '/'")
    return prefix


# --- request limits ---------------------------------------------------------------------------------------------

# InvokeEndpoint's Body: "Length Constraints: Maximum length of 6291456" (SageMaker Runtime API reference,
# API_runtime_InvokeEndpoint; botocore's sagemaker-runtime model, BodyBlob max). A real-time endpoint never hands
# the container more, so a larger cap could only matter to local servers.
SAGEMAKER_MAX_PAYLOAD_BYTES = 6_291_456
# Container environment variables (the Ray Serve deployment) and serving.properties options (DJL: option.<name>).
MAX_REQUEST_BATCH_ENV = "SENTIMENT_MAX_REQUEST_BATCH"
MAX_REQUEST_BYTES_ENV = "SENTIMENT_MAX_REQUEST_BYTES"
MAX_REQUEST_TOKENS_ENV = "SENTIMENT_MAX_REQUEST_TOKENS"


@dataclass(frozen=True)
class Limits:
    """What one request may carry. The bounds are the ones settings and serving.properties accept."""

    # Texts per request: the batch of one forward pass (each text at most the model's window, 512 tokens).
    max_request_batch: int = 32
    # Body bytes: the body is parsed and held whole before any check of its content.
    max_request_bytes: int = SAGEMAKER_MAX_PAYLOAD_BYTES
    # Tokens: the request's texts after each is cut to the model's window, summed (what its forward pass costs).
    # Enforced by the Ray Serve deployment (the Graviton endpoint); the multi-model servers bound texts and bytes only.
    # 8,192 = 16 texts of the full 512-token window: the worst admitted request, measured, fits InvokeEndpoint's
    # 60 s with room on one core per replica (docs/serving.md, "Work per call"; settings check each instance).
    max_request_tokens: int = 8_192

    BOUNDS: ClassVar = {"max_request_batch": (1, 1024), "max_request_bytes": (1_024, SAGEMAKER_MAX_PAYLOAD_BYTES),
                        "max_request_tokens": (512, 262_144)}  # fmt: skip
    ENVIRONMENT: ClassVar = {"max_request_batch": MAX_REQUEST_BATCH_ENV, "max_request_bytes": MAX_REQUEST_BYTES_ENV,
                             "max_request_tokens": MAX_REQUEST_TOKENS_ENV}  # fmt: skip
    PROPERTIES: ClassVar = {"max_request_batch": "max_request_batch", "max_request_bytes": "max_request_bytes"}

    def __post_init__(self) -> None:
        for field in fields(self):
            check_range(field.name, getattr(self, field.name), *self.BOUNDS[field.name])

    @classmethod
    def _from(cls, values: Mapping[str, str], names: Mapping[str, str]) -> Limits:
        given = {}
        for field, key in names.items():
            raw = values.get(key)
            if raw is None or raw == "":
                continue
            try:
                given[field] = int(raw)
            except ValueError:
                raise ValueError(f"{key} must be an integer, got {raw!r}") from None
        return cls(**given)

    @classmethod
    def from_environment(cls, environment: Mapping[str, str]) -> Limits:
        """The limits a container was given in its environment (unset variables keep the defaults); bad values
        raise."""
        return cls._from(environment, cls.ENVIRONMENT)

    @classmethod
    def from_properties(cls, properties: Mapping[str, str]) -> Limits:
        """The limits of DJL's load call (serving.properties ``option.<name>``, passed without the prefix)."""
        return cls._from(properties, cls.PROPERTIES)

    def environment(self) -> dict[str, str]:
        return {name: str(getattr(self, field)) for field, name in self.ENVIRONMENT.items()}

    def properties(self) -> dict[str, str]:
        return {f"option.{name}": str(getattr(self, field)) for field, name in self.PROPERTIES.items()}

    def check_tokens(self, tokens: int) -> None:
        """ValueError (the protocol's 413) when a request's ``tokens`` exceed ``max_request_tokens``."""
        if tokens > self.max_request_tokens:
            raise ValueError(
                f"the request's texts hold {tokens} tokens (each cut to the model's window); at most "
                f"{self.max_request_tokens} are allowed per request (max_request_tokens)"
            )


# --- the caller's time limit ------------------------------------------------------------------------------------

# InvokeEndpoint's limit: "the model container must respond to requests within 60 seconds" (SageMaker Runtime API
# reference, API_runtime_InvokeEndpoint).
INVOKE_TIMEOUT_S = 60
# What one token of a full-window (512-token) text costs a RoBERTa-base forward pass, in core-seconds: the worst
# admitted request (16 such texts, 8,192 tokens) took 12.7 CPU-seconds on one thread of this project's x86 machine
# (0.00155 per token; proving_ground/benchmarks/results/serving_worst_request.json, measured with the load at 11-13 on
# its 2 cores, so its wall time, 47 s, says little), times 2.5: no Graviton host was at hand, and a replica's threads
# do not scale perfectly. Shorter texts cost less per token.
FORWARD_CORE_SECONDS_PER_TOKEN = 0.0038
# SageMaker's wait for a new instance's first /ping 200 (ContainerStartupHealthCheckTimeoutInSeconds), as the
# Graviton endpoint sets it by default: ten times the start-up measured here with a RoBERTa-base-sized model (60.6 s,
# proving_ground/benchmarks/results/serving_startup.json; docs/serving.md, "Start-up"), for up to 16 replicas loading
# at once, another disk and CPU, and this machine's noise.
STARTUP_TIMEOUT_S = 600


def worst_call_seconds(max_request_tokens: int, threads: int) -> float:
    """How long the worst admitted request takes on a replica of ``threads`` threads: a forward pass holds at most
    ``max_request_tokens`` tokens, and a request that arrives as one starts waits for it before its own."""
    return 2 * max_request_tokens * FORWARD_CORE_SECONDS_PER_TOKEN / threads


def max_request_tokens_within_timeout(threads: int) -> int:
    """The largest ``max_request_tokens`` whose worst call stays within InvokeEndpoint's limit on ``threads``."""
    return int(INVOKE_TIMEOUT_S * threads / (2 * FORWARD_CORE_SECONDS_PER_TOKEN))


def check_range(name: str, value: object, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer from {low} to {high}, got {value!r}")


# --- predictor options ------------------------------------------------------------------------------------------

PRECISION_ENV = "SENTIMENT_PRECISION"
TORCH_COMPILE_ENV = "SENTIMENT_TORCH_COMPILE"
Precision = Literal["fp32", "bf16_autocast"]
PRECISIONS: tuple[Precision, ...] = get_args(Precision)

# --- DJL Serving's serving.properties ----------------------------------------------------------------------------

DJL_ENTRY_POINT = "model.py"


@dataclass(frozen=True)
class DjlModelSettings:
    """Per-model ``serving.properties`` of DJL Serving's Python engine; ``None`` leaves DJL's default (AWS's MME
    example sets no worker bounds).

    DJL Serving scales each model's workers on its own queue: it adds a worker while the queue holds more than
    twice ``batch_size`` requests, drops one after ``max_idle_time`` seconds idle, and stays within
    ``minWorkers``..``maxWorkers`` (unset = 1 .. #CPU / OMP_NUM_THREADS). See
    https://docs.djl.ai/docs/serving/serving/docs/configurations_model.html.
    """

    min_workers: int | None = None
    max_workers: int | None = None
    max_idle_time_seconds: int = 600  # AWS's multi-model example's value: shrink a model's workers slowly
    batch_size: int = 1  # must stay 1: see __post_init__
    max_batch_delay_ms: int = 100
    max_request_batch: int = Limits.max_request_batch
    max_request_bytes: int = Limits.max_request_bytes

    BOUNDS: ClassVar = {"min_workers": (1, 128), "max_workers": (1, 128), "max_idle_time_seconds": (1, 86_400),
                        "max_batch_delay_ms": (0, 60_000)}  # fmt: skip

    def __post_init__(self) -> None:
        for name, (low, high) in self.BOUNDS.items():
            if getattr(self, name) is not None or name not in ("min_workers", "max_workers"):
                check_range(name, getattr(self, name), low, high)
        if self.min_workers is not None and self.max_workers is not None and self.min_workers > self.max_workers:
            raise ValueError(f"min_workers ({self.min_workers}) must not exceed max_workers ({self.max_workers})")
        if self.batch_size != 1:
            # DJL Serving 0.36's Python engine gives every request of a dynamic batch the batch Output's status
            # code and properties (PyPredictor.java, tag v0.36.0): one bad request would fail its neighbours or come
            # back 200. Each request needs its own status and Content-Type, so DJL batches are refused.
            raise ValueError(
                f"batch_size must be 1 for DJL Serving, got {self.batch_size!r}: DJL 0.36 gives every request of a "
                "batch the batch's status code and headers, so batched answers cannot be correct"
            )
        self.limits  # noqa: B018 (validates the limits)

    @property
    def limits(self) -> Limits:
        return Limits(max_request_batch=self.max_request_batch, max_request_bytes=self.max_request_bytes)

    def render(self) -> str:
        """The file's text: engine, entry point, limits, worker bounds and batching, one ``key=value`` per line."""
        lines = [
            "# Generated from inference_assets/container/contract.py; DJL Serving reads it per model.",
            "engine=Python",
            f"option.entryPoint={DJL_ENTRY_POINT}",
            *(f"{key}={value}" for key, value in self.limits.properties().items()),
            f"max_idle_time={self.max_idle_time_seconds}",
            f"batch_size={self.batch_size}",
            f"max_batch_delay={self.max_batch_delay_ms}",
        ]
        if self.min_workers is not None:
            lines.append(f"minWorkers={self.min_workers}")
        if self.max_workers is not None:
            lines.append(f"maxWorkers={self.max_workers}")
        return "\n".join(lines) + "\n"
