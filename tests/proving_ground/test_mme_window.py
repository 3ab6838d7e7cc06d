"""The measured window's pure rules (proving_ground/benchmarks/mme_window.py): its counts and intervals, when it
stops, the CPU
account and the ideal LRU replay."""

from __future__ import annotations

import math
import os
import time

import pytest

from mme_sizing.intervals import batch_means, wilson
from proving_ground.benchmarks.mme_window import (
    PRECISE,
    REQUEST_BUDGET,
    TIME_BUDGET,
    Budget,
    Completed,
    CpuAccount,
    lru_loads,
    stop_reason,
    window_statistics,
)


def requests_per_batch(counts: list[int], *, cold_every: int = 0, failed_every: int = 0) -> list[Completed]:
    """``counts[i]`` requests spread over batch i (1 s batches from 100.0)."""
    made, number = [], 0
    for batch, count in enumerate(counts):
        for i in range(count):
            number += 1
            cold = bool(cold_every) and number % cold_every == 0
            failed = bool(failed_every) and number % failed_every == 0
            made.append(Completed(100.0 + batch + i / count, "cold" if cold else "warm", failed, 3000.0 if cold else 5))
    return made


def test_window_counts_requests_loads_and_the_intervals_of_throughput_and_hit_ratio() -> None:
    stats = window_statistics(requests_per_batch([10, 12, 8, 11, 9], cold_every=5), 100.0, 5, 1.0)
    assert (stats["requests"], stats["errors"], stats["model_loads"], stats["window_s"]) == (50, 0, 10, 5.0)
    assert stats["tps"] == 10.0 and stats["hit_ratio"] == 0.8
    expected_tps = batch_means([10.0, 12.0, 8.0, 11.0, 9.0])
    assert (stats["tps_interval"]["low"], stats["tps_interval"]["high"]) == (expected_tps.low, expected_tps.high)
    expected_hits = wilson(40, 50)
    assert stats["hit_ratio_interval"]["low"] == expected_hits.low and "Wilson" in stats["hit_ratio_interval"]["method"]
    assert stats["cold_p50_ms"] == 3000.0 and stats["warm_p50_ms"] == 5


def test_failed_requests_count_for_throughput_but_not_for_the_hit_ratio() -> None:
    stats = window_statistics(requests_per_batch([10, 10], failed_every=10), 100.0, 2, 1.0)
    assert (stats["requests"], stats["errors"]) == (20, 2)
    assert stats["hit_ratio_interval"] == wilson(18, 18).as_dict()


def test_a_throughput_interval_stops_at_zero() -> None:
    stats = window_statistics(requests_per_batch([0, 0, 0, 0, 3]), 100.0, 5, 1.0)  # t interval 0.6 +- 1.67
    assert stats["tps_interval"]["low"] == 0.0 and stats["tps_interval"]["high"] > 2


def test_a_deployed_endpoint_has_no_hit_ratio() -> None:
    invokes = [Completed(100.0 + i / 10, "invoke", False, 5) for i in range(20)]
    stats = window_statistics(invokes, 100.0, 2, 1.0)
    assert stats["hit_ratio"] is None and stats["model_loads"] is None and stats["tps_interval"] is not None


def test_the_window_stops_when_precise_or_when_a_budget_is_spent() -> None:
    steady = window_statistics(requests_per_batch([100] * 5, cold_every=10), 100.0, 5, 1.0)
    assert stop_reason(steady, 5, Budget(precision=0.2, batch_s=1.0, max_window_s=60)) == PRECISE
    assert stop_reason(steady, 4, Budget(precision=0.2, batch_s=1.0, max_window_s=60)) == ""  # five batches first
    assert stop_reason(steady, 5, Budget(precision=0.0, batch_s=1.0, max_window_s=60, max_requests=500)) == (
        REQUEST_BUDGET
    )
    assert stop_reason(steady, 5, Budget(precision=0.0, batch_s=1.0, max_window_s=5.5)) == TIME_BUDGET
    few_hits = window_statistics(requests_per_batch([10] * 5, cold_every=2), 100.0, 5, 1.0)  # 25 of 50 hits
    assert stop_reason(few_hits, 5, Budget(precision=0.2, batch_s=1.0, max_window_s=60)) == ""  # +-0.14 of 0.5


def test_a_budget_refuses_a_window_shorter_than_two_batches() -> None:
    with pytest.raises(ValueError, match="must hold two batches"):
        Budget(max_window_s=15, batch_s=10)


def test_lru_replay_counts_the_loads_of_a_cache_that_always_holds_its_limit() -> None:
    assert lru_loads(["a", "b", "a", "c", "b"], 2, []) == 4  # c evicts b (a was used later), then b evicts a
    assert lru_loads(["a", "b", "a", "c", "b"], 3, []) == 3
    assert lru_loads(["a", "b", "c"], 2, ["a", "b"]) == 1  # a and b resident: only c loads
    assert lru_loads(["a", "c", "b"], 2, ["a", "b"]) == 2  # c evicts b, the least recently used


def test_cpu_account_gives_this_process_its_own_cpu_and_the_rest_to_others() -> None:
    account = CpuAccount()
    before = account.snapshot()
    start = time.process_time()
    while time.process_time() - start < 0.2:  # burn 0.2 s of this process's CPU
        math.sqrt(12345.678)
    used = account.between(before, account.snapshot())
    # The account reads the kernel's clock ticks (psutil: /proc/<pid>/stat), which each snapshot may round down by
    # one: 0.2 s burnt can read as 0.18 on a 100 Hz clock (0.18999999999999773 seen on a loaded host).
    tick = 1 / os.sysconf("SC_CLK_TCK")
    assert used["client_s"] >= 0.2 - 2 * tick - 1e-9 and used["frontend_s"] == used["workers_s"] == 0.0
    assert used["others_s"] >= 0.0 and 0.0 <= used["cores_left"] <= account.cpus
