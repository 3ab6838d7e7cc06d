"""Fine-tune a sequence-classification model for tweet sentiment with the Hugging Face Trainer.

The defaults are the fast path (docs/training-performance.md): batches padded to their own longest text rounded up
to a few bucket lengths, texts of one bucket batched together (``--padding bucketed``, ``--group-by-length``); fused
AdamW; and with a GPU, torch.compile in "reduce-overhead" mode (CUDA graphs, one static graph per bucket length) with
the optimizer step compiled too, bf16 autocast, DataLoader worker processes with pinned memory, and no host-device
synchronisation between optimizer steps (the collator counts tokens on the host, steps are timed on the device;
values are read when a log line needs them; ``--sync-debug error`` makes a hidden one fail the run). ``--padding
packed`` puts several texts into each row instead (packing.py). Each feature has its own switch, so the seed's
baseline stays reproducible: ``--no-torch-compile --no-bf16 --no-fused-adamw --no-compile-optimizer --padding
max_length --no-group-by-length`` is plain eager fp32 AdamW on texts padded to max_seq_length.

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

This module is the training itself; its configuration and command line are ``train_config.py``, its throughput
measurement ``throughput.py``, and the hardware checks ``hardware.py``.
"""

from __future__ import annotations

import functools
import gc
import json
import os
import socket
import sys
import traceback
from collections import Counter
from collections.abc import Sequence
from contextlib import ExitStack, nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from transformers import TrainerCallback

from training_assets.instance import batch_scaling, checkpoints, data_staging, packing
from training_assets.instance.batching import (
    BucketCollator,
    LengthBucketSampler,
    PaddedIndex,
    TokenCounter,
    bucket_lengths,
)
from training_assets.instance.dataset import (
    CHARS_PER_TOKEN_KEPT,
    Schema,
    Split,
    TrainingInputError,
    looks_local,
    read_splits,
)
from training_assets.instance.hardware import (
    check_bf16,
    check_transport,
    compile_threads,
    device_info,
    nccl_network,
    peak_memory_bytes,
)
from training_assets.instance.throughput import (
    LaunchCounter,
    ModelFlops,
    SyncCheck,
    ThroughputMeter,
    compiler_counts,
    graphs_compiled,
    observed_compilation,
)
from training_assets.instance.train_config import (
    CUDA_GRAPH_MODES,
    METRICS_FILE,
    SAVED_MODEL_DIR,
    TrainConfig,
    batch_plan,
    config_from,
    optimizer_step,
    parser,
    resolve,
    training_arguments,
)

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
        row = {"input_ids": self.input_ids[index], "label": self.labels[index]}
        if isinstance(index, PaddedIndex):
            row["padded_length"] = index.padded_length
        elif isinstance(index, packing.PackedIndex):
            row["packed_rows"] = index.rows
        return row

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
            # From the gathered logits (compute_metrics): the Trainer's eval_loss repeats each batch's mean, so on
            # several ranks a last batch that accelerate filled up with repeated rows skews it.
            "eval_loss": round(metrics.get("eval_cross_entropy", metrics["eval_loss"]), 6),
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


class FreezeGarbage(TrainerCallback):
    """After the warm-up steps: one full collection, then ``gc.freeze()``, which moves every object alive (the model,
    the Trainer, the imported modules) to a generation the collector never scans again; the collections that the
    steps' short-lived objects trigger then skip them. Undone at the end of training, unless the process had frozen
    objects already: ``gc.unfreeze()`` would undo the host's own freeze too (a long-lived process that trains
    in-process, as the tests' workers do)."""

    def __init__(self, after_step: int) -> None:
        self.after_step = after_step
        self.host_froze = False

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.after_step:
            self.host_froze = gc.get_freeze_count() > 0
            gc.collect()
            gc.freeze()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self.host_froze:
            gc.unfreeze()


