"""Local serving benchmark: the archive served by Ray Serve as the endpoint serves it (``LocalRayServer``: the
archive's config.yaml + deployment.py, the replica's batching queue), against raw forward passes in a process of
its own, on the same cores, with the same model and texts (one tweet per request).

For 1, 8, 16 and 32 concurrent single-text clients it measures throughput and p50/p99 latency of each served setup,
and reports them as ratios to two raw baselines, measured in the same rounds as the servers (interleaved):

- ``raw batch 1``: ``SentimentPredictor.predict([text])`` back to back, one client (no HTTP, no server);
- ``raw batch 8``: ``SentimentPredictor.predict(8 texts)`` back to back, fp32: what the cores do when every forward
  pass is full. The served throughput at 8 single-text clients over this is the batching's efficiency
  (``vs_raw_b8``; the platform's target is at least 0.9).

Served setups (``--set main``) use the endpoint's defaults (``endpoint_environment()``, i.e. the settings'
defaults) with batching and bf16 on and off:

- ``defaults``: Ray Serve batching as the endpoint configures it, fp32 (on Graviton the endpoint also sets
  DNNL_DEFAULT_FPMATH_MODE=BF16, which does nothing on x86, hence the autocast rows);
- ``batching off``: ``max_batch_size=1``;
- ``bf16 autocast`` (batching on / off): the forward pass under ``torch.autocast(bfloat16)``, x86's equivalent of
  Graviton's bf16 fast-math kernels (needs AVX512-BF16 or AMX to be fast).

``--set ingress`` compares how requests reach the replica (Ray Serve's environment variables, read by every Ray
process at import; ``environment`` in a setup): Ray's proxy actor in front of the replica (Ray Serve's defaults),
Ray Serve's throughput-optimized mode as Ray ships it, and as ray_server.py runs it by default (direct ingress: the
replica serves SageMaker's port itself; its log lines written at once and copied to stderr; the Serve controller's
loop at 1 s), also with the controller's loop at Ray's 0.1 s. Forward passes are counted from the replica's log, so rows
whose log is buffered report none. ``--set delay`` compares batch wait timeouts; ``--set grid`` replicas x threads x
batch size x delay (to choose the defaults).

The model is RoBERTa-base shaped (12 layers, hidden 768, random weights: the hub is out of reach) with the tiny
model's tokenizer; ``--model-size tiny`` runs the 2-layer test model. The load generator shares the cores with the
server, as a client on the endpoint host would not: served numbers are a lower bound. Setups are measured
interleaved, round after round, so background load on a shared machine falls on all of them alike; the load
average is recorded. Results go to proving_ground/benchmarks/results/serving_latency[_grid].{md,json} with the command
at the top.

    .venv/bin/python -m proving_ground.benchmarks.serving_latency --rounds 2 --duration 6
    .venv/bin/python -m proving_ground.benchmarks.serving_latency --set delay --concurrency 1,8
    .venv/bin/python -m proving_ground.benchmarks.serving_latency --set grid --concurrency 1,32
    .venv/bin/python -m proving_ground.benchmarks.serving_latency --set grid --grid-workers 2,4 --concurrency \\
        1,16,32,64  # on a c7g
"""

from __future__ import annotations

import argparse
import functools
import http.client
import json
import multiprocessing
import os
import platform
import shlex
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import psutil

from inference_assets.container.predictor import RuntimeOptions, SentimentPredictor
from inference_assets.local.local_server import LocalRayServer
from inference_assets.tools.endpoint_environment import endpoint_environment
from inference_assets.tools.package_model import build_model_archive
from training_assets.tiny_model import SAMPLE_DATA, build_tiny_model

