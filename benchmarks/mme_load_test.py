"""Run the three multi-model traffic patterns (uniform, hot model, top 10) one after another, side by side.

Local harness (default): builds the tiny model's TorchServe archive, puts ``--models`` copies in a local "S3 prefix",
starts TorchServe + the SageMaker toolkit in multi-model mode and loads models on first use, unloading the least
recently used above ``--max-resident-models`` (so cold loads happen, as on an MME). Every pattern starts with no
model loaded. Deployed endpoint: ``--endpoint-name`` (models published with ``pytorch-platform publish``).

    python -m benchmarks.mme_load_test --models 24 --max-resident-models 6 --users 8 --spawn-rate 8 --duration 60
    python -m benchmarks.mme_load_test --endpoint-name <EndpointName> --models 1000 --users 200 --duration 300

Writes, per pattern, TPS (and its ratio to uniform), p50/p95/p99 latency, cold and warm latency and errors, to
``<output-dir>/mme_<target>_patterns.csv`` (first line: the command) and a plot ``mme_<target>_patterns.png``.
"""

from __future__ import annotations

import argparse
import csv
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import gevent
from locust import User
from locust.env import Environment

from benchmarks import mme_locustfile
from inference_assets.local.local_mme import (
    LocalModelServer,
    LocalMultiModelEndpoint,
    ModelNotFound,
    ModelServerError,
)
from inference_assets.tools.publish_models import build_archive, copy_names

ROOT = Path(__file__).resolve().parents[1]

PROBE_WARM_REQUESTS = 20
STOP_TIMEOUT_S = 300
COLUMNS = ["pattern", "requests", "errors", "tps", "tps_vs_uniform", "p50_ms", "p95_ms", "p99_ms",
           "cold_requests", "cold_p50_ms", "warm_p50_ms", "model_loads", "model_unloads"]  # fmt: skip


