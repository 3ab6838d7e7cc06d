"""Fine-tune a sequence-classification model for tweet sentiment with the Hugging Face Trainer.

The defaults are the fast path (docs/training-performance.md): batches padded to their own longest text rounded up
to a few bucket lengths, texts of one bucket batched together (``--padding bucketed``, ``--group-by-length``); fused
AdamW; and with a GPU, torch.compile in "reduce-overhead" mode (CUDA graphs, one static graph per bucket length) with
the optimizer step compiled too, bf16 autocast, DataLoader worker processes with pinned memory, and no host-device
synchronisation between optimizer steps (tokens are counted and steps timed on the device; values are read when a
log line needs them; ``--sync-debug error`` makes a hidden one fail the run). Each feature has its own switch, so the
seed's baseline stays reproducible: ``--no-torch-compile --no-bf16 --no-fused-adamw --no-compile-optimizer
--padding max_length --no-group-by-length`` is plain eager fp32 AdamW on texts padded to max_seq_length.

    # one process (GPU if there is one, else CPU)
    python -m training_assets.instance.train_sentiment --model MODEL --dataset DATA --output-dir out --torch-compile
    # data-parallel on every GPU of a node (NCCL), or on CPU processes (gloo)
    torchrun --nproc_per_node=8 --module training_assets.instance.train_sentiment ... --torch-compile --bf16

``--model`` is a local model directory or a Hugging Face hub id; ``--dataset`` is a local folder (``train`` and
``validation`` files as JSONL/CSV with text,label columns, or a ``datasets.save_to_disk`` folder) or a hub dataset
id with ``--dataset-config``. Each epoch prints loss, accuracy and macro-F1. At the end rank 0 writes
``<output-dir>/metrics.json`` (per-epoch metrics and throughput with the warm-up steps measured apart) and
``<output-dir>/saved_model/`` (model and tokenizer, safetensors).

Bad input (any dataset problem, see ``dataset.py``; a missing model; bf16 on hardware without it) stops the run
before training: exit status 2 and one line naming the file, the row and what is wrong (``--verbose`` adds the
traceback); anything unexpected is one line and exit status 1. Little data trains, with warnings: rows left out of
full batches, few optimizer steps, a train split with one class. Throughput is reported when there are steps after
the warm-up, otherwise metrics.json says why not.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import sys
import time
import traceback
from collections import Counter
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from transformers import TrainerCallback, TrainingArguments

from training_assets.instance import batch_scaling, checkpoints, data_staging
from training_assets.instance.batching import (
    PADDING_MODES,
    BucketCollator,
    Counts,
    LengthBucketSampler,
    TokenCounter,
    bucket_lengths,
    total,
)
from training_assets.instance.dataset import (
    CHARS_PER_TOKEN_KEPT,
    Schema,
    Split,
    TrainingInputError,
    looks_local,
    read_splits,
)

DEFAULT_MODEL = "cardiffnlp/twitter-roberta-base-sentiment-latest"
DEFAULT_DATASET = "tweet_eval"
DEFAULT_DATASET_CONFIG = "sentiment"
LABELS = ("negative", "neutral", "positive")
METRICS_FILE = "metrics.json"
SAVED_MODEL_DIR = "saved_model"
# torch.compile's modes (torch.compile docstring); "reduce-overhead" and "max-autotune" capture CUDA graphs.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
# torch.cuda.set_sync_debug_mode's settings, "off" for its "default" (no check).
SYNC_DEBUG_MODES = ("off", "warn", "error")
# DataLoader workers per GPU process: collating a batch of token lists takes well under a millisecond each, so a
# few keep ahead of a step; more only take cores from the other ranks' host threads.
MAX_WORKERS_PER_GPU = 4


@dataclass
class TrainConfig:
    """Everything one training run needs; the CLI flags map one-to-one onto these fields."""

    model: str = DEFAULT_MODEL
    dataset: str = DEFAULT_DATASET
    dataset_config: str | None = DEFAULT_DATASET_CONFIG
    output_dir: str = "output"
    labels: tuple[str, ...] = LABELS
    text_column: str = "text"
    label_column: str = "label"
    epochs: int = 3
    per_device_batch_size: int = 32
    learning_rate: float = 2e-5
    max_seq_length: int = 128
    seed: int = 42
    # None: on with a GPU, off on CPU (see resolve()).
    torch_compile: bool | None = None
    bf16: bool | None = None
    fused_adamw: bool = True
    use_cpu: bool = False
    max_train_samples: int | None = None
    warmup_steps: int = 1
    padding: str = "bucketed"
    group_by_length: bool = True
    # None: "reduce-overhead" (CUDA graphs) with a GPU, "default" on CPU, where there are no CUDA graphs.
    torch_compile_mode: str | None = None
    # None: a few worker processes with a GPU, none on CPU (where they would compete with the model for cores).
    dataloader_workers: int | None = None
    # 0: log the train loss once per epoch; N: every N optimizer steps (each log line reads the loss from the device).
    logging_steps: int = 0
    # None: compile the optimizer step whenever torch_compile is on.
    compile_optimizer: bool | None = None
    # GPU only: torch.cuda.set_sync_debug_mode for the steady steps ("error": a hidden host-device sync fails the run).
    sync_debug: str = "off"
    # Multi-node runs: checkpoints and resume, the collective timeout (checkpoints.py); where the tokenized splits
    # are shared once per node (data_staging.py); the global batch and learning-rate scaling (batch_scaling.py).
    checkpoint_steps: int = 0
    checkpoint_dir: str | None = None
    collective_timeout_seconds: int = checkpoints.DEFAULT_COLLECTIVE_TIMEOUT_SECONDS
    tokenized_dir: str | None = None
    global_batch_size: int | None = None
    lr_scaling: str = "none"
    reference_global_batch: int = batch_scaling.REFERENCE_GLOBAL_BATCH

    def __post_init__(self) -> None:
        self.labels = tuple(self.labels)
        for name in ("epochs", "per_device_batch_size", "warmup_steps"):
            if getattr(self, name) < (0 if name == "warmup_steps" else 1):
                raise TrainingInputError(f"{name} must be at least {0 if name == 'warmup_steps' else 1}")
        if not 0 < self.learning_rate < 1:
            raise TrainingInputError(f"learning_rate must be between 0 and 1, got {self.learning_rate}")
        if not 8 <= self.max_seq_length <= 4096:
            raise TrainingInputError(f"max_seq_length must be between 8 and 4096, got {self.max_seq_length}")
        if len(self.labels) < 2 or len(set(self.labels)) != len(self.labels):
            raise TrainingInputError(f"labels must be at least two distinct names, got {list(self.labels)}")
        if self.max_train_samples is not None and self.max_train_samples < 1:
            raise TrainingInputError("max_train_samples must be at least 1")
        if self.padding not in PADDING_MODES:
            raise TrainingInputError(f"padding must be one of {', '.join(PADDING_MODES)}, got {self.padding!r}")
        if self.torch_compile_mode is not None and self.torch_compile_mode not in COMPILE_MODES:
            raise TrainingInputError(
                f"torch_compile_mode must be one of {', '.join(COMPILE_MODES)}, got {self.torch_compile_mode!r}"
            )
        if self.sync_debug not in SYNC_DEBUG_MODES:
            raise TrainingInputError(
                f"sync_debug must be one of {', '.join(SYNC_DEBUG_MODES)}, got {self.sync_debug!r}"
            )
        for name in ("dataloader_workers", "logging_steps"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise TrainingInputError(f"{name} must be 0 or more, got {value}")
        checkpoints.check(self)
        batch_scaling.check(self)


# --------------------------------------------------------------------------------------------------- input checks


def read_config_splits(config: TrainConfig) -> dict[str, Split]:
    schema = Schema(
        text_column=config.text_column,
        label_column=config.label_column,
        labels=config.labels,
        max_text_chars=config.max_seq_length * CHARS_PER_TOKEN_KEPT,
    )
    return read_splits(config.dataset, config.dataset_config, schema)


class TokenizedSplit(torch.utils.data.Dataset):
    """Tokenized rows (``input_ids``, ``label``): what the collator and the samplers read. The ids are lists, or the
    rows of the node's saved copy (data_staging.py). Not a ``datasets.Dataset``, so a training run from local files
    does not import ``datasets`` (the benchmark's GPU machine has no such package)."""

    def __init__(self, input_ids: Sequence[Sequence[int]], labels: list[int]) -> None:
        self.input_ids = input_ids
        self.labels = labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"input_ids": self.input_ids[index], "label": self.labels[index]}

    @property
    def lengths(self) -> list[int]:
        if isinstance(self.input_ids, data_staging.RaggedRows):  # from the row offsets, without reading the rows
            return self.input_ids.lengths()
        return [len(ids) for ids in self.input_ids]


