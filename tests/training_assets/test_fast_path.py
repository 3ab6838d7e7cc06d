"""The fast path of train_sentiment.py on CPU: bucketed padding learns exactly what padding to max_seq_length learns,
computes far fewer padded positions with batches that stay mixed, the train loop never waits for the device between
optimizer steps, torch.compile builds one graph per bucket length and compiles the optimizer step once, and the GPU
settings (CUDA graphs, workers, pinned memory, the sync check) are what the Trainer receives."""

from __future__ import annotations

import json
import math
import random
import shutil
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoTokenizer, TrainerCallback
from transformers.trainer_pt_utils import LengthGroupedSampler

from training_assets.instance import train_config
from training_assets.instance.batching import (
    BucketCollator,
    Counts,
    LengthBucketSampler,
    TokenCounter,
    bucket_lengths,
    padded_length,
)
from training_assets.instance.dataset import TrainingInputError
from training_assets.instance.throughput import ModelFlops, SyncCheck, ThroughputMeter
from training_assets.instance.train_config import TrainConfig
from training_assets.instance.train_sentiment import train

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


def test_token_counts_are_kept_per_step_and_read_once() -> None:
    counter = TokenCounter()
    collate = BucketCollator(pad_token_id=1, buckets=(4,))
    for lengths in ([2, 3], [1], [4, 1]):  # what the collator counts on the host is what the counter keeps
        batch = collate([{"input_ids": [0] * length, "label": 0} for length in lengths])
        tokens, squared = batch["token_counts"]
        counter.add(tokens, squared, tuple(batch["input_ids"].shape))
    # tokens, sum of squared text lengths (2*2 + 3*3), positions computed
    assert counter.read() == [Counts(5, 13, 8), Counts(1, 1, 4), Counts(5, 17, 8)]
    assert counter.shapes == [(2, 4), (1, 4), (2, 4)] and counter.earlier == [0, 0, 1]


# -------------------------------------------------------------------------------------- length-grouped batches


def _batches(order: list[int], size: int) -> list[list[int]]:
    return [order[i : i + size] for i in range(0, len(order) - len(order) % size, size)]


def test_bucket_sampler_batches_one_bucket_and_leaves_random_rows_out() -> None:
    buckets = bucket_lengths(64)
    lengths = [random.Random(i).choice([5, 7, 12, 15, 20, 30, 45, 60]) for i in range(203)]
    torch.manual_seed(0)
    sampler = LengthBucketSampler(lengths, buckets, batch_size=8)
    order = list(sampler)
    assert sorted(order) == list(range(203)) and len(sampler) == 203
    batches = _batches(order, 8)
    mixed = [b for b in batches if len({padded_length(lengths[i], buckets) for i in b}) > 1]
    # Only a batch at the border of two buckets mixes them (one mega-batch of 25 batches here).
    assert len(batches) == 25 and len(mixed) <= 7
    assert max(lengths[i] for i in batches[0]) == 60  # the longest bucket first: out of memory shows at once
    # The 3 rows a drop_last loader leaves out are random, not the tail of one sorted mega-batch.
    left_out = [tuple(sorted(list(LengthBucketSampler(lengths, buckets, 8))[-3:])) for _ in range(5)]
    assert len(set(left_out)) == 5


def _label_entropy(batches: list[list[int]], labels: list[int]) -> float:
    """Mean entropy of the label mix of a batch (ln 3 = 1.10: the three classes in equal parts)."""
    total = 0.0
    for batch in batches:
        counts = Counter(labels[i] for i in batch)
        total -= sum(n / len(batch) * math.log(n / len(batch)) for n in counts.values())
    return total / len(batches)


