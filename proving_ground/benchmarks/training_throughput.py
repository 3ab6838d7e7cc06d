"""Training throughput side by side in one run, and how far it is from the hardware's limit: the seed's baseline
(eager, fp32, plain AdamW, every text padded to max_seq_length, random batches), each PyTorch 2 feature alone
(torch.compile, bf16, fused AdamW) and all three, train_sentiment.py's defaults ("fast_path": bucketed padding,
batches of one bucket, the compiled optimizer step; with a GPU also CUDA graphs, bf16, DataLoader workers with
pinned memory), the fast path with several texts per row ("packed"), without gc.freeze ("no_gc_freeze") and with
the Trainer's per-step module walks ("trainer_host_step"), on the same model and data. ``NAME@N`` runs a variant at
per-device batch N (e.g. packed@256). ``--cprofile`` runs each variant under cProfile and reports the host's calls and
seconds per step in the Trainer's step functions and the module walks.

Per variant: samples/s, non-padding tokens/s, padding fraction, the model's training FLOPs per token from its config
(ModelFlops in training_assets/instance/throughput.py: 6 N + 12 L d l, PaLM's model-FLOPs count) and the model
TFLOP/s they make; on a GPU, that as a fraction of the GPU's dense bf16 peak (platform_facts/accelerators.json,
NVIDIA's figures) and of the matmul peak measured first (--probe-seconds); and what the run observed: graph breaks,
frames compiled, CUDA graph skips and re-records, host and device time per step, data-loader wait, launches per step
(--profile-steps), peak memory, compile seconds. Throughput is taken over the steady steps: after the warm-up steps,
and not the steps that compile a new bucket length or record its CUDA graph (a bucket can first turn up late in an
epoch); the results give the rest apart.

Each variant is one run of training_assets/instance/train_sentiment.py in its own process with a fresh
TorchInductor cache (or one shared cache, --inductor-cache), its output kept in the results folder; --variant-seconds
stops a variant that runs longer, --deadline-seconds lets none run past the run's deadline, and each variant's row is
written as soon as it ends. The variants run in interleaved rounds (--rounds, default 2) and each keeps its best
round, so a burst of other work on a shared machine does not decide a ratio; on CPU each run uses one thread
(--cpu-threads) for the same reason. The results file records every round and the machine's load average around
each run. On a GPU the fast-path runs use ``--sync-debug error`` (torch.cuda.set_sync_debug_mode: a hidden
host-device synchronisation in a steady step fails the run; the results say so, and the variant is measured again
without the check).

This path imports neither ``datasets`` nor anything from the hub: --model-size roberta-base builds a
RoBERTa-base-sized classifier offline (random weights) and --synthetic-rows writes tweet-length texts, so the GPU
measurement runs anywhere torch and transformers are installed (gpu_training_benchmark.sh runs it in one shot).

    # CPU here: a small RoBERTa (4 x 256) built offline, on the shipped sample data
    python -m proving_ground.benchmarks.training_throughput
    # one GPU, in one shot within 9 minutes (the variants, limits and files: see the script)
    bash proving_ground/benchmarks/gpu_training_benchmark.sh OUT
    # a GPU node, the real RoBERTa-base model and tweet_eval data (8 GPUs: DDP through torchrun)
    python -m proving_ground.benchmarks.training_throughput --model cardiffnlp/twitter-roberta-base-sentiment-latest \\
        --dataset tweet_eval --max-train-samples 20000 --batch-size 32 --max-seq-length 128 --nproc-per-node 8 \\
        --output proving_ground/benchmarks/results/training_throughput_p4d.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import pstats
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any, TypedDict

import torch

from platform_facts.accelerators import fraction_of_peak
from training_assets.tiny_model import SAMPLE_DATA, build_tiny_model

ROOT = Path(__file__).resolve().parents[2]
STARTED = time.monotonic()

TRAINING_MODULE = "training_assets.instance.train_sentiment"
# The seed's baseline: eager, fp32, plain AdamW, every text padded to max_seq_length, random batches. The seed's
# variants add one feature to it; "fast_path" is train_sentiment.py's defaults (bucketed padding, length-grouped
# batches, fused AdamW; with a GPU also compile in reduce-overhead mode and bf16).
SEED = ("--no-torch-compile", "--no-bf16", "--no-fused-adamw", "--padding", "max_length", "--no-group-by-length",
        "--no-compile-optimizer")  # fmt: skip
VARIANTS = {
    "baseline": SEED,
    "torch_compile": (*SEED, "--torch-compile"),
    "bf16": (*SEED, "--bf16"),
    "fused_adamw": (*SEED, "--fused-adamw"),
    "all_three": (*SEED, "--torch-compile", "--bf16", "--fused-adamw"),
    "fast_path": (),
    # The fast path with several texts per row instead of buckets (--padding packed: padding near zero).
    "packed": ("--padding", "packed"),
    # The fast path without gc.freeze() after the warm-up: the host time per step it saves.
    "no_gc_freeze": ("--no-gc-freeze",),
    # The fast path with the Trainer's per-step model.train() and zero_grad module walks (--no-lean-host-step).
    "trainer_host_step": ("--no-lean-host-step",),
}
# Variants that run the fast path's code (the GPU's sync check applies to them).
FAST_VARIANTS = ("fast_path", "packed")


class ModelSize(TypedDict):
    """The size arguments of build_tiny_model()."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int