RESULTS = Path(__file__).resolve().parent / "results"
RAW_B8 = "raw batch 8, fp32"
SETS: dict[str, dict[str, dict]] = {
    "main": {
        "defaults (batching on, fp32)": {},
        "batching off, fp32": {"batch_size": 1},
        "batching on, bf16 autocast": {"precision": "bf16_autocast"},
        "batching off, bf16 autocast": {"batch_size": 1, "precision": "bf16_autocast"},
    },
    "ingress": {
        "proxy (Ray Serve defaults)": {
            "environment": {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "0", "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.1"}
        },
        "throughput-optimized as Ray ships it (logs buffered, not on stderr)": {
            "environment": {
                "RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE": "1000",
                "RAY_SERVE_LOG_TO_STDERR": "0",
                "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.1",
            }
        },
        "direct ingress, logs at once and on stderr, controller loop 0.1 s": {
            "environment": {"RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.1"}
        },
        "launcher defaults: the same, controller loop 1 s": {"environment": {}},
    },
    "delay": {f"batch 8, wait {ms} ms": {"batch_size": 8, "max_batch_delay_ms": ms} for ms in (2, 20, 50)},
    "grid": {
        "1 worker x 2 threads, batch 1": {"workers": 1, "batch_size": 1},
        "1 worker x 2 threads, batch 8, delay 2 ms": {"workers": 1, "batch_size": 8, "max_batch_delay_ms": 2},
        "1 worker x 2 threads, batch 16, delay 2 ms": {"workers": 1, "batch_size": 16, "max_batch_delay_ms": 2},
        "1 worker x 2 threads, batch 8, delay 20 ms": {"workers": 1, "batch_size": 8, "max_batch_delay_ms": 20},
        "2 workers x 1 thread, batch 8, delay 2 ms": {"workers": 2, "batch_size": 8, "max_batch_delay_ms": 2},
    },
}


def build_model(directory: Path, size: str, positions: int | None = None) -> Path:
    """The tiny model's tokenizer with a RoBERTa-base shaped classifier (``base``) or the tiny one (``tiny``);
    ``positions`` widens the position embeddings (RoBERTa-base: 514) for long-text measurements."""
    model_dir = build_tiny_model(directory)
    if size == "base" or positions:
        import torch
        from transformers import RobertaConfig, RobertaForSequenceClassification

        tiny = RobertaConfig.from_pretrained(model_dir)
        config = RobertaConfig(
            **{key: getattr(tiny, key) for key in ("vocab_size", "pad_token_id")},
            max_position_embeddings=positions or tiny.max_position_embeddings,
            bos_token_id=tiny.bos_token_id,
            eos_token_id=tiny.eos_token_id,
            id2label=tiny.id2label,  # also sets num_labels (a property over id2label)
            label2id=tiny.label2id,
        )  # RobertaConfig's defaults are roberta-base: 12 layers, hidden 768, 12 heads, FFN 3072
        torch.manual_seed(0)
        RobertaForSequenceClassification(config).save_pretrained(model_dir, safe_serialization=True)
    return model_dir


def sample_texts() -> list[str]:
    lines = (SAMPLE_DATA / "validation.jsonl").read_text().splitlines()
    return [json.loads(line)["text"] for line in lines if line.strip()]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def run_load(call: Callable[[str], bool], texts: list[str], concurrency: int, duration_s: float) -> dict:
    """``concurrency`` threads call ``call(text)`` back to back for ``duration_s``; latency per call in ms."""
    latencies: list[float] = []
    errors = 0
    lock = threading.Lock()
    stop_at = time.perf_counter() + duration_s

    def worker(offset: int) -> None:
        nonlocal errors
        i = offset
        while time.perf_counter() < stop_at:
            start = time.perf_counter()
            ok = call(texts[i % len(texts)])
            elapsed_ms = (time.perf_counter() - start) * 1000
            with lock:
                latencies.append(elapsed_ms)
                errors += not ok
            i += concurrency

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(concurrency)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"latencies_ms": latencies, "errors": errors, "wall_s": time.perf_counter() - began}


def _process_kind(process: psutil.Process) -> str:
    """What a serving process is: Ray's workers by their title (``ray::ProxyActor``, ``ray::ServeReplica:app:name``,
    ``ray::ServeController``), Ray's daemons by their program, anything else by its executable."""
    command = process.cmdline()
    if command and command[0].startswith("ray::"):
        return command[0].split()[0].split(".")[0]
    joined = " ".join(command)
    for daemon in ("gcs_server", "raylet", "log_monitor", "dashboard/agent", "dashboard", "monitor.py", "ray_server"):
        if daemon in joined:
            return daemon
    return process.name()


