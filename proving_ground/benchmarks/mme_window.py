"""The pure half of a measured window (no Locust here, so tests and the simulation side can import it): the stopping
rule, the window's counts and 95% intervals, the host's CPU accounting and an ideal LRU replay.

The host is shared (other jobs, other sessions), so every window also records the CPU it had: the machine's busy
time from /proc/stat and, per process, this process (Locust and the harness client), TorchServe's Java frontend and
its Python workers (reaped workers included, through their parent's children times); what is left is other
processes' CPU, and ``cores_left`` (CPUs less the others' average use) is what the harness could use.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil

from mme_sizing.intervals import Interval, batch_means, lag1_autocorrelation, wilson

MIN_BATCHES = 5
PRECISE = "precise"
REQUEST_BUDGET = "request budget spent"
TIME_BUDGET = "time budget spent"
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# --- CPU accounting ---------------------------------------------------------------------------------------------------


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy since boot (every CPU; idle and iowait excluded)."""
    fields = [int(value) for value in open("/proc/stat").readline().split()[1:]]  # noqa: SIM115 - one line
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / _CLOCK_TICKS


def _cpu_s(process: psutil.Process) -> tuple[float, float]:
    """A process's own CPU seconds, and its reaped children's."""
    times = process.cpu_times()
    return times.user + times.system, times.children_user + times.children_system


@dataclass
class CpuAccount:
    """CPU seconds by who used them: snapshots of this process, the model server's process tree and the machine.

    ``server_pid``: the model server's launcher (None: a deployed endpoint, nothing local but this process)."""

    server_pid: int | None = None
    cpus: int = field(default_factory=lambda: os.cpu_count() or 1)

    def snapshot(self) -> dict[str, float]:
        used = {"wall_s": time.monotonic(), "machine_s": machine_busy_s(), "client_s": _cpu_s(psutil.Process())[0],
                "frontend_s": 0.0, "workers_s": 0.0}  # fmt: skip
        if self.server_pid is None:
            return used
        try:
            launcher = psutil.Process(self.server_pid)
            tree = [launcher, *launcher.children(recursive=True)]
        except psutil.NoSuchProcess:
            return used
        for process in tree:
            try:
                frontend = process is launcher or process.name() == "java"
                own, reaped = _cpu_s(process)
            except psutil.NoSuchProcess:  # a worker that ended between the listing and the read
                continue
            used["frontend_s" if frontend else "workers_s"] += own
            # Java's reaped children are the unloaded workers (the launcher's would be Java itself, still running).
            used["workers_s"] += reaped if process is not launcher else 0.0
        return used

    def between(self, before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        """What each party used between two snapshots, in CPU seconds, and the cores left to the harness."""
        spent = {key: after[key] - before[key] for key in before}
        wall = spent.pop("wall_s")
        ours = spent["client_s"] + spent["frontend_s"] + spent["workers_s"]
        others = max(0.0, spent.pop("machine_s") - ours)
        return {**spent, "wall_s": wall, "others_s": others, "others_cores": others / wall if wall else 0.0,
                "cores_left": max(0.0, self.cpus - others / wall) if wall else float(self.cpus)}  # fmt: skip


# --- requests and the window ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Completed:
    at: float  # time.monotonic() when the answer came back
    kind: str  # cold (this request loaded its model), warm, or invoke (a deployed endpoint does not say)
    failed: bool
    response_ms: float


@dataclass(frozen=True)
class Budget:
    precision: float = 0.2  # stop when every interval's half-width is at most this share of its estimate (0: never)
    max_requests: int = 2000  # ... or when the window has counted this many requests
    max_window_s: float = 180.0  # ... or after this many seconds of window
    batch_s: float = 10.0
    min_batches: int = MIN_BATCHES

    def __post_init__(self) -> None:
        if self.precision < 0 or self.max_requests < 1 or self.batch_s <= 0 or self.min_batches < 2:
            raise ValueError(f"a budget needs precision >= 0, max_requests >= 1, batch_s > 0, min_batches >= 2: {self}")
        if self.max_window_s < self.batch_s * 2:
            raise ValueError(f"the window budget ({self.max_window_s} s) must hold two batches of {self.batch_s} s")


def window_statistics(requests: Sequence[Completed], start: float, batches: int, batch_s: float) -> dict[str, Any]:
    """Counts, throughput and hit-ratio intervals, latencies of the requests completed in ``batches`` batches."""
    counts = [0] * batches
    for request in requests:
        counts[min(batches - 1, int((request.at - start) // batch_s))] += 1
    answered = [r for r in requests if not r.failed]
    known = [r for r in answered if r.kind in ("cold", "warm")]
    loads = sum(r.kind == "cold" for r in known)
    rates = [count / batch_s for count in counts]
    throughput = batch_means(rates) if batches >= 2 else None
    if throughput is not None and throughput.low < 0:  # a rate is never negative: the t interval is cut at 0
        throughput = dataclasses.replace(throughput, low=0.0)
    hit_ratio = wilson(len(known) - loads, len(known)) if known else None
    latencies = sorted(r.response_ms for r in answered)
    cold = sorted(r.response_ms for r in known if r.kind == "cold")
    warm = sorted(r.response_ms for r in known if r.kind == "warm")
    return {
        "requests": len(requests),
        "errors": len(requests) - len(answered),
        "model_loads": loads if known else None,
        "cold_requests": loads if known else 0,
        "window_s": batches * batch_s,
        "batches": batches,
        "tps": len(requests) / (batches * batch_s) if batches else math.nan,
        "tps_interval": throughput.as_dict() if throughput else None,
        "batch_lag1_autocorrelation": lag1_autocorrelation(rates),
        "hit_ratio": hit_ratio.estimate if hit_ratio else None,
        "hit_ratio_interval": hit_ratio.as_dict() if hit_ratio else None,
        "p50_ms": _percentile(latencies, 0.50),
        "p95_ms": _percentile(latencies, 0.95),
        "p99_ms": _percentile(latencies, 0.99),
        "cold_p50_ms": _percentile(cold, 0.50),
        "warm_p50_ms": _percentile(warm, 0.50),
    }


def _precise(stats: dict[str, Any], precision: float) -> bool:
    intervals = [stats["tps_interval"], stats["hit_ratio_interval"]]
    return (
        all(Interval(**interval).relative_half_width <= precision for interval in intervals if interval is not None)
        and stats["tps_interval"] is not None
    )


def stop_reason(stats: dict[str, Any], batches: int, budget: Budget) -> str:
    """Why the window stops after ``batches`` batches, or "" to go on."""
    if batches >= budget.min_batches and budget.precision > 0 and _precise(stats, budget.precision):
        return PRECISE
    if stats["requests"] >= budget.max_requests:
        return REQUEST_BUDGET
    if (batches + 1) * budget.batch_s > budget.max_window_s:
        return TIME_BUDGET
    return ""


def _percentile(ordered: Sequence[float], share: float) -> float | None:
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, math.ceil(share * len(ordered)) - 1)]


# --- what the harness held --------------------------------------------------------------------------------------------


def lru_loads(arrivals: Sequence[str], capacity: int, resident: Sequence[str]) -> int:
    """Loads an ideal least-recently-used cache of ``capacity`` models would make for ``arrivals`` (in order),
    starting from ``resident`` (least recently used first): what a harness that always holds its limit does."""
    cache = dict.fromkeys(resident)
    loads = 0
    for model in arrivals:
        if model in cache:
            del cache[model]
        else:
            loads += 1
            while len(cache) >= capacity:
                del cache[next(iter(cache))]
        cache[model] = None
    return loads
