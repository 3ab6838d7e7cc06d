"""What ``simulate`` reports and the steady state it starts from, each on a case worked out by hand: the prewarmed
fleet (which models, in which LRU order, on how many instances with how many workers, their disk copies), the
percentiles and their unit, the SageMaker timeout at exactly 60 s, the window's length after a warm-up, a window
without requests, and the refusal of impossible arguments. Mutation testing (docs/testing.md) found each of these
unchecked: the end-to-end fixtures' answers stay plausible under the bugs."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest

from mme_sizing.simulation import (
    PREWARM_UTILIZATION,
    SAGEMAKER_TIMEOUT_S,
    Fleet,
    ModelCost,
    Workload,
    _percentile,
    _Simulation,
    simulate,
)

COST = ModelCost(worker_memory_mib=100, download_s=1.0, load_s=2.0, service_s=0.010)


def _prewarmed(fleet: Fleet, cost: ModelCost, workload: Workload) -> _Simulation:
    sim = _Simulation(fleet, cost, workload, seed=0)
    sim.prewarm()
    return sim


def _placement(sim: _Simulation) -> list[dict[int, int]]:
    """Each instance's models (in LRU order, least recently used first) and their workers."""
    return [{model_id: model.workers for model_id, model in instance.models.items()} for instance in sim.instances]


# --- prewarm: the most requested models, the least requested of them first in line for eviction, on disk -----------


def test_a_prewarmed_instance_holds_the_most_requested_models_and_evicts_the_least_requested_of_them_first() -> None:
    fleet = Fleet(instances=1, vcpus=2, memory_mib=3 * COST.worker_memory_mib)  # room for three models
    sim = _prewarmed(fleet, COST, Workload("zipf", 6, requests_per_second=1.0))
    (instance,) = sim.instances
    assert _placement(sim) == [{2: 1, 1: 1, 0: 1}] and instance.memory_free == 0
    assert sim.load(instance, 5) is not None  # a cold model: the least requested prewarmed one makes room
    assert list(instance.models) == [1, 0, 5]
    sim.run(COST.download_s + COST.load_s)  # model 5 was downloaded, then loaded
    assert not instance.models[5].loading
    # Model 1 goes next; a prewarmed model is on the instance's disk: reloading it takes the load alone, no download.
    assert sim.load(instance, 2) is not None and list(instance.models) == [0, 5, 2]
    sim.run(sim.now + COST.load_s)
    assert not instance.models[2].loading


def test_prewarm_goes_by_each_models_share_not_by_its_number() -> None:
    # top-10 with 11 models: the ten share 8/9 (4/45 each), the eleventh has 1/9 alone, the most requested model.
    # Room for ten: it is loaded, and the last of the ten is left out.
    workload = Workload("top-10", 11, requests_per_second=1.0)
    assert max(workload.weights()) == workload.weights()[10] == pytest.approx(1 / 9)
    sim = _prewarmed(Fleet(instances=1, vcpus=2, memory_mib=10 * COST.worker_memory_mib), COST, workload)
    assert sorted(sim.instances[0].models) == [*range(9), 10]


def test_a_prewarmed_fleet_gives_each_model_the_workers_and_replicas_that_keep_them_70_percent_busy() -> None:
    # service 70 ms, 50 rps: the hot model (90%) keeps 3.15 workers busy, 4.5 at 70%: 5 workers; 4 fit an instance
    # (DJL's limit: the vCPUs), so two replicas of 3. The other model (10%): 0.5 at 70%, one worker on one instance,
    # the one with the most memory free.
    cost = ModelCost(worker_memory_mib=100, download_s=1.0, load_s=2.0, service_s=0.07)
    fleet = Fleet(instances=3, vcpus=4, memory_mib=1000, model_server="djl")
    workload = Workload("hot-model", 2, requests_per_second=50.0)
    assert math.ceil(50.0 * 0.9 * cost.service_s / PREWARM_UTILIZATION) == 5
    sim = _prewarmed(fleet, cost, workload)
    assert _placement(sim) == [{0: 3}, {0: 3}, {1: 1}]
    assert [instance.memory_free for instance in sim.instances] == [700, 700, 900]


def test_a_closed_loop_is_prewarmed_with_the_base_workers_whatever_its_models_cost() -> None:
    # No rate to size workers by: one second per request would ask for two workers at an open-loop rate of 1 rps.
    cost = ModelCost(worker_memory_mib=100, download_s=1.0, load_s=2.0, service_s=1.0)
    fleet = Fleet(instances=2, vcpus=4, memory_mib=1000, model_server="djl")
    sim = _prewarmed(fleet, cost, Workload("uniform", 1, clients=4))
    assert _placement(sim) == [{0: 1}, {}]