def tree_cpu_by_process(leader: int) -> dict[str, float]:
    """User + system CPU seconds now of a process and its descendants (the whole server, or the raw worker), by
    kind of process (``_process_kind``)."""
    totals: dict[str, float] = {}
    try:
        root = psutil.Process(leader)
        family = [root, *root.children(recursive=True)]
    except psutil.Error:
        return totals
    for process in family:
        try:
            times = process.cpu_times()
            kind = _process_kind(process)
        except psutil.Error:
            continue
        totals[kind] = totals.get(kind, 0.0) + times.user + times.system
    return totals


def replica_passes(server: LocalRayServer) -> int:
    """Forward passes the server's replicas have logged so far (ray_deployment logs one line per pass)."""
    assert server.workdir is not None
    logs = (server.workdir / "tmp").glob("ray/session_latest/logs/serve/replica_*.log")
    return sum(path.read_text(errors="replace").count("requests answered with one forward pass") for path in logs)


def metered(runner: Runner, leader: int, passes: Callable[[], int] | None = None) -> Runner:
    """``runner`` that also records the CPU seconds the serving processes spent, and the forward passes."""

    def run(level: int, duration_s: float) -> dict:
        cpu, count = tree_cpu_by_process(leader), passes() if passes else 0
        result = runner(level, duration_s)
        if passes:
            time.sleep(1.0)  # the replica's log reaches its file asynchronously
        after = tree_cpu_by_process(leader)
        result["cpu_by_process"] = {kind: seconds - cpu.get(kind, 0.0) for kind, seconds in after.items()}
        result["cpu_s"] = sum(result["cpu_by_process"].values())
        result["passes"] = passes() - count if passes else None
        return result

    return run


def summarise(setup: str, concurrency: int, runs: list[dict]) -> dict:
    latencies = [latency for run in runs for latency in run["latencies_ms"]]
    cpu_s = sum(run.get("cpu_s", 0.0) for run in runs)
    passes = [run.get("passes") for run in runs]
    by_process: dict[str, float] = {}
    for run in runs:
        for kind, seconds in run.get("cpu_by_process", {}).items():
            by_process[kind] = by_process.get(kind, 0.0) + seconds
    pass_count = sum(passes) if None not in passes else 0  # type: ignore[arg-type]
    return {
        "setup": setup,
        "concurrency": concurrency,
        "requests": len(latencies),
        "errors": sum(run["errors"] for run in runs),
        "throughput_rps": round(len(latencies) / sum(run["wall_s"] for run in runs), 2),
        "p50_ms": round(percentile(latencies, 50), 2),
        "p99_ms": round(percentile(latencies, 99), 2),
        "mean_ms": round(statistics.fmean(latencies), 2),
        # Requests per CPU second of the serving processes: what the work costs, whatever share of a loaded host
        # the processes got (a back-to-back loop gets less than a server that idles between requests).
        "requests_per_cpu_s": round(len(latencies) / cpu_s, 2) if cpu_s else None,
        "mean_requests_per_pass": round(len(latencies) / pass_count, 2) if pass_count else None,
        # Where the CPU goes: milliseconds per request by kind of serving process, largest first.
        "cpu_ms_per_request": {
            kind: round(1000 * seconds / len(latencies), 2)
            for kind, seconds in sorted(by_process.items(), key=lambda item: -item[1])
            if round(1000 * seconds / len(latencies), 2) > 0
        },
    }


def http_caller(port: int) -> Callable[[str], bool]:
    """One keep-alive connection per load thread, like a client with a connection pool."""
    local = threading.local()

    def call(text: str) -> bool:
        if not hasattr(local, "connection"):
            local.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        body = json.dumps({"inputs": text}).encode()
        try:
            local.connection.request("POST", "/invocations", body=body, headers={"Content-Type": "application/json"})
            response = local.connection.getresponse()
            response.read()
            return response.status == 200
        except (OSError, http.client.HTTPException):
            local.connection.close()
            del local.connection
            return False

    return call