def check_model(reference: str) -> str:
    """A local model directory must exist and hold config.json; hub ids pass through."""
    path = Path(os.path.expanduser(reference))
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise TrainingInputError(f"model directory {path} has no config.json (save it with save_pretrained)")
        return str(path)
    if path.exists() or looks_local(reference):
        raise TrainingInputError(f"model directory {reference} does not exist")
    return reference


def cpu_flags() -> set[str]:
    """This CPU's feature flags, from /proc/cpuinfo (x86 ``flags``, Arm ``Features``); none where it cannot be read."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    flags = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return flags


def _cpu_model() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    names = [line.partition(":")[2].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else platform.processor() or platform.machine()


def bf16_native(use_cuda: bool) -> bool:
    if use_cuda:
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    return bool({"avx512_bf16", "amx_bf16", "bf16"} & cpu_flags())


def check_bf16(use_cuda: bool) -> None:
    """bf16 needs native support: Ampere or newer GPUs, or CPUs with AVX512-BF16/AMX (x86) or BF16 (Arm)."""
    if use_cuda:
        if not torch.cuda.is_bf16_supported(including_emulation=False):
            major, minor = torch.cuda.get_device_capability()
            raise TrainingInputError(
                f"--bf16 needs a GPU with native bfloat16 (compute capability 8.0+, e.g. A100 on p4d); "
                f"{torch.cuda.get_device_name()} has {major}.{minor}. Run without --bf16."
            )
        return
    native = {"avx512_bf16", "amx_bf16", "bf16"} & cpu_flags()
    if not native:
        raise TrainingInputError(
            f"--bf16 needs native bfloat16 on this CPU ({platform.machine()} without avx512_bf16/amx_bf16/bf16 "
            "flags in /proc/cpuinfo) or a GPU with compute capability 8.0+. Run without --bf16."
        )


# ------------------------------------------------------------------------------------------------------- training


def graphs_compiled() -> int:
    """Graphs TorchDynamo has compiled in this process so far: a host-side counter, free to read."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


class ThroughputMeter(TrainerCallback):
    """Times optimizer steps as a ``TrainerCallback``; the first ``warmup_steps`` (compilation) are kept apart.

    A step lasts from the previous step's end (or its epoch's start, so evaluation is never counted) to its own end,
    and so includes data loading. Nothing here waits for the device while training runs: on CUDA each step end
    records a CUDA event in the stream (timed by the GPU, read once after training), on CPU it reads the host clock
    (the work is done when the step returns). Tokens come from the ``TokenCounter`` the trainer fills on the device.

    Steady steps are the steps after the warm-up that compiled nothing and whose batch shape had run
    ``shape_warmups`` times before (with CUDA graphs 2: a shape's first run compiles it, its second records the
    graph). With bucketed padding a bucket can turn up for the first time late in an epoch and compile there, so
    "the steps after the warm-up" alone would count compilation as training time.
    """

    def __init__(
        self, warmup_steps: int, samples_per_step: int, counter: TokenCounter, use_cuda: bool, shape_warmups: int = 0
    ) -> None:
        self.warmup_steps = warmup_steps
        self.samples_per_step = samples_per_step
        self.counter = counter
        self.use_cuda = use_cuda
        self.shape_warmups = shape_warmups
        self.steps: list[tuple[Any, Any]] = []  # (start mark, end mark) per optimizer step
        self.compiled: list[bool] = []  # per optimizer step: did TorchDynamo compile a graph during it
        self._start: Any = None
        self._graphs = 0

    def _mark(self) -> Any:
        if self.use_cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._start = self._mark()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._graphs = graphs_compiled()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        end = self._mark()
        self.steps.append((self._start, end))
        self._start = end
        self.compiled.append(graphs_compiled() > self._graphs)

    def steady_shape(self, step: int) -> bool:
        """Step ``step`` (0-based) is past the warm-up and its shape has run often enough to need no compilation."""
        return step >= self.warmup_steps and self.counter.earlier[step] >= self.shape_warmups

    def step_seconds(self) -> list[float]:
        if self.use_cuda:
            torch.cuda.synchronize()  # once, after training: every event has been reached
            return [start.elapsed_time(end) / 1000 for start, end in self.steps]
        return [end - start for start, end in self.steps]

    def summary(self, flops: ModelFlops | None = None) -> dict[str, Any]:
        """Read the clocks and counters once (summed over the ranks of a torchrun: every rank must call this)."""
        seconds, counts = self.step_seconds(), self.counter.read()
        warm, whole = total(counts[: self.warmup_steps]), total(counts)
        summary = throughput_summary(
            seconds,
            warmup_steps=self.warmup_steps,
            samples_per_step=self.samples_per_step,
            tokens=(warm.tokens, whole.tokens),
            positions=(warm.positions, whole.positions),
            squared_lengths=(warm.squared_lengths, whole.squared_lengths),
            flops=flops,
        )
        steady = [i for i in range(len(seconds)) if self.steady_shape(i) and not self.compiled[i]]
        return {**summary, **steady_summary(seconds, counts, steady, self.samples_per_step, flops)}


