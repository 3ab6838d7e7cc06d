"""One traffic pattern measured until it says what it must (the pure rules are in
proving_ground/benchmarks/mme_window.py).

A run starts ``users`` closed-loop Locust users, waits ``warmup_s`` (not counted), then measures a window cut into
batches of ``batch_s`` seconds. After each batch it computes the 95% intervals (mme_sizing/intervals.py): throughput
by batch means, hit ratio (requests that did not load their model) by the Wilson interval. It stops when both are
narrow enough (half-width at most ``precision`` of the estimate, so that an error of twice that lies outside), or
when the request budget or the time budget is spent: then the run is reported as inconclusive, with the interval it
reached. Requests still in flight when the window closes finish (so that no model is left half loaded) but are not
counted. Importing this module imports Locust, which monkey-patches the interpreter with gevent.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import gevent
import gevent.event
from locust import User
from locust.env import Environment

from proving_ground.benchmarks import mme_locustfile
from proving_ground.benchmarks.mme_window import PRECISE, Budget, Completed, CpuAccount, stop_reason, window_statistics

STOP_TIMEOUT_S = 300


class RequestLog:
    """Every request the Locust users complete while it is attached, with its completion time."""

    def __init__(self) -> None:
        self.completed: list[Completed] = []

    def _on_request(self, name: str, response_time: float, exception: BaseException | None = None, **_: Any) -> None:
        self.completed.append(Completed(time.monotonic(), name, exception is not None, response_time))

    def __enter__(self) -> RequestLog:
        mme_locustfile.events.request.add_listener(self._on_request)
        return self

    def __exit__(self, *_: object) -> None:
        mme_locustfile.events.request.remove_listener(self._on_request)

    def between(self, start: float, end: float) -> list[Completed]:
        return [request for request in self.completed if start <= request.at < end]


# Long: one traffic window: start Locust, sample the server, stop, then collect the numbers, in that order
def measure_pattern(
    pattern: str,
    *,
    users: int,
    spawn_rate: float,
    warmup_s: float,
    budget: Budget,
    user_class: type[User] | None = None,
    cpu: CpuAccount | None = None,
    on_window_start: Callable[[], None] | None = None,
    sample: Callable[[], dict[str, float]] | None = None,
) -> dict[str, Any]:
    """Run ``users`` users of the pattern (or of ``user_class``): ``warmup_s`` not counted, then batches until the
    budget says stop. ``on_window_start`` runs when the window opens; ``sample`` is called once a second during the
    window (e.g. how many models the harness holds) and its values are averaged."""
    environment = Environment(
        user_classes=[user_class or mme_locustfile.PATTERNS[pattern]],
        events=mme_locustfile.events,
        stop_timeout=STOP_TIMEOUT_S,  # at the end, users finish the request in flight (a model load, say)
    )
    runner = environment.create_local_runner()
    cpu = cpu or CpuAccount()
    samples: list[dict[str, float]] = []
    sampling_done = gevent.event.Event()

    def sampler() -> None:
        while sample is not None and not sampling_done.is_set():
            samples.append(sample())
            sampling_done.wait(1.0)

    with RequestLog() as log:
        runner.start(users, spawn_rate=spawn_rate)
        gevent.sleep(warmup_s)
        if on_window_start is not None:
            on_window_start()
        start, cpu_before = time.monotonic(), cpu.snapshot()
        sampling = gevent.spawn(sampler)
        batches, stop = 0, ""
        while not stop:
            gevent.sleep(max(0.0, start + (batches + 1) * budget.batch_s - time.monotonic()))
            batches += 1
            stats = window_statistics(
                log.between(start, start + batches * budget.batch_s), start, batches, budget.batch_s
            )
            stop = stop_reason(stats, batches, budget)
        cpu_after = cpu.snapshot()
        sampling_done.set()
        sampling.join()
        runner.quit()
        runner.greenlet.join()
    run_requests = len(log.completed)
    stats["cpu"] = cpu.between(cpu_before, cpu_after)
    stats["cpu"]["harness_s_per_request"] = {
        key: stats["cpu"][key] / stats["requests"] if stats["requests"] else math.nan
        for key in ("client_s", "frontend_s", "workers_s")
    }
    averages = {key: statistics.fmean(s[key] for s in samples) for key in samples[0]} if samples else {}
    return {
        "pattern": pattern,
        **stats,
        "stopped": stop,
        "conclusive": stop == PRECISE,
        "warmup_s": warmup_s,
        "requests_total": run_requests,
        "samples": averages,
        "budget": dataclasses.asdict(budget),
        "error_examples": [str(error.error)[:160] for error in list(environment.stats.errors.values())[:3]],
    }
