"""What the bf16 fast path and torch.compile cost and change, measured in-process on this machine's CPU.

1. bf16 vs fp32: the same texts through the fp32 model and under ``torch.autocast(bfloat16)`` (x86's equivalent
   of Graviton's ``DNNL_DEFAULT_FPMATH_MODE=BF16`` fast-math kernels): label agreement, largest difference of any
   class probability, and batch-1 / batch-16 speed of both.
2. torch.compile: the start-up cost of compiling and warming up the model at load (what
   ``graviton_endpoint.torch_compile`` adds to a worker's start), and batch-1 latency compiled vs eager.

The model is the RoBERTa-base shaped, randomly initialised classifier of serving_latency.py. Random weights give
near-uniform probabilities, so a tiny numeric difference can flip a label: the agreement here is a pessimistic
bound for a trained model; the agreement among texts whose fp32 top-two margin exceeds 0.01 is reported as well.

    .venv/bin/python -m proving_ground.benchmarks.serving_precision            # writes \\
        results/serving_precision.{md,json}
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

from inference_assets.container.contract import Limits
from inference_assets.container.predictor import RuntimeOptions, SentimentPredictor
from inference_assets.tools.endpoint_environment import endpoint_environment
from proving_ground.benchmarks.serving_latency import RESULTS, _cpu_name, build_model
from training_assets.tiny_model import SAMPLE_DATA


def all_texts() -> list[str]:
    texts = []
    for name in ("train.jsonl", "validation.jsonl"):
        for line in (SAMPLE_DATA / name).read_text().splitlines():
            if line.strip():
                texts.append(json.loads(line)["text"])
    return texts


def latency_ms(predictor: SentimentPredictor, texts: list[str], size: int, calls: int) -> float:
    """Median milliseconds of one forward pass over ``size`` texts."""
    samples = []
    for call in range(calls):
        batch = [texts[(call * size + i) % len(texts)] for i in range(size)]
        began = time.perf_counter()
        predictor.predict(batch)
        samples.append((time.perf_counter() - began) * 1000)
    return statistics.median(samples)


def compare(fp32: SentimentPredictor, bf16: SentimentPredictor, texts: list[str]) -> dict:
    exact = [p.as_dict() for i in range(0, len(texts), 16) for p in fp32.predict(texts[i : i + 16])]
    fast = [p.as_dict() for i in range(0, len(texts), 16) for p in bf16.predict(texts[i : i + 16])]
    return compare_predictions(exact, fast)


def compare_predictions(exact: list[dict], fast: list[dict]) -> dict:
    """Labels and class probabilities of the same texts from fp32 (``exact``) and bf16 (``fast``) passes."""
    differences = [
        abs(a["scores"][label] - b["scores"][label]) for a, b in zip(exact, fast, strict=True) for label in a["scores"]
    ]
    agree = [a["label"] == b["label"] for a, b in zip(exact, fast, strict=True)]
    margins = [sorted(a["scores"].values())[-1] - sorted(a["scores"].values())[-2] for a in exact]
    clear = [same for same, margin in zip(agree, margins, strict=True) if margin > 0.01]
    return {
        "texts": len(exact),
        "label_agreement": round(sum(agree) / len(agree), 4),
        "texts_with_margin_over_0.01": len(clear),
        "label_agreement_margin_over_0.01": round(sum(clear) / len(clear), 4) if clear else None,
        "max_score_difference": round(max(differences), 5),
        "mean_score_difference": round(statistics.fmean(differences), 6),
    }


# Long: a benchmark script's main: arguments, the runs side by side, and the results written as JSON and Markdown
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-size", choices=("base", "tiny"), default="base")
    parser.add_argument("--calls", type=int, default=20, help="forward passes per latency measurement")
    parser.add_argument("--skip-compile", action="store_true")
    parser.add_argument("--worker-environment", action="store_true", help="run with a default worker's environment")
    parser.add_argument("--output", type=Path, default=RESULTS / "serving_precision")
    args = parser.parse_args(argv)
    command = "python -m proving_ground.benchmarks.serving_precision " + " ".join(
        shlex.quote(a) for a in (argv or sys.argv[1:])
    )
    texts = all_texts()
    load_before = [round(x, 2) for x in os.getloadavg()]
    if args.worker_environment:
        # A default worker's environment (threads, OMP_WAIT_POLICY=PASSIVE, allocator) before torch loads.
        defaults = endpoint_environment(vcpus=os.cpu_count() or 1)
        os.environ.update({k: v for k, v in defaults.items() if not k.startswith("SAGEMAKER_")})
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="serving-precision-") as scratch:
        model_dir = build_model(Path(scratch) / "model", args.model_size)
        fp32 = SentimentPredictor(model_dir, RuntimeOptions())
        bf16 = SentimentPredictor(model_dir, RuntimeOptions(precision="bf16_autocast"))
        results["bf16_vs_fp32"] = compare(fp32, bf16, texts)
        results["latency_ms"] = {
            f"batch {size}, {name}": round(latency_ms(predictor, texts, size, args.calls), 2)
            for size in (1, 16)
            for name, predictor in (("fp32", fp32), ("bf16 autocast", bf16))
        }
        # The largest forward pass the default limits let through: max_request_batch texts, each cut to 512 tokens
        # as RoBERTa-base would be (the benchmark model's tokenizer stops at 64); 2,000 characters exceed that.
        limits = Limits()
        per_text = 2_000
        largest = [("word " * per_text)[:per_text] for _ in range(limits.max_request_batch)]
        long_model = SentimentPredictor(build_model(Path(scratch) / "model-512", args.model_size, positions=514))
        long_model.max_length = 512
        results["largest_request"] = {
            "texts": len(largest),
            "chars_per_text": per_text,
            "tokens_per_text": len(long_model.tokenizer(largest[0], truncation=True, max_length=512)["input_ids"]),
            "latency_ms_fp32": round(latency_ms(long_model, largest, len(largest), 1), 1),
            "typical_request_latency_ms_fp32": round(latency_ms(long_model, texts, 1, args.calls), 2),
        }
        if not args.skip_compile:
            began = time.perf_counter()
            compiled = SentimentPredictor(model_dir, RuntimeOptions(torch_compile=True))
            results["torch_compile"] = {
                "load_with_compile_and_warm_up_s": round(time.perf_counter() - began, 1),
                "warm_up_s": round(compiled.warm_up_seconds, 1),
                "batch 1 latency ms, compiled": round(latency_ms(compiled, texts, 1, args.calls), 2),
                "batch 1 latency ms, eager": round(latency_ms(fp32, texts, 1, args.calls), 2),
                "batch 16 latency ms, compiled": round(latency_ms(compiled, texts, 16, args.calls), 2),
                "batch 16 latency ms, eager": round(latency_ms(fp32, texts, 16, args.calls), 2),
            }
    environment = {
        "cpu": _cpu_name(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch_threads": fp32._torch.get_num_threads(),
        "model": f"RoBERTa-{args.model_size} shaped, random weights, tiny tokenizer",
        "load_average_before": load_before,
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    document = {"command": command, "environment": environment, "results": results}
    args.output.with_suffix(".json").write_text(json.dumps(document, indent=2) + "\n")
    lines = [f"Command: `{command}`", "", "# bf16 autocast and torch.compile vs fp32 eager, in-process", ""]
    lines += [f"- {key}: {value}" for key, value in environment.items()] + [""]
    for section, values in results.items():
        lines += [f"## {section}", "", "| measure | value |", "|---|---|"]
        lines += [f"| {key} | {value} |" for key, value in values.items()] + [""]
    args.output.with_suffix(".md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
