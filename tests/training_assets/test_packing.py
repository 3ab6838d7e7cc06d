"""Packed batches (--padding packed): several texts per row, attention kept inside each text, learn exactly what the
padded batches learn, with padding near zero."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

from inference_assets.container.predictor import SentimentPredictor
from training_assets.instance.batching import BucketCollator, bucket_lengths
from training_assets.instance.dataset import TrainingInputError
from training_assets.instance.packing import (
    AlignedPackingSampler,
    PackedClassifier,
    PackedIndex,
    PackingCollator,
    check_packable,
    pack_rows,
)
from training_assets.instance.train_config import TrainConfig
from training_assets.instance.train_sentiment import train

# float32 on CPU: the packed and padded passes do the same sums over the same tokens (masked scores add exact
# zeros), measured equal to the last bit here; the tolerance leaves room for another CPU's kernels.
TOLERANCE = 1e-5


def test_rows_hold_every_text_once_and_none_overflows() -> None:
    rng = random.Random(0)
    sizes = [rng.randint(3, 40) for _ in range(300)]
    rows = pack_rows(sizes, 64)
    assert sorted(i for row in rows for i in row) == list(range(300))
    assert max(sum(sizes[i] for i in row) for row in rows) <= 64
    assert len(rows) <= -(-sum(sizes) // 64) + 2  # first-fit decreasing: within a row or two of the bound
    with pytest.raises(ValueError, match="a text of 65 tokens does not fit a row of 64"):
        pack_rows([65], 64)


@pytest.fixture(scope="module")
def texts(tiny_model_dir: Path, sample_data: Path) -> list[dict]:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = [json.loads(line) for line in (sample_data / "train.jsonl").read_text().splitlines()[:48]]
    return [{"input_ids": tokenizer(row["text"])["input_ids"], "label": row["label"]} for row in rows]


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_a_packed_batch_gives_the_loss_and_gradients_of_the_padded_batch(
    tiny_model_dir: Path, texts: list[dict], attention: str
) -> None:
    # Larger random weights than the tiny model's (initializer range 0.02): outputs that depend on the text strongly,
    # so the comparison would see one text's attention reaching another's.
    config = AutoConfig.from_pretrained(tiny_model_dir, attn_implementation=attention, initializer_range=0.5)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config)
    model.eval()  # dropout off: the two passes must see the same network
    padded = BucketCollator(pad_token_id=1, buckets=bucket_lengths(64))(texts)
    packed = PackingCollator(pad_token_id=1, width=64)(texts)
    assert packed["input_ids"].shape[0] < len(texts) // 4  # really packed: several texts per row
    assert packed.pop("token_counts") == padded.pop("token_counts")

    def loss_and_gradients(batch: dict, forward: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor, list]:
        model.zero_grad()
        output = forward(**batch)
        output.loss.backward()
        return output.loss.detach(), output.logits.detach(), [p.grad.clone() for p in model.parameters()]

    loss, logits, gradients = loss_and_gradients(padded, model)
    packed_loss, packed_logits, packed_gradients = loss_and_gradients(packed, PackedClassifier(model))
    assert packed_loss.item() == pytest.approx(loss.item(), abs=TOLERANCE)
    assert torch.allclose(packed_logits, logits, atol=TOLERANCE)  # per text, in the input order
    assert all(torch.allclose(a, b, atol=TOLERANCE) for a, b in zip(packed_gradients, gradients, strict=True))

    # The mask is what keeps the texts apart: letting the texts of a row see each other changes the logits.
    leaky = {**packed, "segment_ids": (packed["segment_ids"] > 0).long()}
    _, leaky_logits, _ = loss_and_gradients(leaky, PackedClassifier(model))
    assert (leaky_logits - logits).abs().max() > 1000 * TOLERANCE


def test_every_batch_of_a_step_packs_into_the_rows_of_its_fullest_batch(
    tiny_model_dir: Path, texts: list[dict]
) -> None:
    """Two ranks of 8 texts per step (a global batch of 16): each index carries the most rows either rank's texts
    pack into; the collator adds empty rows up to it, which change neither the loss nor the logits."""
    lengths = [len(text["input_ids"]) for text in texts]
    order = list(range(len(texts)))[::-1]
    sampler = AlignedPackingSampler(order, lengths, width=32, per_device_batch=8, global_batch=16)
    indices = list(sampler)
    assert indices == order and len(sampler) == len(texts)
    for start in range(0, 48, 16):
        own = [len(pack_rows([lengths[i] for i in order[first : first + 8]], 32)) for first in (start, start + 8)]
        assert {index.rows for index in indices[start : start + 16] if isinstance(index, PackedIndex)} == {max(own)}
    collate = PackingCollator(pad_token_id=1, width=32)
    batch = [texts[i] for i in order[:8]]
    alone = collate(batch)
    widened = collate([{**row, "packed_rows": alone["input_ids"].shape[0] + 2} for row in batch])
    assert widened["input_ids"].shape == (alone["input_ids"].shape[0] + 2, 32)
    assert widened["token_counts"] == alone["token_counts"]
    torch.manual_seed(0)
    model = PackedClassifier(AutoModelForSequenceClassification.from_pretrained(tiny_model_dir)).eval()
    alone.pop("token_counts"), widened.pop("token_counts")
    one, other = model(**alone), model(**widened)
    assert torch.allclose(one.logits, other.logits, atol=TOLERANCE) and one.loss.item() == pytest.approx(
        other.loss.item(), abs=TOLERANCE
    )
    with pytest.raises(ValueError, match="the global batch 12 must be a multiple of the per-device batch 8"):
        AlignedPackingSampler(order, lengths, width=32, per_device_batch=8, global_batch=12)


def test_packing_needs_a_model_that_pools_the_first_token(tiny_model_dir: Path) -> None:
    config = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir).config
    assert check_packable(config) is None
    config.model_type = "bert"
    assert check_packable(config) == "packing needs a roberta or xlm-roberta model, this one is bert"


def _run(model: Path, data: Path, output: Path, padding: str) -> dict:
    # --no-group-by-length: both runs draw the Trainer's random batches, so each step trains on the same texts.
    return train(TrainConfig(model=str(model), dataset=str(data), output_dir=str(output), use_cpu=True, epochs=2,
                             per_device_batch_size=64, learning_rate=5e-3, max_seq_length=64, logging_steps=1,
                             padding=padding, group_by_length=False))  # fmt: skip


@pytest.mark.slow
def test_packed_training_learns_what_padded_training_learns_with_little_padding(
    tiny_model_without_dropout: Path, sample_data: Path, tmp_path: Path
) -> None:
    packed = _run(tiny_model_without_dropout, sample_data, tmp_path / "packed", "packed")
    padded = _run(tiny_model_without_dropout, sample_data, tmp_path / "padded", "bucketed")
    assert len(packed["train_loss_log"]) == len(padded["train_loss_log"]) == 2 * (240 // 64)
    for one, other in zip(packed["train_loss_log"], padded["train_loss_log"], strict=True):
        assert one["loss"] == pytest.approx(other["loss"], abs=TOLERANCE)
        assert one["grad_norm"] == pytest.approx(other["grad_norm"], abs=TOLERANCE)
    assert packed["epochs"][-1]["eval_loss"] == pytest.approx(padded["epochs"][-1]["eval_loss"], abs=1e-4)
    # The bound on the sample data; the padded batches compute about a third padding.
    assert packed["throughput"]["padding_fraction"] <= 0.1 < padded["throughput"]["padding_fraction"]
    assert packed["padding"]["mode"] == "packed" and set(packed["padding"]["steps_per_length"]) == {64}
    # What it saved is the plain model (the packing wrapper holds no weights), which serves as usual.
    assert SentimentPredictor(tmp_path / "packed" / "saved_model").predict("The update is amazing!")[0].label


def test_packing_refuses_a_model_it_cannot_pack(tiny_model_dir: Path, sample_data: Path, tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    for path in tiny_model_dir.iterdir():
        (model / path.name).write_bytes(path.read_bytes())
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "attn_implementation": "flex_attention"}))
    with pytest.raises(TrainingInputError, match="--padding packed: packing needs sdpa or eager attention"):
        train(TrainConfig(model=str(model), dataset=str(sample_data), output_dir=str(tmp_path / "out"), use_cpu=True,
                          padding="packed", epochs=1))  # fmt: skip