Runner = Callable[[int, float], dict]  # (concurrent clients, seconds) -> one run_load() result


def measure(setups: dict[str, Runner], levels: list[int], rounds: int, duration_s: float) -> list[dict]:
    """Interleave the setups (round after round, level by level) so that background load on a shared host hits
    them alike, then pool each (setup, level)'s rounds."""
    for runner in setups.values():
        runner(1, 2.0)  # warm-up: first requests pay for lazy initialisation
    runs: dict[tuple[str, int], list[dict]] = {}
    for round_number in range(1, rounds + 1):
        for level in levels:
            for name, runner in setups.items():
                if name.startswith("raw batch 1") and level != 1:
                    continue  # the raw forward pass is measured as one client: the batch-1 baseline
                if name.startswith("raw batch 8") and level != 8:
                    continue  # full batches of 8, beside the servers' 8 single-text clients
                run = runner(level, duration_s)
                runs.setdefault((name, level), []).append(run)
                print(f"round {round_number} {name} x{level}: {len(run['latencies_ms'])} requests", flush=True)
    return [summarise(name, level, runs[(name, level)]) for name in setups for level in levels if (name, level) in runs]


AUTOGROUP = Path("/proc/self/autogroup")


def share_priority(leader: int) -> int:
    """Give the autogroups of ``leader`` and its descendants this process's autogroup nice; returns how many
    processes it reached. A new session gets an autogroup of its own at nice 0 (sched(7), "The autogroup feature"),
    so the servers and raw workers, which start sessions of their own, would not run at the priority the benchmark
    was started with (``echo -15 > /proc/self/autogroup``): beside a nice-19 mutation run whose tests start
    processes in sessions of their own (at nice 0), they shared the cores with those (measured on the 2-core host,
    interleaved: a raw bf16 pass of 8 at 50-53 texts/s with the worker at nice 0, 58-68 at the benchmark's -15;
    92-99 on an idle host). Served and raw processes get the same nice, so the comparison stays even. Nothing
    happens where the kernel has no autogroups."""
    if not AUTOGROUP.is_file():
        return 0
    nice = AUTOGROUP.read_text().split()[-1]  # "/autogroup-25 nice -15"
    reached = 0
    try:
        head = psutil.Process(leader)
        family = [head, *head.children(recursive=True)]
    except psutil.Error:
        return 0
    for process in family:
        try:
            Path(f"/proc/{process.pid}/autogroup").write_text(nice)
            reached += 1
        except OSError:  # gone, or a nice this user may not set: it keeps its own
            continue
    return reached


class RawWorker:
    """The raw predictor in its own process and session, started like a server worker: same environment, and
    a session of its own as the servers have (Linux gives each session's autogroup an equal share, so a predictor
    inside this benchmark's process would compete on other terms than the servers' workers, which run in sessions
    of their own), at this process's autogroup nice (``share_priority``), as the servers are."""

    def __init__(self, model_dir: Path, precision: str, threads: int, environment: dict[str, str]) -> None:
        context = multiprocessing.get_context("spawn")
        self._connection, child = context.Pipe()
        self._process = context.Process(
            target=_raw_worker, args=(child, str(model_dir), precision, threads, environment), daemon=True
        )
        # The environment from the process's start, as a replica gets it: glibc reads MALLOC_* as a process starts,
        # before the worker could set them itself.
        saved = dict(os.environ)
        os.environ.update(environment)
        try:
            self._process.start()
        finally:
            os.environ.clear()
            os.environ.update(saved)
        assert self._connection.recv() == "ready"
        assert self._process.pid is not None
        self.pid: int = self._process.pid
        share_priority(self.pid)

    def run(self, level: int, duration_s: float) -> dict:
        self._connection.send(("load", duration_s))
        return self._connection.recv()

    def run_batches(self, size: int, level: int, duration_s: float) -> dict:
        """Back-to-back forward passes over ``size`` texts, reported as ``size`` requests per pass."""
        self._connection.send(("batches", (size, duration_s)))
        return self._connection.recv()

    def predict(self, texts: list[str]) -> list[dict]:
        """The predictions of ``texts`` (in passes of 16), as the protocol answers them."""
        self._connection.send(("predict", texts))
        return self._connection.recv()

    def close(self) -> None:
        self._connection.send(None)
        self._process.join(timeout=30)


