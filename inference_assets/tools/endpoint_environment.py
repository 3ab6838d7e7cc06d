"""The container environment of the sentiment model: one definition for the endpoint stack and the local server.

Ray Serve (the server of the platform's Graviton serving image and of the local harness;
``inference_assets/container/ray_settings.py`` reads them):

- ``SENTIMENT_SERVE_REPLICAS``: model replicas (``workers``, else the measured default topology,
  ``ray_settings.default_topology``: one replica with every vCPU, direct ingress).
- ``SENTIMENT_SERVE_MAX_BATCH_SIZE`` / ``SENTIMENT_SERVE_BATCH_WAIT_TIMEOUT_S``: the
  replica's batching queue's ``max_batch_size`` and ``batch_wait_timeout_s`` (settings ``server_batch_size``,
  ``server_max_batch_delay_ms``).
- ``OMP_NUM_THREADS``: threads per replica (replicas x threads = the instance's vCPUs); the replica passes it to
  torch explicitly, since Ray sets OMP_NUM_THREADS=1 in its workers where the variable is unset.
- ``RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD=0`` / ``RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP=0``: the replica's
  request handling and the proxy's router run on their process's main event loop instead of a second one (Ray
  2.57 ray/serve/_private/constants.py; both are part of Ray's RAY_SERVE_THROUGHPUT_OPTIMIZED profile). Measured
  here: ~12% less CPU per request in Ray (8.3 instead of 9.1-10.5 ms on this 2-core host, tiny model, 8 clients);
  the forward pass runs on a thread of its own either way, so the loop stays free while it runs.

Read by the model code and torch in every replica:

- ``OMP_WAIT_POLICY=PASSIVE``: idle OpenMP threads sleep instead of spinning. With every core given to the replicas'
  threads, spinning starves the server's own processes (Ray's daemons and proxy; measured with TorchServe's Java
  frontend on RoBERTa-base before the move to Ray Serve: p50 at one request in flight went from ~1 s spinning to
  ~80 ms passive, against ~56 ms for the bare forward pass; that results file has since been rerun on Ray Serve).
- ``TOKENIZERS_PARALLELISM=false``: the tokenizer (Hugging Face ``tokenizers``, Rust) tokenizes on the thread that
  calls it instead of a pool of one thread per core. A replica tokenizes each request on its admission thread (one
  to ``max_request_batch`` short texts), and the pool's threads spun on the cores the forward pass's OpenMP team
  computes on: measured in a loaded replica (2 cores, bf16, 1 client x 8 texts), two pool threads woke ~200 times a
  second each, and each wake-up waited ~1.4 ms for a core that the pass's threads held
  (``proving_ground/benchmarks/serving_topology.py``; docs/serving.md, "Topology").
- ``MALLOC_MMAP_THRESHOLD_=33554432`` / ``MALLOC_TRIM_THRESHOLD_=1073741824``: glibc's allocator (read when a
  process starts; mallopt(3), "Environment variables") serves blocks up to 32 MiB, its largest mmap threshold, from
  its heap and keeps freed heap memory instead of handing it back to the kernel. By default it adapts both to the
  largest block freed so far, so a replica that had run only small passes mapped fresh pages for every pass: measured
  on this project's 2-core host (bf16, RoBERTa-base shape), a new process's passes of 8 took 393 minor page faults per
  text and ran at 65-68 texts/s, the same process after passes of 32 took none and ran at 85-86; with these two
  variables a new process took none from the start (81-87 texts/s). What the heap keeps is what the largest pass
  needed, which the instance holds at that pass anyway
  (``proving_ground/benchmarks/results/serving_replica_threads.md``).
- ``SENTIMENT_MAX_REQUEST_BATCH`` / ``SENTIMENT_MAX_REQUEST_BYTES``: the request limits of the serving contract
  (``inference_assets/container/contract.py``; 413 above them).
- Graviton fast paths from PyTorch's "Inference Performance Tuning on AWS Graviton Processors" recipe
  (https://pytorch.org/tutorials/recipes/inference_tuning_on_aws_graviton.html): ``DNNL_DEFAULT_FPMATH_MODE=BF16``
  lets oneDNN (PyTorch's aarch64 GEMM backend, with Arm Compute Library) run fp32 matmuls on Graviton3's bf16
  instructions; ``LRU_CACHE_CAPACITY`` keeps oneDNN's primitive cache warm across the input shapes of a text model;
  ``THP_MEM_ALLOC_ENABLE=1`` backs PyTorch's tensor allocations with transparent huge pages. On x86 these variables
  change nothing (PyTorch's x86 fp32 GEMMs are MKL's), which is why the local bf16 measurement uses autocast.
- ``SENTIMENT_PRECISION`` (fp32 | bf16_autocast) and ``SENTIMENT_TORCH_COMPILE`` (0 | 1, with
  ``TORCHINDUCTOR_FREEZING=1`` as the recipe recommends): read by ``container/predictor.py``.
"""

from __future__ import annotations

from typing import Literal

from inference_assets.container.contract import (
    PRECISION_ENV,
    TORCH_COMPILE_ENV,
    Limits,
    Precision,
)
from inference_assets.container.ray_settings import (
    DEFAULT_BATCH_WAIT_TIMEOUT_S,
    DEFAULT_MAX_BATCH_SIZE,
    ServeSettings,
    default_topology,
)


def endpoint_environment(
    *,
    vcpus: int,
    workers: int | None = None,
    batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    max_batch_delay_ms: int = round(DEFAULT_BATCH_WAIT_TIMEOUT_S * 1000),
    limits: Limits | None = None,
    fast_math: Literal["bf16", "off"] = "bf16",
    lru_cache_capacity: int = 1024,
    transparent_huge_pages: bool = True,
    precision: Precision = "fp32",
    torch_compile: bool = False,
) -> dict[str, str]:
    """Environment variables for the serving container on a host with ``vcpus`` cores; the endpoint stack passes
    every value from validated settings."""
    topology = default_topology(vcpus, workers)
    workers, threads = topology.replicas, topology.threads
    environment = {
        "OMP_NUM_THREADS": str(threads),
        "OMP_WAIT_POLICY": "PASSIVE",
        "TOKENIZERS_PARALLELISM": "false",
        "MALLOC_MMAP_THRESHOLD_": "33554432",
        "MALLOC_TRIM_THRESHOLD_": "1073741824",
        **(limits or Limits()).environment(),
        "LRU_CACHE_CAPACITY": str(lru_cache_capacity),
        "THP_MEM_ALLOC_ENABLE": "1" if transparent_huge_pages else "0",
        PRECISION_ENV: precision,
        TORCH_COMPILE_ENV: "1" if torch_compile else "0",
    }
    environment.update(ServeSettings(workers, threads, batch_size, max_batch_delay_ms / 1000).environment())
    environment["RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"] = "0"
    environment["RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP"] = "0"
    if fast_math == "bf16":
        environment["DNNL_DEFAULT_FPMATH_MODE"] = "BF16"
    if torch_compile:
        environment["TORCHINDUCTOR_FREEZING"] = "1"
    return environment