def steady_summary(
    seconds: list[float], counts: list[Counts], steady: list[int], samples_per_step: int, flops: ModelFlops | None
) -> dict[str, Any]:
    """The throughput of the steady steps (see ThroughputMeter): what training runs at once nothing compiles."""
    if not steady:
        return {"steady_steps": 0}
    time_ = sum(seconds[i] for i in steady)
    done = total([counts[i] for i in steady])
    result = {
        "steady_steps": len(steady),
        "steady_seconds": round(time_, 4),
        "steady_samples_per_second": round(len(steady) * samples_per_step / time_, 3),
        "steady_non_padding_tokens_per_second": round(done.tokens / time_, 3),
        "steady_padding_fraction": round(1 - done.tokens / done.positions, 4) if done.positions else None,
    }
    if flops is not None:
        useful = flops.training_flops(done.tokens, done.squared_lengths)
        result["steady_model_tflops_per_second"] = round(useful / time_ / 1e12, 6)
    return result


@dataclass(frozen=True)
class ModelFlops:
    """Training FLOPs of a transformer encoder, from its config (multiply and add counted as 2 FLOPs).

    A text of l tokens costs 6 * N * l + 12 * L * d * l**2 FLOPs to train on: N is the number of weights in the
    layers' matrix multiplications (L * (4 * d**2 + 2 * d * d_ff) for BERT/RoBERTa: query, key, value and output
    projections, and the two feed-forward matrices), 6 = 2 (multiply-add) x 3 (forward, and a backward twice as
    costly); the attention scores and their weighted sum are 2 matmuls of l x l x d per layer, 12 * L * d * l per
    token with the same factors. This is the model-FLOPs count of PaLM (Chowdhery et al. 2022, "PaLM: Scaling
    Language Modeling with Pathways", Appendix B: 6N + 12LHQT per token) and of torchtitan's
    get_num_flop_per_token (pytorch/torchtitan torchtitan/tools/utils.py). Counted on the non-padding tokens only,
    so the work spent on padding is not counted as useful. Left out: embeddings (lookups, no matmul), layer norms,
    softmax and the classifier head (once per text: 2 * (d**2 + d * labels) forward, under 0.1% of a tweet's FLOPs
    for RoBERTa-base), and activation recomputation (not model FLOPs).
    """

    layers: int
    hidden: int
    intermediate: int

    @classmethod
    def from_config(cls, config: Any) -> ModelFlops | None:
        names = ("num_hidden_layers", "hidden_size", "intermediate_size")
        if not all(isinstance(getattr(config, name, None), int) for name in names):
            return None  # not a BERT-like encoder config: the formula does not apply
        return cls(config.num_hidden_layers, config.hidden_size, config.intermediate_size)

    @property
    def matmul_weights(self) -> int:
        return self.layers * (4 * self.hidden**2 + 2 * self.hidden * self.intermediate)

    def training_flops(self, tokens: int, squared_lengths: int) -> int:
        """FLOPs to train on texts with ``tokens`` non-padding tokens in all and ``squared_lengths`` = sum of l**2."""
        return 6 * self.matmul_weights * tokens + 12 * self.layers * self.hidden * squared_lengths

    def per_token(self, attention_context: float) -> float:
        """FLOPs per non-padding token when tokens attend, on average, to ``attention_context`` tokens."""
        return 6 * self.matmul_weights + 12 * self.layers * self.hidden * attention_context


def throughput_summary(
    step_seconds: list[float],
    *,
    warmup_steps: int,
    samples_per_step: int,
    tokens: tuple[int, int],
    positions: tuple[int, int],
    squared_lengths: tuple[int, int] = (0, 0),
    flops: ModelFlops | None = None,
) -> dict[str, Any]:
    """The throughput of the steps after the warm-up; when there are none, why it was not measured.

    ``tokens``, ``positions`` and ``squared_lengths`` are (at the end of the warm-up, at the end) counts of
    non-padding tokens, of positions computed (padding included) and the sum over texts of their squared length in
    tokens. A measurement never stops a run: a short run trains, saves its model and reports ``"measured": false``.
    """
    warm, steady = step_seconds[:warmup_steps], step_seconds[warmup_steps:]
    padding = {
        # Padded positions / positions computed, over every training step (warm-up included).
        "padding_fraction": round(1 - tokens[1] / positions[1], 4) if positions[1] else None,
        "non_padding_tokens": tokens[1],
        "positions_computed": positions[1],
    }
    model: dict[str, Any] = {}
    if flops is not None and tokens[1]:
        # Each token attends to the other tokens of its own text: sum(l * l) / sum(l) on average.
        context = squared_lengths[1] / tokens[1]
        model = {
            "model_flops_per_token": round(flops.per_token(context)),
            "model_flops_formula": "6 * N + 12 * L * d * l per non-padding token (ModelFlops)",
            "model_matmul_weights": flops.matmul_weights,
            "mean_attention_context": round(context, 3),
        }
    if not steady:
        return {
            "measured": False,
            "reason": f"the run had {len(step_seconds)} optimizer step(s), all within the "
            f"{warmup_steps} warm-up step(s) kept apart for compilation; more data or epochs, or "
            "--warmup-steps 0, leave steps to measure",
            "optimizer_steps": len(step_seconds),
            "warmup_steps": len(warm),
            "warmup_seconds": round(sum(warm), 4),
            "samples_per_step": samples_per_step,
            **padding,
            **model,
        }
    seconds = sum(steady)
    median = statistics.median(steady)
    if model and flops is not None:
        useful = flops.training_flops(tokens[1] - tokens[0], squared_lengths[1] - squared_lengths[0])
        model["model_tflops_per_second"] = round(useful / seconds / 1e12, 6)
    return {
        "measured": True,
        "train_samples_per_second": round(len(steady) * samples_per_step / seconds, 3),
        "non_padding_tokens_per_second": round((tokens[1] - tokens[0]) / seconds, 3),
        "positions_per_second": round((positions[1] - positions[0]) / seconds, 3),
        "measured_steps": len(steady),
        "measured_seconds": round(seconds, 4),
        "median_step_seconds": round(median, 6),
        "warmup_steps": len(warm),
        "warmup_seconds": round(sum(warm), 4),
        # What the warm-up steps cost beyond ordinary steps: compilation (and, on CUDA, context set-up).
        "compile_warmup_seconds": round(max(0.0, sum(warm) - len(warm) * median), 4),
        "samples_per_step": samples_per_step,
        **padding,
        **model,
        "tokens": "non-padding input tokens and positions computed, summed over all ranks",
    }