def _raw_worker(connection, model_dir: str, precision: str, threads: int, environment: dict[str, str]) -> None:
    os.setsid()
    os.environ.update(environment)  # before torch loads (SentimentPredictor imports it)
    predictor = SentimentPredictor(model_dir, RuntimeOptions(precision=precision, threads=threads))
    texts = sample_texts()
    connection.send("ready")
    while (command := connection.recv()) is not None:
        kind, argument = command
        if kind == "load":
            connection.send(run_load(lambda text: bool(predictor.predict([text])), texts, 1, argument))
        elif kind == "predict":
            chunks = [argument[i : i + 16] for i in range(0, len(argument), 16)]
            connection.send([p for chunk in chunks for p in predictor.predict_dicts(chunk)])
        else:
            connection.send(run_batches(predictor, texts, *argument))


def run_batches(predictor: SentimentPredictor, texts: list[str], size: int, duration_s: float) -> dict:
    """Forward passes over ``size`` texts back to back, as a run_load() result with one entry per text (each text's
    latency is its pass's)."""
    latencies: list[float] = []
    done, began = 0, time.perf_counter()
    while time.perf_counter() - began < duration_s:
        batch = [texts[(done + i) % len(texts)] for i in range(size)]
        start = time.perf_counter()
        predictor.predict(batch)
        latencies += [(time.perf_counter() - start) * 1000] * size
        done += size
    return {"latencies_ms": latencies, "errors": 0, "wall_s": time.perf_counter() - began}


# The worst request the serving contract admits by default (contract.Limits.max_request_tokens = 8192): 16 texts of
# the model's full 512-token window; and a request of mixed lengths, to compare grouping by length with padding all.
WORST_TEXTS, WINDOW = 16, 512
MIXED = (1, 31, 20)  # one full-window review, 31 tweets of 20 tokens


def worst_request(output: Path, threads: int) -> dict:
    """Time one forward pass of the worst admitted request on ``threads`` threads (RoBERTa-base shape, the real
    predictor: grouped by length), the mixed request grouped and padded to its longest, and write them with the
    host's load and the CPU time each pass got: what contract.FORWARD_CORE_SECONDS_PER_TOKEN and docs/serving.md
    ("Work per call") quote. On a shared host the wall time follows the load; the CPU time much less."""
    import torch

    work = Path(tempfile.mkdtemp(prefix="worst-request-"))
    model_dir = build_model(work / "model", "base", positions=WINDOW + 2)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.model_max_length = WINDOW
    tokenizer.save_pretrained(model_dir)
    predictor = SentimentPredictor(model_dir, RuntimeOptions(threads=threads))
    assert predictor.max_length == WINDOW, predictor.max_length
    vocabulary = range(5, tokenizer.vocab_size)

    def text(length: int) -> list[int]:
        return [tokenizer.bos_token_id, *(vocabulary[i % len(vocabulary)] for i in range(length - 2)),
                tokenizer.eos_token_id]  # fmt: skip

    worst = [text(WINDOW)] * WORST_TEXTS
    count, tweets, tweet_length = MIXED
    mixed = [text(WINDOW)] * count + [text(tweet_length)] * tweets
    predictor.predict_encoded(mixed[:2])  # warm-up
    load_before = [round(x, 2) for x in os.getloadavg()]
    timings, cpu = {}, {}
    for name, encodings in (("worst", worst), ("mixed_grouped", mixed)):
        started, cpu_started = time.perf_counter(), time.process_time()
        predictor.predict_encoded(encodings)
        timings[name], cpu[name] = time.perf_counter() - started, time.process_time() - cpu_started
    padded = tokenizer.pad({"input_ids": mixed}, return_tensors="pt")
    with torch.inference_mode():
        started = time.perf_counter()
        predictor.model(**padded)
        timings["mixed_padded"] = time.perf_counter() - started
    tokens = WORST_TEXTS * WINDOW
    result = {
        "command": f"python -m proving_ground.benchmarks.serving_latency --worst-request --threads {threads}",
        "threads": threads,
        "load_before": load_before,
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "cpu": _cpu_name(),
        "worst_request": f"{WORST_TEXTS} texts x {WINDOW} tokens = {tokens} tokens",
        "worst_seconds": round(timings["worst"], 2),
        # The CPU time the pass got (all its threads): what it costs a core, whatever else the host ran meanwhile.
        "worst_cpu_seconds": round(cpu["worst"], 2),
        "core_seconds_per_token": round(cpu["worst"] / tokens, 5),
        "wall_seconds_per_token_x_threads": round(timings["worst"] * threads / tokens, 5),
        "mixed_request": f"{count} x {WINDOW} + {tweets} x {tweet_length} tokens",
        "mixed_grouped_seconds": round(timings["mixed_grouped"], 2),
        "mixed_grouped_cpu_seconds": round(cpu["mixed_grouped"], 2),
        "mixed_padded_to_longest_seconds": round(timings["mixed_padded"], 2),
    }
    output.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    lines = ["# Worst admitted request", "", f"`{result['command']}`", ""]
    lines += [f"- {key}: {value}" for key, value in result.items() if key != "command"]
    output.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return result


