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
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

# Locust (through the load test) first: it monkey-patches the interpreter with gevent, which must happen before
# requests imports ssl.
from benchmarks import mme_locustfile
from benchmarks.mme_load_test import run_pattern
from inference_assets.local.local_mme import LocalModelServer, LocalMultiModelEndpoint
from inference_assets.tools.publish_models import build_archive, copy_names
from mme_sizing.simulation import HOT_SET, PATTERNS
from mme_sizing.validation import predict, relative_error, write_results

ROOT = Path(__file__).resolve().parents[1]
PROBE_REPEATS = 3
WARM_REQUESTS = 20
SATURATION_S = 8.0


def _timed(action: Any) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def _closed_loop_rps(endpoint: LocalMultiModelEndpoint, models: list[str], body: bytes, seconds: float) -> float:
    """Warm requests per second of one closed-loop client per entry of ``models`` (a name may repeat)."""
    done = [0] * len(models)
    deadline = time.perf_counter() + seconds

    def client(index: int) -> None:
        while time.perf_counter() < deadline:
            endpoint.invoke(models[index], body)
            done[index] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(models))]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(done) / (time.perf_counter() - started)


def measure_costs(
    server: LocalModelServer, prefix: Path, names: list[str], *, repeats: int, clients: int, cpus: int, body: bytes
) -> dict[str, float]:
    """Probes on the harness's own server, none of them a pattern run.

    Sequential (medians): first load, reload, unload, warm request. Saturated (``clients`` closed-loop clients, warm):
    all on one model, whose single worker is then the bottleneck (the time a request holds the worker), and each on
    its own model, where the cores are (the CPU a request takes in all: worker, TorchServe's front end and this
    process's client); what the second adds to the first is the CPU a request needs outside the worker.
    """
    endpoint = LocalMultiModelEndpoint(server, prefix, max_resident_models=len(names))
    first, reload, unload, warm = [], [], [], []
    for name in names[:repeats]:
        first.append(_timed(lambda n=name: endpoint.invoke(n, body)))  # unpack + load + one request
        for _ in range(WARM_REQUESTS):
            warm.append(_timed(lambda n=name: endpoint.invoke(n, body)))
        unload.append(_timed(endpoint.unload_all))
        reload.append(_timed(lambda n=name: endpoint.invoke(n, body)))  # load from the unpacked copy + one request
        endpoint.unload_all()
    service = statistics.median(warm)
    own_models = names[:clients]
    for name in own_models:
        endpoint.invoke(name, body)
    one_model_rps = _closed_loop_rps(endpoint, [own_models[0]] * clients, body, SATURATION_S)
    own_models_rps = _closed_loop_rps(endpoint, own_models, body, SATURATION_S)
    endpoint.unload_all()
    worker_s = 1 / one_model_rps
    return {
        "first_load_s": statistics.median(first) - service,
        "reload_s": statistics.median(reload) - service,
        "unload_s": statistics.median(unload),
        "warm_request_s": service,
        "one_model_rps": one_model_rps,
        "own_models_rps": own_models_rps,
        "worker_s": worker_s,
        "frontend_s": max(0.0, cpus / own_models_rps - worker_s),
    }


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
            costs = measure_costs(server, prefix, probes, repeats=PROBE_REPEATS, clients=args.users, cpus=cpus,
                                  body=mme_locustfile.REQUEST_BODY)  # fmt: skip
            print("measured costs: " + ", ".join(f"{k} {v:.3f}" for k, v in costs.items()), flush=True)
            for resident in args.resident:
                endpoint = LocalMultiModelEndpoint(server, prefix, max_resident_models=resident)

                def invoke(model: str, endpoint: LocalMultiModelEndpoint = endpoint) -> tuple[bool | None, int]:
                    answer, cold = endpoint.invoke(model, mme_locustfile.REQUEST_BODY)
                    if answer.status != 200:
                        raise mme_locustfile.InvokeError(f"{model} answered {answer.status}")
                    return cold, len(answer.body)

                mme_locustfile.target = invoke
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