class EpochReporter(TrainerCallback):
    """Prints one line per epoch on rank 0 and keeps the rows for metrics.json."""

    def __init__(self) -> None:
        self.epochs: list[dict[str, float]] = []

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        metrics: dict[str, float] = kwargs["metrics"]  # the Trainer passes them as a keyword argument
        train_losses = [row["loss"] for row in state.log_history if "loss" in row]
        row = {
            "epoch": round(state.epoch or 0.0, 3),
            "train_loss": round(train_losses[-1], 6) if train_losses else float("nan"),
            "eval_loss": round(metrics["eval_loss"], 6),
            "eval_accuracy": round(metrics["eval_accuracy"], 6),
            "eval_macro_f1": round(metrics["eval_macro_f1"], 6),
        }
        self.epochs.append(row)
        if state.is_world_process_zero:
            print(
                "epoch {epoch}: train_loss={train_loss} eval_loss={eval_loss} accuracy={eval_accuracy} "
                "macro_f1={eval_macro_f1}".format(**row),
                flush=True,
            )


class CompiledOptimizerStep:
    """``optimizer.step`` through torch.compile (TorchInductor fuses the update of every parameter into a few
    kernels), following PyTorch's recipe "(beta) Compiling the optimizer with torch.compile" and its section on LR
    schedulers: the learning rate must be a tensor, or every new value the scheduler sets would be a new constant
    and recompile the step (after 8, torch.compile would give up and run it eagerly). The Trainer's scheduler and
    log lines keep plain floats in ``param_groups`` (a tensor there would be read back with ``.item()`` every step
    by ``Trainer._get_learning_rate``); each call copies them into CPU scalar tensors, as the recipe does, which
    costs no device work, and puts the floats back after the step.

    The optimizer must be the plain (foreach / single-tensor) AdamW: torch marks its fused kernel
    ``torch.compiler.disable`` ("don't trace into fused optimizer"), so compiling a fused step would compile nothing.
    The step is compiled without CUDA graphs (mode "default"): the Trainer frees the gradients after each step
    (``zero_grad(set_to_none=True)``), so new gradient tensors come every step and a CUDA graph would copy each of
    them into its static inputs first.
    """

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self.learning_rates = [torch.tensor(float(group["lr"])) for group in optimizer.param_groups]
        # The class's own step, bound to this optimizer (not an instance attribute wrapped by an LR scheduler).
        self.compiled = torch.compile(type(optimizer).step.__get__(optimizer), fullgraph=False)

    def __call__(self, closure: Any = None) -> None:
        if closure is not None:
            raise ValueError("the compiled optimizer step takes no closure")
        groups = self.optimizer.param_groups
        values = [group["lr"] for group in groups]
        for group, tensor, value in zip(groups, self.learning_rates, values, strict=True):
            tensor.fill_(value)
            group["lr"] = tensor
        try:
            self.compiled()
        finally:
            for group, value in zip(groups, values, strict=True):
                group["lr"] = value


class SyncCheck(TrainerCallback):
    """On a GPU, ``torch.cuda.set_sync_debug_mode(mode)`` ("error": a synchronising CUDA call raises) while steady
    steps run: from a steady step's forward pass to the next step's, through backward, clipping, the optimizer and
    scheduler steps, and the next batch's load and copy to the device. Off for steps that compile or record a CUDA
    graph (``ThroughputMeter.steady_shape``: compiling legitimately waits for the device), and whenever the Trainer is
    about to log, evaluate or save (what a user asked for may read the device). torch's own caveat: not every
    synchronising call is covered (torch.distributed is not)."""

    def __init__(self, mode: str, meter: ThroughputMeter) -> None:
        self.mode = mode
        self.meter = meter
        self.steps_checked = 0
        self._on = False

    def step_starts(self, step: int) -> None:
        steady = self.meter.steady_shape(step)
        self.steps_checked += steady
        self.switch(steady)

    def switch(self, on: bool) -> None:
        if on != self._on:
            torch.cuda.set_sync_debug_mode(self.mode if on else "default")
            self._on = on

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if control.should_log or control.should_evaluate or control.should_save or control.should_training_stop:
            self.switch(False)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.switch(False)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.switch(False)


