"""The fast path of train_sentiment.py on CPU: bucketed padding learns exactly what padding to max_seq_length learns,
computes far fewer padded positions, and the train loop never waits for the device between optimizer steps."""

from __future__ import annotations

import json
import shutil
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import TrainerCallback

from training_assets.instance import train_sentiment
from training_assets.instance.batching import BucketCollator, TokenCounter, bucket_lengths, padded_length, read_counts
from training_assets.instance.train_sentiment import ThroughputMeter, TrainConfig, train

# ------------------------------------------------------------------------------------------------------- batching


def test_bucket_lengths_are_few_and_end_at_max_length() -> None:
    assert bucket_lengths(128) == (8, 16, 24, 32, 48, 64, 96, 128)
    assert bucket_lengths(64) == (8, 16, 24, 32, 48, 64)
    assert bucket_lengths(100)[-2:] == (96, 100)
    assert len(bucket_lengths(512)) == 12
    assert padded_length(9, bucket_lengths(64)) == 16 and padded_length(8, bucket_lengths(64)) == 8
    with pytest.raises(ValueError, match="longer than the largest bucket 64"):
        padded_length(65, bucket_lengths(64))


def test_collator_pads_to_the_bucket_or_to_max_length() -> None:
    rows = [{"input_ids": [0, 5, 6, 2], "label": 1}, {"input_ids": [0, 5, 6, 7, 8, 9, 10, 11, 12, 2], "label": 0}]
    bucketed = BucketCollator(pad_token_id=1, buckets=bucket_lengths(64))(rows)
    assert bucketed["input_ids"].shape == (2, 16)
    assert bucketed["input_ids"][0].tolist() == [0, 5, 6, 2] + [1] * 12
    assert bucketed["attention_mask"].sum(dim=1).tolist() == [4, 10] and bucketed["labels"].tolist() == [1, 0]
    padded = BucketCollator(pad_token_id=1, buckets=bucket_lengths(64), padding="max_length")(rows)
    assert padded["input_ids"].shape == (2, 64)
    assert torch.equal(padded["input_ids"][:, :16], bucketed["input_ids"])


def test_token_counts_are_read_once_and_summed() -> None:
    counter = TokenCounter()
    counter.add(torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]]))
    warm = counter.snapshot()
    counter.add(torch.tensor([[1, 0, 0, 0]]))
    assert read_counts([warm, counter.snapshot()]) == [(5, 8), (6, 12)]


# --------------------------------------------------------------------------------- same batches, same per-step loss


