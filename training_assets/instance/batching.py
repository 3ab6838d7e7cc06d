"""Batches without compute on padding: each batch is padded to its own longest text, rounded up to one of a few
bucket lengths, and the non-padding tokens are counted on the device.

Why buckets and not the exact longest length: torch.compile specialises on shapes and CUDA graphs record one graph
per shape, so every distinct length costs a compile or a graph capture; a handful of lengths keeps that bounded
(pytorch/pytorch#188150, and /work/shared FACTS "GPU fine-tuning speed"). Packing several texts into a row is the
other way to pad little (``--padding packed``, packing.py): transformers 5 packs only for FlashAttention models
(``DataCollatorWithFlattening``) and ``RobertaForSequenceClassification`` pools token 0 of a row, so it has its own
mask, positions and pooling.

The attention mask makes padding inert (padded keys get no attention weight, and the classifier reads token 0), so
what the model learns does not depend on how far a batch is padded; tests/training_assets/test_fast_path.py proves it by
training the same batches both ways.

Batches of similar length (``LengthBucketSampler``) are grouped by bucket, not by exact length: what a batch costs
depends only on its bucket, and sorting by exact length would also sort by whatever correlates with length (in the
shipped sample data, the label: see the sampler's docstring).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Sampler

# "packed": several texts per row (packing.py); evaluation then runs bucketed batches.
PADDING_MODES = ("bucketed", "max_length", "packed")
# Tensor cores work on multiples of 8; no bucket is shorter than this.
SMALLEST_BUCKET = 8


def bucket_lengths(max_length: int) -> tuple[int, ...]:
    """8, 16, 24, 32, 48, 64, 96, 128, 192, 256, ... up to ``max_length`` (always the last bucket).

    Powers of two and 1.5 times powers of two from 16 on: each bucket is at most 1.5x the one below (2x from 8 to 16),
    so rounding up wastes at most a third of a batch's positions above 16 tokens, with 8 buckets up to 128 and 12 up
    to 512 (each is one compiled graph and one CUDA graph).
    """
    if max_length < 1:
        raise ValueError(f"max_length must be at least 1, got {max_length}")
    lengths, power = {SMALLEST_BUCKET}, SMALLEST_BUCKET
    while power < max_length:
        lengths.update((2 * power, 3 * power))
        power *= 2
    return tuple(sorted({length for length in lengths if length < max_length} | {max_length}))


def padded_length(longest: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds ``longest`` tokens."""
    for length in buckets:
        if length >= longest:
            return length
    raise ValueError(f"a text of {longest} tokens is longer than the largest bucket {buckets[-1]}")


class PaddedIndex(int):
    """A row index that carries the padded length of the global batch its row belongs to (``LengthBucketSampler``):
    the collator of each rank pads its share of the global batch to that length, so every rank runs the same shape
    at the same step, even in a batch at the border of two buckets. An ``int`` everywhere else."""

    padded_length: int

    def __new__(cls, index: int, padded_length: int) -> PaddedIndex:
        value = super().__new__(cls, index)
        value.padded_length = padded_length
        return value

    def __reduce__(self) -> tuple[type, tuple[int, int]]:  # DataLoader workers get the indices pickled
        return (PaddedIndex, (int(self), self.padded_length))


@dataclass(frozen=True)
class BucketCollator:
    """Collates tokenized rows (``input_ids``, ``label``) into padded tensors.

    ``padding="bucketed"`` pads to the batch's longest row rounded up to a bucket; ``"max_length"`` pads every batch
    to the largest bucket (max_seq_length), as the seed did. A plain top-level class, so DataLoader worker processes
    can pickle it.
    """

    pad_token_id: int
    buckets: tuple[int, ...]
    padding: str = "bucketed"

    def __post_init__(self) -> None:
        if self.padding not in ("bucketed", "max_length"):  # packed rows have their own collator (packing.py)
            raise ValueError(f"the collator pads 'bucketed' or 'max_length', got {self.padding!r}")

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        sizes = [len(row["input_ids"]) for row in rows]
        width = self.buckets[-1] if self.padding == "max_length" else padded_length(max(sizes), self.buckets)
        if self.padding != "max_length" and "padded_length" in rows[0]:  # the global batch's length (PaddedIndex)
            width = max(width, *(row["padded_length"] for row in rows))
        input_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, (row, size) in enumerate(zip(rows, sizes, strict=True)):
            input_ids[i, :size] = torch.as_tensor(row["input_ids"], dtype=torch.long)
            attention_mask[i, :size] = 1
        # Host integers the collator knows anyway: non-padding tokens and the sum of squared lengths (TokenCounter).
        batch: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention_mask,
                                 "token_counts": [sum(sizes), sum(size * size for size in sizes)]}  # fmt: skip
        if "label" in rows[0]:
            batch["labels"] = torch.tensor([row["label"] for row in rows], dtype=torch.long)
        return batch