def test_bucket_grouping_keeps_batches_as_mixed_as_the_padding_allows(tiny_model_dir: Path, sample_data: Path) -> None:
    """In the sample data length says something about the label (10-token texts are mostly neutral, 7-token ones
    mostly positive). transformers' LengthGroupedSampler sorts by exact length and so makes batches of fewer
    classes; grouping by bucket pads exactly as little, with batches of more classes."""
    rows = [json.loads(line) for line in (sample_data / "train.jsonl").read_text().splitlines()]
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    lengths = [len(ids) for ids in tokenizer([row["text"] for row in rows])["input_ids"]]
    labels = [row["label"] for row in rows]
    buckets = bucket_lengths(64)

    def positions(batches: list[list[int]]) -> int:
        return sum(len(b) * padded_length(max(lengths[i] for i in b), buckets) for b in batches)

    ours, theirs = [], []
    mega = min(len(lengths) // (8 * 4), 50)  # transformers' mega-batch for this split, so only the sort key differs
    for seed in range(20):
        torch.manual_seed(seed)
        ours.append(_batches(list(LengthBucketSampler(lengths, buckets, 8, mega_batch_mult=mega)), 8))
        torch.manual_seed(seed)
        theirs.append(_batches(list(LengthGroupedSampler(8, lengths=lengths)), 8))
    assert sum(map(positions, ours)) == sum(map(positions, theirs))
    mixed = sum(_label_entropy(b, labels) for b in ours) / 20
    sorted_ = sum(_label_entropy(b, labels) for b in theirs) / 20
    assert mixed > sorted_ + 0.02, (mixed, sorted_)


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


# ------------------------------------------------------------------------------------- what is learned, end to end

# Issue 25 saw the fast path end 2 epochs with a lower macro-F1 than the seed's padded path (0.17 against 0.31, the
# CPU benchmark's 4 x 256 model at lr 5e-4). Neither had learned anything yet: both train losses were ln 3 = 1.099
# (1.105 and 1.094), and 0.17 and 0.31 are both "almost always one class". Trained until they learn, the two paths
# differ by seed, not by path: on this data these models sit on plateaus (loss 1.10: chance; 0.47: two classes
# merged, macro-F1 0.556) that some seeds leave and others do not. Runs with a final macro-F1 of 0.9 or more:
#   tiny model (2 x 32), batch 8, lr 3e-3, 10 epochs, seeds 0-5:   padded + random 3/6, fast path 5/6
#   2 x 64 (below), batch 8, lr 3e-3, 6 epochs, seeds 0-5, 7, 42:  padded + random 5/8, fast path 8/8
#   the benchmark's 4 x 256, batch 16, lr 1e-3, 4 epochs, seeds 0-3: padded + random 1/4, fast path 3/4
# A real cause of skewed batches was fixed on the way: batches sorted by exact length are sorted by label too in
# this data (test_bucket_grouping_keeps_batches_as_mixed_as_the_padding_allows).


@pytest.fixture(scope="module")
def small_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 layers of 64: the tiny model's architecture with room to learn the sample data in a few epochs."""
    from training_assets.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("small") / "model", hidden_size=64, num_attention_heads=4,
                            intermediate_size=256)  # fmt: skip


