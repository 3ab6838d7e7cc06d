"""Data that scales and a schedule that does not change with the node count: a node's processes tokenize once
(data_staging.py), and the same settings run the same global batch at the same learning rate on one process or two
(batch_scaling.py), as metrics.json reports."""

from __future__ import annotations

import json
import pickle
import subprocess
from pathlib import Path

import pytest

from tests.training_assets.warm_python import WarmPython
from training_assets.instance import batch_scaling, data_staging
from training_assets.instance.dataset import Split, TrainingInputError
from training_assets.instance.train_config import TrainConfig
from training_assets.instance.train_sentiment import train

ROOT = Path(__file__).resolve().parents[2]
MODULE = "training_assets.instance.train_sentiment"
# 240 rows, a global batch of 16: 15 optimizer steps per epoch whatever the process count; the loss and learning
# rate logged at every step.
SETTINGS = {"epochs": 1, "global_batch_size": 16, "learning_rate": 5e-3, "max_seq_length": 32, "logging_steps": 1}


def test_a_fixed_global_batch_is_shared_equally_by_the_devices() -> None:
    config = TrainConfig(global_batch_size=256, per_device_batch_size=32)
    for devices, per_device in ((1, 256), (8, 32), (16, 16)):
        plan = batch_scaling.schedule(config, devices)
        assert (plan.global_batch, plan.per_device_batch_size, plan.learning_rate) == (
            256,
            per_device,
            config.learning_rate,
        )
        assert plan.rule == "fixed global batch"
    with pytest.raises(TrainingInputError, match=r"^global_batch_size 256 must be a multiple of the 24 devices"):
        batch_scaling.schedule(config, 24)


def test_linear_scaling_multiplies_the_learning_rate_by_global_over_reference_batch() -> None:
    config = TrainConfig(per_device_batch_size=32, lr_scaling="linear")  # reference: 32, one GPU's batch
    one, eight, sixteen = (batch_scaling.schedule(config, devices) for devices in (1, 8, 16))
    rate = config.learning_rate
    assert [p.global_batch for p in (one, eight, sixteen)] == [32, 256, 512]
    assert [p.learning_rate for p in (one, eight, sixteen)] == pytest.approx([rate, rate * 8, rate * 16])
    assert sixteen.rule == f"linear: {rate} x 512 / 32"
    unscaled = batch_scaling.schedule(TrainConfig(per_device_batch_size=32), 16)
    assert (unscaled.global_batch, unscaled.learning_rate, unscaled.rule) == (512, rate, "per-device batch")


def test_the_tokens_folder_changes_with_anything_the_tokens_depend_on(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    splits = {"train": Split("train", ["good", "bad"], [2, 0])}
    key = data_staging.fingerprint(splits, tokenizer, 32)
    assert data_staging.fingerprint(splits, tokenizer, 32) == key
    assert data_staging.fingerprint(splits, tokenizer, 64) != key
    assert data_staging.fingerprint({"train": Split("train", ["good", "bad!"], [2, 0])}, tokenizer, 32) != key
    assert data_staging.fingerprint({"train": Split("train", ["goodb", "ad"], [2, 0])}, tokenizer, 32) != key
    assert data_staging.fingerprint({"train": Split("train", ["good", "bad"], [2, 1])}, tokenizer, 32) != key


def test_saved_tokens_read_back_as_the_rows_tokenized(tmp_path: Path) -> None:
    """What a node's other processes map (read-only arrays) is what the first one tokenized, row for row, and
    survives the pickling a DataLoader worker that is not forked gets."""
    splits = {"train": Split("train", ["a b c", "", "d"], [1, 0, 2]), "validation": Split("validation", ["e f"], [0])}
    words = {word: i for i, word in enumerate("abcdef", start=5)}

    def tokenize(texts: list[str]) -> list[list[int]]:
        return [[0, *(words[word] for word in text.split()), 2] for text in texts]

    first = data_staging.tokenize_once_per_node(splits, tokenize, folder=tmp_path, key="k")
    again = data_staging.tokenize_once_per_node(splits, lambda texts: pytest.fail("tokenized twice"),
                                                folder=tmp_path, key="k")  # fmt: skip
    in_memory = data_staging.tokenize_once_per_node(splits, tokenize, folder=None, key="k")
    for tokens in (first, again, in_memory):
        rows = tokens["train"].input_ids
        assert [rows[i] for i in range(len(rows))] == [[0, 5, 6, 7, 2], [0, 2], [0, 8, 2]]
        assert rows.lengths() == [5, 2, 3] and rows[-1] == [0, 8, 2]
        assert tokens["train"].labels == [1, 0, 2] and list(tokens["validation"].input_ids) == [[0, 9, 10, 2]]
    assert sorted(path.name for path in (tmp_path / "k").iterdir()) == [data_staging.DONE, "train", "validation"]
    assert pickle.loads(pickle.dumps(again["train"].input_ids))[0] == [0, 5, 6, 7, 2]


@pytest.mark.slow
def test_two_processes_tokenize_once_and_learn_on_the_schedule_of_one(
    tiny_model_dir: Path, sample_data: Path, tmp_path: Path, warm_python: WarmPython
) -> None:
    tokens = tmp_path / "tokens"
    arguments = [f"--{key.replace('_', '-')}={value}" for key, value in SETTINGS.items()]
    result = subprocess.run(
        [warm_python.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
         "--module", MODULE, "--model", str(tiny_model_dir), "--dataset", str(sample_data),
         "--output-dir", str(tmp_path / "two"), "--tokenized-dir", str(tokens), "--use-cpu", *arguments],
        cwd=tmp_path, env=warm_python.env(), capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    # Two processes of one node: one tokenized (and said so), both trained on the saved arrays.
    assert result.stderr.count("data_staging: tokenized 240 train, 60 validation rows once for this node") == 1
    (saved,) = [path for path in tokens.iterdir() if path.is_dir()]
    assert (saved / data_staging.DONE).is_file()

    two = json.loads((tmp_path / "two" / "metrics.json").read_text())["batch"]
    one = train(TrainConfig(model=str(tiny_model_dir), dataset=str(sample_data), output_dir=str(tmp_path / "one"),
                            tokenized_dir=str(tokens), use_cpu=True, **SETTINGS))["batch"]  # fmt: skip
    assert (one["devices"], one["per_device_batch_size"], two["devices"], two["per_device_batch_size"]) == (1, 16, 2, 8)
    same = ("global_batch", "learning_rate", "base_learning_rate", "lr_scaling", "rule", "learning_rate_log")
    assert {key: one[key] for key in same} == {key: two[key] for key in same}
    assert one["global_batch"] == 16 and len(one["learning_rate_log"]) == 15  # one optimizer step per logged row
    assert one["learning_rate_log"][0] == {"step": 1, "learning_rate": 5e-3}  # linear decay from the base rate
