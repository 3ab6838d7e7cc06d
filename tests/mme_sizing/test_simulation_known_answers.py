"""Known answers for the parts of the fleet model that mutation testing (docs/testing.md) found untested: the cost of
each cold load (unload, download once per instance, load, service) and the count of loads, DJL's worker scaling
(the queue threshold, the worker limit, the memory each new worker takes) and the refusal of impossible costs."""

from __future__ import annotations

import bisect
import random

import pytest

from mme_sizing.simulation import DJL_BATCH_SIZE, Fleet, ModelCost, Workload, simulate

COST = ModelCost(worker_memory_mib=100, download_s=1.0, load_s=2.0, service_s=0.010, unload_s=0.1)


def _one_slot_timeline(seed: int, duration: float) -> tuple[float, int]:
    """One client alternating at random between two models on an instance with room for one: the time until its last
    answer and the number of loads, worked out by hand (same draws as the simulation's: one random() per request)."""
    draws, cumulative = random.Random(seed), [0.5, 1.0]
    now, resident, on_disk, loads = 0.0, None, set(), 0
    while now < duration:
        model = bisect.bisect_left(cumulative, draws.random() * cumulative[-1])
        if model != resident:
            now += (COST.unload_s if resident is not None else 0.0) + (0.0 if model in on_disk else COST.download_s)
            now += COST.load_s
            on_disk.add(model)
            resident, loads = model, loads + 1
        now += COST.service_s
    return now, loads


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_cold_load_costs_its_unload_download_once_and_load(seed: int) -> None:
    fleet = Fleet(instances=1, vcpus=4, memory_mib=COST.worker_memory_mib, model_server="torchserve")
    prediction = simulate(fleet, COST, Workload("uniform", 2, clients=1), duration_s=60, prewarm=False, seed=seed)
    elapsed, loads = _one_slot_timeline(seed, 60)
    assert prediction.elapsed_s == pytest.approx(elapsed, abs=1e-6)
    assert prediction.loads == loads and loads > 5


def test_one_model_is_loaded_once() -> None:
    fleet = Fleet(instances=1, vcpus=4, memory_mib=COST.worker_memory_mib, model_server="torchserve")
    prediction = simulate(fleet, COST, Workload("uniform", 1, clients=1), duration_s=10, prewarm=False)
    assert prediction.loads == 1
    assert prediction.cold_loads_per_minute == pytest.approx(60 / prediction.elapsed_s)


def _djl(clients: int, *, worker_slots: int = 50, max_workers: int | None = None, cost: ModelCost = COST) -> float:
    """Answers per second of one DJL model under ``clients`` closed-loop clients on 4 cores."""
    fleet = Fleet(instances=1, vcpus=4, memory_mib=worker_slots * COST.worker_memory_mib, model_server="djl",
                  max_workers_per_model=max_workers)  # fmt: skip
    return simulate(fleet, cost, Workload("uniform", 1, clients=clients), duration_s=60, warmup_s=10).completed / 60


def test_djl_adds_a_worker_only_when_more_than_twice_the_batch_size_is_queued() -> None:
    # One busy worker and 2 x batch size queued: no new worker, one core's throughput; one more queued: workers up
    # to the 4 cores.
    waiting = 2 * DJL_BATCH_SIZE
    assert _djl(1 + waiting) == pytest.approx(1 / COST.service_s, rel=0.01)
    assert _djl(2 + waiting) == pytest.approx(4 / COST.service_s, rel=0.01)


def test_djl_workers_stop_at_the_worker_limit_and_at_the_memory() -> None:
    assert _djl(8, max_workers=2) == pytest.approx(2 / COST.service_s, rel=0.01)
    assert _djl(8, max_workers=3) == pytest.approx(3 / COST.service_s, rel=0.01)
    # Memory for three workers of the one model: the fourth never starts.
    assert _djl(8, worker_slots=3) == pytest.approx(3 / COST.service_s, rel=0.01)


@pytest.mark.parametrize(
    "changes",
    [
        {"worker_memory_mib": 0},
        {"service_s": 0},
        {"download_s": -0.1},
        {"load_s": -1},
        {"unload_s": -1},
        {"model_memory_mib": -1},
        {"frontend_s": -0.001},
    ],
)
def test_impossible_costs_are_refused(changes: dict) -> None:
    base = {"worker_memory_mib": 100, "download_s": 1.0, "load_s": 2.0, "service_s": 0.01}
    with pytest.raises(ValueError, match="model costs must be positive"):
        ModelCost(**{**base, **changes})


def test_the_smallest_possible_costs_are_accepted() -> None:
    cost = ModelCost(worker_memory_mib=0.5, download_s=0, load_s=0, service_s=0.0001, unload_s=0)
    assert cost.footprint_mib(2) == 1.0
