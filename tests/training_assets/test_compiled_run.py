"""The training script's CLI with TorchInductor for real: a compiled CPU fine-tune (the model and the fused AdamW step),
what it reports and the model it saves. Its own module, so the scheduler (tests/conftest.py) knows its cost apart from
the quick bad-input tests of test_train_sentiment.py: on a fresh clone TorchInductor's cache is empty and the compile
is most of the module's time."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from inference_assets.container.predictor import SentimentPredictor
from tests.training_assets.warm_python import WarmPython
from training_assets.instance.batching import SMALLEST_BUCKET
from training_assets.tiny_model import build_tiny_model

pytestmark = pytest.mark.slow

MODULE = "training_assets.instance.train_sentiment"
# Hyper-parameters with which the tiny model learns the short sample texts in a few epochs.
FAST = ["--per-device-batch-size", "8", "--learning-rate", "5e-3", "--max-seq-length", "32"]
COMPILED_EPOCHS = 6


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def one_layer_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny RoBERTa with one encoder layer instead of two: the same kinds of kernels (embeddings, attention,
    feed-forward, classifier, their backward, the optimizer step over every parameter), fewer to build on an empty
    TorchInductor cache (22 C++ kernels instead of 26, an optimizer step over 25 tensors instead of 41): this module
    took 59 CPU-s instead of 78 cold (pytest -n 0 under a child subreaper, load 6)."""
    return build_tiny_model(tmp_path_factory.mktemp("one-layer") / "model", num_hidden_layers=1)


@pytest.fixture(scope="module")
def one_bucket_data(one_layer_model: Path, sample_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample texts of at most the smallest bucket's tokens, whole batches of training ones: every training batch
    pads to that one bucket, so TorchInductor compiles the training step for one shape (each further shape took ~25
    more C++ kernels, ~25 CPU-seconds here). That each bucket length compiles once, and only then, is TorchDynamo's
    decision, tested on texts of several lengths in test_fast_path."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(one_layer_model)
    folder = tmp_path_factory.mktemp("one-bucket")
    for split in ("train", "validation"):
        rows = [row for row in _rows(sample_data / f"{split}.jsonl")
                if len(tokenizer(row["text"])["input_ids"]) <= SMALLEST_BUCKET]  # fmt: skip
        if split == "train":
            rows = rows[: len(rows) // 8 * 8]
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


@pytest.fixture(scope="module")
def compiled_run(
    one_layer_model: Path, one_bucket_data: Path, tmp_path_factory: pytest.TempPathFactory, warm_python: WarmPython
) -> Path:
    """One CLI run with torch.compile and fused AdamW on; the tests below inspect what it left."""
    output = tmp_path_factory.mktemp("compiled")
    arguments = ["-m", MODULE, "--model", str(one_layer_model), "--dataset", str(one_bucket_data),
                 "--output-dir", str(output), "--torch-compile", "--fused-adamw", "--use-cpu", *FAST,
                 "--epochs", str(COMPILED_EPOCHS)]  # fmt: skip
    # ``python -m`` from outside the repository: the warm interpreter has the repository on its import path.
    result = subprocess.run([warm_python.executable, *arguments], check=False, cwd=tmp_path_factory.getbasetemp(),
                            env=warm_python.env(), capture_output=True, text=True, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    return output


def test_compiled_run_learns_and_reports_every_epoch(compiled_run: Path) -> None:
    metrics = json.loads((compiled_run / "metrics.json").read_text())
    assert metrics["config"]["torch_compile"] and metrics["config"]["fused_adamw"] and not metrics["config"]["bf16"]
    # TorchInductor for real: the optimizer step compiled with the model, each batch shape compiled once.
    assert metrics["optimizer_step"].startswith("compiled")
    assert metrics["compilation"]["steps_that_compiled"] == metrics["compilation"]["first_steps_of_each_shape"]
    assert list(metrics["padding"]["steps_per_length"]) == [str(SMALLEST_BUCKET)]  # one shape: one_bucket_data's
    epochs = metrics["epochs"]
    assert [row["epoch"] for row in epochs] == [float(epoch) for epoch in range(1, COMPILED_EPOCHS + 1)]
    assert epochs[-1]["train_loss"] < epochs[0]["train_loss"]
    assert epochs[-1]["eval_loss"] < epochs[0]["eval_loss"]
    for row in epochs:
        assert 0.0 <= row["eval_accuracy"] <= 1.0 and 0.0 <= row["eval_macro_f1"] <= 1.0


def test_throughput_excludes_the_compile_warmup(compiled_run: Path, one_bucket_data: Path) -> None:
    throughput = json.loads((compiled_run / "metrics.json").read_text())["throughput"]
    steps_per_epoch = len(_rows(one_bucket_data / "train.jsonl")) // 8
    assert throughput["warmup_steps"] == 1
    assert throughput["measured_steps"] == COMPILED_EPOCHS * steps_per_epoch - 1
    assert throughput["samples_per_step"] == 8
    assert throughput["train_samples_per_second"] == pytest.approx(
        throughput["measured_steps"] * 8 / throughput["measured_seconds"], rel=1e-3
    )
    # Non-padding tokens: more than the two special tokens per sample, fewer than the padded length.
    tokens_per_sample = throughput["non_padding_tokens_per_second"] / throughput["train_samples_per_second"]
    assert 2 < tokens_per_sample < 32
    # Bucketed padding (the default): positions computed per sample stay well under max_seq_length.
    assert throughput["positions_per_second"] / throughput["train_samples_per_second"] < 16
    assert 0 < throughput["padding_fraction"] <= 0.4
    assert throughput["warmup_seconds"] >= throughput["compile_warmup_seconds"] >= 0


def test_saved_model_reloads_and_predicts_like_the_trained_one(compiled_run: Path, one_bucket_data: Path) -> None:
    saved = compiled_run / "saved_model"
    assert (saved / "model.safetensors").is_file() and (saved / "tokenizer.json").is_file()
    assert not list(saved.glob("*.bin")), "weights must be safetensors, and no pickled training args"
    predictor = SentimentPredictor(saved)
    rows = _rows(one_bucket_data / "validation.jsonl")
    predictions = predictor.predict([row["text"] for row in rows])
    assert {p.label for p in predictions} <= {"negative", "neutral", "positive"}
    correct = sum(p.label == predictor.labels[row["label"]] for p, row in zip(predictions, rows, strict=True))
    accuracy = correct / len(rows)
    reported = json.loads((compiled_run / "metrics.json").read_text())["epochs"][-1]["eval_accuracy"]
    assert accuracy == pytest.approx(reported, abs=1.5 / len(rows))
