"""Read and check a sentiment dataset before any training starts: every problem is one line naming the file, the row
and what is wrong.

Accepted inputs (``--dataset``):

* a folder with one ``train`` and one ``validation`` file, each ``.jsonl``/``.json`` (one JSON object per line) or
  ``.csv`` (a header row, then one row per example); UTF-8, with or without a byte-order mark;
* a ``datasets.save_to_disk`` folder of a ``DatasetDict`` with ``train`` and ``validation`` splits;
* a Hugging Face hub dataset id (with ``--dataset-config``).

Each row has exactly the text and label columns (``text``, ``label`` unless renamed); duplicate or extra columns are
refused by name (a hub dataset's extra columns are dropped with a warning: its schema is not the user's to change).
A label is an ASCII integer id in the label set or one of the label names; anything else (``²``, non-ASCII digits,
``1.0``, ``true``) is refused. Texts longer than the model can see are cut, and the run says how many.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SPLITS = ("train", "validation")
DATA_SUFFIXES = (".jsonl", ".json", ".csv")
BOM = b"\xef\xbb\xbf"
# Byte-order marks of encodings that are not UTF-8: named, so the message says what the file is.
OTHER_BOMS = {b"\xff\xfe\x00\x00": "UTF-32", b"\x00\x00\xfe\xff": "UTF-32", b"\xff\xfe": "UTF-16",
              b"\xfe\xff": "UTF-16"}  # fmt: skip
# The csv module refuses fields over 131,072 characters by default; a long review or document is still one text.
CSV_FIELD_LIMIT = 2**31 - 1
# Characters kept per text: the tokenizer keeps at most max_seq_length tokens, and no token of a BPE vocabulary is
# anywhere near this many characters long, so the cut never changes what the model sees; it bounds tokenization time
# and memory for texts of megabytes.
CHARS_PER_TOKEN_KEPT = 64
ASCII_INTEGER = re.compile(r"[0-9]+")


class TrainingInputError(ValueError):
    """The run cannot start as configured; the message says what to fix."""


class DatasetError(TrainingInputError):
    """One problem in one place of a dataset: ``<source>, row <n> (line <l>): <problem>``."""

    def __init__(self, source: str, problem: str, *, row: int | None = None, line: int | None = None,
                 byte: int | None = None) -> None:  # fmt: skip
        where = [source]
        if row is not None:
            where.append(f"row {row}" + (f" (line {line})" if line is not None and line != row else ""))
        elif line is not None:
            where.append(f"line {line}")
        if byte is not None:
            where.append(f"byte {byte}")
        super().__init__(f"{', '.join(where)}: {problem}")
        self.source, self.problem, self.row, self.line, self.byte = source, problem, row, line, byte


@dataclass
class Split:
    """One checked split: texts and label ids, where they came from, and what the reader had to say about them."""

    name: str
    texts: list[str]
    labels: list[int]
    warnings: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.texts)


@dataclass(frozen=True)
class Schema:
    """What every row must hold."""

    text_column: str = "text"
    label_column: str = "label"
    labels: tuple[str, ...] = ("negative", "neutral", "positive")
    max_text_chars: int = 128 * CHARS_PER_TOKEN_KEPT

    @property
    def columns(self) -> tuple[str, str]:
        return (self.text_column, self.label_column)

    def allowed_labels(self) -> str:
        return ", ".join(f"{i} ({name})" for i, name in enumerate(self.labels))


# ------------------------------------------------------------------------------------------------------- raw rows


@dataclass
class _Row:
    number: int  # data row, from 1
    line: int | None  # where it starts in the file, when it is a file
    values: dict[str, Any]


def decode_utf8(path: Path) -> str:
    """The file's text: UTF-8, a leading byte-order mark dropped; anything else refused with the byte offset."""
    data = path.read_bytes()
    for mark, encoding in OTHER_BOMS.items():
        if data.startswith(mark):
            raise DatasetError(str(path), f"the file is {encoding} (byte-order mark {mark.hex(' ')}); save it as UTF-8")
    start = len(BOM) if data.startswith(BOM) else 0
    try:
        return data[start:].decode("utf-8")
    except UnicodeDecodeError as error:
        offset = start + error.start
        line = data.count(b"\n", 0, offset) + 1
        bad = data[offset : offset + min(4, error.end - error.start)].hex(" ")
        raise DatasetError(
            str(path), f"not UTF-8 text (bytes {bad}); save the file as UTF-8", line=line, byte=offset
        ) from None


def _duplicates(names: Iterable[str]) -> list[str]:
    return sorted(name for name, count in Counter(names).items() if count > 1)


