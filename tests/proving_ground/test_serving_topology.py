"""The Graviton endpoint's default topology is the best measured one (proving_ground/benchmarks/serving_topology.py).

The results file (proving_ground/benchmarks/results/serving_topology.json) holds what the benchmark measured at
equal cores; ``best_topology`` reads the best there (extrapolated for other sizes by the model docs/serving.md states).
The settings' topology for each Graviton size (``GravitonEndpointSettings.topology``) and what the container does with
the environment the stack writes (the launcher's replicas, threads and ingress) must be that best one. When a new
measurement picks another, change that size's entry of ``REPLICAS_BY_VCPUS`` in
inference_assets/container/ray_settings.py (the failure names it).
"""

from __future__ import annotations

import json

import pytest

from inference_assets.container.ray_server import ingress_environment
from inference_assets.container.ray_settings import ServeSettings, default_topology, direct_ingress
from inference_assets.tools.endpoint_environment import endpoint_environment
from proving_ground.benchmarks import serving_topology as topology
from stacks.settings import parse_environment
from stacks.settings.serving import GravitonEndpointSettings
from tests.conftest import cdk_context

RESULTS = json.loads(topology.DEFAULT_OUTPUT.with_suffix(".json").read_text())
SIZES = topology.sizes()
WHERE = "inference_assets/container/ray_settings.py REPLICAS_BY_VCPUS"


def _launched(settings: GravitonEndpointSettings) -> tuple[int, int, bool]:
    """(replicas, threads, direct ingress) of the container the endpoint stack starts with these settings: the
    environment it writes (endpoint_environment, as GravitonEndpointStack passes the settings), read back by the
    replica's settings and the launcher's ingress rule."""
    environment = endpoint_environment(vcpus=settings.vcpus, workers=settings.workers_per_model)
    serve = ServeSettings.from_environment(environment, cores=1)
    direct = direct_ingress({**environment, **ingress_environment(environment, 8080)})
    return serve.replicas, serve.threads, direct


@pytest.mark.parametrize("instance_type", list(SIZES))
def test_the_settings_choose_the_best_measured_topology_for_every_graviton_size(instance_type: str) -> None:
    best = topology.best_topology(RESULTS, SIZES[instance_type])
    settings = GravitonEndpointSettings(instance_type=instance_type)
    chosen = settings.topology
    assert (chosen.replicas, chosen.threads, chosen.direct_ingress) == best, (
        f"{instance_type}: the settings choose {chosen}, the results file's best is {best} "
        f"(replicas, threads, direct ingress): set {SIZES[instance_type]}: {best[0]} in {WHERE}"
    )
    assert _launched(settings) == best, "the container must run what the settings choose"


@pytest.mark.parametrize("name", ["staging", "prod"])
def test_staging_and_prod_run_the_best_measured_topology_of_their_instance_type(name: str) -> None:
    endpoint = parse_environment(name, cdk_context()["environments"][name]).graviton_endpoint
    assert endpoint.workers_per_model is None, "an explicit workers_per_model would override the measured topology"
    assert _launched(endpoint) == topology.best_topology(RESULTS, endpoint.vcpus)


def test_the_results_file_holds_what_its_measurements_predict() -> None:
    """The per-size table was computed from the file's measurements by today's extrapolation."""
    for name, row in RESULTS["by_instance_type"].items():
        ranked = topology.extrapolate(RESULTS, row["vcpus"])
        assert (row["best"], row["runner_up"]) == (ranked[0], ranked[1]), name
    assert {(t["replicas"], t["threads"], t["direct_ingress"]) for t in RESULTS["topologies"]} == {
        c.key() for c in topology.candidates(RESULTS["cores"])
    }, "every topology of the measured cores was measured"
    assert all(level["errors"] == 0 for t in RESULTS["topologies"] for level in t["levels"].values())


def test_the_results_file_was_measured_with_the_default_batching_and_reports_the_default_topology() -> None:
    """The file's server batch and wait are the settings' defaults (what the endpoint runs), and its default-topology
    row is the measured row of the topology the settings choose on the measured cores."""
    settings, served = GravitonEndpointSettings(), RESULTS["served_with"]
    assert (served["server_batch_size"], served["server_max_batch_delay_ms"]) == (
        settings.server_batch_size,
        settings.server_max_batch_delay_ms,
    ), "rerun the benchmark with the settings' default batching"
    chosen = default_topology(RESULTS["cores"])
    default = RESULTS["default_topology"]
    assert default == topology.default_measured(RESULTS)
    (row,) = [t for t in RESULTS["topologies"] if t["name"] == default["name"]]
    assert (row["replicas"], row["threads"], row["direct_ingress"]) == (
        chosen.replicas,
        chosen.threads,
        chosen.direct_ingress,
    )
    assert set(default["ratios"]) == {str(level) for level in topology.LEVELS}


