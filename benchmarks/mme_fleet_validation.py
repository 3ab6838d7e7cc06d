"""Check the fleet simulation against the local multi-model harness: predicted against measured, side by side, one run.

For each configuration (``--models`` models, each of ``--resident`` models resident at most) the three traffic
patterns run on the real harness (TorchServe + the SageMaker toolkit in multi-model mode, Locust closed-loop users,
every pattern starting with nothing loaded), and the simulation predicts the same run from costs measured on the
same server just before (sequential probes, nothing else running): the first load of a model (unpack + load), a
reload from disk, an unload, a warm request. Nothing in the prediction is fitted to the pattern runs.

    python -m benchmarks.mme_fleet_validation --models 16 --resident 4 8 16 --users 4 --duration 60

Writes ``<output-dir>/mme_fleet_validation.json`` and ``.md``: per configuration and pattern, measured and predicted
throughput and hit ratio (1 - model loads / requests, the same count on both sides) and their errors.
"""

from __future__ import annotations

import argparse
import functools
import itertools
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

from benchmarks import mme_locustfile
from benchmarks.mme_load_test import run_pattern
from benchmarks.mme_model_cost import timed
from inference_assets.local.local_mme import LocalModelServer, LocalMultiModelEndpoint
from inference_assets.tools.publish_models import build_archive, copy_names
from mme_sizing.simulation import HOT_SET, PATTERNS
from mme_sizing.validation import predict, relative_error, write_results

ROOT = Path(__file__).resolve().parents[1]
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


def _saturated_rps(user_class: type[_ProbeUser], first_probe: int, args: argparse.Namespace) -> float:
    """Warm requests per second of ``args.users`` Locust users, through the same client path as the pattern runs."""
    user_class.first_probe = first_probe
    _OwnModelUser.numbering = itertools.count()
    probe_args = argparse.Namespace(**{**vars(args), "duration": SATURATION_S})
    row = run_pattern(user_class.pattern, probe_args, user_class=user_class)
    if row["errors"]:
        raise RuntimeError(f"the {user_class.pattern} probe had errors: {row['error_examples']}")
    return row["tps"]