@pytest.fixture(scope="module")
def dropout_free_model(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model without dropout: a dropout mask is drawn per position, so its random draws depend on the padded
    width; without it, a step's loss depends only on the batch's texts, weights and the attention mask."""
    model = tmp_path_factory.mktemp("no-dropout") / "model"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (model / "config.json").write_text(json.dumps(config))
    return model


def _eager_fp32(model: Path, dataset: Path, output: Path, padding: str) -> dict[str, Any]:
    return train(
        TrainConfig(
            model=str(model), dataset=str(dataset), output_dir=str(output), use_cpu=True, epochs=1,
            per_device_batch_size=8, learning_rate=5e-3, max_seq_length=64, torch_compile=False, bf16=False,
            padding=padding, logging_steps=1, warmup_steps=0,
        )
    )  # fmt: skip


@pytest.mark.slow
def test_bucketed_padding_learns_what_max_length_padding_learns(
    dropout_free_model: Path, sample_data: Path, tmp_path: Path
) -> None:
    """The same batches (same seed, length-grouped sampler), fp32: every step's loss equal with either padding."""
    bucketed = _eager_fp32(dropout_free_model, sample_data, tmp_path / "bucketed", "bucketed")
    padded = _eager_fp32(dropout_free_model, sample_data, tmp_path / "padded", "max_length")
    losses = [row["loss"] for row in bucketed["train_loss_log"]]
    assert [row["step"] for row in bucketed["train_loss_log"]] == list(range(1, 31))  # 240 rows / 8, every step
    assert losses == pytest.approx([row["loss"] for row in padded["train_loss_log"]], rel=1e-4, abs=1e-5)
    assert len({round(loss, 4) for loss in losses}) > 20  # steps of different batches and moving weights
    assert bucketed["epochs"][-1]["eval_loss"] == pytest.approx(padded["epochs"][-1]["eval_loss"], rel=1e-4)

    # ... while computing far fewer positions: the same non-padding tokens, the target for the sample data.
    fast, slow = bucketed["throughput"], padded["throughput"]
    assert fast["non_padding_tokens"] == slow["non_padding_tokens"]
    assert slow["positions_computed"] == 30 * 8 * 64 and slow["padding_fraction"] > 0.85
    assert fast["padding_fraction"] <= 0.4


# ------------------------------------------------------------------------------ no host-device sync in the step loop

# Calls that make the host wait for the device (on CUDA) to read a value. On CPU they do not wait, but they are the
# same calls: counting them on CPU shows what the loop would wait for on a GPU.
SYNCING = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__")
# transformers' SDPA mask helper checks `padding_mask.all()` to drop an all-ones mask; it does so only in eager mode
# (masking_utils._ignore_bidirectional_mask_sdpa skips the check while torch.compile traces), and the GPU default
# compiles, so it is the model's eager-mode cost, not the train loop's.
MODEL_EAGER_ONLY = "transformers/masking_utils.py"


class SyncCounter(TrainerCallback):
    """Counts syncing tensor calls from the first step of each epoch to the epoch's end: data loading, forward,
    backward, clipping, optimizer and scheduler steps and every step callback. The sampler's once-per-epoch shuffle
    (host tensors, before the first step), evaluation and the epoch's log line fall outside."""

    def __init__(self) -> None:
        self.active = False
        self.calls: Counter[str] = Counter()
        self.steps = 0

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.active = True

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.steps += self.active

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.active = False

    @contextmanager
    def patched(self) -> Iterator[None]:
        with pytest.MonkeyPatch.context() as patch:
            for name in SYNCING:
                patch.setattr(torch.Tensor, name, self._counting(name, getattr(torch.Tensor, name)))
            patch.setattr(torch.cuda, "synchronize", self._counting("torch.cuda.synchronize", torch.cuda.synchronize))
            yield

    def _counting(self, name: str, original: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            if self.active:
                caller = sys._getframe(1).f_code
                if MODEL_EAGER_ONLY not in caller.co_filename:
                    self.calls[f"{name} from {caller.co_filename.split('site-packages/')[-1]}:{caller.co_name}"] += 1
            return original(*args, **kwargs)

        return counted


@pytest.mark.slow
def test_the_step_loop_never_reads_the_device(tiny_model_dir: Path, sample_data: Path, tmp_path: Path) -> None:
    """The seed's settings read the token count (.item()) and test the loss for NaN (a Python `if` on a tensor) every
    step; the fast path reads the device only at log time."""
    counter = SyncCounter()
    config = TrainConfig(
        model=str(tiny_model_dir), dataset=str(sample_data), output_dir=str(tmp_path / "out"), use_cpu=True,
        epochs=2, per_device_batch_size=16, max_seq_length=32, torch_compile=False,
    )  # fmt: skip
    with counter.patched():
        metrics = train(config, callbacks=[counter])
    assert counter.steps == metrics["optimizer_steps"] == 2 * 15
    assert dict(counter.calls) == {}


def test_the_meter_records_cuda_events_and_waits_once_after_training(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU the meter must not synchronize per step (the seed's meter did, after every step)."""
    waits = []

    class FakeEvent:
        recorded = 0

        def __init__(self, enable_timing: bool) -> None:
            assert enable_timing
            self.at = 0.0

        def record(self) -> None:
            FakeEvent.recorded += 1
            self.at = FakeEvent.recorded * 0.5  # a step every 0.5 s of GPU time

        def elapsed_time(self, end: FakeEvent) -> float:
            return (end.at - self.at) * 1000  # milliseconds, as torch.cuda.Event gives them

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waits.append(FakeEvent.recorded))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    counter = TokenCounter()
    meter = ThroughputMeter(warmup_steps=1, samples_per_step=32, counter=counter, use_cuda=True)
    meter.on_epoch_begin(None, None, None)
    for _ in range(5):
        counter.add(torch.ones(32, 16, dtype=torch.long))
        meter.on_step_end(None, None, None)
    assert waits == []
    summary = meter.summary()
    assert waits == [6]  # once, after the last event
    assert summary["measured_steps"] == 4 and summary["train_samples_per_second"] == 64.0
    assert summary["non_padding_tokens_per_second"] == 4 * 32 * 16 / 2.0 and summary["padding_fraction"] == 0.0


def test_gpu_defaults_are_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(train_sentiment.os, "cpu_count", lambda: 96)
    gpu = train_sentiment.resolve(TrainConfig(), use_cuda=True)
    assert (gpu.torch_compile, gpu.torch_compile_mode, gpu.bf16, gpu.fused_adamw) == (True, "reduce-overhead", True,
                                                                                      True)  # fmt: skip
    assert (gpu.padding, gpu.group_by_length, gpu.dataloader_workers) == ("bucketed", True, 4)
    cpu = train_sentiment.resolve(TrainConfig(), use_cuda=False)
    assert (cpu.torch_compile, cpu.torch_compile_mode, cpu.bf16, cpu.dataloader_workers) == (False, None, False, 0)
    seed = train_sentiment.resolve(
        train_sentiment.parse_args(["--no-torch-compile", "--no-bf16", "--no-fused-adamw", "--padding", "max_length",
                                    "--no-group-by-length"]), use_cuda=True)  # fmt: skip
    assert (seed.torch_compile, seed.bf16, seed.fused_adamw, seed.padding) == (False, False, False, "max_length")
    with pytest.raises(train_sentiment.TrainingInputError, match="padding must be one of bucketed, max_length"):
        TrainConfig(padding="longest")