def startup(output: Path, replicas: list[int]) -> dict:
    """Seconds from launching the container's command to its first /ping 200 (Ray, then every replica loading a
    RoBERTa-base-sized model), as SageMaker waits for it (ContainerStartupHealthCheckTimeoutInSeconds), per number of
    replicas on this host's cores, with the host's load: what graviton_endpoint.container_startup_timeout_seconds is
    sized from (docs/serving.md, "Start-up")."""
    from inference_assets.tools.package_model import build_model_archive

    work = Path(tempfile.mkdtemp(prefix="startup-"))
    archive = build_model_archive(build_model(work / "model", "base", positions=WINDOW + 2), work / "model.tar.gz")
    result: dict = {
        "command": "python -m proving_ground.benchmarks.serving_latency --startup "
        + ",".join(str(count) for count in replicas),
        "cpu": _cpu_name(),
        "cores": os.cpu_count(),
        "archive_mb": round(archive.stat().st_size / 1e6, 1),
        "runs": [],
    }
    for count in replicas:
        load = [round(x, 2) for x in os.getloadavg()]
        started = time.perf_counter()
        with LocalRayServer(archive, workers=count, startup_timeout_s=900):
            seconds = time.perf_counter() - started
        result["runs"].append({"replicas": count, "seconds_to_first_ping_200": round(seconds, 1), "load_before": load})
    output.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    lines = ["# Start-up to the first /ping 200", "", f"`{result['command']}`", ""]
    lines += [f"- {run}" for run in result["runs"]] + [f"- archive: {result['archive_mb']} MB, {result['cpu']}"]
    output.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return result


