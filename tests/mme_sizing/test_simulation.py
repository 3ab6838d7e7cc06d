"""The fleet model's physics on cases with a known answer: LRU hit ratios, processor sharing, worker rules, routing."""

from __future__ import annotations

import itertools
import math

import pytest

from mme_sizing.simulation import HOT_SET, Fleet, ModelCost, Workload, simulate

COST = ModelCost(worker_memory_mib=100, download_s=1.0, load_s=2.0, service_s=0.010, unload_s=0.1)


def one_instance(resident: int, *, vcpus: int = 4, server: str = "torchserve", workers: int = 1) -> Fleet:
    return Fleet(instances=1, vcpus=vcpus, memory_mib=resident * workers * COST.worker_memory_mib,
                 model_server=server, workers_per_model=workers)  # type: ignore[arg-type]  # fmt: skip


def test_pattern_weights_match_the_blog_posts_task_weights() -> None:
    hot = Workload("hot-model", 100, clients=1).weights()
    top = Workload("top-10", 100, clients=1).weights()
    zipf = Workload("zipf", 100, clients=1, zipf_exponent=1.2).weights()
    for weights in (hot, top, zipf, Workload("uniform", 100, clients=1).weights()):
        assert sum(weights) == pytest.approx(1.0)
    assert hot[0] == pytest.approx(0.9)
    assert sum(top[:HOT_SET]) == pytest.approx(8 / 9)
    assert all(a > b for a, b in itertools.pairwise(zipf))


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"pattern": "bursty", "models": 10, "clients": 1}, "pattern must be one of uniform, hot-model, top-10, zipf"),
        ({"pattern": "top-10", "models": 10, "clients": 1}, "needs at least 11 models"),
        ({"pattern": "uniform", "models": 10}, "either requests_per_second"),
    ],
)
def test_bad_workloads_are_refused_with_the_reason(arguments: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Workload(**arguments)


def test_lru_under_uniform_traffic_hits_in_proportion_to_the_resident_share() -> None:
    # One sequential client: the independent-reference LRU result, hit ratio = resident / models.
    for resident in (2, 4, 6):
        prediction = simulate(one_instance(resident), COST, Workload("uniform", 8, clients=1), duration_s=3000)
        assert prediction.hit_ratio == pytest.approx(resident / 8, abs=0.04)


def test_a_cold_request_waits_for_download_load_and_service_and_the_disk_copy_is_reused() -> None:
    fleet = one_instance(1)
    first = simulate(fleet, COST, Workload("uniform", 1, clients=1), duration_s=0.001, prewarm=False)
    assert first.requests == 1
    assert first.p50_ms == pytest.approx((COST.download_s + COST.load_s + COST.service_s) * 1000)
    # Two models, one slot, one client: every request after the first two reloads from disk (no download).
    alternating = simulate(fleet, COST, Workload("uniform", 2, clients=1), duration_s=200, prewarm=False)
    assert alternating.p99_ms <= (COST.unload_s + COST.download_s + COST.load_s + COST.service_s) * 1000 + 1e-6


def test_processor_sharing_caps_throughput_at_the_cores() -> None:
    # Every model resident with enough workers: 8 clients on 2 cores do 2 cores' worth, 1 client does one.
    fleet = one_instance(40, vcpus=2, server="djl", workers=8)
    busy = simulate(fleet, COST, Workload("uniform", 40, clients=8), duration_s=60)
    alone = simulate(fleet, COST, Workload("uniform", 40, clients=1), duration_s=60)
    assert busy.throughput_rps == pytest.approx(2 / COST.service_s, rel=0.02)
    assert alone.throughput_rps == pytest.approx(1 / COST.service_s, rel=0.02)
    assert busy.p50_ms == pytest.approx(8 / 2 * COST.service_s * 1000, rel=0.02)


def test_fixed_workers_starve_a_hot_model_that_djl_scales_out() -> None:
    # 90% of 400 rps to one model of 10 ms: it needs ~4 busy workers; TorchServe gives it one per instance.
    # Memory for every model plus DJL's extra workers (else those evict the tail and the tail's reloads eat the CPU).
    workload = Workload("hot-model", 50, requests_per_second=400)
    torchserve = simulate(one_instance(60, vcpus=8), COST, workload, duration_s=60, warmup_s=10)
    djl = simulate(one_instance(60, vcpus=8, server="djl"), COST, workload, duration_s=60, warmup_s=10)
    assert torchserve.throughput_rps < 0.5 * 400
    assert torchserve.timeouts > 0.5 * torchserve.requests and torchserve.p99_ms == math.inf  # failed, not fast
    assert djl.throughput_rps == pytest.approx(400, rel=0.1)
    assert djl.p99_ms < 1000


def test_a_hot_model_spills_to_more_instances_when_its_holder_is_saturated() -> None:
    workload = Workload("hot-model", 50, requests_per_second=400)
    fleet = Fleet(instances=8, vcpus=8, memory_mib=50 * COST.worker_memory_mib, model_server="torchserve")
    spread = simulate(fleet, COST, workload, duration_s=60, warmup_s=30)
    # Eight instances with one worker each hold the hot model's 360 rps at 10 ms (3.6 workers' worth).
    assert spread.throughput_rps == pytest.approx(400, rel=0.1)


def test_when_no_instance_can_make_room_requests_are_refused_not_queued_forever() -> None:
    # One slot, two clients on two models: the second finds the only model busy and cannot evict it.
    fleet = one_instance(1)
    prediction = simulate(fleet, COST, Workload("uniform", 2, clients=2), duration_s=30, prewarm=False)
    assert prediction.rejected > 1
    # Each request is answered or refused, each refusal counted: none left over as a timeout.
    answered = round(prediction.throughput_rps * prediction.elapsed_s)
    assert prediction.timeouts == 0 and answered + prediction.rejected == prediction.requests


def test_the_same_seed_gives_the_same_prediction() -> None:
    fleet = Fleet(instances=2, vcpus=4, memory_mib=1000, model_server="djl")
    workload = Workload("top-10", 40, requests_per_second=100)
    first, second = (simulate(fleet, COST, workload, duration_s=20, seed=7) for _ in range(2))
    assert first == second
    assert simulate(fleet, COST, workload, duration_s=20, seed=8) != first


def test_a_prewarmed_fleet_starts_with_the_workers_and_replicas_its_hot_model_needs() -> None:
    # 360 rps to a 10 ms model needs ~5 busy workers at 70%: DJL gets them on one instance without a transient.
    fleet = Fleet(instances=2, vcpus=8, memory_mib=50 * COST.worker_memory_mib, model_server="djl")
    prediction = simulate(fleet, COST, Workload("hot-model", 20, requests_per_second=400), duration_s=30)
    assert prediction.loads == 0 and prediction.hit_ratio == 1.0
    assert prediction.p99_ms < 100


def test_fewer_cores_share_the_same_work_more_slowly() -> None:
    # Eight closed-loop clients over 64 resident models (two rarely share a worker): CPU-bound, so throughput
    # follows the cores given.
    workload = Workload("uniform", 64, clients=8)
    full = simulate(one_instance(64), COST, workload, duration_s=100, warmup_s=10)
    half = simulate(Fleet(instances=1, vcpus=4, cores=2.0, memory_mib=6400, model_server="torchserve"), COST,
                    workload, duration_s=100, warmup_s=10)  # fmt: skip
    assert full.completed / 100 == pytest.approx(4 / COST.service_s, rel=0.01)  # four cores busy
    assert half.completed / 100 == pytest.approx(2 / COST.service_s, rel=0.01)
    with pytest.raises(ValueError, match="cores must be positive"):
        Fleet(instances=1, vcpus=4, cores=0.0, memory_mib=800)


def test_completed_counts_the_answers_inside_the_window() -> None:
    # One client, one loaded model, 10 ms per request: 10 s of window hold 1000 answers.
    prediction = simulate(one_instance(1), COST, Workload("uniform", 1, clients=1), duration_s=10, warmup_s=5)
    assert prediction.completed == pytest.approx(1000, abs=1)