@functools.cache
def sentiment_trainer() -> type:
    """``SentimentTrainer``, defined on first use: importing ``transformers.Trainer`` loads the model code and
    ``datasets`` (about 2 CPU-seconds per process), which ``--check-only`` and an input error's exit never use."""
    from transformers import Trainer

    class SentimentTrainer(Trainer):
        """Counts non-padding tokens on the device; batches texts of one bucket together
        (``LengthBucketSampler``); compiles the optimizer step when asked (``CompiledOptimizerStep``); drops the last
        partial batch in training only (evaluation sees every row); with CUDA graphs, copies evaluation outputs out of
        the graph's memory before the next batch reuses it; with a ``SyncCheck``, arms it for each steady step."""

        def __init__(
            self,
            *args: Any,
            token_counter: TokenCounter,
            clone_eval_outputs: bool,
            buckets: tuple[int, ...] | None = None,
            compile_optimizer: bool = False,
            sync_check: SyncCheck | None = None,
            **kwargs: Any,
        ) -> None:
            super().__init__(*args, **kwargs)
            self.token_counter = token_counter
            self.clone_eval_outputs = clone_eval_outputs
            self.buckets = buckets
            self.compile_optimizer = compile_optimizer
            self.sync_check = sync_check

        def training_step(self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None) -> torch.Tensor:
            # The Trainer's own count (include_num_input_tokens_seen) reads it back with .item() every step.
            self.token_counter.add(inputs["attention_mask"])
            if self.sync_check is not None:
                self.sync_check.step_starts(len(self.token_counter.shapes) - 1)
            return super().training_step(model, inputs, num_items_in_batch)

        def _get_train_sampler(self, train_dataset: Any = None) -> Any:
            dataset = self.train_dataset if train_dataset is None else train_dataset
            if self.buckets is None or not isinstance(dataset, TokenizedSplit):
                return super()._get_train_sampler(train_dataset)
            batch = self.args.train_batch_size * self.args.gradient_accumulation_steps
            return LengthBucketSampler(dataset.lengths, self.buckets, batch)

        def create_optimizer(self, model: Any = None) -> torch.optim.Optimizer:
            optimizer = super().create_optimizer(model)
            if self.compile_optimizer and not isinstance(optimizer.step, CompiledOptimizerStep):
                optimizer.step = CompiledOptimizerStep(optimizer)
            return optimizer

        def prediction_step(self, *args: Any, **kwargs: Any) -> Any:
            outputs = super().prediction_step(*args, **kwargs)
            if not self.clone_eval_outputs:
                return outputs
            # CUDA graph trees reuse a graph's output memory on its next replay, and the evaluation loop keeps the first
            # batch's logits while the next batch runs; "clone the tensor outside of torch.compile()" is the fix the
            # error message and https://docs.pytorch.org/docs/stable/torch.compiler_cudagraph_trees.html give.
            return torch.utils._pytree.tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, outputs)

        def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
            drop_last, self.args.dataloader_drop_last = self.args.dataloader_drop_last, False
            try:
                return super().get_eval_dataloader(eval_dataset)
            finally:
                self.args.dataloader_drop_last = drop_last

    return SentimentTrainer


def compute_metrics(prediction: Any) -> dict[str, float]:
    logits = prediction.predictions[0] if isinstance(prediction.predictions, tuple) else prediction.predictions
    predicted = np.asarray(logits).argmax(axis=-1)
    labels = np.asarray(prediction.label_ids)
    return {"accuracy": float(np.mean(predicted == labels)) if labels.size else 0.0,
            "macro_f1": macro_f1(labels, predicted)}  # fmt: skip


def macro_f1(labels: np.ndarray, predicted: np.ndarray) -> float:
    """F1 averaged over every class that occurs in the labels or the predictions, each 2TP / (2TP + FP + FN): what
    scikit-learn's ``f1_score(average="macro", zero_division=0)`` computes, without importing scikit-learn (1.3 s of
    CPU in every training process, for two numbers)."""
    classes = np.union1d(labels, predicted)
    if not classes.size:
        return 0.0
    scores = []
    for label in classes:
        true_positive = np.sum((predicted == label) & (labels == label))
        wrong = np.sum((predicted == label) != (labels == label))  # false positives + false negatives
        scores.append(2 * true_positive / (2 * true_positive + wrong))
    return float(np.mean(scores))


def _device_info(use_cuda: bool, world_size: int) -> dict[str, Any]:
    info: dict[str, Any] = {"type": "cuda" if use_cuda else "cpu", "world_size": world_size, "torch": torch.__version__}
    if use_cuda:
        capability = ".".join(map(str, torch.cuda.get_device_capability()))
        info.update(name=torch.cuda.get_device_name(), capability=capability)
    else:
        info.update(name=_cpu_model(), threads=torch.get_num_threads())
    return info


# Fewer optimizer steps than this in a whole run is worth a warning: the model barely moves from its start.
FEW_OPTIMIZER_STEPS = 10


def label_warnings(split: Split, labels: tuple[str, ...]) -> list[str]:
    """A train split with one class teaches the model that class only; missing classes are never learned."""
    present = sorted(set(split.labels))
    names = ", ".join(f"{i} ({labels[i]})" for i in present)
    if len(present) == 1:
        return [f"{split.name}: every row has label {names}: the model can only learn to predict that class"]
    if missing := [f"{i} ({name})" for i, name in enumerate(labels) if i not in present]:
        return [f"{split.name}: no row has label {', '.join(missing)}: the model will not learn to predict it"]
    return []


@dataclass(frozen=True)
class BatchPlan:
    drop_last: bool
    steps_per_epoch: int
    samples_per_step: int
    warnings: list[str]


