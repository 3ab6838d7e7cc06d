"""Tokenize once per node, not once per process.

Under torchrun every process of a node runs the training script; each used to tokenize the whole dataset into its
own memory (8 copies on a p4d). Now the first process of a node to take a file lock in ``--tokenized-dir`` (default:
``train_sentiment-tokenized`` in the node's temporary folder; launch_training.sh puts it beside the staged data)
tokenizes every split and saves them there (``datasets.save_to_disk``, Arrow files);
the others wait for the lock, find the saved splits, and every process loads them with ``load_from_disk``, which
memory-maps the Arrow files: one copy per node, in the page cache, shared by its processes. A torchrun restart or a
second run on the same node with the same data, tokenizer and length finds them and tokenizes nothing.

The folder's name is a hash of what the tokens depend on: the tokenizer (its full serialized definition), the
maximum length and every text and label of every split, so a changed file, tokenizer or ``--max-seq-length`` never
reuses stale tokens. On EC2, ec2_run.sh puts the output folder (and so this one, the dataset and the checkpoints) on
the instance's NVMe instance storage when the instance facts say it has some (p4d: 8 x 1 TB at /opt/dlami/nvme).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import datasets

DATASET_DICT = "dataset_dict.json"  # what save_to_disk writes last for a DatasetDict
DEFAULT_FOLDER = "train_sentiment-tokenized"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokenized-dir", default=None, help="tokenized splits are saved and shared here, once per "
                        f"node (default: {DEFAULT_FOLDER} in the temporary folder)")  # fmt: skip


def tokenized_dir(config: Any) -> Path:
    return Path(config.tokenized_dir) if config.tokenized_dir else Path(tempfile.gettempdir()) / DEFAULT_FOLDER


def fingerprint(splits: Mapping[str, datasets.Dataset], tokenizer: Any, max_length: int) -> str:
    """A hash of everything the tokens depend on (module docstring)."""
    digest = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    digest.update((backend.to_str() if backend is not None else repr(tokenizer.get_vocab())).encode())
    digest.update(f"\0max_length={max_length}\0".encode())
    for name in sorted(splits):
        digest.update(f"\0split={name}\0".encode())
        # The rows as Arrow (selections applied): their buffers, with each chunk's offset and length so that two
        # slices of one buffer differ. Seconds for millions of rows, no Python object per row.
        table = splits[name].with_format("arrow")[:]
        for column in ("text", "label"):
            for chunk in table.column(column).chunks:
                digest.update(f"\0{column}:{chunk.type}:{chunk.offset}:{len(chunk)}\0".encode())
                for buffer in chunk.buffers():
                    if buffer is not None:
                        digest.update(buffer)
    return digest.hexdigest()[:20]


def _log(line: str) -> None:
    print(f"data_staging: {line}", file=sys.stderr, flush=True)


def tokenize_once_per_node(
    splits: Mapping[str, datasets.Dataset],
    tokenize: Callable[[dict[str, list]], dict[str, list]],
    *,
    folder: Path,
    key: str,
) -> dict[str, datasets.Dataset]:
    """The tokenized splits, loaded (memory-mapped) from ``folder/key``; tokenized there first if nobody has yet.

    ``tokenize`` is the batched ``datasets.map`` function (texts in, ``input_ids`` out; the text column is dropped).
    """
    folder.mkdir(parents=True, exist_ok=True)
    saved = folder / key
    with open(folder / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        if not (saved / DATASET_DICT).is_file():
            partial = folder / f".{key}.partial-{os.getpid()}"
            shutil.rmtree(partial, ignore_errors=True)
            tokenized = datasets.DatasetDict(
                {name: data.map(tokenize, batched=True, remove_columns=["text"]) for name, data in splits.items()}
            )
            tokenized.save_to_disk(str(partial))
            shutil.rmtree(saved, ignore_errors=True)  # an interrupted earlier attempt without dataset_dict.json
            os.replace(partial, saved)
            rows = ", ".join(f"{len(data)} {name}" for name, data in tokenized.items())
            _log(f"tokenized {rows} rows once for this node into {saved}")
    loaded = datasets.load_from_disk(str(saved))
    return {name: loaded[name] for name in splits}