# The benchmark's CPU model: RoBERTa-shaped like the real one, small enough for a few minutes on two cores.
SMALL_MODEL: ModelSize = {
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "intermediate_size": 1024,
}
# RoBERTa-base (and cardiffnlp/twitter-roberta-base-sentiment-latest, the seed's model): 12 layers of 768 with 12
# heads and a 3072 feed-forward, a 50,265-token vocabulary and 514 positions (512 + RoBERTa's offset of 2).
ROBERTA_BASE: ModelSize = {
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
}
ROBERTA_BASE_VOCABULARY = 50_265
ROBERTA_BASE_POSITIONS = 514
# Tweet-length texts: 1 + Poisson(2.4) sample texts joined, 3.4 on average; a sample text is 6.8 tokens of the
# benchmark's tokenizer plus the 2 special tokens of the joined text: ~25 tokens, the tweet length.
EXTRA_TEXTS_MEAN = 2.4
# What --cprofile reports per optimizer step: (file ending, function name) of the functions the host runs per step.
HOST_FUNCTIONS = {
    "trainer_inner_training_loop": ("transformers/trainer.py", "_inner_training_loop"),
    "trainer_training_step": ("transformers/trainer.py", "training_step"),
    "module_train": ("torch/nn/modules/module.py", "train"),
    "module_zero_grad": ("torch/nn/modules/module.py", "zero_grad"),
    "module_named_modules": ("torch/nn/modules/module.py", "named_modules"),
    "clip_grad_norm": ("accelerate/accelerator.py", "clip_grad_norm_"),
    "gc_collect": ("~", "<built-in method gc.collect>"),
}
PER_RUN_ONLY = ("device", "load_average_1m_before_after")  # in the results once, or per round
HONESTY = (
    "AWS's PyTorch 2.0 blog post reports +42% fine-tuning speed from torch.compile + bf16 + fused AdamW on one "
    "p4d.24xlarge (8 x A100, RoBERTa-base). CPU numbers say nothing about that claim: what the three features save "
    "on an A100 "
    "(kernel launches, tensor-core math, optimizer kernels over GPU memory) is not what limits a small model on a "
    "CPU thread, and a shared machine adds noise (see the rounds and load averages). Run this script unchanged on "
    "the GPU instance to check the claim."
)


def roberta_base_config(pad_token_id: int, bos_token_id: int, eos_token_id: int) -> Any:
    """A RobertaConfig of RoBERTa-base's size, vocabulary and positions included, with the sentiment labels."""
    from transformers import RobertaConfig

    labels = ("negative", "neutral", "positive")
    return RobertaConfig(
        vocab_size=ROBERTA_BASE_VOCABULARY,
        max_position_embeddings=ROBERTA_BASE_POSITIONS,
        type_vocab_size=1,
        pad_token_id=pad_token_id,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
        **ROBERTA_BASE,
    )