class LengthBucketSampler(Sampler[int]):
    """Orders a split so that each run of ``batch_size`` indices is one batch of texts from the same bucket.

    Like transformers' ``LengthGroupedSampler`` (a random permutation cut into mega-batches of ``mega_batch_mult``
    batches, sorted within each; the global torch RNG, so every rank of a torchrun draws the same order), with four
    differences that keep the padding low while the batches stay as mixed as the padding allows:

    - it sorts by bucket (``padded_length``), not by exact length, so texts of one bucket keep their random order:
      sorting by exact length also sorts by whatever correlates with length (in the shipped sample data, texts of 10
      tokens are mostly neutral and of 7 mostly positive), and makes batches of one class;
    - the batches of the epoch are shuffled, instead of running long to short within each mega-batch;
    - so mega-batches are 50 batches even on a small split, where transformers makes them smaller (at least 4 per
      epoch, to keep the batch order random): with 240 rows and batches of 32 that would be one batch per
      mega-batch, no grouping at all (padding fraction 0.45 on the sample data instead of 0.30);
    - the ``len % batch_size`` rows a ``drop_last`` loader leaves out come last and are random rows, not the tail of
      the last sorted mega-batch.

    As there, the batch of the longest bucket comes first, so an out-of-memory error shows in the first step.

    ``batch_size`` is the global batch (every rank's batch, and the accumulated steps): accelerate deals its
    consecutive per-device batches to the ranks in turn (``BatchSamplerShard``), so one global batch is one step on
    every rank. Each index is a ``PaddedIndex`` carrying its global batch's bucket, so a global batch that spans two
    buckets pads to the longer on every rank.
    """

    def __init__(
        self,
        lengths: Sequence[int],
        buckets: Sequence[int],
        batch_size: int,
        mega_batch_mult: int | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.bucket_of = [padded_length(length, buckets) for length in lengths]
        self.batch_size = batch_size
        self.mega_batch_mult = mega_batch_mult or 50

    def __len__(self) -> int:
        return len(self.bucket_of)

    def __iter__(self) -> Iterator[int]:
        order = torch.randperm(len(self.bucket_of)).tolist()
        full = len(order) - len(order) % self.batch_size
        order, rest = order[:full], order[full:]
        mega = self.mega_batch_mult * self.batch_size
        batches = []
        for start in range(0, full, mega):
            # sorted() is stable: within a bucket the random order stays.
            group = sorted(order[start : start + mega], key=self.bucket_of.__getitem__)
            batches += [group[i : i + self.batch_size] for i in range(0, len(group), self.batch_size)]
        if batches:
            batches = [batches[i] for i in torch.randperm(len(batches)).tolist()]
            longest = max(range(len(batches)), key=lambda i: max(self.bucket_of[j] for j in batches[i]))
            batches[0], batches[longest] = batches[longest], batches[0]
        padded = [PaddedIndex(index, max(self.bucket_of[i] for i in batch)) for batch in batches for index in batch]
        return iter(padded + rest)


class TokenCounter:
    """Per optimizer step: the non-padding tokens and the sum of squared text lengths (the squares give the attention
    FLOPs, which grow with each text's length), as the collator counted them on the host (``token_counts``: no
    device work, no device read), and the batch shape. ``read`` sums every step's counts over the ranks at once.
    """

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)  # where the all-reduce runs (NCCL needs the GPU)
        self.counts: list[tuple[int, int]] = []  # (tokens, sum of squared lengths) per step
        self.shapes: list[tuple[int, ...]] = []  # (rows, padded length) per step
        self.earlier: list[int] = []  # per step: how many earlier steps had the same shape
        self._seen: Counter[tuple[int, ...]] = Counter()

    def add(self, tokens: int, squared_lengths: int, shape: tuple[int, ...]) -> None:
        self.counts.append((tokens, squared_lengths))
        self.shapes.append(shape)
        self.earlier.append(self._seen[shape])
        self._seen[shape] += 1

    @property
    def positions(self) -> list[int]:
        """Positions computed per step (padding included)."""
        return [math.prod(shape) for shape in self.shapes]

    def read(self) -> list[Counts]:
        """Every step's counts, summed over the ranks of a torchrun: one device read and one all-reduce for all
        steps together, after training (each rank must call it)."""
        if not self.counts:
            return []
        rows = [[*counts, positions] for counts, positions in zip(self.counts, self.positions, strict=True)]
        values = torch.tensor(rows, dtype=torch.long, device=self.device)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(values)
        return [Counts(*row) for row in values.tolist()]


@dataclass(frozen=True)
class Counts:
    tokens: int  # non-padding tokens
    squared_lengths: int  # sum over texts of (non-padding tokens of the text) ** 2
    positions: int  # positions computed, padding included

    def __add__(self, other: Counts) -> Counts:
        return Counts(self.tokens + other.tokens, self.squared_lengths + other.squared_lengths,
                      self.positions + other.positions)  # fmt: skip


def total(counts: Sequence[Counts]) -> Counts:
    return sum(counts, Counts(0, 0, 0))
