"""Every dataset problem stops the run before training with exit status 2 and one line naming the file, the row and
what is wrong; little data trains with warnings. All data is generated here (no hub access)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import datasets
import pytest

from training_assets.instance import dataset, train_sentiment
from training_assets.instance.dataset import DatasetError, Schema, read_splits
from training_assets.instance.throughput import throughput_summary
from training_assets.instance.train_config import BatchPlan, TrainConfig, batch_plan
from training_assets.instance.train_sentiment import label_warnings

ROOT = Path(__file__).resolve().parents[2]
GOOD_ROWS = [("what a great day", 2), ("it is raining", 1), ("worst update ever", 0)]


def _csv(path: Path, rows: list[list[Any]], *, header: list[str] | None = None, prefix: bytes = b"") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header or ["text", "label"])
        writer.writerows(rows)
    path.write_bytes(prefix + path.read_bytes())
    return path


def _jsonl(path: Path, rows: list[Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    """A good dataset folder: train.csv and validation.jsonl; tests replace one of them with a bad one."""
    data = tmp_path / "data"
    _csv(data / "train.csv", [list(row) for row in GOOD_ROWS])
    _jsonl(data / "validation.jsonl", [{"text": text, "label": label} for text, label in GOOD_ROWS])
    return data


def _refused(folder: Path, pattern: str, schema: Schema | None = None) -> DatasetError:
    with pytest.raises(DatasetError, match=pattern) as caught:
        read_splits(str(folder), None, schema or Schema())
    assert "\n" not in str(caught.value)
    return caught.value


# ----------------------------------------------------------------------------------------------------- encodings


def test_a_utf8_byte_order_mark_is_accepted(folder: Path) -> None:
    # Spreadsheet exports start with a BOM; without handling it the header reads '\ufefftext'.
    _csv(folder / "train.csv", [["café au lait", "positive"]], prefix=b"\xef\xbb\xbf")
    (folder / "validation.jsonl").write_bytes(b"\xef\xbb\xbf" + (folder / "validation.jsonl").read_bytes())
    splits = read_splits(str(folder), None, Schema())
    assert splits["train"].texts == ["café au lait"] and splits["train"].labels == [2]
    assert len(splits["validation"]) == 3


def test_other_encodings_are_refused_with_the_byte_offset(folder: Path) -> None:
    (folder / "train.csv").write_bytes("text,label\ngood,2\ncafé,1\n".encode("latin-1"))
    error = _refused(folder, r"train\.csv, line 3, byte 21: not UTF-8 text \(bytes e9\); save the file as UTF-8")
    assert (folder / "train.csv").read_bytes()[error.byte] == 0xE9


def test_utf16_is_named(folder: Path) -> None:
    (folder / "validation.jsonl").write_bytes('{"text": "a", "label": 1}\n'.encode("utf-16"))
    _refused(folder, r"validation\.jsonl: the file is UTF-16 \(byte-order mark ff fe\); save it as UTF-8")


# ------------------------------------------------------------------------------------------------------- columns


def test_duplicate_csv_columns_are_refused_by_name(folder: Path) -> None:
    _csv(folder / "train.csv", [["a", "1", "b"]], header=["text", "label", "text"])
    _refused(folder, r"train\.csv, line 1: duplicate column\(s\) \['text'\]")


def test_extra_csv_columns_are_refused_by_name(folder: Path) -> None:
    _csv(folder / "train.csv", [["a", "1", "x", "y"]], header=["id", "text", "label", "source"])
    _refused(folder, r"train\.csv, line 1: extra column\(s\) \['id', 'source'\]: only \['text', 'label'\] are read")


def test_missing_csv_column_names_what_the_file_has(folder: Path) -> None:
    _csv(folder / "train.csv", [["a", "1"]], header=["tweet", "label"])
    _refused(folder, r"train\.csv, line 1: missing column\(s\) \['text'\]; it has \['tweet', 'label'\]")


def test_renamed_columns_are_read(folder: Path) -> None:
    _csv(folder / "train.csv", [["a", "positive"]], header=["tweet", "sentiment"])
    _jsonl(folder / "validation.jsonl", [{"tweet": "b", "sentiment": 0}])
    splits = read_splits(str(folder), None, Schema(text_column="tweet", label_column="sentiment"))
    assert splits["train"].labels == [2] and splits["validation"].texts == ["b"]


def test_duplicate_jsonl_keys_are_refused(folder: Path) -> None:
    _jsonl(folder / "validation.jsonl", [{"text": "a", "label": 1}, '{"text": "b", "label": 1, "label": 2}'])
    _refused(folder, r"validation\.jsonl, row 2: duplicate key\(s\) \['label'\]")


def test_extra_jsonl_keys_are_refused(folder: Path) -> None:
    _jsonl(folder / "validation.jsonl", ["", {"text": "a", "label": 1, "score": 0.9}])
    _refused(folder, r"validation\.jsonl, row 1 \(line 2\): extra column\(s\) \['score'\]")


def test_a_row_with_more_fields_than_the_header(folder: Path) -> None:
    (folder / "train.csv").write_text("text,label\ngood,2\nfine, really,1\n")
    _refused(folder, r"train\.csv, row 2 \(line 3\): 3 field\(s\) where the header has 2 \(text, label\)")


def test_broken_csv_quoting(folder: Path) -> None:
    (folder / "train.csv").write_text('text,label\ngood,2\n"never closed,1\n')
    _refused(folder, r"train\.csv, row 2 \(line 3\): not valid CSV")


def test_a_line_that_is_not_json(folder: Path) -> None:
    _jsonl(folder / "validation.jsonl", [{"text": "a", "label": 1}, "{'text': 'b'}"])
    _refused(folder, r"validation\.jsonl, row 2: not a JSON object \(Expecting property name")


# -------------------------------------------------------------------------------------------------------- labels


@pytest.mark.parametrize(
    ("label", "problem"),
    [
        ("²", r"label '²' is neither an ASCII integer id nor a label name"),  # isdigit() but not int()
        ("\u0661", r"label '\u0661' is neither an ASCII integer id nor a label name"),  # int() takes it: 1
        ("1.0", r"label '1\.0' is neither an ASCII integer id nor a label name"),
        ("+1", r"label '\+1' is neither an ASCII integer id nor a label name"),
        ("-1", r"label '-1' is neither an ASCII integer id nor a label name"),
        ("Positive", r"label 'Positive' is neither an ASCII integer id nor a label name"),
        ("", r"label '' is neither an ASCII integer id nor a label name"),
        ("3", r"label 3 is outside the label set"),
    ],
)
def test_csv_labels_are_parsed_strictly(folder: Path, label: str, problem: str) -> None:
    _csv(folder / "train.csv", [["good", "2"], ["text", label]])
    allowed = r"allowed: 0 \(negative\), 1 \(neutral\), 2 \(positive\)"
    _refused(folder, rf"train\.csv, row 2 \(line 3\): {problem}; {allowed}")


@pytest.mark.parametrize(
    ("label", "problem"),
    [
        (True, r"label True is a boolean"),
        (1.0, r"label 1\.0 is a float, not an integer id or a label name"),
        (None, r"label None is a NoneType"),
        ([1], r"label \[1\] is a list"),
        ("²", r"label '²' is neither an ASCII integer id nor a label name"),
        (-1, r"label -1 is outside the label set"),
    ],
)
def test_jsonl_labels_are_parsed_strictly(folder: Path, label: Any, problem: str) -> None:
    _jsonl(folder / "validation.jsonl", [{"text": "a", "label": 0}, {"text": "b", "label": label}])
    _refused(folder, rf"validation\.jsonl, row 2: {problem}")


def test_accepted_label_spellings(folder: Path) -> None:
    _csv(folder / "train.csv", [["a", "0"], ["b", " neutral"], ["c", "2 "], ["d", "positive"]])
    _jsonl(folder / "validation.jsonl", [{"text": "a", "label": 0}, {"text": "b", "label": "1"}])
    splits = read_splits(str(folder), None, Schema())
    assert splits["train"].labels == [0, 1, 2, 2] and splits["validation"].labels == [0, 1]


def test_a_row_without_text(folder: Path) -> None:
    _jsonl(folder / "validation.jsonl", [{"text": "a", "label": 0}, {"text": 42, "label": 1}])
    _refused(folder, r"validation\.jsonl, row 2: no text \(got 42\)")


# ---------------------------------------------------------------------------------------------------- long texts


def test_texts_over_the_csv_field_limit_are_read_and_cut(folder: Path) -> None:
    long_text = "great " * 50_000  # 300,000 characters: over the csv module's default 131,072
    _csv(folder / "train.csv", [[long_text, "positive"], ["short", "0"]])
    limit_before = csv.field_size_limit()
    splits = read_splits(str(folder), None, Schema(max_text_chars=4096))
    assert csv.field_size_limit() == limit_before, "the raised limit is put back"
    assert [len(text) for text in splits["train"].texts] == [4096, 5]
    (warning,) = splits["train"].warnings
    assert "train.csv: 1 text(s) longer than 4096 characters were cut to that length" in warning


def test_long_jsonl_texts_are_cut_the_same_way(folder: Path) -> None:
    _jsonl(folder / "validation.jsonl", [{"text": "x" * 5000, "label": 1}, {"text": "y" * 5000, "label": 2}])
    splits = read_splits(str(folder), None, Schema(max_text_chars=4096))
    assert [len(text) for text in splits["validation"].texts] == [4096, 4096]
    assert (
        splits["validation"]
        .warnings[0]
        .endswith(
            "validation.jsonl: 2 text(s) longer than 4096 characters were cut to that length (the model sees the first "
            "max_seq_length tokens of each text in any case)"
        )
    )


# ------------------------------------------------------------------------------------------------- files, folders


def test_two_files_for_one_split(folder: Path) -> None:
    _jsonl(folder / "train.jsonl", [{"text": "a", "label": 0}])
    _refused(folder, r"data: train\.jsonl and train\.csv are both the train split; keep one")


def test_empty_split(folder: Path) -> None:
    (folder / "train.csv").write_text("text,label\n")
    _refused(folder, r"train\.csv: empty: the split needs at least one row")


def test_a_single_saved_dataset_is_named(tmp_path: Path) -> None:
    datasets.Dataset.from_dict({"text": ["a"], "label": [0]}).save_to_disk(str(tmp_path / "one"))
    _refused(tmp_path / "one", r"no train split: .*it holds one saved Dataset: save a DatasetDict")


def _save(path: Path, columns: dict[str, list], features: datasets.Features | None = None) -> Path:
    split = datasets.Dataset.from_dict(columns, features=features)
    datasets.DatasetDict(train=split, validation=split).save_to_disk(str(path))
    return path


def test_saved_to_disk_extra_columns_are_refused(tmp_path: Path) -> None:
    disk = _save(tmp_path / "disk", {"text": ["a"], "label": [0], "idx": [7]})
    _refused(disk, r"disk\[train\]: extra column\(s\) \['idx'\]")


def test_saved_to_disk_labels_are_parsed_strictly(tmp_path: Path) -> None:
    disk = _save(tmp_path / "disk", {"text": ["a", "b"], "label": ["positive", "²"]})
    _refused(disk, r"disk\[train\], row 2: label '²' is neither an ASCII integer id nor a label name")
    disk = _save(tmp_path / "floats", {"text": ["a", "b"], "label": [1.0, 2.0]})
    _refused(disk, r"floats\[train\], row 1: label 1\.0 is a float")


def test_saved_to_disk_class_label_names_must_match(tmp_path: Path) -> None:
    features = datasets.Features(
        {"text": datasets.Value("string"), "label": datasets.ClassLabel(names=["bad", "meh", "good"])}
    )
    disk = _save(tmp_path / "disk", {"text": ["a", "b"], "label": [0, 2]}, features)
    _refused(disk, r"label names \['bad', 'meh', 'good'\] differ from the label set")


def test_a_damaged_saved_to_disk_folder(tmp_path: Path) -> None:
    disk = _save(tmp_path / "disk", {"text": ["a"], "label": [0]})
    for arrow in disk.rglob("*.arrow"):
        arrow.write_bytes(b"not arrow")
    _refused(disk, r"disk: cannot be loaded with datasets\.load_from_disk")


def test_hub_datasets_drop_extra_columns_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    split = datasets.Dataset.from_dict({"idx": [1, 2], "text": ["a", "b"], "label": [0, 2]})
    monkeypatch.setattr(datasets, "load_dataset", lambda *args, **kwargs: {"train": split, "validation": split})
    splits = read_splits("someone/tweets", "sentiment", Schema())
    assert splits["train"].labels == [0, 2]
    assert splits["train"].warnings == ["someone/tweets:sentiment[train]: extra column(s) ['idx'] are not used"]


def test_an_unreachable_hub_dataset_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("Couldn't reach 'someone/tweets' on the Hub (LocalEntryNotFoundError)\nmore detail")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DatasetError, match=r"^someone/tweets:sentiment: cannot be loaded from the hub \(Couldn't"):
        read_splits("someone/tweets", "sentiment", Schema())


# ------------------------------------------------------------------------------------------------------------ CLI


def _main(capsys: pytest.CaptureFixture, model: Path, data: Path, *extra: str) -> tuple[int, str]:
    code = train_sentiment.main(
        ["--model", str(model), "--dataset", str(data), "--output-dir", str(data.parent / "out"), "--use-cpu", *extra]
    )
    return code, capsys.readouterr().err


def test_every_dataset_problem_is_exit_2_and_one_line(
    tiny_model_dir: Path, folder: Path, capsys: pytest.CaptureFixture
) -> None:
    (folder / "train.csv").write_bytes(b"text,label\n\xff\xfe,1\n")
    code, err = _main(capsys, tiny_model_dir, folder)
    assert code == 2
    assert err.splitlines() == [f"train_sentiment: error: {folder / 'train.csv'}, line 2, byte 11: not UTF-8 text "
                                "(bytes ff); save the file as UTF-8"]  # fmt: skip
    assert not (folder.parent / "out").exists(), "nothing trained, nothing written"


def test_verbose_adds_the_traceback(tiny_model_dir: Path, folder: Path, capsys: pytest.CaptureFixture) -> None:
    _csv(folder / "train.csv", [["a", "1", "b"]], header=["text", "label", "text"])
    code, err = _main(capsys, tiny_model_dir, folder, "--verbose")
    assert code == 2
    assert err.startswith("train_sentiment: error: ") and "duplicate column(s) ['text']" in err.splitlines()[0]
    assert "Traceback (most recent call last)" in err and "DatasetError" in err


def test_an_unexpected_failure_is_one_line_and_exit_1(
    tiny_model_dir: Path, folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text("{ not json")
    code, err = _main(capsys, broken, folder)
    (error,) = [line for line in err.splitlines() if not line.startswith("train_sentiment: warning: ")]
    assert code == 1 and "Traceback" not in err
    assert error.startswith("train_sentiment: error: ") and error.endswith("(--verbose prints the traceback)")
    assert "config.json" in error


def test_no_traceback_reaches_the_user_of_the_module(tiny_model_dir: Path, folder: Path) -> None:
    """As run by hand or by torchrun: `python -m training_assets.instance.train_sentiment`, stderr is one line."""
    _jsonl(folder / "validation.jsonl", [{"text": "a", "label": "²"}])
    result = subprocess.run(
        [sys.executable, "-m", "training_assets.instance.train_sentiment", "--model", str(tiny_model_dir),
         "--dataset", str(folder), "--output-dir", str(folder.parent / "out")],
        cwd=ROOT, check=False, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"train_sentiment: error: {folder / 'validation.jsonl'}, row 1: label '²' is neither an ASCII integer id "
        "nor a label name; allowed: 0 (negative), 1 (neutral), 2 (positive)"
    ]


# ------------------------------------------------------------------------------------------ little data: warnings


def _plan(rows: int, per_device: int = 32, world_size: int = 1, epochs: int = 1) -> BatchPlan:
    config = TrainConfig(per_device_batch_size=per_device, epochs=epochs)
    return batch_plan(rows, per_device * world_size, world_size, config)


def test_dropped_rows_and_few_steps_are_warned() -> None:
    plan = _plan(36)  # the issue's case: 36 rows, the default batch of 32, one epoch
    assert (plan.drop_last, plan.steps_per_epoch, plan.samples_per_step) == (True, 1, 32)
    dropped, steps = plan.warnings
    assert "the train split has 36 rows and training uses full batches of 32 only" in dropped
    assert "each epoch leaves out 4 row(s) (11%)" in dropped
    assert "the run has 1 optimizer step(s) in all (1 epoch(s) x 1 per epoch)" in steps


def test_a_split_smaller_than_one_batch_trains_as_one_partial_batch() -> None:
    plan = _plan(5, per_device=4, world_size=2, epochs=20)
    assert (plan.drop_last, plan.steps_per_epoch, plan.samples_per_step) == (False, 1, 6)  # padded to the 2 ranks
    (smaller,) = plan.warnings  # 20 epochs x 1 step: enough steps, no second warning
    assert "the train split has 5 row(s), fewer than one global batch of 8 (4 per device x 2 device(s))" in smaller


def test_a_split_of_exactly_one_global_batch_is_one_full_batch() -> None:
    """At the limit: 16 rows, a global batch of 16 (8 per device x 2) is one full batch, no warning of a partial
    one (one row fewer is the partial batch)."""
    plan = _plan(16, per_device=8, world_size=2, epochs=10)
    assert (plan.drop_last, plan.steps_per_epoch, plan.samples_per_step, plan.warnings) == (True, 1, 16, [])
    assert _plan(15, per_device=8, world_size=2, epochs=10).drop_last is False


@pytest.mark.parametrize(("length", "refused"), [(7, True), (8, False), (4096, False), (4097, True)])
def test_max_seq_length_is_taken_from_8_to_4096(length: int, refused: bool) -> None:
    if not refused:
        assert TrainConfig(max_seq_length=length).max_seq_length == length
        return
    with pytest.raises(dataset.TrainingInputError, match=rf"^max_seq_length must be between 8 and 4096, got {length}$"):
        TrainConfig(max_seq_length=length)


def test_enough_data_has_no_warnings() -> None:
    assert _plan(240, per_device=8, epochs=3).warnings == []


def test_single_class_and_missing_class_warnings() -> None:
    labels = ("negative", "neutral", "positive")
    one = dataset.Split("train.csv", ["a", "b"], [2, 2])
    assert label_warnings(one, labels) == [
        "train.csv: every row has label 2 (positive): the model can only learn to predict that class"
    ]
    two = dataset.Split("train.csv", ["a", "b"], [0, 2])
    assert label_warnings(two, labels) == ["train.csv: no row has label 1 (neutral): the model will not learn to "
                                           "predict it"]  # fmt: skip
    assert label_warnings(dataset.Split("t", ["a", "b", "c"], [0, 1, 2]), labels) == []


def test_throughput_without_steps_after_the_warmup_says_why() -> None:
    counts = {"warmup_steps": 1, "samples_per_step": 32, "tokens": (300, 300), "positions": (512, 512)}
    summary = throughput_summary([2.5], **counts)
    assert summary["measured"] is False and summary["optimizer_steps"] == 1
    assert "1 optimizer step(s), all within the 1 warm-up step(s)" in summary["reason"]
    measured = throughput_summary([2.5, 0.5, 0.5], **{**counts, "tokens": (300, 900), "positions": (512, 1536)})
    assert measured["measured"] is True and measured["train_samples_per_second"] == 64.0
    assert measured["non_padding_tokens_per_second"] == 600.0 and measured["padding_fraction"] == 0.4141


@pytest.mark.slow
def test_the_issues_small_csv_trains(tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """36 rows, one class missing, a BOM, --epochs 1 and the default batch: it trains, saves and explains (the CLI's
    main() in this process: the module run as a process is test_no_traceback_reaches_the_user_of_the_module)."""
    sample = [json.loads(line) for line in (ROOT / "training_assets/sample_data/train.jsonl").read_text().splitlines()]
    rows = [[row["text"], ["negative", "neutral", "positive"][row["label"]]] for row in sample if row["label"]][:36]
    data = tmp_path / "small"
    _csv(data / "train.csv", rows, prefix=b"\xef\xbb\xbf")
    _csv(data / "validation.csv", rows[:10])
    code, err = _main(capsys, tiny_model_dir, data, "--epochs", "1", "--max-seq-length", "32")
    assert code == 0, err[-3000:]
    warnings = [line for line in err.splitlines() if line.startswith("train_sentiment: warning: ")]
    assert len(warnings) == 3 and "Traceback" not in err
    assert "no row has label 0 (negative)" in warnings[0]
    assert "leaves out 4 row(s)" in warnings[1] and "1 optimizer step(s) in all" in warnings[2]
    assert "train_sentiment: throughput not measured: the run had 1 optimizer step(s)" in err
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["throughput"]["measured"] is False and metrics["optimizer_steps"] == 1
    assert metrics["warnings"] == [line.removeprefix("train_sentiment: warning: ") for line in warnings]
    assert (tmp_path / "out" / "saved_model" / "model.safetensors").is_file()


def test_check_only_checks_and_trains_nothing(
    tiny_model_dir: Path, folder: Path, capsys: pytest.CaptureFixture
) -> None:
    code, err = _main(capsys, tiny_model_dir, folder, "--check-only")
    assert code == 0 and not (folder.parent / "out").exists()
    assert err.splitlines()[-1] == (
        f"train_sentiment: input checked: {tiny_model_dir}, {folder} (3 train rows, 3 validation rows)"
    )
    _jsonl(folder / "validation.jsonl", [{"text": "a", "label": 7}])
    code, err = _main(capsys, tiny_model_dir, folder, "--check-only")
    assert code == 2 and err.splitlines() == [
        f"train_sentiment: error: {folder / 'validation.jsonl'}, row 1: label 7 is outside the label set; "
        "allowed: 0 (negative), 1 (neutral), 2 (positive)"
    ]