def build_roberta_base(output: Path) -> Path:
    """A RoBERTa-base-sized sequence classifier with random weights, offline: the tiny model's tokenizer (byte-level
    BPE trained on the sample data, 512 tokens, allowed 512 positions) and RoBERTa-base's config, vocabulary
    included, so the embedding table and its optimizer state cost what the real model's do."""
    from transformers import AutoTokenizer, RobertaForSequenceClassification

    build_tiny_model(output)  # the tokenizer files (and a tiny model, replaced below)
    tokenizer = AutoTokenizer.from_pretrained(output)
    tokenizer.model_max_length = ROBERTA_BASE_POSITIONS - 2
    tokenizer.save_pretrained(output)
    torch.manual_seed(0)
    config = roberta_base_config(tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id)
    RobertaForSequenceClassification(config).save_pretrained(output, safe_serialization=True)
    return output


def synthetic_tweets(folder: Path, rows: int, seed: int = 0) -> Path:
    """``rows`` training texts (and rows // 8 for validation) of tweet length, each 1 + Poisson(2.4) sample texts
    joined, labelled as its first: a length distribution like tweets' (most short, a long tail), offline."""
    sample = [json.loads(line) for line in (SAMPLE_DATA / "train.jsonl").read_text().splitlines() if line.strip()]
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", rows), ("validation", max(1, rows // 8))):
        lines = []
        for _ in range(count):
            extra = 0
            while rng.random() < 1 - 1 / (1 + EXTRA_TEXTS_MEAN):  # geometric draws, mean 2.4: a long tail
                extra += 1
            picked = [rng.choice(sample) for _ in range(1 + extra)]
            lines.append(json.dumps({"text": " ".join(row["text"] for row in picked), "label": picked[0]["label"]}))
        (folder / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def variant_flags(name: str) -> tuple[str, int | None]:
    """``fast_path@256`` -> ("fast_path", 256); ``baseline`` -> ("baseline", None)."""
    base, _, batch = name.partition("@")
    if base not in VARIANTS or (batch and not batch.isdigit()):
        raise ValueError(f"unknown variant {name!r}: one of {', '.join(VARIANTS)}, optionally @<batch size>")
    return base, int(batch) if batch else None


def run_variant(name: str, args: argparse.Namespace, model: str, dataset: str, work: Path) -> dict:
    base, batch = variant_flags(name)
    flags = VARIANTS[base]
    batch_size = batch or args.batch_size
    on_gpu = not args.use_cpu and torch.cuda.is_available()
    # The GPU's check for hidden host-device synchronisation, on the fast path (the seed's variants read the device
    # by design: eager attention masks). torch.cuda.set_sync_debug_mode exists only with CUDA.
    sync_debug = (
        args.sync_debug if args.sync_debug != "auto" else ("error" if on_gpu and base in FAST_VARIANTS else "off")
    )
    row = _run(name, flags, batch_size, sync_debug, args, model, dataset, work)
    if "error" in row and sync_debug != "off" and "synchronizing CUDA operation" in row["error"]:
        # A hidden sync: say so, and still measure the variant without the check.
        retry = _run(name, flags, batch_size, "off", args, model, dataset, work / "without-sync-check")
        retry["sync_debug"] = {"mode": sync_debug, "passed": False, "error": row["error"]}
        return retry
    return row


def _run(name: str, flags: tuple[str, ...], batch_size: int, sync_debug: str, args: argparse.Namespace,
         model: str, dataset: str, work: Path) -> dict:  # fmt: skip
    output = work / name.replace("@", "-b")
    work.mkdir(parents=True, exist_ok=True)
    stats = work / f"{_file_name(name)}.pstats"  # megabytes: summarized into the row, not kept
    launcher = _launcher(args, stats)
    command = [
        *launcher, "-m", TRAINING_MODULE, "--model", model, "--dataset", dataset, "--output-dir", str(output),
        "--epochs", str(args.epochs), "--per-device-batch-size", str(batch_size),
        "--max-seq-length", str(args.max_seq_length), "--learning-rate", str(args.learning_rate),
        "--warmup-steps", str(args.warmup_steps), "--sync-debug", sync_debug, *flags,
    ]  # fmt: skip
    if args.max_train_samples:
        command += ["--max-train-samples", str(args.max_train_samples)]
    if args.use_cpu:
        command.append("--use-cpu")
    if args.profile_steps:
        command += ["--profile-steps", str(args.profile_steps)]
    # A fresh compile cache per variant (the compile warm-up measured cold, as on a new instance), unless one is
    # shared (--inductor-cache: the one-shot GPU check, where cold compiles of every variant would not fit).
    cache = args.inductor_cache or work / f"inductor-{output.name}"
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache), "TOKENIZERS_PARALLELISM": "false"}
    if args.cpu_threads:
        env["OMP_NUM_THREADS"] = str(args.cpu_threads)
    print(f"[{name}] {shlex.join(command)}", flush=True)
    load_before = os.getloadavg()[0]
    limit = variant_limit(args)
    log = args.results_dir / f"{_file_name(name)}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as stream:  # the child's output, kept beside its results
        try:
            result = subprocess.run(command, env=env, cwd=ROOT, check=False, stdout=stream, stderr=subprocess.STDOUT,
                                    text=True, timeout=limit)  # fmt: skip
            returncode: int | None = result.returncode
        except subprocess.TimeoutExpired:
            returncode = None
    # Other work on the machine slows a variant down: the 1-minute load average before and after shows it.
    load = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    failed = {"variant": name, "flags": list(flags), "per_device_batch_size": batch_size, "load": load,
              "log": log.name}  # fmt: skip
    if returncode is None:
        return {**failed, "error": f"stopped at its time limit of {limit:.0f} s"}
    if returncode != 0:
        lines = log.read_text().strip().splitlines() or ["(no output)"]
        sync = [line for line in lines if "synchronizing CUDA operation" in line]
        errors = [line for line in lines if line.startswith("train_sentiment: error")]
        return {**failed, "error": (sync or errors or lines)[-1]}
    if not (output / "metrics.json").is_file():  # cProfile ends 0 whatever its module's exit status was
        lines = log.read_text().strip().splitlines() or ["(no output)"]
        return {**failed, "error": lines[-1]}
    metrics = json.loads((output / "metrics.json").read_text())
    shutil.copyfile(output / "metrics.json", args.results_dir / f"{_file_name(name)}.metrics.json")
    row = {**summarize(name, flags, batch_size, metrics, load), "log": log.name}
    if args.cprofile:
        row["host_profile_per_step"] = host_profile(stats, metrics["optimizer_steps"])
    return row


