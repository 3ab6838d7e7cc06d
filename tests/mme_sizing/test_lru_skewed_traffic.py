"""LRU eviction on skewed traffic, where the eviction policy decides the answer (under uniform traffic every policy
gives resident / models, so only skewed traffic can tell LRU from a wrong policy).

The simulation's hit ratio is checked against a reference cache of the same size fed the same request mix: an
OrderedDict that evicts its least recently used entry. The same reference evicting the most recently used entry, or
the oldest loaded (FIFO), gives a far lower ratio on these mixes, which is what makes the fixture discriminating."""

from __future__ import annotations

import bisect
import itertools
import random
from collections import OrderedDict

import pytest

from mme_sizing.simulation import Fleet, ModelCost, Workload, simulate

COST = ModelCost(worker_memory_mib=100, download_s=1.0, load_s=2.0, service_s=0.010, unload_s=0.1)
REQUESTS = 100_000  # the reference's sample: its own error is about 0.002


def reference_hit_ratio(workload: Workload, slots: int, policy: str, seed: int = 1) -> float:
    """Independent requests drawn with the workload's weights through a cache of ``slots`` models."""
    rng = random.Random(seed)
    cumulative = list(itertools.accumulate(workload.weights()))
    cache: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for _ in range(REQUESTS):
        model = bisect.bisect_left(cumulative, rng.random() * cumulative[-1])
        if model in cache:
            hits += 1
            if policy != "fifo":
                cache.move_to_end(model)
            continue
        if len(cache) >= slots:
            cache.popitem(last=policy == "mru")
        cache[model] = None
    return hits / REQUESTS


def one_instance(slots: int) -> Fleet:
    return Fleet(instances=1, vcpus=4, memory_mib=slots * COST.worker_memory_mib, model_server="torchserve")


SKEWED = [
    pytest.param(Workload("zipf", 20, clients=1), 8, id="zipf-20-models-8-slots"),
    pytest.param(Workload("top-10", 20, clients=1), 4, id="top10-20-models-4-slots"),
    pytest.param(Workload("hot-model", 10, clients=1), 2, id="hot-model-10-models-2-slots"),
]


@pytest.mark.parametrize(("workload", "slots"), SKEWED)
def test_the_fixture_tells_lru_from_evicting_the_most_recently_used(workload: Workload, slots: int) -> None:
    assert reference_hit_ratio(workload, slots, "lru") - reference_hit_ratio(workload, slots, "mru") > 0.06


def test_zipf_traffic_tells_lru_from_first_in_first_out() -> None:
    # FIFO (a hit does not refresh the model) loses the head of a Zipf mix less often than MRU, but still 0.05.
    workload = Workload("zipf", 20, clients=1)
    assert reference_hit_ratio(workload, 8, "lru") - reference_hit_ratio(workload, 8, "fifo") > 0.04


@pytest.mark.parametrize(("workload", "slots"), SKEWED)
def test_lru_on_skewed_traffic_hits_as_a_least_recently_used_cache_does(workload: Workload, slots: int) -> None:
    # One sequential client: every request finds the others idle, so the simulation is a cache of `slots` models.
    prediction = simulate(one_instance(slots), COST, workload, duration_s=3000)
    assert prediction.requests > 1500  # enough requests for a standard error below 0.013
    assert prediction.hit_ratio == pytest.approx(reference_hit_ratio(workload, slots, "lru"), abs=0.03)


def test_a_cache_that_keeps_the_popular_models_answers_most_requests_warm() -> None:
    # Zipf over 20 models, 8 slots: LRU holds the head of the distribution, so most requests hit and the median
    # request is one warm service time; evicting the most recently used model makes the median a cold load.
    prediction = simulate(one_instance(8), COST, Workload("zipf", 20, clients=1), duration_s=3000)
    assert prediction.hit_ratio > 0.55
    assert prediction.p50_ms == pytest.approx(COST.service_s * 1000)
