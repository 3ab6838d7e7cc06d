"""The Graviton endpoint's default topology, chosen by measurement: every topology the server can take on this host's
cores, through the real server, beside the best raw forward pass on the same cores, then extrapolated to each
instance size.

One command (~7 minutes on an idle 2-core host; it prints its estimate first):

    .venv/bin/python -m proving_ground.benchmarks.serving_topology                 # results/serving_topology.{json,md}
    .venv/bin/python -m proving_ground.benchmarks.serving_topology --duration 3 --raw-duration 2 --out /tmp/topo

1. The raw forward pass (``SentimentPredictor`` in a process of its own, a replica's environment, all the host's
   cores): fp32 and, where the settings' ``fast_math`` is bf16 and every label of the precision set agrees with
   fp32, bf16 (autocast: x86's stand-in for Graviton's ``DNNL_DEFAULT_FPMATH_MODE=BF16``), at batches 8, 16 and
   32 back to back. The fastest is the yardstick; it runs again on one thread (how a pass scales with threads).
2. Each candidate topology (``candidates``: one replica with every core, on SageMaker's port or behind Ray's proxy,
   and every split into several replicas behind the proxy), one after another, alone on the host: the archive
   served by ``LocalRayServer`` (the container's launcher and deployment, the settings' defaults for everything but
   the topology, and the yardstick's precision), loaded by 8 and then 32 single-text clients. The yardstick runs
   before and after each, with no server up, and each served rate is set against their mean: the ratio.
3. ``extrapolate``: each topology's ratio on an instance of any size, from what step 2 measured (docs/serving.md,
   "Topology", states the model), and the best per Graviton size SageMaker hosts: what
   ``inference_assets/container/ray_settings.py`` (``REPLICAS_BY_VCPUS``) must choose, which
   tests/proving_ground/test_serving_topology.py checks against the results file.

The load generator shares the cores with the server (served numbers are a lower bound), and a loaded host makes the
wall-clock ratios noise: run it on a quiet host (the load average before and after is in the results). With the
default output it also rewrites the results line of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import re
import shlex
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

from inference_assets.container.ray_settings import default_topology
from inference_assets.local.local_server import LocalRayServer
from inference_assets.tools.endpoint_environment import endpoint_environment
from inference_assets.tools.package_model import build_model_archive
from proving_ground.benchmarks.serving_latency import (
    RESULTS,
    RawWorker,
    _cpu_name,
    build_model,
    http_caller,
    metered,
    replica_passes,
    run_load,
    sample_texts,
    share_priority,
    summarise,
)
from proving_ground.benchmarks.serving_precision import all_texts, compare_predictions
from stacks.settings.serving import GravitonEndpointSettings

DEFAULT_OUTPUT = RESULTS / "serving_topology"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"
DOCS_BEGIN, DOCS_END = "<!-- serving_topology results: begin -->", "<!-- serving_topology results: end -->"
LEVELS = (8, 32)  # concurrent single-text clients
BATCHES = (8, 16, 32)  # raw forward passes: any batch up to 32
PRECISIONS = ("fp32", "bf16_autocast")
REPLICA, PROXY = "ray::ServeReplica", "ray::ProxyActor"  # process kinds (serving_latency._process_kind)
WALL, CPU = "texts_per_s", "texts_per_cpu_s"  # the two rates of a raw run: by wall clock, per CPU second
# Seconds the untimed steps take on an idle 2-core host, for the estimate printed at the start (estimated: at load
# 12-15 the model and archive took 96 s, the raw workers and labels ~130 s, a server's start 37-84 s).
# The line a replica logs per forward pass (ray_deployment.SentimentReplica.answer_together): its texts and seconds.
PASS_LINE = re.compile(r"answered with one forward pass \((\d+) texts, \d+ tokens\) in ([0-9.]+) s")
FIXED_S = {"model and archive": 45, "raw workers and labels": 40, "server start and stop": 45, "warm-up": 2}


@dataclass(frozen=True)
class Candidate:
    """A topology to measure: ``replicas`` x ``threads`` on this host's cores, and how requests reach them."""

    replicas: int
    threads: int
    direct_ingress: bool

    @property
    def name(self) -> str:
        ingress = "direct ingress" if self.direct_ingress else "Ray's proxy"
        return f"{self.replicas} replica(s) x {self.threads} thread(s), {ingress}"

    def key(self) -> tuple[int, int, bool]:
        return (self.replicas, self.threads, self.direct_ingress)