def host_profile(path: Path, steps: int) -> dict[str, dict[str, float]]:
    """Per optimizer step, from a cProfile of the whole run: the calls (not counting a function's recursive calls)
    and the seconds inside each of HOST_FUNCTIONS (cProfile's overhead included, alike in every variant)."""
    found: dict[str, dict[str, float]] = {}
    for (file, _, function), (primitive, _, _, cumulative, _) in pstats.Stats(str(path)).stats.items():  # type: ignore[attr-defined]
        for key, (ending, wanted) in HOST_FUNCTIONS.items():
            if function == wanted and file.endswith(ending):
                found[key] = {"calls": round(primitive / steps, 3), "seconds": round(cumulative / steps, 6)}
    return found


def _launcher(args: argparse.Namespace, stats: Path) -> list[str]:
    """The start of a variant's command: its interpreter, under cProfile (one process) or torchrun (several).
    PYTHON_EXEC: torchrun's setting for its workers' interpreter (torch.distributed.run), taken for every variant's
    process (with one process per node too)."""
    launcher = [os.environ.get("PYTHON_EXEC", sys.executable)]
    if args.cprofile:  # the profile of the whole run, written when it ends
        return [*launcher, "-m", "cProfile", "-o", str(stats)]
    if args.nproc_per_node > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc_per_node}"]
    return launcher


def _file_name(variant: str) -> str:
    return variant.replace("@", "-b")


