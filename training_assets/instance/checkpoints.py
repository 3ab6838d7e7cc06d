"""Checkpoints that a restarted run resumes from, and collective timeouts that let the survivors of a lost process
stop in minutes.

* ``--checkpoint-steps N`` saves the Trainer's checkpoint (model, optimizer, scheduler, RNG states, trainer state)
  every N optimizer steps into ``--checkpoint-dir`` (default ``<output-dir>/checkpoints``), on every node
  (``save_on_each_node``: a node restarted by torchrun finds its own copy), keeping the newest two. When every
  process has written its part, one process per node writes the completion marker (checkpoint_sync.py).
* A run started on a checkpoint folder that holds complete checkpoints of an unfinished run resumes from the newest
  one that every process has (the processes agree on it over the process group), whether torchrun restarted its
  workers (``--max-restarts``) or the run was launched again with the same checkpoint folder or run id. A run that
  finished marks the folder, and the next run on it starts afresh (removing the old checkpoints first).
* ``--collective-timeout`` (``TrainingArguments.ddp_timeout``: the process group's timeout, NCCL's watchdog aborts a
  collective that exceeds it) bounds how long the survivors of a lost process wait in a collective before they fail
  and torchrun restarts them or gives up. It must exceed the longest pause between two collectives of a healthy run:
  an evaluation, a checkpoint save; the first compilation of a batch shape gets its own bound
  (``CollectiveTimeout``: ``--compile-collective-timeout`` for the steps that compile, and only for those).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from training_assets.instance.checkpoint_sync import CHECKPOINT_PREFIX, MARKER, complete_checkpoints, write_marker
from training_assets.instance.dataset import TrainingInputError

FINISHED = "run-finished.json"
# Local checkpoints kept: the newest complete one survives while the next is being written.
KEEP_CHECKPOINTS = 2
DEFAULT_COLLECTIVE_TIMEOUT_SECONDS = 300


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint-steps", type=int, default=0, help="save a checkpoint every N optimizer steps "
                        "and resume from the newest complete one (default 0: no checkpoints)")  # fmt: skip
    parser.add_argument(
        "--checkpoint-dir", default=None, help="checkpoints go here (default: <output-dir>/checkpoints)"
    )
    parser.add_argument("--collective-timeout", dest="collective_timeout_seconds", type=int,
                        default=DEFAULT_COLLECTIVE_TIMEOUT_SECONDS,
                        help="seconds a process waits in a collective (all-reduce, barrier) before the run fails "
                        f"(default {DEFAULT_COLLECTIVE_TIMEOUT_SECONDS})")  # fmt: skip
    parser.add_argument("--compile-collective-timeout", dest="compile_collective_timeout_seconds", type=int,
                        default=None, help="the same for a step that compiles a new batch shape, and the step after "
                        "it (default: by torch.compile mode, train_config.COMPILE_STEP_TIMEOUT_SECONDS)")  # fmt: skip


def check(config: Any) -> None:
    if config.checkpoint_steps < 0:
        raise TrainingInputError(f"checkpoint_steps must be 0 (off) or more, got {config.checkpoint_steps}")
    if config.collective_timeout_seconds < 30:
        raise TrainingInputError(
            f"collective_timeout_seconds must be at least 30, got {config.collective_timeout_seconds}"
        )
    compiling = config.compile_collective_timeout_seconds
    if compiling is not None and compiling < config.collective_timeout_seconds:
        raise TrainingInputError(
            f"compile_collective_timeout_seconds must be at least collective_timeout_seconds "
            f"({config.collective_timeout_seconds}), got {compiling}"
        )


def checkpoint_dir(config: Any) -> Path:
    return Path(config.checkpoint_dir) if config.checkpoint_dir else Path(config.output_dir) / "checkpoints"


def trainer_arguments(config: Any) -> dict[str, Any]:
    """The TrainingArguments of checkpointing and of the collective timeout."""
    if not config.checkpoint_steps:  # the Trainer writes nothing of its own into the output folder
        return {"output_dir": str(config.output_dir), "save_strategy": "no",
                "ddp_timeout": config.collective_timeout_seconds}  # fmt: skip
    return {"output_dir": str(checkpoint_dir(config)), "save_strategy": "steps", "save_steps": config.checkpoint_steps,
            "save_on_each_node": True, "save_total_limit": KEEP_CHECKPOINTS,
            "ddp_timeout": config.collective_timeout_seconds}  # fmt: skip


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _barrier() -> None:
    if _distributed():
        torch.distributed.barrier()


class CompleteMarker(TrainerCallback):
    """After a checkpoint is saved: wait until every process has written its part, then mark it complete on each
    node. A process that dies while saving stops the barrier, so that checkpoint never gets its marker."""

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        _barrier()
        if state.is_local_process_zero:
            write_marker(Path(args.output_dir) / f"{CHECKPOINT_PREFIX}{state.global_step}", state.global_step)
        _barrier()


class CollectiveTimeout:
    """The process group's collective timeout, step by step: ``compiling_seconds`` for a step that compiles (the
    first step of a batch shape, in training or evaluation) and for the step after it (the optimizer step compiles
    after the gradient all-reduce of step 1, and a slower rank's compile reaches into the next step's first
    collective); ``seconds`` for every other step, so that once its shapes have compiled a run notices a dead rank
    within ``seconds``, not within the compile bound. The ranks need not agree on it by a collective: every rank
    runs the same shape at the same step (batches grouped by the global batch), so each decides the same.

    The timeout is the process group's (``torch.distributed.distributed_c10d._set_pg_timeout``: gloo and NCCL
    apply a new timeout to the collectives started after it, as ``ddp_timeout`` is applied at ``init_process_group``).
    ``raised_steps`` counts the steps that ran under the compile bound (metrics.json)."""

    def __init__(self, seconds: int, compiling_seconds: int) -> None:
        self.seconds = seconds
        self.compiling_seconds = max(seconds, compiling_seconds)
        self.current = seconds  # what the process group was created with (TrainingArguments.ddp_timeout)
        self.previous_compiled = False
        self.raised_steps = 0

    def before_step(self, compiles: bool) -> None:
        wanted = self.compiling_seconds if compiles or self.previous_compiled else self.seconds
        self.previous_compiled = compiles
        self.raised_steps += wanted > self.seconds
        if wanted != self.current and _distributed():
            torch.distributed.distributed_c10d._set_pg_timeout(timedelta(seconds=wanted))
        self.current = wanted


def callbacks(config: Any) -> list[TrainerCallback]:
    return [CompleteMarker()] if config.checkpoint_steps else []


def resume_point(config: Any, local_process_zero: bool) -> str | None:
    """The checkpoint every process resumes from, or None for a fresh start (then the folder is cleared of an
    earlier run's checkpoints). Every process calls this after the process group exists."""
    if not config.checkpoint_steps:
        return None
    root = checkpoint_dir(config)
    mine = [] if (root / FINISHED).is_file() else [step for step, _ in complete_checkpoints(root)]
    everyone = [mine]
    if _distributed():
        everyone = [[] for _ in range(torch.distributed.get_world_size())]
        torch.distributed.all_gather_object(everyone, mine)
    common = set(everyone[0]).intersection(*everyone[1:])
    step = max(common) if common else None
    if step is None and local_process_zero and root.is_dir():
        for stale in [*root.glob(f"{CHECKPOINT_PREFIX}*"), root / FINISHED]:
            shutil.rmtree(stale) if stale.is_dir() else stale.unlink(missing_ok=True)
    _barrier()
    if step is None:
        return None
    folder = root / f"{CHECKPOINT_PREFIX}{step}"
    if local_process_zero:
        print(f"train_sentiment: resuming from {folder} (step {step})", file=sys.stderr, flush=True)
    return str(folder)


def finish(config: Any, local_process_zero: bool) -> None:
    """Mark the checkpoint folder as belonging to a finished run (the next run on it starts afresh)."""
    root = checkpoint_dir(config)
    if config.checkpoint_steps and local_process_zero and root.is_dir():
        (root / FINISHED).write_text(json.dumps({"finished": True}) + "\n")


def report(config: Any, resumed_from: str | None) -> dict[str, Any]:
    return {"checkpoints": {"every_steps": config.checkpoint_steps or None, "folder": str(checkpoint_dir(config)),
                            "resumed_from": resumed_from, "marker": MARKER,
                            "collective_timeout_seconds": config.collective_timeout_seconds,
                            "compile_collective_timeout_seconds":
                                config.compile_collective_timeout_seconds}}  # fmt: skip
