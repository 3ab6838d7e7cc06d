"""The collective timeout of a compiled run: the compile bound only for the steps that compile a new batch shape
(and the step after each), the steady bound for every other step, on a real gloo process group; the compile bound
by torch.compile mode, and the settings that cannot hold."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from training_assets.instance import checkpoints
from training_assets.instance.dataset import TrainingInputError
from training_assets.instance.train_config import TrainConfig, parse_args, resolve


def test_only_a_compiling_step_and_the_next_wait_for_the_compile_bound(tmp_path: Path) -> None:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1,
                            timeout=timedelta(seconds=300))  # fmt: skip
    try:
        backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
        timeout = checkpoints.CollectiveTimeout(300, 600)
        seen = []
        for compiles in (True, False, False, False, True, True, False, False):
            timeout.before_step(compiles)
            seen.append(int(backend.options._timeout.total_seconds()))
        assert seen == [600, 600, 300, 300, 600, 600, 600, 300]
        assert timeout.raised_steps == 5
    finally:
        dist.destroy_process_group()


def test_the_compile_bound_follows_the_mode_and_is_never_below_the_steady_one(tmp_path: Path) -> None:
    def bound(*flags: str) -> int | None:
        return resolve(parse_args(["--output-dir", str(tmp_path), "--torch-compile", *flags]), False)\
            .compile_collective_timeout_seconds  # fmt: skip

    assert bound() == bound("--torch-compile-mode", "reduce-overhead") == 600
    assert bound("--torch-compile-mode", "max-autotune") == 1800
    assert bound("--collective-timeout", "900") == 900  # never below the steady bound
    assert bound("--compile-collective-timeout", "420") == 420
    with pytest.raises(TrainingInputError, match=r"^compile_collective_timeout_seconds must be at least "
                       r"collective_timeout_seconds \(300\), got 200$"):  # fmt: skip
        TrainConfig(output_dir=str(tmp_path), compile_collective_timeout_seconds=200)
