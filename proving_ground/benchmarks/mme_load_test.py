"""Run the three multi-model traffic patterns (uniform, hot model, top 10) one after another, side by side.

Local harness (default): builds the tiny model's TorchServe archive, puts ``--models`` copies in a local "S3 prefix",
starts TorchServe + the SageMaker toolkit in multi-model mode and loads models on first use, unloading the least
recently used above ``--max-resident-models`` (so cold loads happen, as on an MME). Every pattern starts with no
model loaded. Deployed endpoint: ``--endpoint-name`` (models published with ``pytorch-platform publish``).

Each pattern warms up ``--warmup`` seconds (not counted), then measures until its 95% intervals are narrow enough
(``--precision``: half-width over estimate) or its budget is spent (``--max-requests``, ``--duration`` seconds of
window), which the results call inconclusive (proving_ground/benchmarks/mme_measure.py).

    python -m proving_ground.benchmarks.mme_load_test --models 24 --max-resident-models 6 --users 8 --spawn-rate 8 \\
        --duration 120
    python -m proving_ground.benchmarks.mme_load_test --endpoint-name <EndpointName> --models 1000 --users 200 \\
        --duration 300

Writes, per pattern, requests and model loads counted, TPS with its interval (batch means) and ratio to uniform, hit
ratio with its interval (Wilson), p50/p95/p99 latency, cold and warm latency, errors, the CPU the host's other
processes took, and why the window stopped: ``<output-dir>/mme_<target>_patterns.json``, ``.md``, ``.csv`` (first
lines: the command) and a plot ``.png``.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from locust import User

from inference_assets.tools.publish_models import copy_names
from proving_ground.benchmarks import mme_locustfile
from proving_ground.benchmarks.mme_measure import Budget, CpuAccount, measure_pattern
from proving_ground.torchserve_mme.archive import build_archive
from proving_ground.torchserve_mme.local_mme import (
    LocalModelServer,
    LocalMultiModelEndpoint,
    ModelNotFound,
    ModelServerError,
)

ROOT = Path(__file__).resolve().parents[2]

PROBE_WARM_REQUESTS = 20
COLUMNS = ["pattern", "requests", "errors", "tps", "tps_low", "tps_high", "tps_vs_uniform", "hit_ratio", "hit_low",
           "hit_high", "p50_ms", "p95_ms", "p99_ms", "cold_requests", "cold_p50_ms", "warm_p50_ms", "model_loads",
           "model_unloads", "window_s", "stopped", "others_cores"]  # fmt: skip


def _local_endpoint(args: argparse.Namespace, work: Path) -> tuple[LocalModelServer, LocalMultiModelEndpoint]:
    from training_assets.tiny_model import build_tiny_model

    archive = args.archive or build_archive(build_tiny_model(work / "tiny-model"), work / "sentiment.tar.gz")
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


def budget(args: argparse.Namespace) -> Budget:
    """The window's stopping rule from the command line (--duration is the window's time budget)."""
    batch_s = args.batch_seconds or min(10.0, max(1.0, args.duration / 10))
    return Budget(precision=args.precision, max_requests=args.max_requests, max_window_s=args.duration,
                  batch_s=batch_s)  # fmt: skip


def run_pattern(
    pattern: str, args: argparse.Namespace, user_class: type[User] | None = None, **window: Any
) -> dict[str, Any]:
    """Measure ``args.users`` users of the pattern (or of ``user_class``): a warm-up, then a window that runs until
    its intervals are narrow enough or the budget is spent (proving_ground/benchmarks/mme_measure.py); ``window``:
    more arguments of
    measure_pattern (the CPU account, a sampler)."""
    return measure_pattern(pattern, users=args.users, spawn_rate=args.spawn_rate, warmup_s=args.warmup,
                           budget=budget(args), user_class=user_class, **window)  # fmt: skip


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


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint-name", help="a deployed multi-model endpoint; default: the local harness")
    parser.add_argument("--region", help="AWS region of the deployed endpoint")
    parser.add_argument("--models", type=int, default=24, help="number of models (TargetModel names from the template)")
    parser.add_argument("--name-template", default=mme_locustfile.DEFAULT_NAME_TEMPLATE)
    parser.add_argument("--max-resident-models", type=int, default=6, help="local harness: models loaded at once")
    parser.add_argument(
        "--archive",
        type=Path,
        help="local harness: an archive of proving_ground.torchserve_mme.archive to copy (default: the tiny model's)",
    )
    parser.add_argument("--users", type=int, default=8, help="concurrent Locust users")
    parser.add_argument("--spawn-rate", type=float, default=8, help="users started per second")
    parser.add_argument("--warmup", type=float, default=20, help="seconds per pattern before the window (not counted)")
    parser.add_argument("--duration", type=float, default=120, help="the window's time budget, seconds per pattern")
    parser.add_argument("--max-requests", type=int, default=2000, help="the window's request budget per pattern")
    parser.add_argument("--precision", type=float, default=0.2,
                        help="stop a window once its intervals' half-widths are at most this share of the estimate "
                             "(0: always run the whole --duration)")  # fmt: skip
    parser.add_argument("--batch-seconds", type=float, help="batch length of the throughput interval (default: "
                        "--duration / 10, between 1 and 10 s)")  # fmt: skip
    parser.add_argument(
        "--patterns",
        nargs="+",
        choices=list(mme_locustfile.PATTERNS),
        default=list(mme_locustfile.PATTERNS),
        help="uniform must be among them (the baseline)",
    )
    parser.add_argument("--output-dir", type=Path, default=ROOT / "proving_ground" / "benchmarks" / "results")
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
    for name in ("users", "duration", "spawn_rate", "max_requests"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if args.warmup < 0 or args.precision < 0 or (args.batch_seconds is not None and args.batch_seconds <= 0):
        parser.error("--warmup and --precision must not be negative, --batch-seconds must be positive")
    try:
        budget(args)
    except ValueError as error:
        parser.error(f"--duration must hold at least two batches: {error}")
    return args


def _interval_cell(row: dict[str, Any], key: str, digits: int) -> str:
    interval = row.get(f"{key}_interval")
    if row.get(key) is None:
        return "n/a"
    if interval is None:
        return f"{row[key]:.{digits}f}"
    return f"{row[key]:.{digits}f} [{interval['low']:.{digits}f}, {interval['high']:.{digits}f}]"


def _seconds(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value / 1000:.1f} s" if value >= 1000 else f"{value:.0f} ms"


def markdown(result: dict[str, Any]) -> str:
    """The results as Markdown: every measured figure with its count and 95% interval."""
    rows, settings = result["rows"], result["settings"]
    lines = [
        f"# Multi-model traffic patterns: {result['target']}",
        "",
        f"```\n{result['command']}\n```",
        "",
        f"Host: {result['host']}. {settings['users']} closed-loop users; each pattern warmed up "
        f"{settings['warmup_s']:g} s (not counted), then measured until its intervals' half-widths were at most "
        f"{settings['precision']:.0%} of the estimate, or {settings['max_requests']} requests, or "
        f"{settings['max_window_s']:g} s of window (inconclusive).",
        "",
        "| pattern | requests | model loads | TPS [95% CI] | vs uniform | hit ratio [95% CI] | p50 | p99 | errors "
        "| window | stopped | other processes' CPU |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        loads = row.get("model_loads")
        lines.append(
            f"| {row['pattern']} | {row['requests']} | {'n/a' if loads is None else loads} | "
            f"{_interval_cell(row, 'tps', 2)} | {row['tps_vs_uniform']:.2f} | {_interval_cell(row, 'hit_ratio', 2)} | "
            f"{_seconds(row['p50_ms'])} | {_seconds(row['p99_ms'])} | {row['errors']} | {row['window_s']:.0f} s | "
            f"{row['stopped']} | {row['cpu']['others_cores']:.2f} cores |"
        )
    lines += ["", "Intervals: " + METHODS]
    return "\n".join(lines) + "\n"


METHODS = (
    "throughput by batch means (the window cut into equal batches, Student t over the per-batch rates; "
    "`batch_lag1_autocorrelation` in the JSON says whether the batches are close to independent); hit ratio "
    "(requests that found their model loaded, 1 - model loads / requests) by the Wilson score interval, binomial "
    "over requests. Both 95%. Requests in a closed loop are not independent, so the hit-ratio interval is a lower "
    "bound on the uncertainty."
)


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    command = "python -m proving_ground.benchmarks.mme_load_test " + shlex.join(sys.argv[1:] if argv is None else argv)
    mme_locustfile.models, mme_locustfile.name_template = args.models, args.name_template
    target_kind = "sagemaker" if args.endpoint_name else "local"
    host = f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} before the run"
    rows, probe, endpoint = [], {}, None
    with tempfile.TemporaryDirectory(prefix="mme-load-") as scratch:
        work = args.work_dir or Path(scratch)
        server = None
        try:
            cpu = CpuAccount()
            if args.endpoint_name:
                mme_locustfile.target = mme_locustfile.sagemaker_target(args.endpoint_name, args.region)
            else:
                server, endpoint = _local_endpoint(args, work)
                cpu = CpuAccount(server_pid=server_pid(server))
                mme_locustfile.target = _local_target(endpoint)
                probe = probe_cold_and_warm(endpoint)
                print(f"cold first invoke {probe['cold_first_invoke_ms']:.0f} ms, "
                      f"warm {probe['warm_median_ms']:.1f} ms")  # fmt: skip
            for pattern in args.patterns:
                loads_before, unloads_before = (endpoint.cold_loads, endpoint.unloads) if endpoint else (0, 0)
                row = run_pattern(pattern, args, cpu=cpu)
                if endpoint:
                    if server is None:
                        raise RuntimeError("a local endpoint without its TorchServe server")
                    server.check_alive()  # a dead server would pass for a slow one
                    row["model_loads_run"] = endpoint.cold_loads - loads_before
                    row["model_unloads"] = endpoint.unloads - unloads_before
                    endpoint.unload_all()  # the next pattern starts cold, too
                rows.append(row)
                print(f"{pattern}: {_interval_cell(row, 'tps', 2)} TPS, hit ratio {_interval_cell(row, 'hit_ratio', 2)}"
                      f", {row['requests']} requests, {row['stopped']}, {row['errors']} errors "
                      f"{row['error_examples']}", flush=True)  # fmt: skip
        finally:
            if server is not None:
                server.stop()
    baseline = next(row["tps"] for row in rows if row["pattern"] == "uniform")
    for row in rows:
        row["tps_vs_uniform"] = row["tps"] / baseline if baseline else float("nan")
    result = {
        "command": command,
        "target": target_kind,
        "host": host,
        "probe": probe,
        "settings": {
            "users": args.users,
            "warmup_s": args.warmup,
            **dataclasses.asdict(budget(args)),
            "models": args.models,
            "max_resident_models": None if args.endpoint_name else args.max_resident_models,
        },
        "methods": METHODS,
        "rows": rows,
    }
    write_results(result, args.output_dir, title=_title(args, endpoint is not None))
    return 0


def _title(args: argparse.Namespace, local: bool) -> str:
    return (f"{'local' if local else 'sagemaker'}: {args.models} models, {args.users} users"
            + (f", {args.max_resident_models} resident at most" if local else ""))  # fmt: skip


def write_results(result: dict[str, Any], output_dir: Path, *, title: str) -> None:
    output_dir.mkdir(parents=True, exist_ok=True)
    stem = output_dir / f"mme_{result['target']}_patterns"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    stem.with_suffix(".md").write_text(markdown(result))
    with stem.with_suffix(".csv").open("w", newline="") as stream:
        stream.write(f"# {result['command']}\n# host: {result['host']}\n")
        probe = result["probe"]
        if probe:
            stream.write(f"# sequential probe: cold first invoke {probe['cold_first_invoke_ms']:.0f} ms, "
                         f"warm median {probe['warm_median_ms']:.1f} ms\n")  # fmt: skip
        writer = csv.DictWriter(stream, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in result["rows"]:
            flat = {**row, "others_cores": row["cpu"]["others_cores"]}
            for key, low, high in (("tps_interval", "tps_low", "tps_high"), ("hit_ratio_interval", "hit_low",
                                                                                 "hit_high")):  # fmt: skip
                if row.get(key):
                    flat[low], flat[high] = row[key]["low"], row[key]["high"]
            writer.writerow({k: round(v, 3) if isinstance(v, float) else v for k, v in flat.items()})
    _plot(result["rows"], stem.with_suffix(".png"), title)
    print(f"wrote {stem}.json, .md, .csv and .png")


def server_pid(server: LocalModelServer) -> int:
    """The launcher of the server's process group (whose tree holds the Java frontend and the Python workers)."""
    return server.process_group


if __name__ == "__main__":
    sys.exit(main())