class LeanHostStep:
    """Host work the Trainer repeats at every step that the run does not need, taken off the model object the train
    loop steps (bound once, as instance attributes that shadow the module's methods):

    * ``model.train()``, at the start of every ``Trainer.training_step``, walks every submodule to set its mode: it
      now walks only when the mode changes. The mode is forgotten after an evaluation (``forget_mode``), whose
      ``model.eval()`` may switch another object (the unwrapped model inside DDP).
    * ``model.zero_grad()``, after every optimizer step, walks every module for its parameters: it now sets the
      gradients of the parameter list taken once to None, what ``Module.zero_grad(set_to_none=True)`` does.
    * the gradient clipping gets ``model.parameters()`` from the Trainer, another walk: it now gets that list
      (``SentimentTrainer._clip_grad_norm``).
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.mode: bool | None = None  # unknown until it is set through train()
        self.parameters = list(model.parameters())
        object.__setattr__(model, "train", self.train)  # not Module.__setattr__: a plain instance attribute
        object.__setattr__(model, "zero_grad", self.zero_grad)

    def train(self, mode: bool = True) -> torch.nn.Module:
        if mode is not self.mode:
            type(self.model).train(self.model, mode)
            self.mode = mode
        return self.model

    def zero_grad(self, set_to_none: bool = True) -> None:
        if not set_to_none:
            type(self.model).zero_grad(self.model, set_to_none)
            return
        for parameter in self.parameters:
            parameter.grad = None

    def forget_mode(self) -> None:
        self.mode = None


class NcclTransport(TrainerCallback):
    """At the start of training (the process group and DDP's first broadcast have set NCCL up by then): which
    network NCCL chose, from its debug log; a run that expected EFA and got TCP sockets stops there."""

    def __init__(self, efa_expected: bool) -> None:
        self.efa_expected = efa_expected
        self.network: str | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not (torch.distributed.is_initialized() and torch.distributed.get_backend() == "nccl"):
            return
        self.network = nccl_network(os.environ.get("NCCL_DEBUG_FILE"), socket.gethostname(), os.getpid())
        if state.is_world_process_zero:
            print(f"train_sentiment: NCCL network: {self.network or 'not in its log'}", file=sys.stderr, flush=True)
        check_transport(self.network, self.efa_expected)


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


# Long: one Trainer subclass, defined inside so that importing this module does not import Trainer.
@functools.cache
def sentiment_trainer() -> type:
    """``SentimentTrainer``, defined on first use: importing ``transformers.Trainer`` loads the model code and
    ``datasets`` (about 2 CPU-seconds per process), which ``--check-only`` and an input error's exit never use."""
    from accelerate.data_loader import SeedableRandomSampler  # type: ignore[import-untyped]
    from torch.utils.data import RandomSampler
    from transformers import Trainer

    class SentimentTrainer(Trainer):
        """Keeps the collator's token counts per step (``TokenCounter``); batches each global batch from one bucket
        (``LengthBucketSampler``), or packs every rank's batch of a step into the same rows (``AlignedPackingSampler``);
        compiles the optimizer step when asked (``CompiledOptimizerStep``); drops the last
        partial batch in training only (evaluation sees every row, padded even when training is packed); with CUDA
        graphs, copies evaluation outputs out of the graph's memory before the next batch reuses it; with a
        ``SyncCheck``, arms it for each steady step; reports the loss as one process would on any number of ranks."""

        data_collator: Any  # the Trainer's (transformers is not type-checked here)

        def __init__(
            self,
            *args: Any,
            token_counter: TokenCounter,
            clone_eval_outputs: bool,
            buckets: tuple[int, ...] | None = None,
            packing_width: int | None = None,
            compile_optimizer: bool = False,
            lean_host_step: bool = False,
            collective_timeout: checkpoints.CollectiveTimeout | None = None,
            model_compiled: bool = False,
            sync_check: SyncCheck | None = None,
            eval_collator: Any = None,
            **kwargs: Any,
        ) -> None:
            super().__init__(*args, **kwargs)
            # RoBERTa's forward takes **kwargs, so the Trainer concludes it accepts loss keyword arguments; then
            # (transformers 5.23 Trainer.compute_loss) it multiplies each rank's loss by the number of processes
            # when average_tokens_across_devices (default True), and training_step skips the division by the
            # gradient accumulation steps, while the classification head returns a plain mean and ignores
            # num_items_in_batch. False: the mean loss as one process computes it, and no per-step label count.
            self.model_accepts_loss_kwargs = False
            self.token_counter = token_counter
            self.clone_eval_outputs = clone_eval_outputs
            self.buckets = buckets
            self.packing_width = packing_width
            self.compile_optimizer = compile_optimizer
            self.lean_host_step = lean_host_step
            self.lean: LeanHostStep | None = None
            self.collective_timeout = collective_timeout
            self.model_compiled = model_compiled
            self.eval_shapes: set[tuple[int, ...]] = set()
            self.sync_check = sync_check
            self.eval_collator = eval_collator

        def training_step(self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None) -> torch.Tensor:
            # The Trainer's own count (include_num_input_tokens_seen) reads it back with .item() every step.
            tokens, squared = inputs.pop("token_counts")
            self.token_counter.add(tokens, squared, tuple(inputs["input_ids"].shape))
            if self.sync_check is not None:
                self.sync_check.step_starts(len(self.token_counter.shapes) - 1)
            if self.collective_timeout is not None:  # a new shape compiles the model; step 1 the optimizer step
                first = len(self.token_counter.shapes) == 1
                new_shape = self.token_counter.earlier[-1] == 0
                self.collective_timeout.before_step(new_shape if self.model_compiled else first)
            if self.lean_host_step and (self.lean is None or self.lean.model is not model):
                self.lean = LeanHostStep(model)  # the object the loop steps (DDP or compiled wrapper): once
            return super().training_step(model, inputs, num_items_in_batch)

        def _clip_grad_norm(self, model: Any) -> Any:
            # transformers 5.23 passes model.parameters() (a walk over every module) to accelerate's clipping; the
            # lean step's list holds the same parameters. DTensor meshes (tensor parallelism, unused here) keep the
            # Trainer's own path, which handles them.
            if self.lean is None or self.lean.model is not model or self._has_mixed_mesh_grads(model):
                return super()._clip_grad_norm(model)
            return self.accelerator.clip_grad_norm_(self.lean.parameters, self.args.max_grad_norm)

        def evaluation_loop(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return super().evaluation_loop(*args, **kwargs)
            finally:
                if self.lean is not None:  # it switched some object to eval mode: the next step sets train mode
                    self.lean.forget_mode()

        def _get_train_sampler(self, train_dataset: Any = None) -> Any:
            dataset = self.train_dataset if train_dataset is None else train_dataset
            base = super()._get_train_sampler(train_dataset)
            if not isinstance(dataset, TokenizedSplit):
                return base
            # Grouped by the global batch: accelerate deals consecutive per-device batches to the ranks in turn
            # (BatchSamplerShard), so each run of world_size batches is one bucket on every rank at the same step.
            batch = self.args.train_batch_size * self.args.gradient_accumulation_steps * self.args.world_size
            if self.buckets is not None:
                return LengthBucketSampler(dataset.lengths, self.buckets, batch)
            if self.packing_width is None:
                return base
            # Packed: the Trainer's shuffled order, made seedable as accelerate would have made it (its
            # prepare_data_loader replaces a RandomSampler only), with each step's row count agreed on every rank.
            if isinstance(base, RandomSampler) and self.args.accelerator_config.use_seedable_sampler:
                base = SeedableRandomSampler(data_source=base.data_source, replacement=base.replacement,
                                             num_samples=base._num_samples, generator=base.generator,
                                             data_seed=self.args.data_seed)  # fmt: skip
            per_device = self.args.train_batch_size
            return packing.AlignedPackingSampler(base, dataset.lengths, self.packing_width, per_device, batch)

        def create_optimizer(self, model: Any = None) -> torch.optim.Optimizer:
            optimizer = super().create_optimizer(model)
            if self.compile_optimizer and not isinstance(optimizer.step, CompiledOptimizerStep):
                optimizer.step = CompiledOptimizerStep(optimizer)
            return optimizer

        def prediction_step(self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
            inputs.pop("token_counts", None)  # the collator's host counts are for training steps
            if self.collective_timeout is not None:  # a new evaluation shape compiles too
                shape = tuple(inputs["input_ids"].shape)
                self.collective_timeout.before_step(self.model_compiled and shape not in self.eval_shapes)
                self.eval_shapes.add(shape)
            outputs = super().prediction_step(model, inputs, *args, **kwargs)
            if not self.clone_eval_outputs:
                return outputs
            # CUDA graph trees reuse a graph's output memory on its next replay, and the evaluation loop keeps the first
            # batch's logits while the next batch runs; "clone the tensor outside of torch.compile()" is the fix the
            # error message and https://docs.pytorch.org/docs/stable/torch.compiler_cudagraph_trees.html give.
            return torch.utils._pytree.tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, outputs)

        def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
            drop_last, self.args.dataloader_drop_last = self.args.dataloader_drop_last, False
            collator: Any = self.data_collator
            self.data_collator = self.eval_collator or collator  # packed training still evaluates padded batches
            try:
                return super().get_eval_dataloader(eval_dataset)
            finally:
                self.args.dataloader_drop_last = drop_last
                self.data_collator = collator

        def floating_point_ops(self, inputs: dict[str, Any]) -> int:
            # The Trainer's count walks every parameter each step (PreTrainedModel.num_parameters) for a total_flos
            # nothing reads; the model's FLOPs are counted once, after training (ModelFlops).
            return 0

    return SentimentTrainer


def compute_metrics(prediction: Any) -> dict[str, float]:
    logits = prediction.predictions[0] if isinstance(prediction.predictions, tuple) else prediction.predictions
    predicted = np.asarray(logits).argmax(axis=-1)
    labels = np.asarray(prediction.label_ids)
    return {
        "accuracy": float(np.mean(predicted == labels)) if labels.size else 0.0,
        "macro_f1": macro_f1(labels, predicted),
        "cross_entropy": cross_entropy(np.asarray(logits), labels),
    }


def cross_entropy(logits: np.ndarray, labels: np.ndarray) -> float:
    """The mean cross-entropy of ``labels`` under ``logits`` (what the classification head's loss computes)."""
    if not labels.size:
        return float("nan")
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return float(-log_probs[np.arange(labels.size), labels].mean())


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


def label_warnings(split: Split, labels: tuple[str, ...]) -> list[str]:
    """A train split with one class teaches the model that class only; missing classes are never learned."""
    present = sorted(set(split.labels))
    names = ", ".join(f"{i} ({labels[i]})" for i in present)
    if len(present) == 1:
        return [f"{split.name}: every row has label {names}: the model can only learn to predict that class"]
    if missing := [f"{i} ({name})" for i, name in enumerate(labels) if i not in present]:
        return [f"{split.name}: no row has label {', '.join(missing)}: the model will not learn to predict it"]
    return []


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


# Long: the run's steps in order (check, resolve, tokenize, train, report), each a call or two.
def train(config: TrainConfig | dict[str, Any], callbacks: Sequence[TrainerCallback] = ()) -> dict[str, Any]:
    """Fine-tune per ``config``; return the metrics (rank 0 also writes metrics.json and saved_model/).

    ``callbacks`` join the run's own (``TrainerCallback`` instances: a caller's hooks into the train loop)."""
    if isinstance(config, dict):
        config = TrainConfig(**config)
    use_cuda = torch.cuda.is_available() and not config.use_cpu
    # Everything that can be wrong with the input is checked before any process group or model is created.
    model_reference, raw = check_inputs(config, use_cuda)
    config = resolve(config, use_cuda)
    if config.compile_cache_dir:  # before anything compiles: TorchInductor reads it at each cache access
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(config.compile_cache_dir).expanduser().resolve())
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
    counter = TokenCounter(args.device)
    # A shape's first run compiles it; with CUDA graphs its second records the graph (see ThroughputMeter).
    shape_warmups = 2 if cuda_graphs else 1 if config.torch_compile else 0
    meter = ThroughputMeter(config.warmup_steps, plan.samples_per_step, counter, use_cuda, shape_warmups)
    reporter = EpochReporter()
    sync_check = SyncCheck(config.sync_debug, meter) if config.sync_debug != "off" else None
    launches = LaunchCounter(config.profile_steps, use_cuda) if config.profile_steps else None
    transport = NcclTransport(config.expect_efa)
    host = [transport, *([FreezeGarbage(max(1, config.warmup_steps))] if config.gc_freeze else []),
            *([launches] if launches else [])]  # fmt: skip
    steady_timeout = config.collective_timeout_seconds
    compile_timeout = config.compile_collective_timeout_seconds or steady_timeout  # resolve() has set it
    compiling = bool(config.torch_compile or config.compile_optimizer)
    timeout = checkpoints.CollectiveTimeout(steady_timeout, compile_timeout) if compiling else None
    packed = config.padding == "packed"
    if packed and (reason := packing.check_packable(model.config)):
        raise TrainingInputError(f"--padding packed: {reason}")
    padded = BucketCollator(tokenizer.pad_token_id, buckets, "bucketed" if packed else config.padding)
    trainer = sentiment_trainer()(
        model=packing.PackedClassifier(model) if packed else model,
        args=args,
        data_collator=packing.PackingCollator(tokenizer.pad_token_id, max_length) if packed else padded,
        eval_collator=padded,
        train_dataset=encoded["train"],
        eval_dataset=encoded["validation"],
        processing_class=tokenizer,
        compute_metrics=compute_metrics,
        callbacks=[
            meter,
            reporter,
            *([sync_check] if sync_check else []),
            *host,
            *checkpoints.callbacks(config),
            *callbacks,
        ],
        token_counter=counter,
        clone_eval_outputs=cuda_graphs,
        buckets=buckets if config.group_by_length and not packed else None,
        packing_width=max_length if packed else None,
        compile_optimizer=bool(config.compile_optimizer),
        lean_host_step=config.lean_host_step,
        collective_timeout=timeout,
        model_compiled=bool(config.torch_compile),
        sync_check=sync_check,
    )
    graphs_before, compiler_before = graphs_compiled(), compiler_counts()
    try:
        with _compile_settings(config, buckets):
            result = trainer.train(resume_from_checkpoint=resume)
    finally:
        if sync_check is not None:
            sync_check.switch(False)

    compilation = {
        # TorchDynamo graphs compiled during the run (training and evaluation), and the (1-based) optimizer
        # steps during which one was: with static shapes, the first step of each new batch shape.
        "graphs": graphs_compiled() - graphs_before,
        **observed_compilation(compiler_before, [step + 1 for step, compiled in enumerate(meter.compiled) if compiled]),
        "first_steps_of_each_shape": [step + 1 for step, earlier in enumerate(counter.earlier) if not earlier],
        # The host's seconds in each step that compiled (the compile of one shape: what the compile timeout bounds),
        # and the steps (training and evaluation batches) that ran under that timeout (checkpoints.CollectiveTimeout).
        "host_seconds_of_steps_that_compiled": [
            round(seconds, 3) for seconds, compiled in zip(meter.host_seconds, meter.compiled, strict=True) if compiled
        ],
        "steps_under_compile_timeout": timeout.raised_steps if timeout else 0,
    }
    if launches and launches.result:
        meter.excluded = {step - 1 for step in launches.result["profiled_steps"]}
    metrics = {
        "config": {**asdict(config), "labels": list(config.labels)},
        "device": device_info(use_cuda, world_size),
        "train_samples": len(raw["train"]),
        "validation_samples": len(raw["validation"]),
        "max_seq_length": max_length,
        "padding": {
            "mode": config.padding,
            "bucket_lengths": list(buckets),
            "group_by_length": config.group_by_length and not packed,
            # Optimizer steps per padded length: which buckets the run used, and how often (packed: per rows).
            "steps_per_length": dict(sorted(Counter(shape[-1] for shape in counter.shapes).items())),
            "steps_per_rows": dict(sorted(Counter(shape[0] for shape in counter.shapes).items())),
        },
        "optimizer_step": optimizer_step(config),
        # As configured, and whether it ran so: a CUDA graph skip (TorchInductor ran a graph without) observed.
        "cuda_graphs_configured": cuda_graphs,
        "cuda_graphs": cuda_graphs and not compilation["cuda_graph_skips"],
        "compilation": compilation,
        "host": {
            "compile_threads": compile_threads(int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
            if config.torch_compile or config.compile_optimizer
            else None,
            "inductor_cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
            "nccl_network": transport.network,
            "gc_freeze_after_step": max(1, config.warmup_steps) if config.gc_freeze else None,
            "peak_memory_bytes": peak_memory_bytes(use_cuda),
            **(launches.result if launches else {}),
        },
        "optimizer_steps": len(meter.steps),
        "warnings": notes,
        "epochs": reporter.epochs,
        # The train loss of every logging window (--logging-steps N: every N optimizer steps).
        "train_loss_log": [
            {"step": row["step"], "loss": row["loss"], "grad_norm": row.get("grad_norm")}
            for row in trainer.state.log_history
            if "loss" in row
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
        if packed:  # the model inside the packing wrapper, as the padded path saves it
            model.save_pretrained(str(saved))
            tokenizer.save_pretrained(str(saved))
        else:
            trainer.save_model(str(saved))
        (saved / "training_args.bin").unlink(missing_ok=True)  # a pickle the served model does not need
        (output_dir / METRICS_FILE).write_text(json.dumps(metrics, indent=2) + "\n")
    trainer.accelerator.wait_for_everyone()
    checkpoints.finish(config, args.local_process_index == 0)
    return metrics


# Distinct row counts of packed batches that compile before TorchDynamo would fall back to eager.
PACKED_ROW_COUNTS = 32


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
    import torch._inductor.config as inductor_config

    settings = ExitStack()
    threads = compile_threads(int(os.environ.get("LOCAL_WORLD_SIZE", "1")))  # torchrun's processes on this node
    settings.enter_context(inductor_config.patch(compile_threads=threads))
    limit = max(torch._dynamo.config.recompile_limit, 2 * len(buckets) + 4)
    if config.padding == "packed":
        # A packed batch's row count varies a few rows around (texts x mean length / width): one graph per count.
        limit += PACKED_ROW_COUNTS
    settings.enter_context(torch._dynamo.config.patch(recompile_limit=limit, automatic_dynamic_shapes=False))
    return settings


def _position_limit(model_config: Any, tokenizer: Any) -> int:
    limits = [tokenizer.model_max_length]
    positions = getattr(model_config, "max_position_embeddings", None)
    if positions:  # RoBERTa reserves two positions (padding_idx + 1 offset)
        limits.append(positions - 2 if model_config.model_type in ("roberta", "xlm-roberta") else positions)
    return min(limits)


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
    namespace = parser().parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    try:
        config = config_from(namespace)
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