@pytest.mark.slow
def test_the_fast_path_learns_as_well_as_the_seeds_padded_path(
    small_model: Path, sample_data: Path, tmp_path: Path
) -> None:
    """Same seed (the default, 42), data, model and hyper-parameters; the seed's path pads to max_seq_length and
    samples at random, the fast path pads to buckets and batches by bucket. Tolerance: the fast path's final
    macro-F1 at most 0.05 below the padded path's (3 of the 60 validation texts) and at least 0.9. One-sided, since
    what is tested is that the fast path does not learn worse: where the padded path stays on a plateau (its result
    depends on the seed, see above), the fast path is still held to 0.9."""

    def run(name: str, padding: str, group: bool) -> float:
        metrics = train(TrainConfig(
            model=str(small_model), dataset=str(sample_data), output_dir=str(tmp_path / name), use_cpu=True, epochs=6,
            per_device_batch_size=8, learning_rate=3e-3, max_seq_length=64, padding=padding, group_by_length=group,
        ))  # fmt: skip
        return float(metrics["epochs"][-1]["eval_macro_f1"])

    padded = run("padded", "max_length", False)
    fast = run("fast", "bucketed", True)
    assert fast >= max(padded - 0.05, 0.9), (fast, padded)


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
@pytest.mark.usefixtures("compile_without_codegen")
def test_the_step_loop_never_reads_the_device(tiny_model_dir: Path, sample_data: Path, tmp_path: Path) -> None:
    """The seed's settings read the token count (.item()) and test the loss for NaN (a Python `if` on a tensor) every
    step; the fast path reads the device only at log time."""
    counter = SyncCounter()
    # The fast path with the optimizer step compiled (the model eager: torch.compile does not call Tensor methods
    # from Python, so patched ones would count nothing inside it).
    config = TrainConfig(
        model=str(tiny_model_dir), dataset=str(sample_data), output_dir=str(tmp_path / "out"), use_cpu=True,
        epochs=2, per_device_batch_size=16, max_seq_length=32, torch_compile=False, compile_optimizer=True,
    )  # fmt: skip
    with counter.patched():
        metrics = train(config, callbacks=[counter])
    assert counter.steps == metrics["optimizer_steps"] == 2 * 15
    assert dict(counter.calls) == {}
    # The learning rate reached the compiled step as a tensor and the Trainer's schedule as floats: a tensor left in
    # param_groups would be read back by Trainer._get_learning_rate (.item()) at every step, counted above.
    assert metrics["optimizer_step"].startswith("compiled") and metrics["compilation"]["steps_that_compiled"] == [1]


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
    meter = ThroughputMeter(warmup_steps=1, samples_per_step=32, counter=counter, use_cuda=True, shape_warmups=2)
    meter.on_epoch_begin(None, None, None)
    for width in (16, 16, 16, 24, 16, 16):
        meter.on_step_begin(None, None, None)
        counter.add(32 * width, 32 * width * width, (32, width))  # 32 texts filling their rows
        meter.on_step_end(None, None, None)
    assert waits == []
    summary = meter.summary(ModelFlops(layers=1, hidden=2, intermediate=4))
    assert waits == [7]  # once, after the last event
    assert summary["measured_steps"] == 5 and summary["train_samples_per_second"] == 64.0
    assert summary["non_padding_tokens_per_second"] == (4 * 32 * 16 + 32 * 24) / 2.5
    assert summary["padding_fraction"] == 0.0
    # Steady: past the warm-up, and the shape ran twice before (compiled, then its CUDA graph recorded): steps 4
    # (a new width) and 2 (16 seen once) are not.
    assert summary["steady_steps"] == 3 and summary["steady_samples_per_second"] == 64.0
    # 6 * N * tokens + 12 * L * d * sum(l**2) with N = 1 * (4 * 2**2 + 2 * 2 * 4) = 32
    steady_tokens, squares = 3 * 32 * 16, 3 * 32 * 16**2
    assert summary["steady_model_tflops_per_second"] == round((6 * 32 * steady_tokens + 24 * squares) / 1.5 / 1e12, 6)


def test_model_flops_of_roberta_base() -> None:
    """12 x 768, feed-forward 3072: 84,934,656 matmul weights (of RoBERTa-base's 124.6M parameters, 38.6M are the
    embedding table); a tweet of 25 tokens costs 6 * N + 12 * 12 * 768 * 25 FLOPs per token to train on."""
    flops = ModelFlops(layers=12, hidden=768, intermediate=3072)
    assert flops.matmul_weights == 84_934_656
    assert flops.per_token(25) == 6 * 84_934_656 + 12 * 12 * 768 * 25
    assert flops.training_flops(tokens=25, squared_lengths=25 * 25) == 25 * flops.per_token(25)


