"""Tokenize once per node, not once per process.

Under torchrun every process of a node runs the training script; each used to tokenize the whole dataset into its
own memory (8 copies on a p4d). Now the first process of a node to take a file lock in ``--tokenized-dir`` (default:
``train_sentiment-tokenized`` in the node's temporary folder; launch_training.sh puts it beside the staged data)
tokenizes every split and saves it there as three NumPy arrays (the token ids of all rows end to end, each row's
start, the labels); the others wait for the lock and find them, and every process maps them read-only
(``numpy.load(mmap_mode="r")``): one copy per node, in the page cache, shared by its processes. A torchrun restart or
a second run on the same node with the same data, tokenizer and length finds them and tokenizes nothing. A single
process without ``--tokenized-dir`` (nobody to share with) keeps its tokens in memory and writes nothing.

Plain arrays, not ``datasets`` Arrow files: a training run from local files does not import ``datasets`` (see
``TokenizedSplit`` in train_sentiment.py).

The folder's name is a hash of what the tokens depend on: the tokenizer (its full serialized definition), the
maximum length and every text and label of every split, so a changed file, tokenizer or ``--max-seq-length`` never
reuses stale tokens. On EC2, ec2_run.sh puts the output folder (and so this one, the dataset and the checkpoints) on
the instance's NVMe instance storage when the instance facts say it has some (p4d: 8 x 1 TB at /opt/dlami/nvme).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

import numpy as np

from training_assets.instance.dataset import Split

DEFAULT_FOLDER = "train_sentiment-tokenized"
DONE = "tokens.json"  # written last into a folder of saved splits: the rows of each
ARRAYS = ("input_ids", "offsets", "labels")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokenized-dir", default=None, help="tokenized splits are saved and shared here, once per "
                        f"node (default: {DEFAULT_FOLDER} in the temporary folder when a node runs several "
                        "processes; one process keeps them in memory)")  # fmt: skip


def tokenized_dir(config: Any) -> Path | None:
    """Where the node's processes share their tokens; None for a lone process that was given no folder."""
    if config.tokenized_dir:
        return Path(config.tokenized_dir)
    if int(os.environ.get("LOCAL_WORLD_SIZE", "1")) > 1:  # set by torchrun
        return Path(tempfile.gettempdir()) / DEFAULT_FOLDER
    return None


def fingerprint(splits: Mapping[str, Split], tokenizer: Any, max_length: int) -> str:
    """A hash of everything the tokens depend on (module docstring)."""
    digest = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    digest.update((backend.to_str() if backend is not None else repr(tokenizer.get_vocab())).encode())
    digest.update(f"\0max_length={max_length}\0".encode())
    for name in sorted(splits):
        texts = [text.encode() for text in splits[name].texts]
        # Each text's byte length, then the bytes end to end: two different lists never hash alike.
        digest.update(f"\0split={name}:{len(texts)}\0".encode())
        digest.update(np.fromiter(map(len, texts), dtype=np.int64, count=len(texts)).tobytes())
        digest.update(b"".join(texts))
        digest.update(np.asarray(splits[name].labels, dtype=np.int64).tobytes())
    return digest.hexdigest()[:20]


class RaggedRows(Sequence[list[int]]):
    """Rows of token ids kept end to end in one array (``input_ids``) with each row's start (``offsets``, one more
    than the rows): no Python object per token until a row is read. Pickled (to a DataLoader worker that is not forked)
    as its folder, which the other side maps again."""

    def __init__(self, input_ids: np.ndarray, offsets: np.ndarray, folder: Path | None = None) -> None:
        self.input_ids, self.offsets, self.folder = input_ids, offsets, folder

    @classmethod
    def from_rows(cls, rows: Sequence[Sequence[int]]) -> RaggedRows:
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum([len(row) for row in rows], out=offsets[1:])
        flat = np.fromiter((token for row in rows for token in row), dtype=np.int32, count=int(offsets[-1]))
        return cls(flat, offsets)

    @classmethod
    def load(cls, folder: Path) -> RaggedRows:
        ids, offsets = (np.load(folder / f"{name}.npy", mmap_mode="r") for name in ARRAYS[:2])
        return cls(ids, offsets, folder)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @overload
    def __getitem__(self, index: int) -> list[int]: ...
    @overload
    def __getitem__(self, index: slice) -> list[list[int]]: ...
    def __getitem__(self, index: int | slice) -> list[int] | list[list[int]]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if not -len(self) <= index < len(self):
            raise IndexError(f"row {index} of {len(self)}")
        index %= len(self)
        # A list, not a view of the read-only map (torch warns about tensors over memory it cannot write).
        return self.input_ids[self.offsets[index] : self.offsets[index + 1]].tolist()

    def lengths(self) -> list[int]:
        return np.diff(self.offsets).tolist()

    def __getstate__(self) -> dict[str, Any]:
        if self.folder is None:
            return dict(vars(self))
        return {"folder": self.folder}

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "input_ids" in state:
            vars(self).update(state)
        else:
            vars(self).update(vars(RaggedRows.load(state["folder"])))


@dataclass(frozen=True)
class TokenizedRows:
    """One tokenized split: the rows' token ids and their label ids."""

    input_ids: RaggedRows
    labels: list[int]


def _log(line: str) -> None:
    print(f"data_staging: {line}", file=sys.stderr, flush=True)


def _save(tokens: Mapping[str, TokenizedRows], folder: Path) -> None:
    for name, split in tokens.items():
        (folder / name).mkdir(parents=True)
        arrays = (split.input_ids.input_ids, split.input_ids.offsets, np.asarray(split.labels, dtype=np.int64))
        for array_name, array in zip(ARRAYS, arrays, strict=True):
            np.save(folder / name / f"{array_name}.npy", array)
    (folder / DONE).write_text(json.dumps({name: len(split.labels) for name, split in tokens.items()}) + "\n")


def _load(folder: Path, names: Sequence[str]) -> dict[str, TokenizedRows]:
    return {
        name: TokenizedRows(RaggedRows.load(folder / name), np.load(folder / name / "labels.npy").tolist())
        for name in names
    }


def tokenize_once_per_node(
    splits: Mapping[str, Split],
    tokenize: Callable[[list[str]], list[list[int]]],
    *,
    folder: Path | None,
    key: str,
) -> dict[str, TokenizedRows]:
    """The tokenized splits, mapped from ``folder/key``; tokenized there first if nobody has yet (in memory only when
    ``folder`` is None). ``tokenize`` takes a split's texts and returns each text's token ids."""

    def tokenized() -> dict[str, TokenizedRows]:
        return {
            name: TokenizedRows(RaggedRows.from_rows(tokenize(split.texts)), list(split.labels))
            for name, split in splits.items()
        }

    if folder is None:
        return tokenized()
    folder.mkdir(parents=True, exist_ok=True)
    saved = folder / key
    with open(folder / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        if not (saved / DONE).is_file():
            partial = folder / f".{key}.partial-{os.getpid()}"
            shutil.rmtree(partial, ignore_errors=True)
            tokens = tokenized()
            _save(tokens, partial)
            shutil.rmtree(saved, ignore_errors=True)  # an interrupted earlier attempt without its DONE file
            os.replace(partial, saved)
            rows = ", ".join(f"{len(split.labels)} {name}" for name, split in tokens.items())
            _log(f"tokenized {rows} rows once for this node into {saved}")
    return _load(saved, list(splits))