def _local_endpoint(args: argparse.Namespace, work: Path) -> tuple[LocalModelServer, LocalMultiModelEndpoint]:
    from training_assets.tiny_model import build_tiny_model

    archive = args.archive or build_archive(
        build_tiny_model(work / "tiny-model"), work / "sentiment.tar.gz", model_server="torchserve"
    )
    prefix = work / "prefix"
    prefix.mkdir(parents=True)
    for name in copy_names(args.models, args.name_template):
        (prefix / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(archive, prefix / name)
    server = LocalModelServer(work / "server").start()
    return server, LocalMultiModelEndpoint(server, prefix, max_resident_models=args.max_resident_models)


def _local_target(endpoint: LocalMultiModelEndpoint):
    def invoke(model: str) -> tuple[bool | None, int]:
        try:
            answer, cold = endpoint.invoke(model, mme_locustfile.REQUEST_BODY, mme_locustfile.CONTENT_TYPE)
        except (ModelServerError, ModelNotFound) as error:
            raise mme_locustfile.InvokeError(str(error)) from error
        if answer.status != 200:
            raise mme_locustfile.InvokeError(f"{model} answered {answer.status}: {answer.body[:200]!r}")
        return cold, len(answer.body)

    return invoke


def probe_cold_and_warm(endpoint: LocalMultiModelEndpoint) -> dict[str, float]:
    """First invoke of a model (its load included) against the median warm invoke; sequential, nothing else runs."""
    name = mme_locustfile.model_name(0)
    started = time.perf_counter()
    answer, cold = endpoint.invoke(name, mme_locustfile.REQUEST_BODY)
    first = (time.perf_counter() - started) * 1000
    if answer.status != 200 or not cold:
        raise RuntimeError(f"the probe's first invoke should load {name} and succeed: {answer.status} {answer.body!r}")
    warm = []
    for _ in range(PROBE_WARM_REQUESTS):
        started = time.perf_counter()
        endpoint.invoke(name, mme_locustfile.REQUEST_BODY)
        warm.append((time.perf_counter() - started) * 1000)
    endpoint.unload_all()
    return {"cold_first_invoke_ms": first, "warm_median_ms": statistics.median(warm)}


def run_pattern(pattern: str, args: argparse.Namespace, user_class: type[User] | None = None) -> dict[str, Any]:
    """Run ``args.users`` users of the pattern (or of ``user_class``) for ``args.duration`` seconds and measure."""
    # stop_timeout: at the end, users finish the request in flight (a model load, say) instead of being killed.
    environment = Environment(
        user_classes=[user_class or mme_locustfile.PATTERNS[pattern]],
        events=mme_locustfile.events,
        stop_timeout=STOP_TIMEOUT_S,
    )
    runner = environment.create_local_runner()
    started = time.perf_counter()
    runner.start(args.users, spawn_rate=args.spawn_rate)
    gevent.sleep(args.duration)
    runner.quit()
    runner.greenlet.join()
    elapsed = time.perf_counter() - started  # includes the drain: every counted request finished inside it
    total = environment.stats.total
    entries = {name: entry for (name, _), entry in environment.stats.entries.items()}
    cold, warm = entries.get("cold"), entries.get("warm")
    return {
        "pattern": pattern,
        "requests": total.num_requests,
        "errors": total.num_failures,
        "tps": total.num_requests / elapsed,
        "p50_ms": total.get_response_time_percentile(0.50),
        "p95_ms": total.get_response_time_percentile(0.95),
        "p99_ms": total.get_response_time_percentile(0.99),
        "cold_requests": cold.num_requests if cold else 0,
        "cold_p50_ms": cold.get_response_time_percentile(0.50) if cold else None,
        "warm_p50_ms": warm.get_response_time_percentile(0.50) if warm else None,
        "error_examples": [str(error.error)[:160] for error in list(environment.stats.errors.values())[:3]],
    }


def _plot(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    patterns = [row["pattern"] for row in rows]
    figure, (tps_axis, latency_axis) = plt.subplots(1, 2, figsize=(11, 4.2))
    bars = tps_axis.bar(patterns, [row["tps"] for row in rows], color=["#4c72b0", "#dd8452", "#55a868"])
    tps_axis.bar_label(bars, labels=[f"{row['tps']:.1f}\n({row['tps_vs_uniform']:.2f}x)" for row in rows])
    tps_axis.set_ylim(top=max(row["tps"] for row in rows) * 1.3)  # room for the labels
    tps_axis.set_ylabel("requests per second")
    tps_axis.set_title("Throughput (ratio to uniform)")
    width = 0.25
    for offset, key in enumerate(("p50_ms", "p95_ms", "p99_ms")):
        positions = [i + (offset - 1) * width for i in range(len(rows))]
        latency_axis.bar(positions, [row[key] or 0 for row in rows], width, label=key.removesuffix("_ms"))
    latency_axis.set_xticks(range(len(rows)), patterns)
    latency_axis.set_yscale("log")
    latency_axis.set_ylabel("latency (ms, log scale)")
    latency_axis.set_title("Latency percentiles")
    latency_axis.legend()
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint-name", help="a deployed multi-model endpoint; default: the local harness")
    parser.add_argument("--region", help="AWS region of the deployed endpoint")
    parser.add_argument("--models", type=int, default=24, help="number of models (TargetModel names from the template)")
    parser.add_argument("--name-template", default=mme_locustfile.DEFAULT_NAME_TEMPLATE)
    parser.add_argument("--max-resident-models", type=int, default=6, help="local harness: models loaded at once")
    parser.add_argument(
        "--archive",
        type=Path,
        help="local harness: a --model-server torchserve archive to copy (default: the tiny model's)",
    )
    parser.add_argument("--users", type=int, default=8, help="concurrent Locust users")
    parser.add_argument("--spawn-rate", type=float, default=8, help="users started per second")
    parser.add_argument("--duration", type=float, default=60, help="seconds per pattern")
    parser.add_argument(
        "--patterns",
        nargs="+",
        choices=list(mme_locustfile.PATTERNS),
        default=list(mme_locustfile.PATTERNS),
        help="uniform must be among them (the baseline)",
    )
    parser.add_argument("--output-dir", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument(
        "--work-dir",
        type=Path,
        help="local harness: keep models and server logs here (default: a temporary directory, removed at the end)",
    )
    args = parser.parse_args(argv)
    if args.models <= mme_locustfile.HOT_SET:
        parser.error(f"--models must exceed {mme_locustfile.HOT_SET} (the top-10 pattern needs a tail)")
    if "uniform" not in args.patterns:
        parser.error("--patterns must include uniform: the other patterns are reported as a ratio to it")
    if not args.endpoint_name and args.max_resident_models >= args.models:
        parser.error("--max-resident-models must be below --models, or no model is ever unloaded")
    for name in ("users", "duration", "spawn_rate"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    command = "python -m benchmarks.mme_load_test " + shlex.join(sys.argv[1:] if argv is None else argv)
    mme_locustfile.models, mme_locustfile.name_template = args.models, args.name_template
    target_kind = "sagemaker" if args.endpoint_name else "local"
    host = f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} before the run"
    rows, probe, endpoint = [], {}, None
    with tempfile.TemporaryDirectory(prefix="mme-load-") as scratch:
        work = args.work_dir or Path(scratch)
        server = None
        try:
            if args.endpoint_name:
                mme_locustfile.target = mme_locustfile.sagemaker_target(args.endpoint_name, args.region)
            else:
                server, endpoint = _local_endpoint(args, work)
                mme_locustfile.target = _local_target(endpoint)
                probe = probe_cold_and_warm(endpoint)
                print(f"cold first invoke {probe['cold_first_invoke_ms']:.0f} ms, "
                      f"warm {probe['warm_median_ms']:.1f} ms")  # fmt: skip
            for pattern in args.patterns:
                loads_before, unloads_before = (endpoint.cold_loads, endpoint.unloads) if endpoint else (0, 0)
                row = run_pattern(pattern, args)
                if endpoint:
                    if server is None:
                        raise RuntimeError("a local endpoint without its TorchServe server")
                    server.check_alive()  # a dead server would pass for a slow one
                    row["model_loads"] = endpoint.cold_loads - loads_before
                    row["model_unloads"] = endpoint.unloads - unloads_before
                    endpoint.unload_all()  # the next pattern starts cold, too
                rows.append(row)
                print(f"{pattern}: {row['tps']:.1f} TPS, p50 {row['p50_ms']} ms, p99 {row['p99_ms']} ms, "
                      f"{row['errors']} errors {row['error_examples']}")  # fmt: skip
        finally:
            if server is not None:
                server.stop()
    baseline = next(row["tps"] for row in rows if row["pattern"] == "uniform")
    for row in rows:
        row["tps_vs_uniform"] = row["tps"] / baseline if baseline else float("nan")

    args.output_dir.mkdir(parents=True, exist_ok=True)
    csv_path = args.output_dir / f"mme_{target_kind}_patterns.csv"
    with csv_path.open("w", newline="") as stream:
        stream.write(f"# {command}\n# host: {host}\n")
        if probe:
            stream.write(f"# sequential probe: cold first invoke {probe['cold_first_invoke_ms']:.0f} ms, "
                         f"warm median {probe['warm_median_ms']:.1f} ms\n")  # fmt: skip
        writer = csv.DictWriter(stream, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()})
    title = (f"{target_kind}: {args.models} models, {args.users} users, {args.duration:.0f} s per pattern"
             + (f", {args.max_resident_models} resident at most" if endpoint else ""))  # fmt: skip
    _plot(rows, csv_path.with_suffix(".png"), title)
    print(f"wrote {csv_path} and {csv_path.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
