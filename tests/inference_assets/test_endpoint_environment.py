"""The container environment shared by the endpoint stack and the local server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from inference_assets.container.contract import Limits
from inference_assets.container.predictor import RuntimeOptions
from inference_assets.container.ray_server import ingress_environment
from inference_assets.container.ray_settings import ServeSettings, default_topology, direct_ingress
from inference_assets.tools.endpoint_environment import endpoint_environment


@pytest.mark.parametrize("vcpus", [1, 2, 4, 8, 16, 48, 64])
def test_the_default_topology_fills_the_instance_and_the_launcher_runs_it(vcpus: int) -> None:
    """The measured default (ray_settings.default_topology; tests/proving_ground/test_serving_topology.py checks it
    is the best measured) is what the container runs: its replicas and threads, every vCPU used, and direct ingress
    exactly when there is one replica."""
    environment = endpoint_environment(vcpus=vcpus)
    expected = default_topology(vcpus)
    assert environment["SENTIMENT_SERVE_REPLICAS"] == str(expected.replicas)
    assert environment["OMP_NUM_THREADS"] == str(expected.threads)
    assert expected.replicas * expected.threads == vcpus
    assert direct_ingress({**environment, **ingress_environment(environment, 8080)}) is expected.direct_ingress
    assert expected.direct_ingress is (expected.replicas == 1)


def test_explicit_workers_become_ray_replicas_and_nothing_of_torchserve_is_set() -> None:
    limits = Limits(max_request_batch=64)
    environment = endpoint_environment(vcpus=16, workers=8, batch_size=4, max_batch_delay_ms=10, limits=limits)
    assert environment == {
        "OMP_NUM_THREADS": "2",
        "OMP_WAIT_POLICY": "PASSIVE",
        "TOKENIZERS_PARALLELISM": "false",
        "MALLOC_MMAP_THRESHOLD_": "33554432",
        "MALLOC_TRIM_THRESHOLD_": "1073741824",
        "SENTIMENT_MAX_REQUEST_BATCH": "64",
        "SENTIMENT_MAX_REQUEST_BYTES": "6291456",
        "SENTIMENT_MAX_REQUEST_TOKENS": "8192",
        "DNNL_DEFAULT_FPMATH_MODE": "BF16",
        "LRU_CACHE_CAPACITY": "1024",
        "THP_MEM_ALLOC_ENABLE": "1",
        "SENTIMENT_PRECISION": "fp32",
        "SENTIMENT_TORCH_COMPILE": "0",
        "SENTIMENT_SERVE_REPLICAS": "8",
        "SENTIMENT_SERVE_MAX_BATCH_SIZE": "4",
        "SENTIMENT_SERVE_BATCH_WAIT_TIMEOUT_S": "0.01",
        "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0",
        "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0",
    }


def test_fast_paths_can_be_turned_off_and_compile_brings_inductor_freezing() -> None:
    environment = endpoint_environment(vcpus=4, fast_math="off", transparent_huge_pages=False, torch_compile=True)
    assert "DNNL_DEFAULT_FPMATH_MODE" not in environment
    assert environment["THP_MEM_ALLOC_ENABLE"] == "0"
    assert (environment["SENTIMENT_TORCH_COMPILE"], environment["TORCHINDUCTOR_FREEZING"]) == ("1", "1")


def test_the_container_reads_back_what_the_environment_sets() -> None:
    """The container package ships without the tools: its readers must understand every value the stack writes."""
    limits = Limits(max_request_batch=7, max_request_bytes=4096)
    environment = endpoint_environment(vcpus=8, workers=2, limits=limits, precision="bf16_autocast")
    assert Limits.from_environment(environment) == limits
    assert RuntimeOptions.from_environment(environment) == RuntimeOptions("bf16_autocast", False, threads=4)
    assert ServeSettings.from_environment(environment) == ServeSettings(replicas=2, threads=4)  # default batching


@pytest.mark.parametrize(("vcpus", "workers"), [(2, None), (16, None), (16, 2), (64, 3)])
def test_ray_replicas_times_threads_fit_the_instance(vcpus: int, workers: int | None) -> None:
    """Each replica reserves its threads as Ray CPUs: more than the host's cores and a replica never starts."""
    settings = ServeSettings.from_environment(endpoint_environment(vcpus=vcpus, workers=workers), cores=1)
    assert settings.replicas * settings.threads <= vcpus
    assert settings.replicas == (workers or default_topology(vcpus).replicas)


