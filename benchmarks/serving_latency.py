"""Local serving benchmark: the real SageMaker PyTorch toolkit + TorchServe against the raw in-process predictor.

Same host, same cores, same model, same texts (one tweet per request, the real-time case). For each concurrency
level it measures throughput and p50/p99 latency of

- ``raw``: ``SentimentPredictor.predict([text])`` called from N threads in this process, one call at a time as in
  one server worker (no HTTP, no server, no serialisation);
- ``served, batching off``: POST /invocations to the toolkit server (SAGEMAKER_TS_BATCH_SIZE=1);
- ``served, batching on``: the same with TorchServe batching (SAGEMAKER_TS_BATCH_SIZE, SAGEMAKER_TS_MAX_BATCH_DELAY);
- ``served, ... OMP_WAIT_POLICY unset``: batching off without the endpoint's ``OMP_WAIT_POLICY=PASSIVE``;

and reports the serving overhead as ratios to ``raw`` at the same concurrency. The model is RoBERTa-base shaped
(12 layers, hidden 768, ~90M parameters, randomly initialised: the hub is out of reach) with the tiny model's
tokenizer, so the compute per request is that of the seed's model; ``--model-size tiny`` runs the 2-layer test model.

The load generator runs on the same cores as the server, as a client on the endpoint host would not: served numbers
are a lower bound. Setups are measured interleaved, round after round, so background load on a shared machine
falls on all of them alike. Results go to benchmarks/results/serving_latency.{md,json} with the command at the top.

    .venv/bin/python benchmarks/serving_latency.py --concurrency 1,2,4,8 --rounds 3 --duration 5
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from inference_assets.container.predictor import SentimentPredictor  # noqa: E402
from inference_assets.local.local_server import LocalToolkitServer  # noqa: E402
from inference_assets.tools.endpoint_environment import endpoint_environment  # noqa: E402
from inference_assets.tools.package_model import build_model_archive  # noqa: E402
from training_assets.tiny_model import SAMPLE_DATA, build_tiny_model  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def build_model(directory: Path, size: str) -> Path:
    """The tiny model's tokenizer with a RoBERTa-base shaped classifier (``base``) or the tiny one (``tiny``)."""
    model_dir = build_tiny_model(directory)
    if size == "base":
        import torch
        from transformers import RobertaConfig, RobertaForSequenceClassification

        tiny = RobertaConfig.from_pretrained(model_dir)
        config = RobertaConfig(
            **{key: getattr(tiny, key) for key in ("vocab_size", "max_position_embeddings", "pad_token_id")},
            bos_token_id=tiny.bos_token_id,
            eos_token_id=tiny.eos_token_id,
            num_labels=tiny.num_labels,
            id2label=tiny.id2label,
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


def summarise(setup: str, concurrency: int, runs: list[dict]) -> dict:
    latencies = [latency for run in runs for latency in run["latencies_ms"]]
    return {
        "setup": setup,
        "concurrency": concurrency,
        "requests": len(latencies),
        "errors": sum(run["errors"] for run in runs),
        "throughput_rps": round(len(latencies) / sum(run["wall_s"] for run in runs), 2),
        "p50_ms": round(percentile(latencies, 50), 2),
        "p99_ms": round(percentile(latencies, 99), 2),
        "mean_ms": round(statistics.fmean(latencies), 2),
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


def measure(
    setups: dict[str, Callable[[str], bool]], texts: list[str], levels: list[int], rounds: int, duration_s: float
) -> list[dict]:
    """Interleave the setups (round after round, level by level) so that background load on a shared host hits
    them alike, then pool each (setup, level)'s rounds."""
    for call in setups.values():
        for text in texts[:10]:  # warm-up: first requests pay for lazy initialisation
            call(text)
    runs: dict[tuple[str, int], list[dict]] = {}
    for round_number in range(1, rounds + 1):
        for level in levels:
            for name, call in setups.items():
                run = run_load(call, texts, level, duration_s)
                runs.setdefault((name, level), []).append(run)
                print(f"round {round_number} {name} x{level}: {len(run['latencies_ms'])} requests", flush=True)
    return [summarise(name, level, runs[(name, level)]) for name in setups for level in levels]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="1,2,4,8", help="comma-separated concurrency levels")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds of load per setup, level and round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds over all setups and levels")
    parser.add_argument("--model-size", choices=("base", "tiny"), default="base")
    parser.add_argument("--batch-size", type=int, default=4, help="TorchServe batch size of the 'batching on' run")
    parser.add_argument("--max-batch-delay-ms", type=int, default=20)
    parser.add_argument("--output", type=Path, default=RESULTS / "serving_latency")
    args = parser.parse_args(argv)
    levels = [int(level) for level in args.concurrency.split(",")]
    command = "python " + " ".join(shlex.quote(part) for part in [str(Path(sys.argv[0])), *sys.argv[1:]])
    cores = os.cpu_count() or 1
    texts = sample_texts()
    load_before = [round(x, 2) for x in os.getloadavg()]
    # The raw predictor runs with the thread settings of the one server worker (OpenMP reads them when torch loads).
    worker_environment = endpoint_environment(vcpus=cores, workers=1)
    os.environ.update({name: worker_environment[name] for name in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")})

    with tempfile.TemporaryDirectory(prefix="serving-bench-") as scratch:
        model_dir = build_model(Path(scratch) / "model", args.model_size)
        archive = build_model_archive(model_dir, Path(scratch) / "model.tar.gz")
        predictor = SentimentPredictor(model_dir)
        one_at_a_time = threading.Lock()  # like one TorchServe worker (and the fast tokenizer is not re-entrant)

        def predict(text: str) -> bool:
            with one_at_a_time:
                return bool(predictor.predict([text]))

        server_options = {"workers": 1, "max_batch_delay_ms": args.max_batch_delay_ms, "vcpus": cores}
        with (
            LocalToolkitServer(archive, batch_size=1, **server_options) as unbatched,
            LocalToolkitServer(archive, batch_size=args.batch_size, **server_options) as batched,
            LocalToolkitServer(
                archive, batch_size=1, environment_overrides={"OMP_WAIT_POLICY": None}, **server_options
            ) as spinning,
        ):
            setups = {
                "raw in-process": predict,
                "served, batching off": http_caller(unbatched.port),
                f"served, batching on ({args.batch_size})": http_caller(batched.port),
                "served, batching off, OMP_WAIT_POLICY unset": http_caller(spinning.port),
            }
            rows = measure(setups, texts, levels, args.rounds, args.duration)

    raw = {row["concurrency"]: row for row in rows if row["setup"] == "raw in-process"}
    for row in rows:
        base = raw[row["concurrency"]]
        row["throughput_vs_raw"] = round(row["throughput_rps"] / base["throughput_rps"], 3)
        row["p50_vs_raw"] = round(row["p50_ms"] / base["p50_ms"], 3)
    environment = {
        "cpu": platform.processor() or platform.machine(),
        "cores": cores,
        "python": platform.python_version(),
        "model": f"RoBERTa-{args.model_size} shaped, random weights, tiny tokenizer (max 64 tokens)",
        "server": f"1 TorchServe worker; batching on = batch {args.batch_size}, max delay {args.max_batch_delay_ms} ms",
        "worker_environment": worker_environment,
        "load_average_before": load_before,
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }
    write_results(args.output, command, environment, rows)
    return 0


def write_results(output: Path, command: str, environment: dict, rows: list[dict]) -> None:
    output.parent.mkdir(parents=True, exist_ok=True)
    output.with_suffix(".json").write_text(
        json.dumps({"command": command, "environment": environment, "results": rows}, indent=2) + "\n"
    )
    header = "| setup | concurrency | requests | errors | req/s | p50 ms | p99 ms | req/s vs raw | p50 vs raw |"
    lines = [
        f"Command: `{command}`",
        "",
        "# Local serving latency: SageMaker PyTorch toolkit + TorchServe vs the in-process predictor",
        "",
        *(f"- {key}: {value}" for key, value in environment.items()),
        "",
        header,
        "|" + "---|" * (header.count("|") - 1),
        *(
            f"| {r['setup']} | {r['concurrency']} | {r['requests']} | {r['errors']} | {r['throughput_rps']} | "
            f"{r['p50_ms']} | {r['p99_ms']} | {r['throughput_vs_raw']} | {r['p50_vs_raw']} |"
            for r in rows
        ),
        "",
    ]
    output.with_suffix(".md").write_text("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