# Long: a benchmark script's main: arguments, the runs side by side, and the results written as JSON and Markdown
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", choices=sorted(SETS), default="main", help="which served setups to compare")
    parser.add_argument("--concurrency", default="1,8,16,32", help="comma-separated numbers of concurrent clients")
    parser.add_argument("--duration", type=float, default=6.0, help="seconds of load per setup, level and round")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds over all setups and levels")
    parser.add_argument("--model-size", choices=("base", "tiny"), default="base")
    parser.add_argument(
        "--grid-workers", help="with --set grid on another machine: comma-separated worker counts, e.g. 2,4"
    )
    parser.add_argument("--grid-batch", default="1,8,16", help="with --grid-workers: batch sizes (delay 2 ms)")
    parser.add_argument("--output", type=Path, help="results path without suffix (default: results/serving_latency)")
    parser.add_argument("--worst-request", action="store_true", help="time the worst admitted request and exit")
    parser.add_argument("--threads", type=int, default=1, help="with --worst-request: the replica's threads")
    parser.add_argument("--startup", help="comma-separated replica counts: time the start to /ping 200 and exit")
    args = parser.parse_args(argv)
    if args.startup:
        counts = [int(count) for count in args.startup.split(",")]
        print(json.dumps(startup(args.output or RESULTS / "serving_startup", counts), indent=1))
        return 0
    if args.worst_request:
        print(json.dumps(worst_request(args.output or RESULTS / "serving_worst_request", args.threads), indent=1))
        return 0
    # 1 client: the batch-1 baseline; 8 clients: beside full batch-8 forward passes.
    levels = sorted({1, 8, *(int(level) for level in args.concurrency.split(","))})
    output = args.output or RESULTS / ("serving_latency" if args.set == "main" else f"serving_latency_{args.set}")
    command = "python -m proving_ground.benchmarks.serving_latency " + " ".join(
        shlex.quote(part) for part in (argv or sys.argv[1:])
    )
    cores = os.cpu_count() or 1
    texts = sample_texts()
    load_before = [round(x, 2) for x in os.getloadavg()]
    defaults = endpoint_environment(vcpus=cores)
    # The raw predictor runs with the environment of one default worker (threads, OpenMP wait policy, allocator).
    worker_environment = {
        name: value for name, value in defaults.items() if not name.startswith(("SAGEMAKER_", "SENTIMENT_SERVE_"))
    }
    threads = int(defaults["OMP_NUM_THREADS"])

    with tempfile.TemporaryDirectory(prefix="serving-bench-") as scratch, ExitStack() as servers:
        model_dir = build_model(Path(scratch) / "model", args.model_size)
        archive = build_model_archive(model_dir, Path(scratch) / "model.tar.gz")
        raw = {
            label: RawWorker(model_dir, precision, threads, worker_environment)
            for label, precision in (("fp32", "fp32"), ("bf16 autocast", "bf16_autocast"))
        }
        for worker in raw.values():
            servers.callback(worker.close)
        setups: dict[str, Runner] = {
            f"raw batch 1, {label}": metered(worker.run, worker.pid) for label, worker in raw.items()
        }
        setups[RAW_B8] = metered(functools.partial(raw["fp32"].run_batches, 8), raw["fp32"].pid)
        configurations: dict[str, dict] = {name: {} for name in setups}
        chosen = SETS[args.set]
        if args.set == "grid" and args.grid_workers:
            chosen = {
                f"{w} workers x {cores // w} threads, batch {b}": {
                    "workers": w,
                    "batch_size": b,
                    "max_batch_delay_ms": 2,
                }
                for w in (int(x) for x in args.grid_workers.split(","))
                for b in (int(x) for x in args.grid_batch.split(","))
            }
        for name, chosen_options in chosen.items():
            options = dict(chosen_options)
            ray_environment: dict[str, str] = options.pop("environment", {})
            server = servers.enter_context(
                LocalRayServer(archive, vcpus=cores, environment_overrides=ray_environment, **options)
            )
            caller = http_caller(server.port)
            # A buffered replica log (Ray's throughput-optimized default) holds the pass lines back: no count.
            buffered = ray_environment.get("RAY_SERVE_THROUGHPUT_OPTIMIZED", "1") == "1" and (
                ray_environment.get("RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE", "1") != "1"
            )
            passes = None if buffered else functools.partial(replica_passes, server)
            setups[name] = metered(functools.partial(run_load, caller, texts), server.process_group, passes)
            configurations[name] = {
                key: server.environment[key]
                for key in ("SENTIMENT_SERVE_REPLICAS", "OMP_NUM_THREADS", "SENTIMENT_SERVE_MAX_BATCH_SIZE",
                            "SENTIMENT_SERVE_BATCH_WAIT_TIMEOUT_S", "SENTIMENT_PRECISION")
            } | ray_environment  # fmt: skip
        rows = measure(setups, levels, args.rounds, args.duration)

    raw_rows = [row for row in rows if row["setup"] == "raw batch 1, fp32"]  # one client: the baseline
    base_rps = (
        raw_rows[0]["throughput_rps"] if raw_rows[0]["concurrency"] == 1 else max(r["throughput_rps"] for r in raw_rows)
    )
    base_p50 = next(r["p50_ms"] for r in raw_rows if r["concurrency"] == min(levels))
    b8_rps = next(row["throughput_rps"] for row in rows if row["setup"] == RAW_B8)
    for row in rows:
        row["throughput_vs_raw_b1"] = round(row["throughput_rps"] / base_rps, 3)
        row["p50_vs_raw_b1"] = round(row["p50_ms"] / base_p50, 3)
        row["throughput_vs_raw_b8"] = round(row["throughput_rps"] / b8_rps, 3)
    b8_per_cpu = next(row["requests_per_cpu_s"] for row in rows if row["setup"] == RAW_B8)
    # The batching's efficiency: 8 single-text clients served, over full batch-8 forward passes on the same cores,
    # in wall-clock throughput and per CPU second of the serving processes (what the work costs), with the mean
    # forward-pass size the replica logged.
    efficiency = {
        row["setup"]: {
            "throughput": row["throughput_vs_raw_b8"],
            "per_cpu_s": round(row["requests_per_cpu_s"] / b8_per_cpu, 3) if row["requests_per_cpu_s"] else None,
            "mean_requests_per_pass": row["mean_requests_per_pass"],
        }
        for row in rows
        if row["concurrency"] == 8 and not row["setup"].startswith("raw")
    }
    environment = {
        "cpu": _cpu_name(),
        "cores": cores,
        "python": platform.python_version(),
        "model": f"RoBERTa-{args.model_size} shaped, random weights, tiny tokenizer",
        "baseline": f"raw batch 1, fp32, 1 client: {base_rps} texts/s, p50 {base_p50} ms ({threads} threads)",
        "raw_batch_8_fp32_texts_per_s": b8_rps,
        "served_8_clients_vs_raw_batch_8": efficiency,
        "configurations": configurations,
        "load_average_before": load_before,
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }
    write_results(output, command, environment, rows)
    print(output.with_suffix(".md").read_text())
    return 0


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip() + f" ({platform.machine()})"
    except OSError:
        pass
    return platform.processor() or platform.machine()


