"""Batches without compute on padding: each batch is padded to its own longest text, rounded up to one of a few
bucket lengths, and the non-padding tokens are counted on the device.

Why buckets and not the exact longest length: torch.compile specialises on shapes and CUDA graphs record one graph
per shape, so every distinct length costs a compile or a graph capture; a handful of lengths keeps that bounded
(pytorch/pytorch#188150, and /work/shared FACTS "GPU fine-tuning speed"). Why not packing: transformers 5 packs
only for FlashAttention models (``DataCollatorWithFlattening``), and ``RobertaForSequenceClassification`` pools
token 0 of a row, so packed texts would need their own pooling.

The attention mask makes padding inert (padded keys get no attention weight, and the classifier reads token 0), so
what the model learns does not depend on how far a batch is padded; tests/training/test_padding.py proves it by
training the same batches both ways.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

PADDING_MODES = ("bucketed", "max_length")
# Tensor cores work on multiples of 8; no bucket is shorter than this.
SMALLEST_BUCKET = 8


def bucket_lengths(max_length: int) -> tuple[int, ...]:
    """8, 16, 24, 32, 48, 64, 96, 128, 192, 256, ... up to ``max_length`` (always the last bucket).

    Powers of two and 1.5 times powers of two: each bucket is at most 1.5x the one below, so rounding up wastes at
    most a third of a batch's positions, with 8 buckets up to 128 and 12 up to 512.
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
        if self.padding not in PADDING_MODES:
            raise ValueError(f"padding must be one of {', '.join(PADDING_MODES)}, got {self.padding!r}")

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        sizes = [len(row["input_ids"]) for row in rows]
        width = self.buckets[-1] if self.padding == "max_length" else padded_length(max(sizes), self.buckets)
        input_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, (row, size) in enumerate(zip(rows, sizes, strict=True)):
            input_ids[i, :size] = torch.as_tensor(row["input_ids"], dtype=torch.long)
            attention_mask[i, :size] = 1
        batch = {"input_ids": input_ids, "attention_mask": attention_mask}
        if "label" in rows[0]:
            batch["labels"] = torch.tensor([row["label"] for row in rows], dtype=torch.long)
        return batch


class TokenCounter:
    """Non-padding tokens on the device (summed without reading them back), positions computed on the host (known
    from shapes). Read once, at log time; the train loop never waits for the device to count."""

    def __init__(self) -> None:
        self.tokens: torch.Tensor | None = None  # non-padding tokens, a device scalar
        self.positions = 0  # padded positions computed, from shapes: no device read

    def add(self, attention_mask: torch.Tensor) -> None:
        count = attention_mask.sum()
        self.tokens = count if self.tokens is None else self.tokens + count
        self.positions += attention_mask.numel()

    def snapshot(self) -> tuple[torch.Tensor | None, int]:
        """The counts so far; the tensor is a new one (``+`` above never writes in place), so nothing is read."""
        return self.tokens, self.positions


def read_counts(snapshots: Sequence[tuple[torch.Tensor | None, int]]) -> list[tuple[int, int]]:
    """(non-padding tokens, positions) of each snapshot, summed over the ranks of a torchrun: one device read and
    one all-reduce for all of them together, at the end."""
    device = next((tokens.device for tokens, _ in snapshots if tokens is not None), torch.device("cpu"))
    zero = torch.zeros((), dtype=torch.long, device=device)
    tokens = torch.stack([zero if count is None else count.to(torch.long) for count, _ in snapshots])
    positions = torch.tensor([count for _, count in snapshots], dtype=torch.long, device=device)
    values = torch.stack([tokens, positions], dim=1)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(values)
    return [(int(tokens), int(positions)) for tokens, positions in values.tolist()]