def test_gpu_defaults_are_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(train_config.os, "cpu_count", lambda: 96)
    gpu = train_config.resolve(TrainConfig(), use_cuda=True)
    assert (gpu.torch_compile, gpu.torch_compile_mode, gpu.bf16, gpu.fused_adamw) == (True, "reduce-overhead", True,
                                                                                      True)  # fmt: skip
    assert (gpu.padding, gpu.group_by_length, gpu.dataloader_workers) == ("bucketed", True, 4)
    cpu = train_config.resolve(TrainConfig(), use_cuda=False)
    assert (cpu.torch_compile, cpu.torch_compile_mode, cpu.bf16, cpu.dataloader_workers) == (False, None, False, 0)
    assert gpu.compile_optimizer is True and train_config.optimizer_name(gpu) == "adamw_torch"
    cpu = train_config.resolve(TrainConfig(), use_cuda=False)
    assert (cpu.torch_compile, cpu.torch_compile_mode, cpu.bf16, cpu.dataloader_workers) == (False, None, False, 0)
    assert cpu.compile_optimizer is False and train_config.optimizer_name(cpu) == "adamw_torch_fused"
    seed = train_config.resolve(
        train_config.parse_args(["--no-torch-compile", "--no-bf16", "--no-fused-adamw", "--padding", "max_length",
                                    "--no-group-by-length"]), use_cuda=True)  # fmt: skip
    assert (seed.torch_compile, seed.bf16, seed.fused_adamw, seed.padding) == (False, False, False, "max_length")
    assert seed.compile_optimizer is False and train_config.optimizer_name(seed) == "adamw_torch"
    with pytest.raises(TrainingInputError, match="padding must be one of bucketed, max_length, packed"):
        TrainConfig(padding="longest")


def test_the_trainer_gets_the_gpu_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the Trainer receives with a GPU: CUDA graphs, the plain AdamW for the compiled step, worker processes
    collating into pinned memory with non-blocking copies, no per-step token count or NaN check; on CPU no pinning
    (nothing to copy to) and no workers."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(train_config.os, "cpu_count", lambda: 16)
    gpu = train_config.trainer_settings(train_config.resolve(TrainConfig(), True), use_cuda=True,
                                           distributed=False)  # fmt: skip
    fast = {"torch_compile": True, "torch_compile_mode": "reduce-overhead", "optim": "adamw_torch", "bf16": True}
    assert {key: gpu[key] for key in fast} == fast
    assert gpu["dataloader_num_workers"] == 4 and gpu["dataloader_pin_memory"] is True
    assert gpu["dataloader_persistent_workers"] is True and gpu["accelerator_config"] == {"non_blocking": True}
    assert gpu["include_num_input_tokens_seen"] == "no" and gpu["logging_nan_inf_filter"] is False
    assert gpu["train_sampling_strategy"] == "group_by_length" and gpu["dataloader_drop_last"] is True
    cpu = train_config.trainer_settings(train_config.resolve(TrainConfig(), False), use_cuda=False,
                                           distributed=False)  # fmt: skip
    assert (cpu["dataloader_num_workers"], cpu["dataloader_pin_memory"], cpu["torch_compile"]) == (0, False, False)


