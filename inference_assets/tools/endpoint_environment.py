"""The container environment of the sentiment model: one definition for the endpoint stack and the local server.

The SageMaker PyTorch toolkit reads these variables when the container starts:

- ``SAGEMAKER_MODEL_SERVER_WORKERS``: TorchServe workers (one model copy and one Python process each).
- ``SAGEMAKER_TS_BATCH_SIZE`` / ``SAGEMAKER_TS_MAX_BATCH_DELAY``: TorchServe request batching. Setting any
  ``SAGEMAKER_TS_*`` variable makes the toolkit write a per-model entry whose min/max workers default to 1, which
  would override the worker count above, so ``SAGEMAKER_TS_MIN_WORKERS``/``MAX_WORKERS`` are always set with it.
- ``OMP_NUM_THREADS``: intra-op threads per worker, so workers x threads = the instance's vCPUs (no oversubscription).
- ``OMP_WAIT_POLICY=PASSIVE``: idle OpenMP threads sleep instead of spinning. With every core given to the workers'
  threads, spinning starves TorchServe's Java frontend and the other workers: measured locally on RoBERTa-base
  (benchmarks/results/serving_latency.md), p50 at one request in flight went from ~1 s spinning to ~80 ms passive,
  against ~56 ms for the bare forward pass.
- ``SENTIMENT_MAX_REQUEST_BATCH``: the most texts one request may carry (the container's handler answers 413 above).
"""

from __future__ import annotations

import re

# Each worker gets this many cores for its intra-op threads: a RoBERTa-base forward pass on a short text scales
# to about 4 Graviton cores; more workers with fewer threads each serve concurrent requests better.
CORES_PER_WORKER = 4
_SIZE = re.compile(r"\.(?:(?P<n>\d*)xlarge|(?P<large>large)|(?P<medium>medium))$")


def instance_vcpus(instance_type: str) -> int:
    """vCPUs of a SageMaker c/m/r instance type: medium 1, large 2, xlarge 4, Nxlarge 4N (Graviton: 1 vCPU = 1 core)."""
    match = _SIZE.search(instance_type)
    if not match:
        raise ValueError(f"cannot tell the vCPUs of instance type {instance_type!r}")
    if match["medium"]:
        return 1
    if match["large"]:
        return 2
    return 4 * int(match["n"] or 1)


def endpoint_environment(
    *,
    vcpus: int,
    workers: int | None = None,
    batch_size: int = 1,
    max_batch_delay_ms: int = 100,
    max_request_batch: int = 32,
) -> dict[str, str]:
    """Environment variables for the serving container on a host with ``vcpus`` cores."""
    if vcpus < 1:
        raise ValueError(f"vcpus must be >= 1, got {vcpus}")
    workers = workers or max(1, vcpus // CORES_PER_WORKER)
    return {
        "SAGEMAKER_MODEL_SERVER_WORKERS": str(workers),
        "SAGEMAKER_TS_MIN_WORKERS": str(workers),
        "SAGEMAKER_TS_MAX_WORKERS": str(workers),
        "SAGEMAKER_TS_BATCH_SIZE": str(batch_size),
        "SAGEMAKER_TS_MAX_BATCH_DELAY": str(max_batch_delay_ms),
        "OMP_NUM_THREADS": str(max(1, vcpus // workers)),
        "OMP_WAIT_POLICY": "PASSIVE",
        "SENTIMENT_MAX_REQUEST_BATCH": str(max_request_batch),
    }