# --- processor sharing: jobs over a core share it alike, each done when it has had its work ---------------------


def test_jobs_that_overlap_on_one_core_each_finish_when_they_have_had_their_own_work() -> None:
    # One core: A (1 s of work) from 0, B (0.25 s) from 0.5. Alone, A does 0.5 s by 0.5; then each gets half the
    # core: B is done at 1.0, when A has had 0.75 s; A alone again, done at 1.25.
    sim = _Simulation(Fleet(instances=1, vcpus=1, memory_mib=100), COST, Workload("uniform", 1, clients=1), seed=0)
    (instance,) = sim.instances
    done: dict[str, float] = {}
    instance.run(1.0, lambda: done.__setitem__("A", sim.now))
    sim.at(0.5, instance.run, 0.25, lambda: done.__setitem__("B", sim.now))
    sim.run(10.0)
    assert done == {"A": pytest.approx(1.25), "B": pytest.approx(1.0)}


# --- simulate's report ------------------------------------------------------------------------------------------


def test_percentiles_are_nearest_rank() -> None:
    ordered = [float(value) for value in range(1, 201)]
    assert (_percentile(ordered, 0.50), _percentile(ordered, 0.99)) == (100.0, 198.0)
    assert (_percentile([1.0, 2.0, 3.0], 0.50), _percentile([1.0, 2.0, 3.0], 0.99)) == (2.0, 3.0)
    assert math.isnan(_percentile([], 0.5))


def test_a_warm_request_is_reported_in_milliseconds_and_the_window_after_the_warm_up() -> None:
    # One client, one loaded model of 10 ms: every latency is 10 ms; the window is the 10 s after the 5 s warm-up
    # (the closed loop's last answer ends it, at most one request past its end).
    fleet = Fleet(instances=1, vcpus=2, memory_mib=COST.worker_memory_mib)
    prediction = simulate(fleet, COST, Workload("uniform", 1, clients=1), duration_s=10, warmup_s=5)
    assert prediction.pattern == "uniform" and prediction.hit_ratio == 1.0
    assert (prediction.p50_ms, prediction.p99_ms) == (pytest.approx(10.0), pytest.approx(10.0))
    assert 10.0 <= prediction.elapsed_s <= 10.0 + COST.service_s
    assert prediction.throughput_rps == pytest.approx(100, rel=0.002)
    # Without the warm-up or the prewarmed model, the first request is cold (3.01 s) and the ~700 after it warm:
    # the 99th percentile is still 10 ms, the cold one is above it.
    cold = simulate(fleet, COST, Workload("uniform", 1, clients=1), duration_s=10, prewarm=False)
    assert cold.requests > 600 and cold.loads == 1
    assert (cold.p50_ms, cold.p99_ms) == (pytest.approx(10.0), pytest.approx(10.0))


@pytest.mark.parametrize(("service_s", "timed_out"), [(0.5, False), (0.75, True)])
def test_an_answer_at_exactly_the_sagemaker_timeout_counts_as_answered(service_s: float, timed_out: bool) -> None:
    # A cold request: 32 s download, 27.5 s load, then its service: 60 s exactly, or 60.25 s (all exact in binary).
    cost = ModelCost(worker_memory_mib=100, download_s=32.0, load_s=27.5, service_s=service_s)
    fleet = Fleet(instances=1, vcpus=2, memory_mib=100, model_server="torchserve")
    prediction = simulate(fleet, cost, Workload("uniform", 1, clients=1), duration_s=0.001, prewarm=False)
    assert prediction.requests == 1 and prediction.timeouts == int(timed_out)
    assert prediction.p50_ms == (math.inf if timed_out else SAGEMAKER_TIMEOUT_S * 1000)


def test_a_short_closed_loop_window_ends_with_its_last_answer_and_counts_answers_before_its_end() -> None:
    # One client, one loaded model of 0.25 s, a 0.5 s window: requests at 0 and 0.25, answered at 0.25 and 0.5. The
    # window ends at the last answer (0.5 s: two answers, 4 per second); of the answers, the one at 0.25 s came back
    # inside it, the one at exactly 0.5 s at its end, outside (the window is [warmup_s, warmup_s + duration_s)).
    cost = ModelCost(worker_memory_mib=100, download_s=1.0, load_s=2.0, service_s=0.25)
    fleet = Fleet(instances=1, vcpus=2, memory_mib=100)
    prediction = simulate(fleet, cost, Workload("uniform", 1, clients=1), duration_s=0.5)
    assert (prediction.requests, prediction.elapsed_s, prediction.throughput_rps) == (2, 0.5, 4.0)
    assert prediction.completed == 1