def batch_plan(rows: int, global_batch: int, world_size: int, config: TrainConfig) -> BatchPlan:
    """How the train split falls into optimizer steps, and what a user with little data should know about it.

    Training keeps full batches only (static shapes for torch.compile), so ``rows % global_batch`` rows sit out
    each epoch; a split smaller than one global batch trains as one partial batch per epoch instead of not at all.
    """
    devices = global_batch // config.per_device_batch_size
    per_device = f"{config.per_device_batch_size} per device x {devices} device(s)"
    warnings = []
    if rows < global_batch:
        drop_last, steps, samples = False, 1, -(-rows // world_size) * world_size  # the sampler pads to the ranks
        warnings.append(
            f"the train split has {rows} row(s), fewer than one global batch of {global_batch} ({per_device}): "
            "each epoch is one partial batch "
            "(a smaller --per-device-batch-size gives more optimizer steps)"
        )
    else:
        drop_last, steps, samples = True, rows // global_batch, global_batch
        if dropped := rows % global_batch:
            warnings.append(
                f"the train split has {rows} rows and training uses full batches of {global_batch} only "
                f"({per_device}): each epoch leaves out {dropped} row(s) ({100 * dropped / rows:.0f}%); "
                "a --per-device-batch-size that divides the rows keeps them all"
            )
    total = steps * config.epochs
    if total < FEW_OPTIMIZER_STEPS:
        warnings.append(
            f"the run has {total} optimizer step(s) in all ({config.epochs} epoch(s) x {steps} per epoch): too few "
            "to learn much; add data or epochs, or lower --per-device-batch-size"
        )
    return BatchPlan(drop_last, steps, samples, warnings)


def resolve(config: TrainConfig, use_cuda: bool) -> TrainConfig:
    """The config with every automatic setting decided for this machine (what metrics.json records).

    With a GPU the fast path is on; on CPU, torch.compile and bf16 stay off unless asked for: the project's CPU
    benchmark measured compile slower than eager there, and not every CPU has native bf16.
    """
    compile_on = use_cuda if config.torch_compile is None else config.torch_compile
    if config.torch_compile_mode is not None:
        mode = config.torch_compile_mode
    else:
        mode = "reduce-overhead" if use_cuda else "default"
    workers = config.dataloader_workers
    if workers is None:
        cpus_per_gpu = (os.cpu_count() or 1) // max(1, torch.cuda.device_count() if use_cuda else 1)
        workers = max(1, min(MAX_WORKERS_PER_GPU, cpus_per_gpu - 1)) if use_cuda else 0
    return replace(
        config,
        torch_compile=compile_on,
        bf16=(use_cuda and bf16_native(use_cuda)) if config.bf16 is None else config.bf16,
        torch_compile_mode=mode if compile_on else None,
        dataloader_workers=workers,
        compile_optimizer=compile_on if config.compile_optimizer is None else config.compile_optimizer,
    )


def optimizer_name(config: TrainConfig) -> str:
    """The Trainer's ``optim`` for a resolved config: a compiled step needs the plain AdamW (see
    CompiledOptimizerStep); transformers 5 defaults to the fused one, so the baseline names the plain one too."""
    return "adamw_torch_fused" if config.fused_adamw and not config.compile_optimizer else "adamw_torch"


def optimizer_step(config: TrainConfig) -> str:
    """How the resolved config's optimizer step runs, for metrics.json."""
    if config.compile_optimizer:
        return "compiled (torch.compile of AdamW.step, TorchInductor kernels)"
    return "fused AdamW kernel" if config.fused_adamw else "AdamW (foreach or per-tensor, eager)"


def training_arguments(config: TrainConfig, use_cuda: bool, distributed: bool) -> TrainingArguments:
    """The Trainer's arguments for a resolved config (``resolve``)."""
    return TrainingArguments(**trainer_settings(config, use_cuda, distributed))


def trainer_settings(config: TrainConfig, use_cuda: bool, distributed: bool) -> dict[str, Any]:
    """``TrainingArguments`` keywords for a resolved config (apart, so a test can read the GPU settings on a machine
    without a GPU, where ``TrainingArguments`` refuses bf16)."""
    assert config.dataloader_workers is not None  # resolved
    return dict(
        num_train_epochs=config.epochs,
        per_device_train_batch_size=config.per_device_batch_size,
        per_device_eval_batch_size=config.per_device_batch_size,
        learning_rate=config.learning_rate,
        seed=config.seed,
        torch_compile=bool(config.torch_compile),
        torch_compile_backend="inductor" if config.torch_compile else None,
        torch_compile_mode=config.torch_compile_mode,
        bf16=bool(config.bf16),
        optim=optimizer_name(config),
        use_cpu=not use_cuda,
        ddp_backend=("nccl" if use_cuda else "gloo") if distributed else None,
        ddp_find_unused_parameters=False,  # every parameter takes part in the classifier's forward pass
        eval_strategy="epoch",
        logging_strategy="steps" if config.logging_steps else "epoch",
        logging_steps=config.logging_steps or 500,
        report_to="none",
        # Full training batches only: the batch dimension stays static for torch.compile and CUDA graphs
        # (off when the split is smaller than one batch: see batch_plan).
        dataloader_drop_last=True,
        # Texts of one bucket share a batch (SentimentTrainer's LengthBucketSampler), so a batch pads little.
        train_sampling_strategy="group_by_length" if config.group_by_length else "random",
        # Both default to reading a device value every step: the token count (.item()) and the NaN check of the loss
        # (a Python `if` on a tensor; transformers#33693). Tokens are counted on the device instead (TokenCounter).
        include_num_input_tokens_seen="no",
        logging_nan_inf_filter=False,
        # Batches are collated in worker processes into pinned memory (only with CUDA: pinning is for copies to a
        # GPU) and copied to the GPU without blocking the host.
        dataloader_num_workers=config.dataloader_workers,
        dataloader_persistent_workers=config.dataloader_workers > 0,
        dataloader_pin_memory=use_cuda,
        accelerator_config={"non_blocking": use_cuda},
        disable_tqdm=True,
        **checkpoints.trainer_arguments(config),  # output_dir, save_*, ddp_timeout
    )


def check_inputs(config: TrainConfig, use_cuda: bool) -> tuple[str, dict[str, Split]]:
    """The model reference and the checked splits; TrainingInputError (one line) for anything that cannot train."""
    model_reference = check_model(config.model)
    if config.bf16:  # asked for explicitly (None, automatic, is on only where it is native)
        check_bf16(use_cuda)
    if config.sync_debug != "off" and not use_cuda:
        raise TrainingInputError(
            f"--sync-debug {config.sync_debug} needs a GPU (torch.cuda.set_sync_debug_mode); run without it on CPU"
        )
    raw = read_config_splits(config)
    if config.max_train_samples is not None:
        train_split = raw["train"]
        raw["train"] = Split(train_split.name, train_split.texts[: config.max_train_samples],
                             train_split.labels[: config.max_train_samples], train_split.warnings)  # fmt: skip
    return model_reference, raw


def train(config: TrainConfig | dict[str, Any], callbacks: Sequence[TrainerCallback] = ()) -> dict[str, Any]:
    """Fine-tune per ``config``; return the metrics (rank 0 also writes metrics.json and saved_model/).

    ``callbacks`` join the run's own (``TrainerCallback`` instances: a caller's hooks into the train loop)."""
    if isinstance(config, dict):
        config = TrainConfig(**config)
    use_cuda = torch.cuda.is_available() and not config.use_cpu
    # Everything that can be wrong with the input is checked before any process group or model is created.
    model_reference, raw = check_inputs(config, use_cuda)
    config = resolve(config, use_cuda)
    # The per-device batch and learning rate that keep the same settings learning the same on any device count.
    schedule = batch_scaling.schedule(config, batch_scaling.devices(use_cuda, torch.cuda.device_count()))
    config = batch_scaling.apply(config, schedule)
    notes = [warning for split in raw.values() for warning in split.warnings]
    notes += label_warnings(raw["train"], config.labels)

    output_dir = Path(config.output_dir)
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1  # set by torchrun
    args = training_arguments(config, use_cuda, distributed)
    resume = checkpoints.resume_point(config, args.local_process_index == 0)
    world_size = args.world_size
    # train_batch_size counts every GPU of one process (nn.DataParallel when not launched by torchrun).
    global_batch = args.train_batch_size * world_size
    plan = batch_plan(len(raw["train"]), global_batch, world_size, config)
    args.dataloader_drop_last = plan.drop_last
    notes += plan.warnings
    if int(os.environ.get("RANK", "0")) == 0:
        for note in notes:
            print(f"train_sentiment: warning: {note}", file=sys.stderr, flush=True)
    # The model code, only now: --check-only and an input error stop before it (see sentiment_trainer).
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    transformers.set_seed(config.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_reference)
    model = AutoModelForSequenceClassification.from_pretrained(
        model_reference,
        num_labels=len(config.labels),
        id2label=dict(enumerate(config.labels)),
        label2id={label: i for i, label in enumerate(config.labels)},
        ignore_mismatched_sizes=True,  # a base model with another head gets a fresh one of the right size
        # Set now, not by the first forward pass (RobertaForSequenceClassification writes it into its config then):
        # a config changed after the first compiled call fails torch.compile's guard and recompiles the model.
        problem_type="single_label_classification",
    )
    max_length = min(config.max_seq_length, _position_limit(model.config, tokenizer))
    buckets = bucket_lengths(max_length)

    def tokenize(texts: list[str]) -> list[list[int]]:
        # No padding here: the collator pads each batch (to its bucket, or to max_length with --padding max_length).
        return tokenizer(texts, truncation=True, max_length=max_length, return_attention_mask=False)["input_ids"]

    # Once per node: the first process tokenizes and saves, every process of the node maps the saved tokens.
    key = data_staging.fingerprint(raw, tokenizer, max_length)
    tokens = data_staging.tokenize_once_per_node(raw, tokenize, folder=data_staging.tokenized_dir(config), key=key)
    encoded = {name: TokenizedSplit(split.input_ids, split.labels) for name, split in tokens.items()}

    cuda_graphs = use_cuda and bool(config.torch_compile) and config.torch_compile_mode in CUDA_GRAPH_MODES
    counter = TokenCounter()
    # A shape's first run compiles it; with CUDA graphs its second records the graph (see ThroughputMeter).
    shape_warmups = 2 if cuda_graphs else 1 if config.torch_compile else 0
    meter = ThroughputMeter(config.warmup_steps, plan.samples_per_step, counter, use_cuda, shape_warmups)
    reporter = EpochReporter()
    sync_check = SyncCheck(config.sync_debug, meter) if config.sync_debug != "off" else None
    trainer = sentiment_trainer()(
        model=model,
        args=args,
        data_collator=BucketCollator(tokenizer.pad_token_id, buckets, config.padding),
        train_dataset=encoded["train"],
        eval_dataset=encoded["validation"],
        processing_class=tokenizer,
        compute_metrics=compute_metrics,
        callbacks=[meter, reporter, *([sync_check] if sync_check else []), *checkpoints.callbacks(config), *callbacks],
        token_counter=counter,
        clone_eval_outputs=cuda_graphs,
        buckets=buckets if config.group_by_length else None,
        compile_optimizer=bool(config.compile_optimizer),
        sync_check=sync_check,
    )
    graphs_before = graphs_compiled()
    try:
        with _compile_settings(config, buckets):
            result = trainer.train(resume_from_checkpoint=resume)
    finally:
        if sync_check is not None:
            sync_check.switch(False)

    metrics = {
        "config": {**asdict(config), "labels": list(config.labels)},
        "device": _device_info(use_cuda, world_size),
        "train_samples": len(raw["train"]),
        "validation_samples": len(raw["validation"]),
        "max_seq_length": max_length,
        "padding": {
            "mode": config.padding,
            "bucket_lengths": list(buckets),
            "group_by_length": config.group_by_length,
            # Optimizer steps per padded length: which buckets the run used, and how often.
            "steps_per_length": dict(sorted(Counter(shape[-1] for shape in counter.shapes).items())),
        },
        "optimizer_step": optimizer_step(config),
        "cuda_graphs": cuda_graphs,
        "compilation": {
            # TorchDynamo graphs compiled during the run (training and evaluation), and the (1-based) optimizer
            # steps during which one was: with static shapes, the first step of each new batch shape.
            "graphs": graphs_compiled() - graphs_before,
            "steps_that_compiled": [step + 1 for step, compiled in enumerate(meter.compiled) if compiled],
            "first_steps_of_each_shape": [step + 1 for step, earlier in enumerate(counter.earlier) if not earlier],
        },
        "optimizer_steps": len(meter.steps),
        "warnings": notes,
        "epochs": reporter.epochs,
        # The train loss of every logging window (--logging-steps N: every N optimizer steps).
        "train_loss_log": [
            {"step": row["step"], "loss": row["loss"]} for row in trainer.state.log_history if "loss" in row
        ],
        "throughput": meter.summary(ModelFlops.from_config(model.config)),
        "train_runtime_seconds": round(result.metrics["train_runtime"], 3),
        "saved_model": str(output_dir / SAVED_MODEL_DIR),
        **batch_scaling.report(schedule, trainer.state.log_history),
        **checkpoints.report(config, resume),
    }
    if sync_check is not None:
        metrics["sync_debug"] = {"mode": config.sync_debug, "steps_checked": sync_check.steps_checked}
    if trainer.is_world_process_zero():
        saved = output_dir / SAVED_MODEL_DIR
        trainer.save_model(str(saved))
        (saved / "training_args.bin").unlink(missing_ok=True)  # a pickle the served model does not need
        (output_dir / METRICS_FILE).write_text(json.dumps(metrics, indent=2) + "\n")
    trainer.accelerator.wait_for_everyone()
    checkpoints.finish(config, args.local_process_index == 0)
    return metrics


def _compile_settings(config: TrainConfig, buckets: tuple[int, ...]) -> Any:
    """TorchDynamo settings for the run, restored afterwards.

    Static shapes, one graph per bucket length: by default TorchDynamo recompiles a function whose input shape
    changed as one graph for all sizes ("automatic dynamic shapes"), with kernels that cannot specialise on the
    length, and CUDA graphs still record one graph per size. One graph per bucket length (training and evaluation,
    plus the last partial evaluation batch) is more than TorchDynamo's default of 8 recompilations, after which it
    would run the model eagerly.
    """
    if not (config.torch_compile or config.compile_optimizer):
        return nullcontext()
    limit = max(torch._dynamo.config.recompile_limit, 2 * len(buckets) + 4)
    return torch._dynamo.config.patch(recompile_limit=limit, automatic_dynamic_shapes=False)


def _position_limit(model_config: Any, tokenizer: Any) -> int:
    limits = [tokenizer.model_max_length]
    positions = getattr(model_config, "max_position_embeddings", None)
    if positions:  # RoBERTa reserves two positions (padding_idx + 1 offset)
        limits.append(positions - 2 if model_config.model_type in ("roberta", "xlm-roberta") else positions)
    return min(limits)


# ------------------------------------------------------------------------------------------------------------ CLI


def _parser() -> argparse.ArgumentParser:
    defaults = TrainConfig()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=defaults.model, help="local model directory or hub id")
    parser.add_argument(
        "--dataset",
        default=defaults.dataset,
        help="local folder (train/validation JSONL or CSV, or a save_to_disk folder) or hub id",
    )
    parser.add_argument("--dataset-config", default=defaults.dataset_config, help="hub dataset configuration")
    parser.add_argument("--output-dir", default=defaults.output_dir, help="metrics.json and saved_model/ go here")
    parser.add_argument("--labels", default=",".join(defaults.labels), help="comma-separated label names, id order")
    parser.add_argument("--text-column", default=defaults.text_column)
    parser.add_argument("--label-column", default=defaults.label_column)
    parser.add_argument("--epochs", type=int, default=defaults.epochs)
    parser.add_argument("--per-device-batch-size", type=int, default=defaults.per_device_batch_size)
    parser.add_argument("--learning-rate", type=float, default=defaults.learning_rate)
    parser.add_argument("--max-seq-length", type=int, default=defaults.max_seq_length)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--max-train-samples", type=int, default=None, help="train on the first N rows only")
    parser.add_argument(
        "--warmup-steps",
        type=int,
        default=defaults.warmup_steps,
        help="optimizer steps excluded from the throughput (they hold the compilation)",
    )
    parser.add_argument(
        "--padding",
        choices=PADDING_MODES,
        default=defaults.padding,
        help="bucketed: each batch to its longest text, rounded up to a few bucket lengths; max_length: every batch "
        "to --max-seq-length (the seed's way)",
    )
    parser.add_argument(
        "--torch-compile-mode",
        choices=COMPILE_MODES,
        default=None,
        help="torch.compile mode (default: reduce-overhead, i.e. CUDA graphs, with a GPU; default on CPU)",
    )
    parser.add_argument(
        "--dataloader-workers",
        type=int,
        default=None,
        help=f"DataLoader worker processes per GPU process (default: up to {MAX_WORKERS_PER_GPU} with a GPU, 0 on CPU)",
    )
    parser.add_argument(
        "--sync-debug",
        choices=SYNC_DEBUG_MODES,
        default=defaults.sync_debug,
        help="GPU only: torch.cuda.set_sync_debug_mode during steady steps (error: a hidden host-device sync fails "
        "the run; the benchmark's GPU run uses it)",
    )
    parser.add_argument(
        "--logging-steps",
        type=int,
        default=defaults.logging_steps,
        help="log the train loss every N optimizer steps (default 0: once per epoch)",
    )
    for flag, default, text in (
        ("torch-compile", None, "torch.compile with TorchInductor (default: on with a GPU, off on CPU)"),
        ("bf16", None, "bfloat16 mixed precision (default: on with a GPU that has it natively, off on CPU)"),
        ("fused-adamw", True, "fused AdamW optimizer (default: on; a compiled step replaces it)"),
        ("compile-optimizer", None, "compile the optimizer step with torch.compile (default: with --torch-compile)"),
        ("group-by-length", True, "batch texts of similar length together (default: on)"),
        ("use-cpu", False, "train on CPU even if a GPU is present"),
    ):
        parser.add_argument(f"--{flag}", action=argparse.BooleanOptionalAction, default=default, help=text)
    for module in (checkpoints, data_staging, batch_scaling):
        module.add_arguments(parser)
    parser.add_argument("--verbose", action="store_true", help="on an error, also print its traceback")
    parser.add_argument(
        "--check-only",
        action="store_true",
        help="check the model folder, --bf16 and the dataset, then exit (0: it can train, 2: it cannot); "
        "launch_training.sh runs this once before torchrun starts a process per GPU",
    )
    return parser