def _check_columns(source: str, names: Sequence[str], schema: Schema, **where: int | None) -> None:
    """Exactly the schema's columns, each once."""
    if duplicated := _duplicates(names):
        raise DatasetError(source, f"duplicate column(s) {duplicated}: each column may appear once", **where)
    if missing := [name for name in schema.columns if name not in names]:
        raise DatasetError(source, f"missing column(s) {missing}; it has {list(names)}", **where)
    if extra := [name for name in names if name not in schema.columns]:
        raise DatasetError(
            source, f"extra column(s) {extra}: only {list(schema.columns)} are read; remove the others", **where
        )


def _csv_rows(path: Path, schema: Schema) -> Iterator[_Row]:
    text = decode_utf8(path)
    limit = csv.field_size_limit(CSV_FIELD_LIMIT)
    try:
        reader = csv.reader(io.StringIO(text, newline=""), strict=True)
        try:
            header = next(reader, None)
        except csv.Error as error:
            raise DatasetError(str(path), f"not a valid CSV header ({error})", line=1) from None
        if header is None:
            return
        header = [name.strip() for name in header]
        _check_columns(str(path), header, schema, line=1)
        number, line = 0, reader.line_num + 1
        while True:
            try:
                cells = next(reader)
            except StopIteration:
                return
            except csv.Error as error:
                raise DatasetError(str(path), f"not valid CSV ({error})", row=number + 1, line=line) from None
            if cells:  # blank lines carry no row
                number += 1
                if len(cells) != len(header):
                    raise DatasetError(
                        str(path),
                        f"{len(cells)} field(s) where the header has {len(header)} ({', '.join(header)}); "
                        "quote texts that contain commas",
                        row=number,
                        line=line,
                    )
                yield _Row(number, line, dict(zip(header, cells, strict=True)))
            line = reader.line_num + 1
    finally:
        csv.field_size_limit(limit)


def _refuse_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    if duplicated := _duplicates(key for key, _ in pairs):
        raise ValueError(f"duplicate key(s) {duplicated}")
    return dict(pairs)


def _jsonl_rows(path: Path, schema: Schema) -> Iterator[_Row]:
    number = 0
    for line, content in enumerate(decode_utf8(path).splitlines(), start=1):
        if not content.strip():
            continue
        number += 1
        try:
            values = json.loads(content, object_pairs_hook=_refuse_duplicate_keys)
        except json.JSONDecodeError as error:
            raise DatasetError(str(path), f"not a JSON object ({error.msg})", row=number, line=line) from None
        except ValueError as error:  # the duplicate keys
            raise DatasetError(str(path), f"{error}: each column may appear once", row=number, line=line) from None
        if not isinstance(values, dict):
            raise DatasetError(str(path), f"not a JSON object (got {type(values).__name__})", row=number, line=line)
        _check_columns(str(path), list(values), schema, row=number, line=line)
        yield _Row(number, line, values)


# ------------------------------------------------------------------------------------------------- checked values


def label_id(label: Any, schema: Schema) -> int:
    """The id of ``label``: an int or ASCII-digit string within the label set, or a label name; else ValueError."""
    if isinstance(label, bool):  # bool is an int in Python; true/false is not a label
        raise ValueError(f"label {label!r} is a boolean")
    if isinstance(label, str):
        value = label.strip(" \t")
        if value in schema.labels:
            return schema.labels.index(value)
        if not ASCII_INTEGER.fullmatch(value):
            # str.isdigit() and int() accept '²' or Arabic-Indic digits; a label file should not.
            raise ValueError(f"label {label!r} is neither an ASCII integer id nor a label name")
        label = int(value)
    if not isinstance(label, int):
        raise ValueError(f"label {label!r} is a {type(label).__name__}, not an integer id or a label name")
    if not 0 <= label < len(schema.labels):
        raise ValueError(f"label {label} is outside the label set")
    return label


def _checked(source: str, rows: Iterable[_Row], schema: Schema) -> Split:
    split = Split(source, [], [])
    cut = 0
    for row in rows:
        text, label = row.values[schema.text_column], row.values[schema.label_column]
        if not isinstance(text, str) or not text.strip():
            raise DatasetError(source, f"no text (got {text!r})", row=row.number, line=row.line)
        try:
            split.labels.append(label_id(label, schema))
        except ValueError as error:
            raise DatasetError(
                source, f"{error}; allowed: {schema.allowed_labels()}", row=row.number, line=row.line
            ) from None
        if len(text) > schema.max_text_chars:
            text, cut = text[: schema.max_text_chars], cut + 1
        split.texts.append(text)
    if not split.texts:
        raise DatasetError(source, "empty: the split needs at least one row")
    if cut:
        split.warnings.append(
            f"{source}: {cut} text(s) longer than {schema.max_text_chars} characters were cut to that length "
            "(the model sees the first max_seq_length tokens of each text in any case)"
        )
    return split