def measure_costs(
    server: LocalModelServer, prefix: Path, names: list[str], first_probe: int, args: argparse.Namespace, cpus: int
) -> dict[str, float]:
    """Probes on the harness's own server, none of them a pattern run (``names``: the probe models, from index
    ``first_probe`` of the name template).

    Sequential (medians): first load, reload, unload, warm request. Concurrent: ``args.users`` reloads at once (the
    CPU work of a reload when loads share the cores). Saturated (``args.users`` Locust users, warm):
    all on one model, whose single worker is then the bottleneck (the time a request holds the worker), and each on
    its own model, where the cores are (the CPU a request takes in all: worker, TorchServe's front end and the
    Locust client in this process); what the second adds to the first is the CPU a request needs outside the worker.
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
    concurrent_reload_s = _concurrent_reload_s(endpoint, names[: args.users], body) - service
    for name in names[: args.users]:
        endpoint.invoke(name, body)
    mme_locustfile.target = _invoker(endpoint)
    one_model_rps = _saturated_rps(_OneModelUser, first_probe, args)
    own_models_rps = _saturated_rps(_OwnModelUser, first_probe, args)
    endpoint.unload_all()
    worker_s = 1 / one_model_rps
    users = args.users
    return {
        # The CPU work of one reload as processor sharing sees it: k reloads at once on c cores end after k x W / c.
        "load_work_s": concurrent_reload_s * min(cpus, users) / users,
        "concurrent_reload_s": concurrent_reload_s,
        "first_load_s": statistics.median(first) - service,
        "reload_s": statistics.median(reload) - service,
        "unload_s": statistics.median(unload),
        "warm_request_s": service,
        "one_model_rps": one_model_rps,
        "own_models_rps": own_models_rps,
        "worker_s": worker_s,
        "frontend_s": max(0.0, cpus / own_models_rps - worker_s),
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


def _invoker(endpoint: LocalMultiModelEndpoint) -> Callable[[str], tuple[bool | None, int]]:
    def invoke(model: str) -> tuple[bool | None, int]:
        answer, cold = endpoint.invoke(model, mme_locustfile.REQUEST_BODY)
        if answer.status != 200:
            raise mme_locustfile.InvokeError(f"{model} answered {answer.status}")
        return cold, len(answer.body)

    return invoke


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=16)
    parser.add_argument("--resident", type=int, nargs="+", default=[4, 8, 16], help="configurations to run")
    parser.add_argument("--users", type=int, default=4, help="concurrent closed-loop Locust users")
    parser.add_argument("--duration", type=float, default=60, help="seconds per pattern")
    parser.add_argument("--patterns", nargs="+", choices=PATTERNS, default=list(PATTERNS))
    parser.add_argument("--output-dir", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    args.spawn_rate = args.users  # every user starts at once, as the simulation's clients do
    if args.models <= HOT_SET:
        parser.error(f"--models must exceed {HOT_SET} (the top-10 pattern needs a tail)")
    if any(not 1 <= resident <= args.models for resident in args.resident):
        parser.error(f"--resident values must be between 1 and --models ({args.models})")
    if args.users < 1 or args.duration <= 0:
        parser.error("--users and --duration must be positive")
    if min(args.resident) < args.users:
        parser.error("--resident must be at least --users, or a load can find every resident model in use")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    from training_assets.tiny_model import build_tiny_model  # torch: only once the arguments are good

    command = "python -m benchmarks.mme_fleet_validation " + shlex.join(sys.argv[1:] if argv is None else argv)
    cpus = os.cpu_count() or 1
    host = {"cpus": cpus, "load_average_before": round(os.getloadavg()[0], 2)}
    mme_locustfile.models, mme_locustfile.name_template = args.models, mme_locustfile.DEFAULT_NAME_TEMPLATE
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="mme-validation-") as scratch:
        work = Path(scratch)
        archive = build_archive(  # the local harness is TorchServe
            build_tiny_model(work / "tiny-model"), work / "sentiment.tar.gz", model_server="torchserve"
        )
        prefix = work / "prefix"
        prefix.mkdir()
        names = copy_names(args.models + max(PROBE_REPEATS, args.users), mme_locustfile.DEFAULT_NAME_TEMPLATE)
        for name in names:
            shutil.copy(archive, prefix / name)
        with LocalModelServer(work / "server") as server:
            # Probe models the patterns never name.
            probes = names[args.models :]
            costs = measure_costs(server, prefix, probes, args.models, args, cpus)
            print("measured costs: " + ", ".join(f"{k} {v:.3f}" for k, v in costs.items()), flush=True)
            for resident in args.resident:
                endpoint = LocalMultiModelEndpoint(server, prefix, max_resident_models=resident)
                mme_locustfile.target = _invoker(endpoint)
                for pattern in args.patterns:
                    loads_before = endpoint.cold_loads
                    measured = run_pattern(pattern, args)
                    server.check_alive()
                    loads = endpoint.cold_loads - loads_before
                    endpoint.unload_all()  # the next pattern starts cold, as the prediction assumes
                    predicted = predict(costs, cpus=cpus, models=args.models, resident=resident, pattern=pattern,
                                        users=args.users, duration_s=args.duration)  # fmt: skip
                    row = {
                        "models": args.models,
                        "resident": resident,
                        "pattern": pattern,
                        "measured_tps": measured["tps"],
                        "predicted_tps": predicted["tps"],
                        "tps_error": relative_error(predicted["tps"], measured["tps"]),
                        "measured_hit_ratio": 1 - loads / measured["requests"] if measured["requests"] else 0.0,
                        "predicted_hit_ratio": predicted["hit_ratio"],
                        "measured_requests": measured["requests"],
                        "measured_errors": measured["errors"],
                        "measured_loads": loads,
                        "predicted_loads": predicted["loads"],
                    }
                    row["hit_ratio_error"] = relative_error(row["predicted_hit_ratio"], row["measured_hit_ratio"])
                    rows.append(row)
                    print(f"{resident} resident, {pattern}: measured {row['measured_tps']:.2f} TPS "
                          f"hit {row['measured_hit_ratio']:.2f}; predicted {row['predicted_tps']:.2f} TPS "
                          f"hit {row['predicted_hit_ratio']:.2f}", flush=True)  # fmt: skip
    result = {"command": command, "host": host, "costs": costs, "users": args.users, "duration_s": args.duration,
              "rows": rows}  # fmt: skip
    write_results(result, args.output_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