def test_a_window_without_requests_reports_no_hits_and_no_answers() -> None:
    fleet = Fleet(instances=1, vcpus=2, memory_mib=COST.worker_memory_mib)
    quiet = simulate(fleet, COST, Workload("uniform", 1, requests_per_second=1e-6), duration_s=1.0)
    nobody = simulate(fleet, COST, Workload("uniform", 1, clients=0), duration_s=1.0)
    for prediction in (quiet, nobody):
        assert (prediction.requests, prediction.hit_ratio, prediction.throughput_rps) == (0, 0.0, 0.0)


# --- refusals, each sentence whole ---------------------------------------------------------------------------------

SIMULATE_REFUSAL = "duration_s must be positive and warmup_s not negative"


@pytest.mark.parametrize(("duration_s", "warmup_s"), [(0.0, 0.0), (-1.0, 5.0), (1.0, -0.001), (0.0, -1.0)])
def test_a_window_of_no_length_or_a_negative_warm_up_is_refused(duration_s: float, warmup_s: float) -> None:
    fleet = Fleet(instances=1, vcpus=2, memory_mib=100)
    with pytest.raises(ValueError, match=f"^{re.escape(SIMULATE_REFUSAL)}$"):
        simulate(fleet, COST, Workload("uniform", 1, clients=1), duration_s=duration_s, warmup_s=warmup_s)
    assert simulate(fleet, COST, Workload("uniform", 1, clients=1), duration_s=0.001, warmup_s=0.0).requests == 1


@pytest.mark.parametrize(("pattern", "minimum"), [("uniform", 1), ("zipf", 1), ("hot-model", 2), ("top-10", 11)])
def test_each_pattern_needs_its_least_number_of_models(pattern: str, minimum: int) -> None:
    assert len(Workload(pattern, minimum, clients=1).weights()) == minimum
    if minimum > 1:
        refusal = f"the {pattern} pattern needs at least {minimum} models, got {minimum - 1}"
        with pytest.raises(ValueError, match=f"^{re.escape(refusal)}$"):
            Workload(pattern, minimum - 1, clients=1)


def test_zipf_traffic_requests_each_model_in_proportion_to_one_over_its_rank_to_the_exponent() -> None:
    # 1, 1/4, 1/9 of 49/36: the exponent is a power, not a factor (the default exponent of 1 cannot tell)
    weights = Workload("zipf", 3, clients=1, zipf_exponent=2.0).weights()
    assert weights == pytest.approx([36 / 49, 9 / 49, 4 / 49])


FLEET: dict[str, Any] = {"instances": 1, "vcpus": 1, "workers_per_model": 1, "memory_mib": 0.5, "cores": 0.5}


@pytest.mark.parametrize("field", ["instances", "vcpus", "workers_per_model"])
def test_a_fleet_needs_at_least_one_instance_vcpu_and_worker_per_model(field: str) -> None:
    assert Fleet(**FLEET).worker_limit == 1  # the least of each, and a share of a core (what the validation gives)
    refusal = "instances, vcpus and workers_per_model must be at least 1: Fleet("
    with pytest.raises(ValueError, match=f"^{re.escape(refusal)}.*{field}=0"):
        Fleet(**{**FLEET, field: 0})


@pytest.mark.parametrize(
    ("change", "refusal"),
    [({"memory_mib": 0.0}, "memory_mib must be positive, got 0.0"),
     ({"cores": 0.0}, "cores must be positive when given, got 0.0")],
)  # fmt: skip
def test_a_fleet_without_memory_or_cores_is_refused(change: dict, refusal: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(refusal)}$"):
        Fleet(**{**FLEET, **change})


@pytest.mark.parametrize("loop", [{}, {"requests_per_second": 1.0, "clients": 1}])
def test_a_workload_is_either_an_open_or_a_closed_loop(loop: dict) -> None:
    refusal = "give either requests_per_second (open loop) or clients (closed loop)"
    with pytest.raises(ValueError, match=f"^{re.escape(refusal)}$"):
        Workload("uniform", 1, **loop)
