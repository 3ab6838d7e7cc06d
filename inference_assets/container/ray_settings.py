"""How the Ray Serve deployment runs, read from the container environment; no Ray import (the endpoint stack and
the local tools read the variable names here without Ray installed).

    SENTIMENT_SERVE_REPLICAS              model replicas (one process and one model copy each; default 1)
    OMP_NUM_THREADS                       intra-op threads per replica; unset: the host's cores / replicas. Ray sets
                                          OMP_NUM_THREADS=1 in a worker where it is unset (ray/_private/utils.py
                                          ``set_omp_num_threads_if_unset``), so the replica is given these threads
                                          explicitly and reserves as many Ray CPUs
    SENTIMENT_SERVE_MAX_BATCH_SIZE        requests per forward pass (the replica's queue's max_batch_size; default
                                          DEFAULT_MAX_BATCH_SIZE)
    SENTIMENT_SERVE_BATCH_WAIT_TIMEOUT_S  how long a batch waits for its round (``batch_wait_timeout_s``; default
                                          DEFAULT_BATCH_WAIT_TIMEOUT_S)
    RAY_SERVE_THROUGHPUT_OPTIMIZED        Ray Serve's throughput-optimized mode (ray/serve/_private/constants.py, end;
                                          docs.ray.io serve/advanced-guides/performance); the launcher turns it on
                                          unless set ("0" turns it off): with one replica, that replica serves HTTP
                                          on the SageMaker port itself (direct ingress, no proxy actor in the path)
    RAY_SERVE_ENABLE_DIRECT_INGRESS       Ray's own switch for direct ingress alone; the launcher sets it to "0"
                                          when there are several replicas (one port cannot reach them all, so Ray's
                                          proxy balances them on the SageMaker port)

The endpoint stack and the local server set them from the endpoint's settings (``graviton_endpoint``), through
``inference_assets/tools/endpoint_environment.py``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

REPLICAS_ENV = "SENTIMENT_SERVE_REPLICAS"
MAX_BATCH_SIZE_ENV = "SENTIMENT_SERVE_MAX_BATCH_SIZE"
BATCH_WAIT_TIMEOUT_ENV = "SENTIMENT_SERVE_BATCH_WAIT_TIMEOUT_S"
THREADS_ENV = "OMP_NUM_THREADS"
THROUGHPUT_OPTIMIZED_ENV = "RAY_SERVE_THROUGHPUT_OPTIMIZED"
DIRECT_INGRESS_ENV = "RAY_SERVE_ENABLE_DIRECT_INGRESS"
# Ray slots of a replica that only /ping uses: invocations are refused (503) at max_invocations, so a health check
# always finds a free slot, with every replica saturated, in Ray's proxy as with direct ingress.
PING_RESERVE = 4
# The batching defaults, chosen by measurement (proving_ground/benchmarks/serving_topology.py; docs/serving.md,
# "Topology"): the one source the settings (server_batch_size, server_max_batch_delay_ms), the endpoint's environment
# and the replica read. Passes of 32: the best raw pass of up to 32 texts is a pass of 32, and a server whose passes
# hold 8 serves 32 clients at most at a pass of 8's rate (about half of it). A 50 ms wait: the round of 32 clients
# comes back over tens of milliseconds, and a shorter wait splits it (a lone client never waits).
DEFAULT_MAX_BATCH_SIZE = 32
DEFAULT_BATCH_WAIT_TIMEOUT_S = 0.05


@dataclass(frozen=True)
class Topology:
    """How an instance's vCPUs serve the model: ``replicas`` processes (one model copy each) of ``threads`` intra-op
    threads, and how requests reach them: with one replica, that replica listens on SageMaker's port itself (direct
    ingress, ray_server.py); with several, Ray's proxy balances them on that port (one port reaches one process)."""

    replicas: int
    threads: int

    @property
    def direct_ingress(self) -> bool:
        return self.replicas == 1

    def __str__(self) -> str:
        ingress = "direct ingress" if self.direct_ingress else "Ray's proxy"
        return f"{self.replicas} replica(s) x {self.threads} thread(s), {ingress}"