def candidates(cores: int) -> list[Candidate]:
    """Every topology of ``cores``: one replica with all of them, on SageMaker's port (direct ingress) or behind Ray's
    proxy (the settings give one replica direct ingress; the proxy row prices the proxy alone), and each split into
    ``r`` replicas of ``cores / r`` threads, which only Ray's proxy can balance on one port."""
    one = [Candidate(1, cores, True), Candidate(1, cores, False)]
    return one + [Candidate(r, cores // r, False) for r in range(2, cores + 1) if cores % r == 0]


def _per_request_ms(rows: list[dict], kind: str) -> float:
    """CPU milliseconds per request of the processes whose kind starts with ``kind``, over ``rows``."""
    requests = sum(row["requests"] for row in rows)
    spent = sum(
        ms * row["requests"] for row in rows for name, ms in row["cpu_ms_per_request"].items() if name.startswith(kind)
    )
    return spent / requests if requests else 0.0


def _base(measured: list[dict], replicas: int, threads: int, direct: bool) -> dict:
    """The measured topology a topology of ``replicas`` x ``threads`` extrapolates from: same ingress, the most
    threads up to ``threads`` (else the fewest: a host with more cores than the instance), and on a tie one or several
    replicas as it has."""
    same = [m for m in measured if m["direct_ingress"] == direct]
    fitting = [m for m in same if m["threads"] <= threads] or [min(same, key=lambda m: m["threads"])]
    return max(fitting, key=lambda m: (m["threads"], (m["replicas"] > 1) == (replicas > 1)))


def predict(results: dict, vcpus: int, replicas: int, threads: int, direct: bool) -> float:
    """The ratio (served over the best raw pass on the same cores) of a topology on ``vcpus`` cores, from what was
    measured on ``results["cores"]`` (docs/serving.md, "Topology"):

    - compute: the ratio of the measured topology it extrapolates from (``_base``), times the thread scaling per
      doubling (``raw.thread_scaling``) for each doubling of threads per replica beyond the measured ones;
    - serial work: Ray's proxy is one process, and a replica's event loop and admission thread are one each, so the
      instance serves at most 1000 / (the proxy's CPU ms per request) requests a second, and each replica 1000 /
      (its CPU ms per request outside the forward pass); over the yardstick scaled to ``vcpus`` cores, a ceiling.

    On the measured cores a measured topology's prediction is its measurement."""
    measured, cores = results["topologies"], results["cores"]
    for m in measured:
        if vcpus == cores and (m["replicas"], m["threads"], m["direct_ingress"]) == (replicas, threads, direct):
            return float(m["ratio"])
    base = _base(measured, replicas, threads, direct)
    compute = base["ratio"] * results["raw"]["thread_scaling"] ** math.log2(threads / base["threads"])
    yardstick = vcpus * results["raw"]["yardstick_per_core"]
    ceilings = [compute]
    if results["replica_serial_cpu_ms"] > 0:
        ceilings.append(replicas * 1000 / results["replica_serial_cpu_ms"] / yardstick)
    if not direct and base["proxy_cpu_ms"] > 0:
        ceilings.append(1000 / base["proxy_cpu_ms"] / yardstick)
    return min(ceilings)


def extrapolate(results: dict, vcpus: int) -> list[dict]:
    """Every topology of ``vcpus`` cores with its predicted ratio, best first (on a tie, fewer replicas)."""
    rows = [
        {"replicas": c.replicas, "threads": c.threads, "direct_ingress": c.direct_ingress, "name": c.name,
         "predicted_ratio": round(predict(results, vcpus, *c.key()), 3)}
        for c in candidates(vcpus)
    ]  # fmt: skip
    return sorted(rows, key=lambda row: (-row["predicted_ratio"], row["replicas"], not row["direct_ingress"]))


def best_topology(results: dict, vcpus: int) -> tuple[int, int, bool]:
    """(replicas, threads, direct ingress) of the best topology on ``vcpus`` cores: measured where ``vcpus`` is the
    measured host's, extrapolated elsewhere."""
    best = extrapolate(results, vcpus)[0]
    return best["replicas"], best["threads"], best["direct_ingress"]


def sizes() -> dict[str, int]:
    """The Graviton endpoint's instance sizes: the c7g types SageMaker hosts in the facts table, by vCPUs."""
    from platform_facts.instances import instance_types

    found = {f.sagemaker_name: f.vcpus for name, f in instance_types().items() if name.startswith("c7g.")}
    hosted = {name: vcpus for name, vcpus in found.items() if _hosted(name)}
    return dict(sorted(hosted.items(), key=lambda item: item[1]))


def _hosted(name: str) -> bool:
    from platform_facts.instances import instance_type

    return instance_type(name).offered("hosting")


def by_instance_type(results: dict) -> dict[str, dict]:
    """Per Graviton size: the best topology and its predicted ratio, with the runner-up, for the results file."""
    table = {}
    for name, vcpus in sizes().items():
        ranked = extrapolate(results, vcpus)
        table[name] = {"vcpus": vcpus, "best": ranked[0], "runner_up": ranked[1] if len(ranked) > 1 else None}
    return table


def default_measured(results: dict) -> dict:
    """The topology the settings choose on the measured cores (``ray_settings.default_topology``), as measured: its
    ratio per number of clients and the worse of them."""
    chosen = default_topology(results["cores"])
    key = (chosen.replicas, chosen.threads, chosen.direct_ingress)
    (row,) = [t for t in results["topologies"] if (t["replicas"], t["threads"], t["direct_ingress"]) == key]
    ratios = {level: values["ratio"] for level, values in row["levels"].items()}
    return {"name": row["name"], "ratios": ratios, "ratio": row["ratio"]}


@contextmanager
def _raw_worker(model_dir: Path, precision: str, threads: int, environment: dict[str, str]) -> Iterator[RawWorker]:
    worker = RawWorker(model_dir, precision, threads, {**environment, "OMP_NUM_THREADS": str(threads)})
    try:
        yield worker
    finally:
        worker.close()


def _warm(worker: RawWorker, batch: int, seconds: float) -> None:
    """Untimed passes of ``batch`` texts, as long as a timed run."""
    worker.run_batches(batch, batch, seconds)


def _raw_run(worker: RawWorker, batch: int, seconds: float) -> dict:
    row = summarise("raw", batch, [metered(functools.partial(worker.run_batches, batch), worker.pid)(batch, seconds)])
    return {"batch": batch, "texts_per_s": row["throughput_rps"], "texts_per_cpu_s": row["requests_per_cpu_s"]}


def _tree_rss_mib(leader: int) -> float:
    try:
        root = psutil.Process(leader)
        family = [root, *root.children(recursive=True)]
        return round(sum(p.memory_info().rss for p in family if p.is_running()) / 2**20)
    except psutil.Error:
        return 0.0


def pass_totals(log_texts: list[str]) -> tuple[int, float]:
    """Texts and seconds of the forward passes logged in ``log_texts`` (replica logs)."""
    found = [match for text in log_texts for match in PASS_LINE.findall(text)]
    return sum(int(texts) for texts, _ in found), sum(float(seconds) for _, seconds in found)


def _logged_passes(server: LocalRayServer) -> tuple[int, float]:
    assert server.workdir is not None
    logs = (server.workdir / "tmp").glob("ray/session_latest/logs/serve/replica_*.log")
    return pass_totals([path.read_text(errors="replace") for path in logs])


def forward_share(before: tuple[int, float], after: tuple[int, float], replicas: int, wall_s: float) -> dict:
    """Where a level's time went: the share of the wall time the replicas' forward threads were in a pass (the rest is
    the wait between passes: answers out, requests in, admission), and the passes' own rate (texts per second of
    pass), against which the raw pass shows what the server's other work took from the pass's cores."""
    texts, seconds = after[0] - before[0], after[1] - before[1]
    return {
        "forward_busy": round(seconds / (replicas * wall_s), 3) if wall_s > 0 else 0.0,
        "pass_texts_per_s": round(texts / seconds, 2) if seconds > 0 else 0.0,
    }


def serve(archive: Path, candidate: Candidate, cores: int, precision: str, batch: int, duration_s: float) -> dict:
    """``candidate`` served on ``cores`` with the settings' defaults, ``precision`` and a server batch of ``batch``,
    loaded by each of LEVELS."""
    settings = GravitonEndpointSettings()
    ingress = {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1" if candidate.direct_ingress else "0"}
    options: dict[str, Any] = {
        "workers": candidate.replicas,
        "batch_size": batch,
        "max_batch_delay_ms": settings.server_max_batch_delay_ms,
        "fast_math": settings.fast_math,
        "precision": precision,
    }
    texts, starting = sample_texts(), time.perf_counter()
    with LocalRayServer(
        archive, vcpus=cores, environment_overrides=ingress, startup_timeout_s=900, **options
    ) as server:
        assert server.environment["OMP_NUM_THREADS"] == str(candidate.threads), server.environment
        share_priority(server.process_group)  # Ray's processes run in sessions of their own, as the raw workers do
        startup_s = round(time.perf_counter() - starting, 1)
        caller = http_caller(server.port)
        run_load(caller, texts, 1, 2.0)  # warm-up: lazy initialisation
        runner = metered(functools.partial(run_load, caller, texts), server.process_group,
                         functools.partial(replica_passes, server))  # fmt: skip
        rows = []
        for level in LEVELS:
            run_load(caller, texts, level, duration_s / 3)  # untimed: this level's pass shapes, as the raw passes
            before = _logged_passes(server)
            run_ = runner(level, duration_s)  # waits a second after the load for the replicas' logs
            share = forward_share(before, _logged_passes(server), candidate.replicas, run_["wall_s"])
            rows.append(summarise(candidate.name, level, [run_]) | share)
        rss = _tree_rss_mib(server.process_group)
    return {**asdict(candidate), "name": candidate.name, "rows": rows, "server_rss_mib": rss, "startup_s": startup_s}


def measure_raw(
    model_dir: Path, environment: dict[str, str], cores: int, seconds: float, rate: str, served_batch: int
) -> tuple[dict, dict[str, RawWorker]]:
    """The raw forward passes: labels of bf16 against fp32, every precision x batch, the best on one thread, and per
    number of clients the yardstick: the best pass (by ``rate``: texts per second or per CPU second) of at most that
    many texts. Returns the raw results and the yardsticks' workers, kept for the runs around each server (the
    caller closes them)."""
    settings = GravitonEndpointSettings()
    workers = {p: RawWorker(model_dir, p, cores, environment) for p in PRECISIONS}
    texts = all_texts()
    labels = compare_predictions(workers["fp32"].predict(texts), workers["bf16_autocast"].predict(texts))
    bf16 = settings.fast_math == "bf16" and labels["label_agreement"] == 1.0
    eligible = ["fp32", "bf16_autocast"] if bf16 else ["fp32"]
    batches = sorted({*BATCHES, served_batch})  # the server's batch too: what its full pass costs
    # Untimed first: a worker's first passes of each shape (texts per length band x padded length) build and cache
    # its kernels (LRU_CACHE_CAPACITY), and a cold 6 s run read ~0.7 of a warm one; the server's levels warm alike.
    for p in eligible:
        for batch in batches:
            _warm(workers[p], batch, seconds)
    sweep = [{"precision": p, **_raw_run(workers[p], batch, seconds)} for p in eligible for batch in batches]
    best = max(sweep, key=lambda row: row[rate])
    yardsticks = {
        str(level): max((row for row in sweep if row["batch"] <= level), key=lambda row: row[rate]) for level in LEVELS
    }
    needed = {row["precision"] for row in yardsticks.values()}
    for precision in set(workers) - needed:
        workers.pop(precision).close()
    with _raw_worker(model_dir, best["precision"], 1, environment) as single:
        _warm(single, best["batch"], seconds)
        one_thread = _raw_run(single, best["batch"], seconds)
    # Throughput a pass keeps when its threads double (log2(cores) doublings from one thread to all the cores): by
    # wall clock, all the cores against one; per CPU second (a loaded host) the CPU cost alone, which misses threads
    # that wait for each other.
    kept = best[rate] / one_thread[rate] / (cores if rate == WALL else 1)
    raw = {
        "labels_bf16_vs_fp32": labels,
        "eligible_precisions": eligible,
        "sweep": sweep,
        "best": best,
        "yardsticks": {level: {"precision": r["precision"], "batch": r["batch"]} for level, r in yardsticks.items()},
        "one_thread": one_thread,
        "thread_scaling": round(min(1.0, kept ** (1 / math.log2(cores))), 3) if cores > 1 else 1.0,
        # The best pass per core, by the rate: the yardstick of an instance is its vCPUs times this.
        "yardstick_per_core": round(best[rate] / (cores if rate == WALL else 1), 2),
    }
    return raw, workers


def summarise_topology(served: dict, around: dict[str, list[dict]], rate: str) -> dict:
    """One topology's ratios per number of clients (served over that level's yardstick, mean of its runs before and
    after the server: ``around``), by wall clock and per CPU second; ``ratio`` is the worse level's by ``rate``."""
    levels = {}
    for row in served["rows"]:
        runs = around[str(row["concurrency"])]
        wall = row["throughput_rps"] / (sum(r[WALL] for r in runs) / len(runs))
        cpu = row["requests_per_cpu_s"] / (sum(r[CPU] for r in runs) / len(runs))
        levels[str(row["concurrency"])] = {
            "requests_per_s": row["throughput_rps"],
            "ratio_wall_clock": round(wall, 3),
            "ratio_per_cpu_s": round(cpu, 3),
            "ratio": round(wall if rate == WALL else cpu, 3),
            "p50_ms": row["p50_ms"],
            "p99_ms": row["p99_ms"],
            "errors": row["errors"],
            "requests_per_pass": row["mean_requests_per_pass"],
            "cpu_ms_per_request": row["cpu_ms_per_request"],
            "forward_busy": row["forward_busy"],
            "pass_texts_per_s": row["pass_texts_per_s"],
        }
    keys = ("replicas", "threads", "direct_ingress", "name", "server_rss_mib", "startup_s")
    return {
        **{key: served[key] for key in keys},
        "levels": levels,
        "ratio": min(level["ratio"] for level in levels.values()),  # the worse of the client counts
        "proxy_cpu_ms": round(_per_request_ms(served["rows"], PROXY), 2) if not served["direct_ingress"] else 0.0,
        "replica_cpu_ms": round(_per_request_ms(served["rows"][-1:], REPLICA), 2),  # the fullest passes: most clients
    }


def replica_serial_ms(raw: dict, topologies: list[dict], precision: str, batch: int) -> float:
    """CPU ms per request that one replica spends outside the forward pass (HTTP, admission, batching: its event loop
    and its one admission thread), from the one-replica, direct-ingress topology at the most clients (full passes)
    against the raw pass over the server's batch; 0 where noise hides it."""
    (forward,) = [r for r in raw["sweep"] if r["precision"] == precision and r["batch"] == batch]
    (direct,) = [t for t in topologies if t["direct_ingress"]]
    return round(max(0.0, direct["replica_cpu_ms"] - 1000 / forward[CPU]), 2)


def expected_seconds(candidate_count: int, duration_s: float, raw_s: float) -> float:
    """What one run takes on an idle host: the fixed steps (FIXED_S, per server where they are) and the timed ones
    (the raw sweep of both precisions and the one-thread run; two yardsticks around each server, at most)."""
    fixed = FIXED_S["model and archive"] + FIXED_S["raw workers and labels"]
    per_server = FIXED_S["server start and stop"] + FIXED_S["warm-up"] + len(LEVELS) * duration_s * 4 / 3
    sweep = (len(PRECISIONS) * len(BATCHES) + 1) * raw_s * 2  # each after its warm-up run
    return fixed + sweep + candidate_count * per_server + (candidate_count + 1) * len(LEVELS) * raw_s


def choose_rate(load_average: float, cores: int) -> str:
    """Wall clock on a quiet host (fewer runnable processes than cores before the run), else per CPU second: under
    load a back-to-back loop and a server get different shares of the cores, and only CPU time compares them."""
    return WALL if load_average < cores else CPU


def _yardstick_runs(workers: dict[str, RawWorker], raw: dict, seconds: float) -> dict[str, dict]:
    """One run of each level's yardstick (a level whose pass is another's shares its run)."""
    runs: dict[tuple[str, int], dict] = {}
    for pass_ in raw["yardsticks"].values():
        key = (pass_["precision"], pass_["batch"])
        if key not in runs:
            runs[key] = _raw_run(workers[key[0]], key[1], seconds)
    return {level: runs[(p["precision"], p["batch"])] for level, p in raw["yardsticks"].items()}


# Long: the benchmark's steps in order (model, raw passes, each topology between two yardstick runs), then the results
def run(
    output: Path, duration_s: float, raw_s: float, model_size: str, command: str, rate: str | None, batch: int | None
) -> dict:
    cores = os.cpu_count() or 1
    chosen = candidates(cores)
    estimate = expected_seconds(len(chosen), duration_s, raw_s)
    load_before = [round(x, 2) for x in os.getloadavg()]
    rate = rate or choose_rate(load_before[0], cores)
    print(f"serving_topology: {len(chosen)} topologies on {cores} cores, about {estimate / 60:.1f} minutes on an "
          f"idle host; load average now {load_before[0]}: ratios by {rate}", flush=True)  # fmt: skip
    started, settings = time.perf_counter(), GravitonEndpointSettings()
    batch = batch or settings.server_batch_size
    with tempfile.TemporaryDirectory(prefix="serving-topology-") as scratch:
        model_dir = build_model(Path(scratch) / "model", model_size)
        archive = build_model_archive(model_dir, Path(scratch) / "model.tar.gz")
        phases = {"model and archive": round(time.perf_counter() - started)}
        # The raw passes run with a replica's environment (threads, OpenMP wait policy, allocator, fast math).
        environment = {
            name: value
            for name, value in endpoint_environment(vcpus=cores, fast_math=settings.fast_math).items()
            if not name.startswith(("SENTIMENT_SERVE_", "RAY_"))
        }
        raw, workers = measure_raw(model_dir, environment, cores, raw_s, rate, batch)
        phases["raw passes"] = round(time.perf_counter() - started) - phases["model and archive"]
        precision = raw["best"]["precision"]
        print(f"raw: best {raw['best']}, yardsticks {raw['yardsticks']}, thread scaling {raw['thread_scaling']}")
        try:
            yardstick_runs = [_yardstick_runs(workers, raw, raw_s)]
            topologies = []
            for candidate in chosen:
                served = serve(archive, candidate, cores, precision, batch, duration_s)
                yardstick_runs.append(_yardstick_runs(workers, raw, raw_s))
                around = {level: [runs[level] for runs in yardstick_runs[-2:]] for level in raw["yardsticks"]}
                topologies.append(summarise_topology(served, around, rate))
                print(f"{candidate.name}: {topologies[-1]['levels']}", flush=True)
        finally:
            for worker in workers.values():
                worker.close()
    raw["yardstick_runs"] = yardstick_runs
    results = {
        "command": command,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpu": _cpu_name(),
        "cores": cores,
        "model": f"RoBERTa-{model_size} shaped, random weights, the tiny model's tokenizer (tweets of ~20-60 tokens)",
        "served_with": {
            "precision": precision,
            "server_batch_size": batch,
            "server_max_batch_delay_ms": settings.server_max_batch_delay_ms,
        },
        "ratios_by": rate,
        "duration_s": {"per_level": duration_s, "per_raw_run": raw_s, "run": round(time.perf_counter() - started)}
        | phases,
        "load_average_before": load_before,
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "raw": raw,
        "topologies": topologies,
        "replica_serial_cpu_ms": replica_serial_ms(raw, topologies, precision, batch),
    }
    results["by_instance_type"] = by_instance_type(results)
    results["default_topology"] = default_measured(results)
    write(output, results)
    return results


def _ratios(topology: dict) -> str:
    ratios = topology.get("ratios") or {level: row["ratio"] for level, row in topology["levels"].items()}
    return "/".join(f"{ratios[str(level)]:.2f}" for level in LEVELS)


def docs_line(results: dict) -> str:
    """The results line of docs/benchmarks.md: what the file says, in one line."""
    raw = results["raw"]
    yardsticks = ", ".join(
        f"{level} clients: {p['precision']} batch {p['batch']}" for level, p in raw["yardsticks"].items()
    )
    rows = ", ".join(f"{t['name']} **{_ratios(t)}**" for t in results["topologies"])
    loads = results["load_average_before"][0], results["load_average_after"][0]
    chosen = "; ".join(
        f"{name}: {row['best']['replicas']} x {row['best']['threads']}"
        f"{' direct' if row['best']['direct_ingress'] else ' proxy'} {row['best']['predicted_ratio']:.2f}"
        for name, row in results["by_instance_type"].items()
    )
    default = results["default_topology"]
    return (
        f"`{results['command']}` ({results['date']}, {results['cpu']}, {results['cores']} cores, load "
        f"{loads[0]} before, {loads[1]} after; ratios by {results['ratios_by']}): yardsticks {yardsticks}; served at "
        f"{' / '.join(map(str, LEVELS))} single-text clients: {rows}; the default topology ({default['name']}, "
        f"server batch {results['served_with']['server_batch_size']}): **{_ratios(default)}**. Best per size "
        f"(measured at {results['cores']} vCPUs, extrapolated above, predicted ratio): {chosen}."
    )


SUMMARY_KEYS = ("date", "cpu", "cores", "model", "served_with", "ratios_by", "duration_s", "load_average_before")


def markdown(results: dict) -> str:
    raw = results["raw"]
    runs = [{level: run[results["ratios_by"]] for level, run in around.items()} for around in raw["yardstick_runs"]]
    lines = [
        "# The Graviton endpoint's topology at equal cores",
        "",
        f"Command: `{results['command']}`",
        "",
        *(f"- {key}: {results[key]}" for key in (*SUMMARY_KEYS, "load_average_after")),
        f"- bf16 against fp32: {raw['labels_bf16_vs_fp32']} (eligible: {', '.join(raw['eligible_precisions'])})",
        f"- best raw pass: {raw['best']}; on one thread {raw['one_thread']}; thread scaling per doubling "
        f"{raw['thread_scaling']}; per core {raw['yardstick_per_core']}",
        f"- yardstick per number of clients (the best pass of at most that many texts): {raw['yardsticks']}; its runs "
        f"before and after each server ({results['ratios_by']}): {runs}",
        f"- a replica's serial CPU per request (outside the forward pass): {results['replica_serial_cpu_ms']} ms",
        f"- **the default topology** (what the settings choose on {results['cores']} vCPUs): "
        f"{results['default_topology']['name']}, ratio {_ratios(results['default_topology'])} at "
        f"{' / '.join(map(str, LEVELS))} clients",
        "",
        "| raw precision | batch | texts/s | texts per CPU s |",
        "|---|---|---|---|",
        *(f"| {r['precision']} | {r['batch']} | {r['texts_per_s']} | {r['texts_per_cpu_s']} |" for r in raw["sweep"]),
        "",
        "| topology | clients | req/s | **ratio** | wall clock | per CPU s | req per pass | forward busy "
        "| pass texts/s | p50 ms | p99 ms | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t in results["topologies"]:
        for level, row in t["levels"].items():
            lines.append(
                f"| {t['name']} | {level} | {row['requests_per_s']} | **{row['ratio']}** | {row['ratio_wall_clock']} | "
                f"{row['ratio_per_cpu_s']} | {row['requests_per_pass']} | {row.get('forward_busy', '')} | "
                f"{row.get('pass_texts_per_s', '')} | {row['p50_ms']} | {row['p99_ms']} | {row['errors']} |"
            )
    lines += [
        "",
        "| topology | ratio (worse level) | proxy CPU ms/request | replica CPU ms/request | RSS MiB | start s |",
    ]
    lines += ["|---|---|---|---|---|---|"]
    lines += [
        f"| {t['name']} | {t['ratio']} | {t['proxy_cpu_ms']} | {t['replica_cpu_ms']} | {t['server_rss_mib']} | "
        f"{t['startup_s']} |"
        for t in results["topologies"]
    ]
    lines += ["", "| instance type | vCPUs | best topology | predicted ratio | runner-up | its ratio |"]
    lines += ["|---|---|---|---|---|---|"]
    for name, row in results["by_instance_type"].items():
        second = row["runner_up"] or {"name": "", "predicted_ratio": ""}
        lines.append(
            f"| {name} | {row['vcpus']} | {row['best']['name']} | {row['best']['predicted_ratio']} | "
            f"{second['name']} | {second['predicted_ratio']} |"
        )
    return "\n".join(lines) + "\n"


def write(output: Path, results: dict) -> None:
    output.parent.mkdir(parents=True, exist_ok=True)
    output.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    output.with_suffix(".md").write_text(markdown(results))


def update_docs(results: dict, docs: Path = DOCS) -> None:
    """Replace the results line between the markers of docs/benchmarks.md with this run's."""
    text = docs.read_text()
    head, rest = text.split(DOCS_BEGIN, 1)
    _, tail = rest.split(DOCS_END, 1)
    docs.write_text(f"{head}{DOCS_BEGIN}\n{docs_line(results)}\n{DOCS_END}{tail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUTPUT, help="results path without suffix")
    parser.add_argument("--duration", type=float, default=15.0, help="seconds of load per topology and level")
    parser.add_argument("--raw-duration", type=float, default=6.0, help="seconds per raw run")
    parser.add_argument("--model-size", choices=("base", "tiny"), default="base")
    parser.add_argument(
        "--rate", choices=(WALL, CPU), help="what the ratios compare (default: by wall clock on a quiet host, else CPU)"
    )
    parser.add_argument("--server-batch-size", type=int, help="the server's batch (default: the settings' default)")
    args = parser.parse_args(argv)
    command = "python -m proving_ground.benchmarks.serving_topology " + " ".join(
        shlex.quote(part) for part in (sys.argv[1:] if argv is None else argv)
    )
    results = run(
        args.out, args.duration, args.raw_duration, args.model_size, command.strip(), args.rate, args.server_batch_size
    )
    if args.out.resolve() == DEFAULT_OUTPUT.resolve():
        update_docs(results)
    print(args.out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