def write_results(output: Path, command: str, environment: dict, rows: list[dict]) -> None:
    output.parent.mkdir(parents=True, exist_ok=True)
    output.with_suffix(".json").write_text(
        json.dumps({"command": command, "environment": environment, "results": rows}, indent=2) + "\n"
    )
    header = (
        "| setup | clients | requests | errors | req/s | p50 ms | p99 ms | req/s vs raw b1 | p50 vs raw b1 "
        "| req/s vs raw b8 | req per CPU s | req per pass |"
    )
    lines = [
        f"Command: `{command}`",
        "",
        "# Local serving (Ray Serve + the archive's deployment) vs raw forward passes of 1 and 8 texts",
        "",
        *(f"- {key}: {value}" for key, value in environment.items()),
        "",
        header,
        "|" + "---|" * (header.count("|") - 1),
        *(
            f"| {r['setup']} | {r['concurrency']} | {r['requests']} | {r['errors']} | {r['throughput_rps']} | "
            f"{r['p50_ms']} | {r['p99_ms']} | {r['throughput_vs_raw_b1']} | {r['p50_vs_raw_b1']} | "
            f"{r['throughput_vs_raw_b8']} | {r['requests_per_cpu_s']} | {r['mean_requests_per_pass'] or ''} |"
            for r in rows
        ),
        "",
        "CPU milliseconds per request by serving process, 8 clients:",
        "",
        *(f"- {r['setup']}: {r['cpu_ms_per_request']}" for r in rows if r["concurrency"] == 8),
        "",
    ]
    output.with_suffix(".md").write_text("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