def _config(namespace: argparse.Namespace) -> TrainConfig:
    values = vars(namespace)
    values["labels"] = tuple(label.strip() for label in values["labels"].split(",") if label.strip())
    known = {f.name for f in fields(TrainConfig)}
    return TrainConfig(**{key: value for key, value in values.items() if key in known})


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    return _config(_parser().parse_args(argv))


def _error(message: str, *, verbose: bool) -> None:
    """One line on stderr (the first line of ``message``); the traceback only with --verbose."""
    lines = message.strip().splitlines() or [""]
    print(f"train_sentiment: error: {lines[0]}", file=sys.stderr, flush=True)
    if verbose:
        traceback.print_exc()


def end_distributed() -> None:
    """Destroy the torchrun process group the Trainer set up, if any: a gloo/NCCL group left to the interpreter's
    exit can abort the process after training ("terminate called without an active exception", exit -6), which
    torchrun reports as a failed run."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    """Exit 0 after training, 2 for input that cannot train (nothing trained), 1 for anything unexpected."""
    namespace = _parser().parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    try:
        config = _config(namespace)
        if namespace.check_only:
            _, splits = check_inputs(config, torch.cuda.is_available() and not config.use_cpu)
            sizes = ", ".join(f"{len(split)} {name} rows" for name, split in splits.items())
            print(f"train_sentiment: input checked: {config.model}, {config.dataset} ({sizes})", file=sys.stderr)
            return 0
        metrics = train(config)
        end_distributed()
    except TrainingInputError as error:
        # Every rank of a torchrun finds the same problem; each says it, as torchrun stops the others at the first
        # exit (launch_training.sh checks once with --check-only first, so only direct torchrun use sees repeats).
        _error(str(error), verbose=namespace.verbose)
        return 2
    except Exception as error:  # no traceback for the user unless asked: what failed, in one line
        detail = str(error).strip().splitlines()
        hint = "" if namespace.verbose else " (--verbose prints the traceback)"
        _error(f"{type(error).__name__}: {detail[0] if detail else 'no message'}{hint}", verbose=namespace.verbose)
        return 1
    if rank == 0:
        throughput = metrics["throughput"]
        if not throughput["measured"]:
            print(f"train_sentiment: throughput not measured: {throughput['reason']}", file=sys.stderr)
        print(json.dumps({"throughput": throughput, "last_epoch": metrics["epochs"][-1]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