def test_one_source_for_the_batching_defaults() -> None:
    """The settings' defaults, the environment the stack writes for them and what a replica reads with the variables
    unset are one batch size and one wait."""
    settings = GravitonEndpointSettings()
    written = ServeSettings.from_environment(endpoint_environment(vcpus=2), cores=2)
    unset = ServeSettings.from_environment({}, cores=2)
    for serve in (written, unset, ServeSettings()):
        assert serve.max_batch_size == settings.server_batch_size
        assert serve.batch_wait_timeout_s * 1000 == pytest.approx(settings.server_max_batch_delay_ms)


def test_the_rule_gives_each_listed_size_its_replicas_and_other_sizes_one_replica() -> None:
    """REPLICAS_BY_VCPUS as the settings read it: the listed replicas share the vCPUs (behind the proxy when several);
    a vCPU count it does not list runs one replica with every vCPU on SageMaker's port."""
    from inference_assets.container import ray_settings

    for vcpus, replicas in ray_settings.REPLICAS_BY_VCPUS.items():
        chosen = default_topology(vcpus)
        assert (chosen.replicas, chosen.threads, chosen.direct_ingress) == (replicas, vcpus // replicas, replicas == 1)
    unlisted = next(n for n in range(3, 100) if n not in ray_settings.REPLICAS_BY_VCPUS)
    assert default_topology(unlisted).direct_ingress and default_topology(unlisted).threads == unlisted
    assert default_topology(8, replicas=2).threads == 4, "workers_per_model overrides the rule"


def test_a_levels_forward_share_is_pass_time_over_wall_time_per_replica() -> None:
    """Two replicas logged 64 texts in 2 s of passes over a 4 s level: each was in a pass a quarter of the time, at
    32 texts per second of pass."""
    share = topology.forward_share((10, 1.0), (74, 3.0), replicas=2, wall_s=4.0)
    assert share == {"forward_busy": 0.25, "pass_texts_per_s": 32.0}
    assert topology.forward_share((5, 1.0), (5, 1.0), replicas=1, wall_s=4.0) == {
        "forward_busy": 0.0,
        "pass_texts_per_s": 0.0,
    }


def test_docs_benchmarks_carry_the_results_line() -> None:
    text = topology.DOCS.read_text()
    block = text.split(topology.DOCS_BEGIN, 1)[1].split(topology.DOCS_END, 1)[0]
    assert block.strip() == topology.docs_line(RESULTS), "rerun the benchmark with its default output"


def _measured(
    direct: float, proxy: float, proxies: float, *, proxy_ms: float = 4.0, scaling: float = 1.0, tps: float = 60.0
) -> dict:
    """Results as the benchmark writes them for 2 cores: the three topologies' ratios, the proxy's CPU per request,
    the thread scaling per doubling and the yardstick's texts/s."""
    rows = [(1, 2, True, direct, 0.0), (1, 2, False, proxy, proxy_ms), (2, 1, False, proxies, proxy_ms)]
    return {
        "cores": 2,
        "raw": {"yardstick_per_core": tps / 2, "thread_scaling": scaling},
        "replica_serial_cpu_ms": 1.0,
        "topologies": [
            {"replicas": r, "threads": t, "direct_ingress": d, "ratio": ratio, "proxy_cpu_ms": ms}
            for r, t, d, ratio, ms in rows
        ],
    }


def test_on_the_measured_cores_the_best_is_the_best_measured() -> None:
    assert topology.best_topology(_measured(0.9, 0.7, 0.66), 2) == (1, 2, True)
    assert topology.best_topology(_measured(0.8, 0.7, 0.85), 2) == (2, 1, False)
    measured = _measured(0.9, 0.7, 0.66)
    for row in measured["topologies"]:
        key = (row["replicas"], row["threads"], row["direct_ingress"])
        assert topology.predict(measured, 2, *key) == row["ratio"]


def test_more_threads_per_replica_cost_what_one_doubling_cost_on_the_measured_host() -> None:
    measured = _measured(0.9, 0.7, 0.66, scaling=0.9)
    assert topology.predict(measured, 8, 1, 8, True) == pytest.approx(0.9 * 0.9**2)
    assert topology.predict(measured, 8, 4, 2, False) == pytest.approx(0.7)  # replicas of 2 threads: as measured
    assert topology.predict(measured, 8, 8, 1, False) == pytest.approx(0.66)


def test_the_proxy_is_one_process_and_caps_large_instances() -> None:
    """Replicas behind the proxy win where threads scale badly and the proxy is cheap, until the proxy's own CPU per
    request (one process: at most one core) caps the instance: then one replica with direct ingress wins."""
    measured = _measured(0.8, 0.75, 0.85, proxy_ms=2.0, scaling=0.95, tps=30.0)
    assert topology.best_topology(measured, 4) == (4, 1, False)
    assert topology.predict(measured, 64, 64, 1, False) == pytest.approx(1000 / 2.0 / (64 * 15))
    assert topology.best_topology(measured, 64) == (1, 64, True)


def test_candidates_cover_every_split_of_the_cores() -> None:
    assert [c.key() for c in topology.candidates(2)] == [(1, 2, True), (1, 2, False), (2, 1, False)]
    assert [c.key() for c in topology.candidates(4)] == [(1, 4, True), (1, 4, False), (2, 2, False), (4, 1, False)]