# --------------------------------------------------------------------------------------------------------- sources


def split_file(folder: Path, split: str) -> Path:
    candidates = [folder / f"{split}{suffix}" for suffix in DATA_SUFFIXES]
    found = [path for path in candidates if path.is_file()]
    if not found:
        hint = (
            " (it holds one saved Dataset: save a DatasetDict with train and validation splits)"
            if (folder / "state.json").is_file()
            else ""
        )
        raise DatasetError(
            str(folder),
            f"no {split} split: expected one of {', '.join(p.name for p in candidates)} "
            f"or a datasets.save_to_disk folder (dataset_dict.json){hint}",
        )
    if len(found) > 1:
        raise DatasetError(str(folder), f"{' and '.join(p.name for p in found)} are both the {split} split; keep one")
    return found[0]


def read_file(path: Path, schema: Schema) -> Split:
    """One JSONL or CSV split file, checked row by row."""
    rows = _csv_rows(path, schema) if path.suffix == ".csv" else _jsonl_rows(path, schema)
    return _checked(str(path), rows, schema)


def read_dataset(loaded: Any, source: str, schema: Schema, *, extra_columns: str = "refuse") -> Split:
    """One ``datasets.Dataset`` (a save_to_disk split or a hub split), checked like a file.

    ``extra_columns``: ``"refuse"`` (local folders: the user made them) or ``"drop"`` (hub datasets; warned).
    """
    import datasets  # the file readers above do not need it

    names = list(loaded.column_names)
    warnings = []
    if extra_columns == "drop" and (extra := [name for name in names if name not in schema.columns]):
        names = [name for name in names if name in schema.columns]
        warnings.append(f"{source}: extra column(s) {extra} are not used")
    _check_columns(source, names, schema)
    feature = loaded.features[schema.label_column]
    if isinstance(feature, datasets.ClassLabel) and tuple(feature.names) != schema.labels:
        raise DatasetError(source, f"its label names {feature.names} differ from the label set {list(schema.labels)}")
    texts, labels = loaded[schema.text_column], loaded[schema.label_column]
    rows = (_Row(number, None, {schema.text_column: text, schema.label_column: label})
            for number, (text, label) in enumerate(zip(texts, labels, strict=True), start=1))  # fmt: skip
    split = _checked(source, rows, schema)
    split.warnings[:0] = warnings
    return split


def _both_splits(loaded: Any, name: str) -> dict[str, Any]:
    missing = [split for split in SPLITS if split not in loaded]
    if missing:
        raise DatasetError(name, f"has splits {list(loaded)}; it needs {', '.join(SPLITS)}")
    return {split: loaded[split] for split in SPLITS}


def looks_local(reference: str) -> bool:
    return reference.startswith(("/", "./", "../", "~")) or Path(reference).suffix in DATA_SUFFIXES


def read_splits(reference: str, config_name: str | None, schema: Schema) -> dict[str, Split]:
    """``{"train": Split, "validation": Split}`` from a local folder, a save_to_disk folder or a hub dataset."""
    reference = os.path.expanduser(reference)
    folder = Path(reference)
    if folder.is_dir() and (folder / "dataset_dict.json").is_file():
        import datasets

        try:
            loaded = datasets.load_from_disk(str(folder))
        except Exception as error:  # a damaged save_to_disk folder: arrow, json or file errors
            raise DatasetError(str(folder), f"cannot be loaded with datasets.load_from_disk ({error})") from None
        raw = _both_splits(loaded, str(folder))
        return {split: read_dataset(raw[split], f"{folder}[{split}]", schema) for split in SPLITS}
    if folder.is_dir():
        return {split: read_file(split_file(folder, split), schema) for split in SPLITS}
    if folder.exists() or looks_local(reference):
        raise DatasetError(reference, "no such dataset folder (it does not exist, or is not a folder)")
    import datasets

    try:
        loaded = datasets.load_dataset(reference, config_name)
    except Exception as error:  # not found, no network, bad config name: all stop the run the same way
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise DatasetError(f"{reference}:{config_name}", f"cannot be loaded from the hub ({message})") from None
    raw = _both_splits(loaded, reference)
    return {
        split: read_dataset(raw[split], f"{reference}:{config_name}[{split}]", schema, extra_columns="drop")
        for split in SPLITS
    }