def test_replicas_share_the_hosts_cores_when_the_threads_are_not_given() -> None:
    """Without OMP_NUM_THREADS each of 4 replicas on 16 cores gets 4 threads, not 16 (16 x 4 threads on 16 cores)."""
    assert ServeSettings.from_environment({"SENTIMENT_SERVE_REPLICAS": "4"}, cores=16).threads == 4
    assert ServeSettings.from_environment({}, cores=16).threads == 16
    assert ServeSettings.from_environment({"SENTIMENT_SERVE_REPLICAS": "3"}, cores=16).threads == 5


def test_a_batch_wait_of_zero_and_of_ten_seconds_are_accepted() -> None:
    """The settings allow server_max_batch_delay_ms 0 (a pass never waits for its round) and up to 10,000."""
    for value, seconds in (("0", 0.0), ("10", 10.0)):
        environment = {**endpoint_environment(vcpus=4), "SENTIMENT_SERVE_BATCH_WAIT_TIMEOUT_S": value}
        assert ServeSettings.from_environment(environment).batch_wait_timeout_s == seconds
    with pytest.raises(ValueError, match="within"):
        ServeSettings.from_environment({"SENTIMENT_SERVE_BATCH_WAIT_TIMEOUT_S": "10.001"})


def test_a_thread_count_that_is_no_positive_number_leaves_the_predictor_its_cores() -> None:
    """OMP_NUM_THREADS=0 (or a word) is no count: the predictor takes every core rather than failing to load."""
    for value in ("0", "four", ""):
        assert RuntimeOptions.from_environment({"OMP_NUM_THREADS": value}).threads is None, value
    assert RuntimeOptions.from_environment({"OMP_NUM_THREADS": "3"}).threads == 3


def test_direct_ingress_is_on_only_where_ray_reads_it_as_on() -> None:
    """Ray reads "1" as on and every other value as off (ray/serve/_private/constants_utils.py get_env_bool, and the
    direct-ingress constant compares with "1"): "true" turns nothing on, and an explicit "0" wins over the mode."""
    assert direct_ingress({"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1"})
    assert direct_ingress({"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"})
    for environment in (
        {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "true"},
        {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "true"},
        {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "RAY_SERVE_ENABLE_DIRECT_INGRESS": "0"},
        {},
    ):
        assert not direct_ingress(environment), environment


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("SENTIMENT_SERVE_REPLICAS", "0", "SENTIMENT_SERVE_REPLICAS must be a positive integer"),
        ("SENTIMENT_SERVE_MAX_BATCH_SIZE", "eight", "SENTIMENT_SERVE_MAX_BATCH_SIZE must be a positive integer"),
        ("OMP_NUM_THREADS", "-2", "OMP_NUM_THREADS must be a positive integer"),
        ("SENTIMENT_SERVE_BATCH_WAIT_TIMEOUT_S", "soon", "must be a number of seconds"),
        ("SENTIMENT_SERVE_BATCH_WAIT_TIMEOUT_S", "nan", "within"),
        ("SENTIMENT_SERVE_BATCH_WAIT_TIMEOUT_S", "-1", "within"),
    ],
)
def test_the_replica_refuses_bad_serving_variables_by_name(name: str, value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ServeSettings.from_environment({**endpoint_environment(vcpus=4), name: value})


# Tokenizes a request of 8 texts with the model's tokenizer (the Rust library SentimentPredictor.encode calls, without
# torch and transformers to import) and prints the threads the process gained.
_TOKENIZE = """
import os, sys
from tokenizers import Tokenizer
tokenizer = Tokenizer.from_file(sys.argv[1])
before = len(os.listdir("/proc/self/task"))
tokenizer.encode_batch(["Covid cases are increasing fast!"] * 8)
print(len(os.listdir("/proc/self/task")) - before)
"""


def _threads_started_by_tokenizing(model_dir: Path, environment: dict[str, str]) -> int:
    done = subprocess.run(
        [sys.executable, "-c", _TOKENIZE, str(model_dir / "tokenizer.json")],
        env={**os.environ, **environment},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return int(done.stdout.split()[-1])


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc")
def test_a_replica_tokenizes_on_its_own_thread_without_a_pool_beside_the_forward_pass(tiny_model_dir: Path) -> None:
    """The tokenizer's thread pool (one thread per core) would share the cores with the forward pass's OpenMP team
    (docs/serving.md, "Topology"): in the endpoint's environment tokenizing starts no thread; without
    TOKENIZERS_PARALLELISM it does, so the variable is what keeps the pool away."""
    environment = endpoint_environment(vcpus=2)
    assert _threads_started_by_tokenizing(tiny_model_dir, environment) == 0
    environment.pop("TOKENIZERS_PARALLELISM")
    assert _threads_started_by_tokenizing(tiny_model_dir, environment) > 0