def test_the_sync_check_is_on_for_steady_steps_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """set_sync_debug_mode("error") from a steady step's forward pass on, off for steps that compile or record a
    CUDA graph and before a log line, an evaluation or the end of an epoch."""
    modes: list[tuple[int, str]] = []
    counter = TokenCounter()
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: modes.append((len(counter.shapes), mode)))
    meter = ThroughputMeter(warmup_steps=1, samples_per_step=8, counter=counter, use_cuda=False, shape_warmups=2)
    check = SyncCheck("error", meter)
    quiet = type("Control", (), {"should_log": False, "should_evaluate": False, "should_save": False,
                                 "should_training_stop": False})()  # fmt: skip
    logs = type("Control", (), {**vars(type(quiet)), "should_log": True})()
    widths = (16, 16, 16, 16, 24, 24, 24, 16)
    for step, width in enumerate(widths, start=1):
        counter.add(8 * width, 8 * width * width, (8, width))
        check.step_starts(len(counter.shapes) - 1)
        check.on_step_end(None, None, logs if step == 4 else quiet)
    check.on_epoch_end(None, None, quiet)
    # On at step 3 (16 seen twice before), off after step 4 (it logs), off at 5 and 6 (24 is new, then seen once),
    # on at 7, off at the end of the epoch.
    assert modes == [(3, "error"), (4, "default"), (7, "error"), (8, "default")]
    assert check.steps_checked == 4  # steps 3, 4, 7, 8


def test_the_sync_check_needs_a_gpu(tiny_model_dir: Path, sample_data: Path, tmp_path: Path) -> None:
    with pytest.raises(TrainingInputError, match="--sync-debug error needs a GPU"):
        train(TrainConfig(model=str(tiny_model_dir), dataset=str(sample_data), output_dir=str(tmp_path),
                          use_cpu=True, sync_debug="error"))  # fmt: skip


# ------------------------------------------------------------------------------- one graph per bucket length


def _texts_of_many_lengths(sample_data: Path, folder: Path) -> Path:
    """The sample texts alone or two joined: lengths from 7 to ~20 tokens, so batches fall into three buckets (each
    further one is another graph to compile)."""
    rows = [json.loads(line) for line in (sample_data / "train.jsonl").read_text().splitlines()]
    rng = random.Random(7)
    folder.mkdir(parents=True)
    for split, count in (("train", 64), ("validation", 8)):
        picked = [rng.sample(rows, rng.choice([1, 1, 2])) for _ in range(count)]
        lines = [
            json.dumps({"text": " ".join(r["text"] for r in group), "label": group[0]["label"]}) for group in picked
        ]
        (folder / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    return folder


@pytest.mark.slow
@pytest.mark.usefixtures("compile_without_codegen")
def test_compile_builds_one_graph_per_bucket_length_and_the_optimizer_step_once(
    tiny_model_dir: Path, sample_data: Path, tmp_path: Path
) -> None:
    """With torch.compile every bucket length is one static graph, compiled in the first step of that length and
    never again; the optimizer step is compiled in step 1 and reused although the learning rate changes every step.
    It fails if TorchDynamo generalises to dynamic shapes (a third length would then compile nothing), if the
    learning rate were a new constant each step (a recompile per step, then eager after 8), or if anything else
    recompiles mid-run."""
    data = _texts_of_many_lengths(sample_data, tmp_path / "data")
    metrics = train(TrainConfig(
        model=str(tiny_model_dir), dataset=str(data), output_dir=str(tmp_path / "out"), use_cpu=True, epochs=2,
        per_device_batch_size=8, learning_rate=5e-3, max_seq_length=64, torch_compile=True,
    ))  # fmt: skip
    compilation = metrics["compilation"]
    # Three lengths at least: with dynamic shapes the second would compile one graph for all, the third nothing.
    assert len(metrics["padding"]["steps_per_length"]) >= 3
    assert compilation["steps_that_compiled"] == compilation["first_steps_of_each_shape"]
    assert metrics["optimizer_step"].startswith("compiled") and metrics["cuda_graphs"] is False  # no CUDA on CPU
    # Steady: every step but the compiling ones (step 1, compiling too, is the warm-up step).
    assert metrics["throughput"]["steady_steps"] == 2 * 8 - len(compilation["steps_that_compiled"])
    # The compile bound of the collectives held for the compiling steps (and the next ones), not for the whole run.
    compiled = len(compilation["steps_that_compiled"])
    assert len(compilation["host_seconds_of_steps_that_compiled"]) == compiled
    assert compiled <= compilation["steps_under_compile_timeout"] < 2 * 8
