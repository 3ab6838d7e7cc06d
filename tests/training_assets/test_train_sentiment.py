"""The training script for real: every bad input and the CLI (the compiled CPU fine-tune: test_compiled_run.py; two
processes: test_many_ranks.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.training_assets.warm_python import WarmPython
from training_assets.instance import hardware, train_config, train_sentiment
from training_assets.instance.dataset import TrainingInputError
from training_assets.instance.train_config import TrainConfig
from training_assets.instance.train_sentiment import train

ROOT = Path(__file__).resolve().parents[2]
MODULE = "training_assets.instance.train_sentiment"
TRAIN_ROWS = 240


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _run(python: WarmPython, arguments: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``python <arguments>``, with the repository on the import path as ``python -m`` from its root would have it
    (the tests run elsewhere)."""
    return subprocess.run([python.executable, *arguments], check=False, cwd=cwd, env=python.env(), capture_output=True,
                          text=True, timeout=600)  # fmt: skip


# ------------------------------------------------------------------------------------------------------ bad input


def _write(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture()
def data_dir(tmp_path: Path, sample_data: Path) -> Path:
    folder = tmp_path / "data"
    shutil.copytree(sample_data, folder)
    return folder


def _config(model: Path, dataset: Path, **overrides) -> TrainConfig:
    settings = {"use_cpu": True, **overrides}
    return TrainConfig(model=str(model), dataset=str(dataset), output_dir=str(dataset.parent / "out"), **settings)


def test_missing_dataset_folder(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(TrainingInputError, match=r"nowhere: no such dataset folder"):
        train(_config(tiny_model_dir, tmp_path / "nowhere"))


def test_missing_split_file(tiny_model_dir: Path, data_dir: Path) -> None:
    (data_dir / "validation.jsonl").unlink()
    with pytest.raises(TrainingInputError, match=r"data: no validation split: expected one of validation.jsonl"):
        train(_config(tiny_model_dir, data_dir))


def test_missing_model_directory(data_dir: Path) -> None:
    with pytest.raises(TrainingInputError, match=r"model directory .*no-model does not exist"):
        train(_config(data_dir.parent / "no-model", data_dir))


def test_model_directory_without_config(data_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "empty-model").mkdir()
    with pytest.raises(TrainingInputError, match=r"has no config.json"):
        train(_config(tmp_path / "empty-model", data_dir))


def test_label_outside_the_label_set(tiny_model_dir: Path, data_dir: Path) -> None:
    rows = _rows(data_dir / "train.jsonl")
    rows[6]["label"] = 5
    _write(data_dir / "train.jsonl", rows)
    with pytest.raises(
        TrainingInputError,
        match=r"train.jsonl, row 7: label 5 is outside the label set; allowed: "
        r"0 \(negative\), 1 \(neutral\), 2 \(positive\)$",
    ):
        train(_config(tiny_model_dir, data_dir))


def test_unknown_label_name_in_csv(tiny_model_dir: Path, data_dir: Path) -> None:
    (data_dir / "validation.jsonl").unlink()
    (data_dir / "validation.csv").write_text("text,label\nnice day,positive\nawful day,furious\n")
    message = r"validation.csv, row 2 \(line 3\): label 'furious' is neither an ASCII integer id"
    with pytest.raises(TrainingInputError, match=message):
        train(_config(tiny_model_dir, data_dir))


def test_empty_dataset(tiny_model_dir: Path, data_dir: Path) -> None:
    (data_dir / "train.jsonl").write_text("")
    with pytest.raises(TrainingInputError, match=r"train.jsonl: empty: the split needs at least one row"):
        train(_config(tiny_model_dir, data_dir))


def test_line_that_is_not_a_json_object(tiny_model_dir: Path, data_dir: Path) -> None:
    (data_dir / "train.jsonl").write_text('{"text": "fine", "label": 1}\n["not", "an", "object"]\n')
    with pytest.raises(TrainingInputError, match=r"train.jsonl, row 2: not a JSON object \(got list\)"):
        train(_config(tiny_model_dir, data_dir))


def test_saved_to_disk_dataset_without_validation_split(tiny_model_dir: Path, tmp_path: Path) -> None:
    import datasets

    split = datasets.Dataset.from_dict({"text": ["a"], "label": [0]})
    datasets.DatasetDict(train=split, test=split).save_to_disk(str(tmp_path / "disk"))
    with pytest.raises(TrainingInputError, match=r"has splits \['train', 'test'\]; it needs train, validation"):
        train(_config(tiny_model_dir, tmp_path / "disk"))


def test_row_without_text(tiny_model_dir: Path, data_dir: Path) -> None:
    _write(data_dir / "validation.jsonl", [{"text": "fine", "label": 1}, {"text": "  ", "label": 0}])
    with pytest.raises(TrainingInputError, match=r"validation.jsonl, row 2: no text \(got '  '\)"):
        train(_config(tiny_model_dir, data_dir))


def test_bf16_on_a_gpu_without_it(tiny_model_dir: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla V100-SXM2-16GB")
    config = _config(tiny_model_dir, data_dir, bf16=True, use_cpu=False)
    message = r"--bf16 needs a GPU with native bfloat16.*Tesla V100-SXM2-16GB has 7.0"
    with pytest.raises(TrainingInputError, match=message):
        train(config)


def test_bf16_on_a_cpu_without_it(tiny_model_dir: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hardware, "cpu_flags", lambda: {"sse4_2", "avx2"})
    with pytest.raises(TrainingInputError, match=r"--bf16 needs native bfloat16 on this CPU"):
        train(_config(tiny_model_dir, data_dir, bf16=True))


@pytest.mark.slow
def test_fewer_rows_than_one_global_batch_still_trains(tiny_model_dir: Path, data_dir: Path) -> None:
    metrics = train(_config(tiny_model_dir, data_dir, per_device_batch_size=256, max_seq_length=32, epochs=2))
    assert metrics["optimizer_steps"] == 2  # one partial batch of all 240 rows per epoch
    assert metrics["throughput"]["measured"] and metrics["throughput"]["samples_per_step"] == 240
    assert "the train split has 240 row(s), fewer than one global batch of 256" in metrics["warnings"][0]


def test_saved_to_disk_dataset_with_other_label_names(tiny_model_dir: Path, tmp_path: Path) -> None:
    import datasets

    features = datasets.Features(
        {"text": datasets.Value("string"), "label": datasets.ClassLabel(names=["bad", "meh", "good"])}
    )
    split = datasets.Dataset.from_dict({"text": ["a", "b"], "label": [0, 2]}, features=features)
    datasets.DatasetDict(train=split, validation=split).save_to_disk(str(tmp_path / "disk"))
    with pytest.raises(TrainingInputError, match=r"label names \['bad', 'meh', 'good'\] differ from the label set"):
        train(_config(tiny_model_dir, tmp_path / "disk"))


def _load_splits(config: TrainConfig) -> dict[str, object]:
    """The checked splits as ``datasets.Dataset`` objects (training itself reads them without the package)."""
    import datasets

    splits = train_sentiment.read_config_splits(config).items()
    return {name: datasets.Dataset.from_dict({"text": split.texts, "label": split.labels}) for name, split in splits}


def test_csv_and_saved_to_disk_inputs_load(tmp_path: Path) -> None:
    import datasets

    csv_dir = tmp_path / "csv"
    csv_dir.mkdir()
    for split in ("train", "validation"):
        (csv_dir / f"{split}.csv").write_text('text,label\n"good, really",positive\nmeh,1\nawful,0\n')
    splits = _load_splits(TrainConfig(dataset=str(csv_dir)))
    assert splits["train"]["text"] == ["good, really", "meh", "awful"] and splits["train"]["label"] == [2, 1, 0]

    datasets.DatasetDict({name: splits[name] for name in splits}).save_to_disk(str(tmp_path / "disk"))
    reloaded = _load_splits(TrainConfig(dataset=str(tmp_path / "disk")))
    assert reloaded["validation"]["label"] == [2, 1, 0]


def test_cli_prints_the_error_and_exits_2(tiny_model_dir: Path, tmp_path: Path, warm_python: WarmPython) -> None:
    result = _run(
        warm_python,
        [
            "-m",
            MODULE,
            "--model",
            str(tiny_model_dir),
            "--dataset",
            str(tmp_path / "none"),
            "--output-dir",
            str(tmp_path / "out"),
        ],
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("train_sentiment: error: ") and "no such dataset folder" in result.stderr
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_cli_flags_map_onto_the_config() -> None:
    config = train_config.parse_args(
        [
            "--torch-compile",
            "--bf16",
            "--no-fused-adamw",
            "--labels",
            "neg, pos",
            "--epochs",
            "2",
            "--dataset",
            "cardiffnlp/tweet_eval",
        ]
    )
    assert (config.torch_compile, config.bf16, config.fused_adamw) == (True, True, False)
    assert config.labels == ("neg", "pos") and config.epochs == 2 and config.dataset_config == "sentiment"
    with pytest.raises(TrainingInputError, match="learning_rate must be between 0 and 1"):
        train_config.parse_args(["--learning-rate", "3"])


@pytest.mark.parametrize("seed", range(6))
def test_metrics_agree_with_scikit_learn(seed: int) -> None:
    """The script's accuracy and macro-F1 are scikit-learn's, also where a class occurs only in the labels or only in
    the predictions, or not at all."""
    import numpy as np
    from sklearn.metrics import accuracy_score, f1_score, log_loss

    rng = np.random.default_rng(seed)
    size, classes = int(rng.integers(1, 40)), 3
    labels = rng.integers(0, classes - (seed % 2), size)  # odd seeds: the last class never in the labels
    logits = rng.normal(size=(size, classes))
    if seed == 4:
        logits[:, 1] = -10  # class 1 never predicted
    predicted = logits.argmax(axis=-1)
    metrics = train_sentiment.compute_metrics(type("Prediction", (), {"predictions": logits, "label_ids": labels}))
    assert metrics["accuracy"] == pytest.approx(accuracy_score(labels, predicted))
    assert metrics["macro_f1"] == pytest.approx(f1_score(labels, predicted, average="macro", zero_division=0))
    probabilities = np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)
    assert metrics["cross_entropy"] == pytest.approx(log_loss(labels, probabilities, labels=range(classes)))


def test_cross_entropy_stays_finite_for_large_logits() -> None:
    """Logits of a confident model in the thousands (exp overflows past 709): a loss near 0 for the right class and
    the logit gap for the wrong one, as the classification head's log-softmax gives, not inf or nan."""
    import numpy as np

    logits = np.array([[1000.0, 0.0, -5.0], [0.0, 800.0, 0.0]])
    assert train_sentiment.cross_entropy(logits, np.array([0, 1])) == pytest.approx(0.0, abs=1e-9)
    assert train_sentiment.cross_entropy(logits[:1], np.array([1])) == pytest.approx(1000.0)


@pytest.mark.parametrize(("model_type", "limit"), [("roberta", 64), ("xlm-roberta", 64), ("bert", 66)])
def test_texts_are_cut_to_the_positions_the_model_has(model_type: str, limit: int) -> None:
    """A tokenizer that claims no limit of its own (model_max_length 1e30, as hub tokenizers without one do): the
    texts are cut to the position embeddings, less RoBERTa's two reserved positions (a 66th token would index past
    the table and fail the first batch that holds it)."""
    from types import SimpleNamespace

    model = SimpleNamespace(max_position_embeddings=66, model_type=model_type)
    assert train_sentiment._position_limit(model, SimpleNamespace(model_max_length=int(1e30))) == limit
    assert train_sentiment._position_limit(model, SimpleNamespace(model_max_length=32)) == 32


def test_a_row_carries_the_padded_length_of_its_global_batch() -> None:
    """Each rank pads its share of a global batch to that batch's bucket, also a row shorter or longer than it."""
    from training_assets.instance.batching import PaddedIndex

    split = train_sentiment.TokenizedSplit([[5] * 3, [5] * 20], [0, 1])
    assert split[PaddedIndex(0, 24)] == {"input_ids": [5] * 3, "label": 0, "padded_length": 24}
    assert split[PaddedIndex(1, 16)]["padded_length"] == 16
    assert "padded_length" not in split[1]
