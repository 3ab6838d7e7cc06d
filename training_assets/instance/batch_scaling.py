"""The same settings learn the same on one process or many: the global batch and the learning rate.

The global batch is what one optimizer step averages over: per-device batch x devices (processes of a torchrun, or
the GPUs of one nn.DataParallel process). Left alone it grows with the node count at a fixed learning rate, so the
same settings take fewer, larger steps on more nodes and learn something else. Two ways to keep a run the same:

* ``--global-batch-size G`` (what the platform's EC2 runs use): the per-device batch becomes G / devices, so every
  run of the same settings takes the same steps over the same batches at the same learning rate, on one GPU or 16
  nodes; G must be a multiple of the devices. The learning rate needs no change.
* ``--lr-scaling linear`` with the per-device batch fixed: the learning rate is multiplied by global batch /
  ``--reference-global-batch`` (default 32, the batch the default learning rate 2e-5 was chosen for on one GPU): the
  linear scaling rule of Goyal et al., "Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour" (2017), which
  holds for SGD while the batch stays small against the data; for Adam-type optimizers the square-root rule is the
  one with a theory (Malladi et al., "On the SDEs and Scaling Rules for Adaptive Gradient Algorithms", 2022), and
  fine-tuning with AdamW at 8x the batch and 8x the rate can diverge. Prefer a fixed global batch.

``metrics.json`` records the outcome under ``batch``: the global batch, the per-device batch, the devices, the
learning rate the optimizer used and the rule that produced it.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict, dataclass, replace
from typing import Any, TypeVar

from training_assets.instance.dataset import TrainingInputError

Config = TypeVar("Config")

LR_SCALING = ("none", "linear")
REFERENCE_GLOBAL_BATCH = 32


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--global-batch-size", type=int, default=None, help="samples per optimizer step over all "
                        "devices; the per-device batch becomes this / devices (default: --per-device-batch-size x "
                        "devices)")  # fmt: skip
    parser.add_argument("--lr-scaling", choices=LR_SCALING, default="none", help="linear: learning rate x global "
                        "batch / --reference-global-batch (default none)")  # fmt: skip
    parser.add_argument(
        "--reference-global-batch",
        type=int,
        default=REFERENCE_GLOBAL_BATCH,
        help=f"the global batch --learning-rate is meant for (default {REFERENCE_GLOBAL_BATCH})",
    )


def check(config: Any) -> None:
    if config.global_batch_size is not None and config.global_batch_size < 1:
        raise TrainingInputError(f"global_batch_size must be at least 1, got {config.global_batch_size}")
    if config.lr_scaling not in LR_SCALING:
        raise TrainingInputError(f"lr_scaling must be one of {', '.join(LR_SCALING)}, got {config.lr_scaling!r}")
    if config.reference_global_batch < 1:
        raise TrainingInputError(f"reference_global_batch must be at least 1, got {config.reference_global_batch}")


def devices(use_cuda: bool, device_count: int) -> int:
    """Data-parallel devices: torchrun's processes (WORLD_SIZE), else the GPUs one process drives (DataParallel)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        return world
    return max(1, device_count) if use_cuda else 1


@dataclass(frozen=True)
class BatchSchedule:
    devices: int
    per_device_batch_size: int
    global_batch: int
    base_learning_rate: float
    learning_rate: float
    lr_scaling: str
    reference_global_batch: int | None
    rule: str


def schedule(config: Any, device_count: int) -> BatchSchedule:
    """The per-device batch and learning rate ``config`` means on ``device_count`` devices."""
    per_device = config.per_device_batch_size
    if config.global_batch_size is not None:
        per_device, left = divmod(config.global_batch_size, device_count)
        if left or not per_device:
            raise TrainingInputError(
                f"global_batch_size {config.global_batch_size} must be a multiple of the {device_count} devices of "
                f"this run (each takes an equal share); use e.g. {max(1, per_device) * device_count}"
            )
    global_batch = per_device * device_count
    rate, rule = config.learning_rate, "fixed global batch" if config.global_batch_size else "per-device batch"
    reference = None
    if config.lr_scaling == "linear":
        reference = config.reference_global_batch
        rate = config.learning_rate * global_batch / reference
        rule = f"linear: {config.learning_rate:g} x {global_batch} / {reference}"
    return BatchSchedule(device_count, per_device, global_batch, config.learning_rate, rate, config.lr_scaling,
                         reference, rule)  # fmt: skip


def apply(config: Config, plan: BatchSchedule) -> Config:
    """``config`` with the per-device batch and learning rate of ``plan`` (what the run uses)."""
    return replace(config, per_device_batch_size=plan.per_device_batch_size, learning_rate=plan.learning_rate)  # type: ignore[type-var]


def report(plan: BatchSchedule, log_history: list[dict[str, Any]]) -> dict[str, Any]:
    """``batch`` for metrics.json: the schedule, and the learning rate of every logged step (the optimizer's)."""
    rates = [{"step": row["step"], "learning_rate": row["learning_rate"]} for row in log_history
             if "learning_rate" in row and "loss" in row]  # fmt: skip
    return {"batch": {**asdict(plan), "learning_rate_log": rates}}