def variant_limit(args: argparse.Namespace) -> float | None:
    """Seconds the next variant may run: its own limit, and no more than what is left of the whole run's."""
    limits = [args.variant_seconds] if args.variant_seconds else []
    if args.deadline_seconds:
        limits.append(args.deadline_seconds - (time.monotonic() - STARTED))
    return max(1.0, min(limits)) if limits else None


# Long: one flat row, a key per number the results report, read straight from metrics.json.
def summarize(name: str, flags: tuple[str, ...], batch_size: int, metrics: dict, load: list[float]) -> dict:
    """One row of the results from a run's metrics.json: the steady steps' throughput first."""
    throughput, last = metrics["throughput"], metrics["epochs"][-1]
    steady = throughput.get("steady_steps", 0) > 0
    prefix = "steady_" if steady else ""
    samples_trained = max(1, metrics["optimizer_steps"] * throughput["samples_per_step"])
    samples = throughput["steady_samples_per_second"] if steady else throughput["train_samples_per_second"]
    row: dict[str, Any] = {
        "variant": name,
        "flags": list(flags),
        "per_device_batch_size": batch_size,
        "train_samples_per_second": samples,
        "non_padding_tokens_per_second": (
            throughput["steady_non_padding_tokens_per_second"]
            if steady
            else throughput["non_padding_tokens_per_second"]
        ),
        "padding_fraction": throughput["padding_fraction"],
        "mean_tokens_per_text": round(throughput["non_padding_tokens"] / samples_trained, 2),
        "model_flops_per_token": throughput.get("model_flops_per_token"),
        "model_tflops_per_second": throughput.get(f"{prefix}model_tflops_per_second"),
        "measured_steps": throughput["steady_steps"] if steady else throughput["measured_steps"],
        "median_step_seconds": throughput["median_step_seconds"],
        # Samples per second at the median step time: robust to a few steps slowed by other processes.
        "median_samples_per_second": round(throughput["samples_per_step"] / throughput["median_step_seconds"], 3),
        "all_steps_after_warmup_samples_per_second": throughput["train_samples_per_second"],
        "warmup_seconds": throughput["warmup_seconds"],
        "compile_warmup_seconds": throughput["compile_warmup_seconds"],
        "steps_that_compiled": metrics["compilation"]["steps_that_compiled"],
        "steps_per_length": metrics["padding"]["steps_per_length"],
        "optimizer_step": metrics["optimizer_step"],
        "cuda_graphs": metrics["cuda_graphs"],
        "final_train_loss": last["train_loss"],
        "final_eval_macro_f1": last["eval_macro_f1"],
        "device": metrics["device"],
        "load_average_1m_before_after": load,
    }
    compilation, host = metrics["compilation"], metrics.get("host", {})
    row.update({
        # Observed while it ran (metrics.json), not taken from the configuration.
        "cuda_graphs_configured": metrics.get("cuda_graphs_configured", metrics["cuda_graphs"]),
        "cuda_graph_skips": compilation.get("cuda_graph_skips"),
        "cuda_graph_rerecords": compilation.get("cuda_graph_rerecords"),
        "graph_breaks": compilation.get("graph_breaks"),
        "graph_break_reasons": compilation.get("graph_break_reasons"),
        "frames_compiled": compilation.get("frames_compiled"),
        "compile_seconds": compilation.get("compile_seconds"),
        "fx_graph_cache_hits": compilation.get("fx_graph_cache_hits"),
        "host_seconds_per_step": throughput.get("steady_host_seconds_per_step"),
        "host_seconds_per_step_max": throughput.get("steady_host_seconds_per_step_max"),
        "host_cpu_seconds_per_step": throughput.get("steady_host_cpu_seconds_per_step"),
        "device_seconds_per_step": throughput.get("steady_device_seconds_per_step"),
        "data_loader_wait_seconds": throughput.get("steady_data_loader_wait_seconds"),
        "kernel_launches_per_step": host.get("kernel_launches_per_step"),
        "cuda_graph_launches_per_step": host.get("cuda_graph_launches_per_step"),
        "aten_ops_per_step": host.get("aten_ops_per_step"),
        "peak_memory_bytes": host.get("peak_memory_bytes"),
    })  # fmt: skip
    if "sync_debug" in metrics:
        row["sync_debug"] = {**metrics["sync_debug"], "passed": True}
    if metrics["device"]["type"] == "cuda" and row["model_tflops_per_second"] is not None:
        row.update(fraction_of_peak(metrics["device"]["name"], row["model_tflops_per_second"]))
    return row