# THE DEFAULT TOPOLOGY (workers_per_model unset), chosen by measurement: proving_ground/benchmarks/serving_topology.py
# runs every topology at equal cores through the real server and extrapolates to each instance size
# (proving_ground/benchmarks/results/serving_topology.json; docs/serving.md, "Topology").
# REPLICAS_BY_VCPUS gives, for each vCPU count of the Graviton sizes SageMaker hosts, the replicas of the best: one
# replica listens on SageMaker's port itself (direct ingress), several share the vCPUs behind Ray's proxy.
# tests/proving_ground/test_serving_topology.py fails, naming the entry to write, when an entry is not the results
# file's best. A vCPU count not listed (another family) runs one replica with every vCPU.
REPLICAS_BY_VCPUS: dict[int, int] = {2: 1, 4: 1, 8: 4, 16: 1, 32: 1, 48: 1, 64: 1}


def default_topology(vcpus: int, replicas: int | None = None) -> Topology:
    """The topology on ``vcpus`` cores: ``replicas`` (the settings' workers_per_model) or the measured rule above, and
    the cores shared among the replicas (the endpoint's environment and the settings' checks use this one rule)."""
    if vcpus < 1:
        raise ValueError(f"vcpus must be >= 1, got {vcpus}")
    if replicas is None:
        replicas = min(vcpus, REPLICAS_BY_VCPUS.get(vcpus, 1))
    return Topology(replicas, max(1, vcpus // replicas))


def _positive_int(environment: Mapping[str, str], name: str, default: int) -> int:
    raw = environment.get(name) or ""
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{name} must be a positive integer, got {raw!r}")
    return int(raw)


@dataclass(frozen=True)
class ServeSettings:
    replicas: int = 1
    threads: int = 1
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    batch_wait_timeout_s: float = DEFAULT_BATCH_WAIT_TIMEOUT_S

    def __post_init__(self) -> None:
        for name in ("replicas", "threads", "max_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.batch_wait_timeout_s <= 10:
            raise ValueError(f"batch_wait_timeout_s must be within [0, 10] seconds, got {self.batch_wait_timeout_s}")

    @property
    def max_invocations(self) -> int:
        """Invocations a replica holds at once (queued or in a forward pass); the next one gets a 503 at once. Eight
        forward passes' worth: a request further back would wait more than eight worst passes (docs/serving.md)."""
        return 8 * self.max_batch_size

    @property
    def max_ongoing_requests(self) -> int:
        """Ray's limit of requests in a replica: the invocations plus ``PING_RESERVE`` for /ping. Ray Serve's
        default is 5 (ray/serve/_private/constants.py DEFAULT_MAX_ONGOING_REQUESTS); at Ray's limit a request waits
        in Ray (the proxy or the replica's queue), where /ping would wait behind invocations: the replica refuses
        invocations itself before Ray's limit, so Ray never queues."""
        return self.max_invocations + PING_RESERVE

    @classmethod
    def from_environment(cls, environment: Mapping[str, str], cores: int | None = None) -> ServeSettings:
        """Bad values raise with the variable's name; ``cores`` defaults to this host's."""
        replicas = _positive_int(environment, REPLICAS_ENV, 1)
        threads = _positive_int(environment, THREADS_ENV, max(1, (cores or os.cpu_count() or 1) // replicas))
        raw_timeout = environment.get(BATCH_WAIT_TIMEOUT_ENV) or str(DEFAULT_BATCH_WAIT_TIMEOUT_S)
        try:
            timeout = float(raw_timeout)
        except ValueError:
            raise ValueError(f"{BATCH_WAIT_TIMEOUT_ENV} must be a number of seconds, got {raw_timeout!r}") from None
        return cls(
            replicas=replicas,
            threads=threads,
            max_batch_size=_positive_int(environment, MAX_BATCH_SIZE_ENV, DEFAULT_MAX_BATCH_SIZE),
            batch_wait_timeout_s=timeout,
        )

    def environment(self) -> dict[str, str]:
        """The variables that give these settings back (``from_environment`` inverts it)."""
        return {
            REPLICAS_ENV: str(self.replicas),
            THREADS_ENV: str(self.threads),
            MAX_BATCH_SIZE_ENV: str(self.max_batch_size),
            BATCH_WAIT_TIMEOUT_ENV: f"{self.batch_wait_timeout_s:g}",
        }


def direct_ingress(environment: Mapping[str, str]) -> bool:
    """Whether Ray Serve will run with direct ingress in this environment, as ray/serve/_private/constants.py decides
    it at import: RAY_SERVE_ENABLE_DIRECT_INGRESS="1", or throughput-optimized mode without that variable set
    otherwise (Ray reads "1" as on, anything else as off)."""
    if DIRECT_INGRESS_ENV in environment:
        return environment[DIRECT_INGRESS_ENV] == "1"
    return environment.get(THROUGHPUT_OPTIMIZED_ENV) == "1"
