"""The configuration of a training run: ``TrainConfig`` (every setting, checked), the command line that maps onto it,
what the automatic settings resolve to on this machine (``resolve``), the Trainer's arguments, and how the train
split falls into optimizer steps (``batch_plan``)."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, fields, replace
from typing import Any

import torch
from transformers import TrainingArguments

from training_assets.instance import batch_scaling, checkpoints, data_staging
from training_assets.instance.batching import PADDING_MODES
from training_assets.instance.dataset import TrainingInputError
from training_assets.instance.hardware import bf16_native

DESCRIPTION = "Fine-tune a sequence-classification model for tweet sentiment with the Hugging Face Trainer."

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
# The collective timeout of a step that compiles (checkpoints.CollectiveTimeout), by torch.compile mode: one shape's
# first compile on the slowest rank, since every rank compiles the same shape at the same step and the timeout
# bounds each collective, not the run (docs/training.md derives them: 46 s, the slowest cold first step measured on
# an H200 for RoBERTa-base, x 8 ranks sharing the host's compile threads = 368 s, with margin 600 s). Autotuning
# benchmarks candidate kernels per shape and has not been measured: its modes keep 30 minutes.
COMPILE_STEP_TIMEOUT_SECONDS = {
    "default": 600,
    "reduce-overhead": 600,
    "max-autotune": 1800,
    "max-autotune-no-cudagraphs": 1800,
}


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
    # None: COMPILE_STEP_TIMEOUT_SECONDS of the torch.compile mode (resolve()); the bound of a compiling step only.
    compile_collective_timeout_seconds: int | None = None
    tokenized_dir: str | None = None
    global_batch_size: int | None = None
    # TorchInductor's cache (TORCHINDUCTOR_CACHE_DIR): a folder that outlives the process, on storage every node
    # reads, so a restarted or added node reuses the kernels compiled before (None: torch's default, /tmp).
    compile_cache_dir: str | None = None
    # Multi-node runs over EFA (launch_training.sh --efa): NCCL's chosen network is read from its debug log and a
    # fall-back to TCP sockets stops the run (hardware.check_transport).
    expect_efa: bool = False
    # Host work off the step: gc.freeze() after the warm-up (collections then skip the long-lived objects), and the
    # Trainer's per-step model.train() and model.zero_grad() module walks replaced (train_sentiment.LeanHostStep).
    gc_freeze: bool = True
    lean_host_step: bool = True
    # N > 0: profile the last N optimizer steps and report the launches per step (left out of the throughput).
    profile_steps: int = 0
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
        for name in ("dataloader_workers", "logging_steps", "profile_steps"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise TrainingInputError(f"{name} must be 0 or more, got {value}")
        checkpoints.check(self)
        batch_scaling.check(self)


# Fewer optimizer steps than this in a whole run is worth a warning: the model barely moves from its start.
FEW_OPTIMIZER_STEPS = 10


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
        # A rank waits in a collective while a slower one compiles the step's new shape (docs/training.md).
        compile_collective_timeout_seconds=compile_step_timeout(config, mode if compile_on else None),
    )


def compile_step_timeout(config: TrainConfig, mode: str | None) -> int:
    """The collective timeout of a compiling step: as set, else by mode (the optimizer step alone compiles as in
    mode "default"), never below the steady steps' timeout."""
    if config.compile_collective_timeout_seconds is not None:
        return config.compile_collective_timeout_seconds
    return max(config.collective_timeout_seconds, COMPILE_STEP_TIMEOUT_SECONDS[mode or "default"])


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
        # The rows carry what the collator needs besides the model's inputs (the global batch's padded length:
        # batching.PaddedIndex); the Trainer would otherwise drop every key the model's forward does not name.
        remove_unused_columns=False,
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


# ------------------------------------------------------------------------------------------------------------ CLI


# Long: one declaration per flag, the CLI's reference read top to bottom.
def parser() -> argparse.ArgumentParser:
    defaults = TrainConfig()
    parser = argparse.ArgumentParser(description=DESCRIPTION)
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
        "--compile-cache-dir",
        default=None,
        help="TorchInductor's cache folder: storage that restarts and other nodes reuse (default: torch's, in /tmp)",
    )
    parser.add_argument(
        "--profile-steps",
        type=int,
        default=defaults.profile_steps,
        help="profile the last N optimizer steps: kernel launches per step in metrics.json (default 0: off)",
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
        ("expect-efa", False, "stop if NCCL uses TCP sockets instead of EFA (launch_training.sh --efa sets it)"),
        (
            "gc-freeze",
            True,
            "gc.freeze() after the warm-up steps: collections skip what lives all run (default: on)",
        ),
        (
            "lean-host-step",
            True,
            "no per-step model.train() and module walk for zero_grad (the Trainer's); default: on",
        ),
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


def config_from(namespace: argparse.Namespace) -> TrainConfig:
    values = vars(namespace)
    values["labels"] = tuple(label.strip() for label in values["labels"].split(",") if label.strip())
    known = {f.name for f in fields(TrainConfig)}
    return TrainConfig(**{key: value for key, value in values.items() if key in known})


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    return config_from(parser().parse_args(argv))