def device_probe(on_gpu: bool, seconds: float = 1.0) -> dict[str, Any]:
    """The machine as measured: library versions, the device, a dense matmul's TFLOP/s (bf16 8192^3 on a GPU, fp32
    512^3 on a CPU) and a device-to-device copy's GB/s (bytes read + written), each repeated for ``seconds``."""
    device = torch.device("cuda" if on_gpu else "cpu")
    size, dtype = (8192, torch.bfloat16) if on_gpu else (512, torch.float32)
    left = torch.randn(size, size, dtype=dtype, device=device)
    right = torch.randn(size, size, dtype=dtype, device=device)
    source = torch.empty(256 * 2**20 if on_gpu else 32 * 2**20, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)

    def timed(work: Any) -> tuple[int, float]:
        work()  # warm-up (kernel selection, allocation)
        if on_gpu:
            torch.cuda.synchronize()
        repeats, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            work()
            repeats += 1
            if on_gpu and repeats % 10 == 0:
                torch.cuda.synchronize()  # the host clock then counts the GPU's work
        if on_gpu:
            torch.cuda.synchronize()
        return repeats, time.perf_counter() - start

    matmuls, matmul_seconds = timed(lambda: torch.matmul(left, right))
    copies, copy_seconds = timed(lambda: target.copy_(source))
    info: dict[str, Any] = {
        "python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
        **{name: metadata.version(name) for name in ("transformers", "accelerate", "tokenizers")},
        "device": torch.cuda.get_device_name() if on_gpu else platform.processor() or platform.machine(),
        "matmul": f"{size}x{size}x{size} {str(dtype).removeprefix('torch.')}",
        "measured_matmul_tflops": round(2 * size**3 * matmuls / matmul_seconds / 1e12, 3),
        "measured_copy_gb_per_second": round(2 * source.numel() * copies / copy_seconds / 1e9, 3),
    }  # fmt: skip
    if on_gpu:
        info["capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
        info.update(fraction_of_peak(info["device"], info["measured_matmul_tflops"]))
    return info


def write_results(args: argparse.Namespace, given: list[str], names: list[str], runs: dict[str, list[dict]],
                  probe: dict[str, Any] | None) -> dict[str, Any]:  # fmt: skip
    """The results so far (written after every variant, so a run stopped early keeps what it measured)."""
    rows = [_best(name, rounds) for name, rounds in runs.items() if rounds]
    done = {row["variant"]: row for row in rows if "error" not in row}
    baseline = done.get("baseline")
    measured_peak = (probe or {}).get("measured_matmul_tflops")
    for row in rows:
        if "error" in row:
            continue
        if baseline:
            for metric in ("train_samples_per_second", "median_samples_per_second"):
                row[f"{metric}_vs_baseline"] = round(row[metric] / baseline[metric], 3)
        if measured_peak and row.get("model_tflops_per_second") and (probe or {}).get("capability"):
            row["fraction_of_measured_matmul_peak"] = round(row["model_tflops_per_second"] / measured_peak, 4)
    device = next((row["device"] for row in rows if "device" in row), None)
    size = {"roberta-base": ROBERTA_BASE, "small": SMALL_MODEL}.get(args.model_size, "(training_assets.tiny_model)")
    described = f"{args.model_size} RoBERTa built offline {size}" + (
        f", vocabulary {ROBERTA_BASE_VOCABULARY:,}, {ROBERTA_BASE_POSITIONS} positions, random weights"
        if args.model_size == "roberta-base" else "")  # fmt: skip
    result: dict[str, Any] = {
        "command": shlex.join(["python", "-m", "proving_ground.benchmarks.training_throughput", *given]),
        "note": HONESTY,
        "device": device,
        "probe": probe,
        "model": args.model or described,
        "dataset": (f"{args.synthetic_rows} synthetic tweet-length texts (training_throughput.synthetic_tweets)"
                    if args.synthetic_rows
                    else os.path.relpath(args.dataset, ROOT) if Path(args.dataset).exists() else args.dataset),
        "settings": {
            "epochs": args.epochs, "per_device_batch_size": args.batch_size, "max_seq_length": args.max_seq_length,
            "warmup_steps_excluded": args.warmup_steps, "nproc_per_node": args.nproc_per_node,
            "rounds": args.rounds, "cpu_threads": args.cpu_threads, "variant_seconds": args.variant_seconds,
            "deadline_seconds": args.deadline_seconds, "shared_inductor_cache": bool(args.inductor_cache),
        },
        "throughput_definition": "steady steps: after the warm-up steps, without the steps that compiled a new batch "
        "shape or recorded its CUDA graph (all_steps_after_warmup_samples_per_second counts those too)",
        "variants_planned": names,
        "variants": [{k: v for k, v in row.items() if k not in PER_RUN_ONLY} for row in rows],
    }  # fmt: skip
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    for row in result["variants"]:
        (args.results_dir / f"{_file_name(row['variant'])}.json").write_text(json.dumps(row, indent=2) + "\n")
    return result


def _best(name: str, rounds: list[dict]) -> dict:
    """The variant's round with the best median-step throughput (least disturbed), with every round's numbers."""
    done = [run for run in rounds if "error" not in run]
    if not done:
        return rounds[-1]
    best = max(done, key=lambda run: run["median_samples_per_second"])
    return {
        **best,
        "rounds_median_samples_per_second": [run["median_samples_per_second"] for run in done],
        "rounds_host_cpu_seconds_per_step": [run.get("host_cpu_seconds_per_step") for run in done],
        "rounds_compile_warmup_seconds": [run["compile_warmup_seconds"] for run in done],
        "rounds_load_average_1m_before_after": [run["load_average_1m_before_after"] for run in done],
    }


# Long: the command line's declarations, then the loop over rounds and variants.
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model directory or hub id (default: built offline, see --model-size)")
    parser.add_argument(
        "--model-size",
        choices=("tiny", "small", "roberta-base"),
        default="small",
        help="the model built offline without --model: tiny (2 x 32, the tests' model), small (4 x 256, for CPUs) or "
        "roberta-base (12 x 768, "
        "50,265-token vocabulary, 514 positions, random weights)",
    )
    parser.add_argument("--dataset", default=str(SAMPLE_DATA), help="dataset folder or hub id")
    parser.add_argument("--synthetic-rows", type=int, help="train on this many tweet-length texts made offline")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16, help="per device (a variant's @N overrides it)")
    parser.add_argument("--max-seq-length", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=5e-4)
    parser.add_argument("--max-train-samples", type=int)
    parser.add_argument("--warmup-steps", type=int, default=2, help="steps excluded from throughput (compilation)")
    parser.add_argument("--nproc-per-node", type=int, default=1, help="torchrun processes (GPUs)")
    parser.add_argument("--use-cpu", action="store_true", help="CPU even where a GPU is present")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds over all variants; best kept")
    parser.add_argument(
        "--cpu-threads",
        type=int,
        default=None,
        help="OMP threads per run (default: 1 on CPU, where threads fight other work; all on GPU)",
    )
    parser.add_argument(
        "--sync-debug",
        choices=("auto", "off", "warn", "error"),
        default="auto",
        help="train_sentiment.py --sync-debug (auto: error for the fast path on a GPU, off otherwise)",
    )
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"subset of {','.join(VARIANTS)}, each optionally @<batch size>")  # fmt: skip
    parser.add_argument(
        "--output", type=Path, default=ROOT / "proving_ground/benchmarks/results/training_throughput.json"
    )
    parser.add_argument("--results-dir", type=Path, help="per-variant results, metrics.json and logs, written as "
                        "each variant ends (default: the --output file's name without .json, beside it)")  # fmt: skip
    parser.add_argument("--variant-seconds", type=float, help="stop a variant that runs longer (default: no limit)")
    parser.add_argument("--deadline-seconds", type=float, help="no variant runs past this many seconds from the "
                        "start: each gets at most what is left (default: no limit)")  # fmt: skip
    parser.add_argument("--inductor-cache", type=Path, help="one TorchInductor cache for every variant (default: a "
                        "fresh one per variant, so each compiles cold)")  # fmt: skip
    parser.add_argument("--cprofile", action="store_true", help="run each variant under cProfile (one process) and "
                        "report the host's calls and seconds per step in the functions of HOST_FUNCTIONS")  # fmt: skip
    parser.add_argument("--profile-steps", type=int, default=0, help="train_sentiment.py --profile-steps (launches "
                        "per step)")  # fmt: skip
    parser.add_argument("--probe-seconds", type=float, default=0.0, help="measure the device first for this long "
                        "per measurement: matmul TFLOP/s, copy GB/s, versions (default 0: not measured)")  # fmt: skip
    given = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(given)
    names = [name.strip() for name in args.variants.split(",") if name.strip()]
    try:
        for name in names:
            variant_flags(name)
    except ValueError as error:
        parser.error(str(error))
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.cprofile and args.nproc_per_node > 1:
        parser.error("--cprofile profiles one process: use --nproc-per-node 1")
    on_cpu = args.use_cpu or not torch.cuda.is_available()
    if args.cpu_threads is None and on_cpu:
        args.cpu_threads = 1
    if args.sync_debug in ("warn", "error") and on_cpu:
        parser.error("--sync-debug warn/error needs a GPU (torch.cuda.set_sync_debug_mode)")
    args.results_dir = args.results_dir or args.output.with_suffix("")
    args.results_dir.mkdir(parents=True, exist_ok=True)

    probe = device_probe(on_gpu=not on_cpu, seconds=args.probe_seconds) if args.probe_seconds else None
    if probe:
        (args.results_dir / "device.json").write_text(json.dumps(probe, indent=2) + "\n")
    runs: dict[str, list[dict]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="training-benchmark-") as folder:
        work = Path(folder)
        if args.model:
            model = args.model
        elif args.model_size == "roberta-base":
            model = str(build_roberta_base(work / "roberta-base-sized"))
        elif args.model_size == "tiny":
            model = str(build_tiny_model(work / "tiny-roberta"))
        else:
            model = str(build_tiny_model(work / "small-roberta", **SMALL_MODEL))
        dataset = str(synthetic_tweets(work / "tweets", args.synthetic_rows)) if args.synthetic_rows else args.dataset
        # Rounds interleave the variants, so a burst of other work on the machine hits them alike.
        for round_number in range(args.rounds):
            for name in names:
                if args.deadline_seconds and time.monotonic() - STARTED >= args.deadline_seconds:
                    runs[name].append({"variant": name, "error": "not run: the run's deadline had passed"})
                else:
                    runs[name].append(run_variant(name, args, model, dataset, work / f"round-{round_number}"))
                result = write_results(args, given, names, runs, probe)  # after every variant: nothing waits
    print_table(result)
    print(f"\nwrote {args.output} and {args.results_dir}/")


def print_table(result: dict[str, Any]) -> None:
    print(f"\n{'variant':<16} {'samples/s':>10} {'vs baseline':>12} {'tokens/s':>11} {'padding':>8} {'TFLOP/s':>9} "
          f"{'of peak':>8} {'compile s':>10}")  # fmt: skip
    for row in result["variants"]:
        if "error" in row:
            print(f"{row['variant']:<16} failed: {row['error']}")
            continue
        peak, ratio = row.get("fraction_of_dense_bf16_peak"), row.get("train_samples_per_second_vs_baseline")
        print(f"{row['variant']:<16} {row['train_samples_per_second']:>10.1f} "
              f"{'-' if ratio is None else f'{ratio:.2f}x':>12} {row['non_padding_tokens_per_second']:>11.0f} "
              f"{row['padding_fraction']:>8.3f} {row['model_tflops_per_second'] or 0:>9.4f} "
              f"{'-' if peak is None else f'{peak:.1%}':>8} {row['compile_warmup_seconds']:>10.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
