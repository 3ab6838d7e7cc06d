"""Check the fleet simulation against the local multi-model harness: measured with its intervals, predicted with its
spread over seeds, and a verdict per run.

For each configuration (``--models`` models, at most ``--resident`` of them resident) the three traffic patterns run
on the real harness (TorchServe + the SageMaker toolkit in multi-model mode, Locust closed-loop users). Each run starts
from a steady state (the most requested models loaded), warms up, then measures a window until its 95% intervals are
narrow enough to tell a 20% error or its budget is spent (proving_ground/benchmarks/mme_measure.py). The simulation
predicts the
same window with several seeds, from costs that probes measured on the same server before the runs (the CPU of a
load, the time a request holds its worker, the CPU it takes outside the worker), on the CPU the run had (the shared
host's CPUs less what other processes took during the window). Nothing in the prediction is fitted to the runs.
Each run also records what the harness held: the resident models it counted and TorchServe registered (sampled
every second), and the loads an ideal LRU cache of the same limit makes for the same requests in the same order.

    python -m proving_ground.benchmarks.mme_fleet_validation --models 16 --resident 4 8 16
    python -m proving_ground.benchmarks.mme_fleet_validation --models 24 --resident 6 12 --name mme_fleet_validation_24

Writes ``<output-dir>/<name>.json`` and ``.md`` (proving_ground/sizing_validation.py): per configuration and pattern,
requests
and loads counted, measured throughput and hit ratio (1 - model loads / requests, the same count on both sides) with
their intervals, the prediction's mean and spread, and the verdicts.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import math
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Locust (through the load test) first: it monkey-patches the interpreter with gevent, which must happen before
# requests imports ssl.
from locust import task
from requests import RequestException

from inference_assets.tools.publish_models import copy_names
from mme_sizing.simulation import HOT_SET, PATTERNS
from proving_ground.benchmarks import mme_locustfile
from proving_ground.benchmarks.mme_load_test import server_pid
from proving_ground.benchmarks.mme_measure import measure_pattern
from proving_ground.benchmarks.mme_model_cost import machine, timed
from proving_ground.benchmarks.mme_window import Budget, CpuAccount, lru_loads
from proving_ground.sizing_validation import SEEDS, diagnose_row, judge, predict_row, write_results
from proving_ground.torchserve_mme.archive import build_archive
from proving_ground.torchserve_mme.local_mme import LocalModelServer, LocalMultiModelEndpoint

ROOT = Path(__file__).resolve().parents[2]
PROBE_REPEATS = 3
WARM_REQUESTS = 20
SATURATION_S = 8.0


class _ProbeUser(mme_locustfile.PatternUser):
    abstract = True
    first_probe = 0  # the name-template index of the first probe model


class _OneModelUser(_ProbeUser):
    """Every user on the first probe model: its single worker is the bottleneck."""

    pattern = "one-model"

    @task
    def same_model(self) -> None:
        self._invoke(self.first_probe)


class _OwnModelUser(_ProbeUser):
    """User i on probe model i: the cores are the bottleneck."""

    pattern = "own-model"
    numbering = itertools.count()

    def on_start(self) -> None:
        self.index = self.first_probe + next(self.numbering)

    @task
    def own_model(self) -> None:
        self._invoke(self.index)


def _saturated(user_class: type[_ProbeUser], first_probe: int, args: argparse.Namespace, cpu: CpuAccount
               ) -> dict[str, Any]:  # fmt: skip
    """``args.users`` Locust users of a probe for SATURATION_S, through the same client path as the pattern runs."""
    user_class.first_probe = first_probe
    _OwnModelUser.numbering = itertools.count()
    budget = Budget(precision=0, max_requests=10**9, max_window_s=SATURATION_S, batch_s=1.0)
    row = measure_pattern(user_class.pattern, users=args.users, spawn_rate=args.users, warmup_s=1.0, budget=budget,
                          user_class=user_class, cpu=cpu)  # fmt: skip
    if row["errors"]:
        raise RuntimeError(f"the {user_class.pattern} probe had errors: {row['error_examples']}")
    return row


# Long: one measurement script, step after step (build, load, measure, unload), each step timed where it runs
def measure_costs(
    server: LocalModelServer, prefix: Path, names: list[str], first_probe: int, args: argparse.Namespace,
    cpu: CpuAccount
) -> dict[str, Any]:  # fmt: skip
    """Probes on the harness's own server, none of them a pattern run (``names``: the probe models, from index
    ``first_probe`` of the name template).

    Sequential (medians): first load, reload, unload, warm request. Concurrent: ``args.users`` reloads at once, with
    the CPU the server's processes spent on them (a load's CPU, whatever else ran on the host). Saturated
    (``args.users`` Locust users, warm): all on one model, whose single worker is then the bottleneck (the time a
    request holds the worker: its worker's CPU per request, and the wall time per request for comparison), and each
    on its own model (the CPU a request takes outside the worker: this process's Locust client and harness, and
    TorchServe's Java frontend).
    """
    body = mme_locustfile.REQUEST_BODY
    endpoint = LocalMultiModelEndpoint(server, prefix, max_resident_models=len(names))
    first, reload, unload, warm = [], [], [], []
    for name in names[:PROBE_REPEATS]:
        invoke = functools.partial(endpoint.invoke, name, body)
        first.append(timed(invoke))  # unpack + load + one request
        for _ in range(WARM_REQUESTS):
            warm.append(timed(invoke))
        unload.append(timed(endpoint.unload_all))
        reload.append(timed(invoke))  # load from the unpacked copy + one request
        endpoint.unload_all()
    service = statistics.median(warm)
    for name in names[: args.users]:  # unpacked and loaded: the saturated probes find them warm
        endpoint.invoke(name, body)
    endpoint.unload_all()
    before = cpu.snapshot()
    concurrent_reload_s = _concurrent_reload_s(endpoint, names[: args.users], body) - service
    reload_cpu = cpu.between(before, cpu.snapshot())
    for name in names[: args.users]:
        endpoint.invoke(name, body)
    mme_locustfile.target = _invoker(endpoint)
    one_model = _saturated(_OneModelUser, first_probe, args, cpu)
    own_models = _saturated(_OwnModelUser, first_probe, args, cpu)
    endpoint.unload_all()
    one_cpu, own_cpu = one_model["cpu"]["harness_s_per_request"], own_models["cpu"]["harness_s_per_request"]
    return {
        "load_cpu_s": (reload_cpu["frontend_s"] + reload_cpu["workers_s"]) / args.users,
        "concurrent_reload_s": concurrent_reload_s,
        "concurrent_reload_cores_left": reload_cpu["cores_left"],
        "first_load_s": statistics.median(first) - service,
        "reload_s": statistics.median(reload) - service,
        "unload_s": statistics.median(unload),
        "warm_request_s": service,
        # A request holds its model's worker while the worker computes and while TorchServe's frontend hands the
        # request to it and reads the answer (WorkerThread sends one request and waits for its answer before the
        # next): the worker's and the Java frontend's CPU per request, from the probe on the models' own workers.
        "worker_s": own_cpu["workers_s"] + own_cpu["frontend_s"],
        # Outside the worker: the client (Locust and the harness in this process).
        "frontend_s": own_cpu["client_s"],
        "own_models_rps": own_models["tps"],
        "own_models_cores_left": own_models["cpu"]["cores_left"],
        "own_models_cpu_per_request": own_cpu,
        "one_model_rps": one_model["tps"],
        "one_model_cores_left": one_model["cpu"]["cores_left"],
        "one_model_cpu_per_request": one_cpu,
        "worker_wall_s": 1 / one_model["tps"],
    }


def _concurrent_reload_s(endpoint: LocalMultiModelEndpoint, names: list[str], body: bytes) -> float:
    """Unload ``names`` (already unpacked), then reload them all at once: seconds until the last one answered."""
    endpoint.unload_all()
    threads = [threading.Thread(target=endpoint.invoke, args=(name, body)) for name in names]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


class _Arrivals:
    """The harness's side of a run: the models requested, in order (for the LRU replay), and the invoker."""

    def __init__(self, endpoint: LocalMultiModelEndpoint) -> None:
        self.endpoint = endpoint
        self.models: list[tuple[float, str]] = []

    def __call__(self, model: str) -> tuple[bool | None, int]:
        self.models.append((time.monotonic(), model))
        answer, cold = self.endpoint.invoke(model, mme_locustfile.REQUEST_BODY)
        if answer.status != 200:
            raise mme_locustfile.InvokeError(f"{model} answered {answer.status}")
        return cold, len(answer.body)


def _invoker(endpoint: LocalMultiModelEndpoint) -> Callable[[str], tuple[bool | None, int]]:
    return _Arrivals(endpoint)


def steady_state(endpoint: LocalMultiModelEndpoint, resident: int) -> list[str]:
    """Load the ``resident`` most requested models (the same for every pattern: models 0, 1, ...), the least
    requested least recently used, as the simulation's prewarm does; return their names."""
    targets = [mme_locustfile.model_name(index) for index in range(resident)]
    if set(endpoint.resident()) != set(targets):
        endpoint.unload_all()
        missing = iter(targets)  # two loaders: the harness's host has two cores
        loaders = [threading.Thread(target=lambda: [endpoint.invoke(name, mme_locustfile.REQUEST_BODY)
                                                    for name in missing]) for _ in range(2)]  # fmt: skip
        for loader in loaders:
            loader.start()
        for loader in loaders:
            loader.join()
    for name in reversed(targets):  # least requested first: it ends least recently used
        answer, cold = endpoint.invoke(name, mme_locustfile.REQUEST_BODY)
        if answer.status != 200 or cold:
            raise RuntimeError(f"{name} should be loaded and answer: {answer.status}, cold {cold}")
    if endpoint.resident() != list(reversed(targets)):
        raise RuntimeError(f"the steady state is not the expected LRU order: {endpoint.resident()}")
    return endpoint.resident()


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=16)
    parser.add_argument("--resident", type=int, nargs="+", default=[4, 8, 16], help="configurations to run")
    parser.add_argument("--users", type=int, default=4, help="concurrent closed-loop Locust users")
    parser.add_argument("--warmup", type=float, default=10, help="seconds per run before its window (not counted)")
    parser.add_argument(
        "--precision",
        type=float,
        default=0.2,
        help="stop a window once its intervals' half-widths are at most this share of the estimate",
    )
    parser.add_argument("--max-requests", type=int, default=1500, help="a window's request budget")
    parser.add_argument("--max-window", type=float, default=150, help="a window's time budget, seconds")
    parser.add_argument("--batch-seconds", type=float, default=10, help="batch length of the throughput interval")
    parser.add_argument("--seeds", type=int, default=SEEDS, help="simulation seeds per prediction")
    parser.add_argument("--patterns", nargs="+", choices=PATTERNS, default=list(PATTERNS))
    parser.add_argument("--output-dir", type=Path, default=ROOT / "proving_ground" / "benchmarks" / "results")
    parser.add_argument("--name", default="mme_fleet_validation", help="results file name (.json and .md)")
    parser.add_argument(
        "--render",
        type=Path,
        metavar="RESULTS",
        help="measure nothing: judge the rows of a results file again and rewrite its .json and .md",
    )
    parser.add_argument("--costs-from", type=Path, metavar="RESULTS",
                        help="skip the probes: take the costs of an earlier results file of this benchmark (CPU "
                             "seconds, so a later run on the same host can reuse them)")  # fmt: skip
    args = parser.parse_args(argv)
    args.spawn_rate = args.users  # every user starts at once, as the simulation's clients do
    if args.models <= HOT_SET:
        parser.error(f"--models must exceed {HOT_SET} (the top-10 pattern needs a tail)")
    if any(not 1 <= resident <= args.models for resident in args.resident):
        parser.error(f"--resident values must be between 1 and --models ({args.models})")
    if args.users < 1 or args.seeds < 1 or args.warmup < 0:
        parser.error("--users and --seeds must be positive, --warmup not negative")
    if min(args.resident) < args.users:
        parser.error("--resident must be at least --users, or a load can find every resident model in use")
    if args.costs_from is not None and not args.costs_from.is_file():
        parser.error(f"--costs-from: no results file at {args.costs_from}")
    try:
        args.budget = Budget(precision=args.precision, max_requests=args.max_requests, max_window_s=args.max_window,
                             batch_s=args.batch_seconds)  # fmt: skip
    except ValueError as error:
        parser.error(str(error))
    return args


def _run(endpoint: LocalMultiModelEndpoint, server: LocalModelServer, resident: int, pattern: str,
         args: argparse.Namespace, cpu: CpuAccount) -> dict[str, Any]:  # fmt: skip
    """One measured window of a pattern from the steady state, with what the harness held during it."""
    steady_state(endpoint, resident)
    arrivals = _Arrivals(endpoint)
    mme_locustfile.target = arrivals
    opened: dict[str, Any] = {}

    def window_opens() -> None:
        opened.update(at=time.monotonic(), resident=endpoint.resident())

    def held() -> dict[str, float]:
        try:
            registered = float(len(server.loaded()))
        except RequestException:  # the management API is slow on a busy host: skip this sample
            registered = math.nan
        return {"resident": len(endpoint.resident()), "registered": registered}

    row = measure_pattern(pattern, users=args.users, spawn_rate=args.spawn_rate, warmup_s=args.warmup,
                          budget=args.budget, cpu=cpu, on_window_start=window_opens, sample=held)  # fmt: skip
    server.check_alive()
    in_window = [model for at, model in arrivals.models if opened["at"] <= at < opened["at"] + row["window_s"]]
    row["replay_loads"] = lru_loads(in_window, resident, opened["resident"])
    row["window_arrivals"] = len(in_window)
    return row


def render(path: Path) -> None:
    """Judge a results file's measured rows again (the current verdict rules, a rate interval cut at 0, the
    diagnosis at the window's load cost where it is missing) and rewrite its .json and .md: the same measurements,
    the current report."""
    result = json.loads(path.read_text())
    settings = result["settings"]
    for row in result["rows"]:
        if row["tps_interval"] is not None:
            row["tps_interval"]["low"] = max(0.0, row["tps_interval"]["low"])
        if "predicted_at_window_load_cost" not in row:  # results from before the diagnosis
            diagnose_row(row, result["costs"], users=settings["users"], warmup_s=settings["warmup_s"],
                         seeds=result["seeds"])  # fmt: skip
        judge(row)
    write_results(result, path.parent, path.stem)


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    if args.render is not None:
        render(args.render)
        return 0
    from training_assets.tiny_model import build_tiny_model  # torch: only once the arguments are good

    command = "python -m proving_ground.benchmarks.mme_fleet_validation " + shlex.join(
        sys.argv[1:] if argv is None else argv
    )
    host = {"machine": machine(), "cpus": os.cpu_count() or 1, "load_average_before": round(os.getloadavg()[0], 2)}
    mme_locustfile.models, mme_locustfile.name_template = args.models, mme_locustfile.DEFAULT_NAME_TEMPLATE
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="mme-validation-") as scratch:
        work = Path(scratch)
        archive = build_archive(  # the local harness is TorchServe
            build_tiny_model(work / "tiny-model"), work / "sentiment.tar.gz"
        )
        prefix = work / "prefix"
        prefix.mkdir()
        names = copy_names(args.models + max(PROBE_REPEATS, args.users), mme_locustfile.DEFAULT_NAME_TEMPLATE)
        for name in names:
            shutil.copy(archive, prefix / name)
        with LocalModelServer(work / "server") as server:
            cpu = CpuAccount(server_pid=server_pid(server))
            if args.costs_from is None:  # probe models the patterns never name
                costs = measure_costs(server, prefix, names[args.models :], args.models, args, cpu)
            else:
                costs = {**json.loads(args.costs_from.read_text())["costs"], "from": str(args.costs_from)}
            print(f"costs: {costs}", flush=True)
            for resident in args.resident:
                endpoint = LocalMultiModelEndpoint(server, prefix, max_resident_models=resident)
                for pattern in args.patterns:
                    row = _run(endpoint, server, resident, pattern, args, cpu)
                    row.update(models=args.models, resident=resident)
                    predict_row(row, costs, users=args.users, warmup_s=args.warmup, seeds=args.seeds)
                    judge(row)
                    rows.append(row)
                    print(_line(row), flush=True)
                    settings = {"users": args.users, "warmup_s": args.warmup, **dataclasses.asdict(args.budget)}
                    result = {"command": command, "host": host, "costs": costs, "settings": settings,
                              "seeds": args.seeds, "rows": rows}  # fmt: skip
                    write_results(result, args.output_dir, args.name)  # after every run: a stopped run keeps its data
                endpoint.unload_all()
    return 0


def _line(row: dict[str, Any]) -> str:
    predicted = row["predicted"]
    return (
        f"{row['resident']} resident, {row['pattern']}: {row['requests']} requests, {row['model_loads']} loads (ideal "
        f"LRU {row['replay_loads']}), {row['stopped']}; TPS {_interval(row, 'tps')} predicted "
        f"{predicted['tps']['mean']:.2f} ({row['tps_verdict']}); hit ratio {_interval(row, 'hit_ratio')} predicted "
        f"{predicted['hit_ratio']['mean']:.2f} ({row['hit_ratio_verdict']}); cores left {row['cpu']['cores_left']:.2f}"
    )


def _interval(row: dict[str, Any], key: str) -> str:
    interval = row[f"{key}_interval"]
    if interval is None:
        return "none (nothing answered)"
    return f"{interval['estimate']:.2f} [{interval['low']:.2f}, {interval['high']:.2f}]"


if __name__ == "__main__":
    sys.exit(main())
