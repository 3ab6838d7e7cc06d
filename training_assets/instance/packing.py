"""Packed batches (``--padding packed``): several texts share one row, each attending only to its own tokens, so a
batch computes almost no padding.

What RoBERTa in the pinned transformers (5.23) supports, and what this uses: ``RobertaModel.forward`` takes
``position_ids`` (so each text's positions restart at ``padding_idx + 1``, as ``create_position_ids_from_input_ids``
numbers a text alone in its row), and ``masking_utils.create_bidirectional_mask`` passes a ready 4D mask through
unchanged ("an already prepared 4D mask ... is returned as-is"), so a block-diagonal mask keeps attention inside each
text. The classification head pools a row's first token (``RobertaClassificationHead``: ``features[:, 0, :]``), so
``PackedClassifier`` gathers the hidden state of each text's first token and runs the model's own head on those.
Without FlashAttention there is no padding-free (varlen) kernel: the attention still computes every row's
width x width scores, but the masked ones are the only waste, and the matrix multiplications outside attention (most
of RoBERTa-base's FLOPs on tweets) run on real tokens only.

Only the training batches are packed; evaluation runs the padded batches through the unchanged model.

Every rank packs the same number of rows on the same step (``AlignedPackingSampler``): the rows a batch packs into
vary with its texts' lengths, and a rank whose batch packed into another row count than the others' would compile
(and, with CUDA graphs, record) a shape of its own while the others wait for it in the gradient all-reduce.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import Sampler

# Model types whose sequence classifier is an encoder (``base_model``) and a head that pools the first token.
PACKABLE_MODEL_TYPES = ("roberta", "xlm-roberta")
# Attention implementations that take a boolean 4D mask (sdpa) or an additive one (eager); flash and flex
# attention take neither.
PACKABLE_ATTENTION = ("sdpa", "eager")


def pack_rows(sizes: Sequence[int], width: int) -> list[list[int]]:
    """First-fit decreasing: the texts (indices into ``sizes``) of each row, no row longer than ``width`` tokens."""
    rows: list[list[int]] = []
    free: list[int] = []
    for index in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        if sizes[index] > width:
            raise ValueError(f"a text of {sizes[index]} tokens does not fit a row of {width}")
        for row, space in enumerate(free):
            if sizes[index] <= space:
                rows[row].append(index)
                free[row] -= sizes[index]
                break
        else:
            rows.append([index])
            free.append(width - sizes[index])
    return rows


class PackedIndex(int):
    """A row index that carries the row count of its step's packed batches (``AlignedPackingSampler``): the collator
    of each rank adds empty rows up to it. An ``int`` everywhere else."""

    rows: int

    def __new__(cls, index: int, rows: int) -> PackedIndex:
        value = super().__new__(cls, index)
        value.rows = rows
        return value

    def __reduce__(self) -> tuple[type, tuple[int, int]]:  # DataLoader workers get the indices pickled
        return (PackedIndex, (int(self), self.rows))


class AlignedPackingSampler(Sampler[int]):
    """The order of ``base`` (the Trainer's shuffled sampler), each index of a full global batch carrying the most
    rows that any per-device batch of that global batch packs into, so that every rank (and every accumulated
    micro-step) packs its batch into that many rows: one shape per step on every rank.

    ``global_batch`` counts every rank's batch and the accumulated steps: accelerate deals the consecutive
    ``per_device_batch`` indices of the loader to the ranks in turn (``BatchSamplerShard``), so one global batch is
    one optimizer step on every rank (as ``LengthBucketSampler`` groups buckets). Rows of a last partial global batch
    (a split smaller than one global batch, batch_plan) are plain indices. ``pack_rows`` is deterministic, so the
    sampler counts exactly the rows the collator will pack.
    """

    def __init__(self, base: Any, lengths: Sequence[int], width: int, per_device_batch: int,
                 global_batch: int) -> None:  # fmt: skip
        if not 1 <= per_device_batch <= global_batch or global_batch % per_device_batch:
            raise ValueError(f"the global batch {global_batch} must be a multiple of the per-device batch "
                             f"{per_device_batch}")  # fmt: skip
        self.base = base
        self.lengths = lengths
        self.width = width
        self.per_device_batch = per_device_batch
        self.global_batch = global_batch

    def __len__(self) -> int:
        return len(self.base)

    def set_epoch(self, epoch: int) -> None:  # the Trainer reshuffles each epoch through the sampler's epoch
        if hasattr(self.base, "set_epoch"):
            self.base.set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        order = list(self.base)
        full = len(order) - len(order) % self.global_batch
        aligned: list[int] = []
        for start in range(0, full, self.global_batch):
            batch = order[start : start + self.global_batch]
            rows = max(
                len(pack_rows([self.lengths[i] for i in batch[first : first + self.per_device_batch]], self.width))
                for first in range(0, self.global_batch, self.per_device_batch)
            )
            aligned += [PackedIndex(index, rows) for index in batch]
        return iter(aligned + order[full:])


@dataclass(frozen=True)
class PackingCollator:
    """Packs tokenized rows (``input_ids``, ``label``) into rows of ``width`` tokens.

    Returns ``input_ids`` and ``position_ids`` (rows x width; padding has the pad id and RoBERTa's padding position),
    ``segment_ids`` (0 on padding, 1, 2, ... for the texts of a row), ``text_starts`` (per text, in input order, the
    flat index of its first token), ``labels`` and ``token_counts`` (host integers: non-padding tokens and the sum of
    squared text lengths). Rows carrying ``packed_rows`` (``PackedIndex``) get empty rows up to that count (padding
    only, each position attending to itself). A plain top-level class, so DataLoader worker processes can pickle it.
    """

    pad_token_id: int
    width: int

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        sizes = [len(row["input_ids"]) for row in rows]
        packed = pack_rows(sizes, self.width)
        shape = (max(len(packed), *(row.get("packed_rows", 0) for row in rows)), self.width)
        input_ids = torch.full(shape, self.pad_token_id, dtype=torch.long)
        # RoBERTa numbers positions from padding_idx + 1 and gives padding padding_idx (its pad token id).
        position_ids = torch.full(shape, self.pad_token_id, dtype=torch.long)
        segment_ids = torch.zeros(shape, dtype=torch.long)
        text_starts = torch.empty(len(rows), dtype=torch.long)
        first_position = self.pad_token_id + 1
        for row, texts in enumerate(packed):
            offset = 0
            for segment, index in enumerate(texts, start=1):
                end = offset + sizes[index]
                input_ids[row, offset:end] = torch.as_tensor(rows[index]["input_ids"], dtype=torch.long)
                position_ids[row, offset:end] = torch.arange(first_position, first_position + sizes[index])
                segment_ids[row, offset:end] = segment
                text_starts[index] = row * self.width + offset
                offset = end
        batch: dict[str, Any] = {
            "input_ids": input_ids,
            "position_ids": position_ids,
            "segment_ids": segment_ids,
            "text_starts": text_starts,
            "token_counts": [sum(sizes), sum(size * size for size in sizes)],
        }
        if "label" in rows[0]:
            batch["labels"] = torch.tensor([row["label"] for row in rows], dtype=torch.long)
        return batch


def text_attention_mask(segment_ids: torch.Tensor, implementation: str, dtype: torch.dtype) -> torch.Tensor:
    """The (rows, 1, width, width) mask that keeps each token's attention inside its own text: boolean for SDPA
    (True: attend), additive for eager attention. A padding position attends to itself only, so no softmax row is
    empty (an all-masked row would give NaN); nothing reads its output."""
    same_text = segment_ids[:, :, None] == segment_ids[:, None, :]
    allowed = (same_text & (segment_ids[:, None, :] > 0)) | torch.eye(
        segment_ids.shape[-1], dtype=torch.bool, device=segment_ids.device
    )
    allowed = allowed[:, None]
    if implementation == "eager":
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
            ~allowed, torch.finfo(dtype).min
        )
    return allowed


class PackedClassifier(nn.Module):
    """A sequence classifier (RoBERTa family) that also takes packed batches: the model's encoder on the packed rows
    with the block-diagonal mask and per-text positions, its own head on each text's first token, cross-entropy
    averaged over the texts (what the model's loss is on the same texts padded). Padded batches (evaluation) go to
    the model unchanged. ``model`` is what gets saved: this wrapper holds no weights of its own."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model: Any = model  # a PreTrainedModel: config, base_model, classifier
        self.config = model.config
        self.main_input_name = getattr(model, "main_input_name", "input_ids")

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        segment_ids: torch.Tensor | None = None,
        text_starts: torch.Tensor | None = None,
    ) -> Any:
        from transformers.modeling_outputs import SequenceClassifierOutput

        if text_starts is None or segment_ids is None:
            return self.model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
        dtype = self.model.get_input_embeddings().weight.dtype
        mask = text_attention_mask(segment_ids, self.config._attn_implementation, dtype)
        hidden = self.model.base_model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids)[0]
        firsts = hidden.flatten(0, 1)[text_starts][:, None, :]  # (texts, 1, hidden): each text's first token
        logits = self.model.classifier(firsts)
        loss = None if labels is None else nn.functional.cross_entropy(logits, labels)
        return SequenceClassifierOutput(loss=loss, logits=logits)


def check_packable(config: Any) -> str | None:
    """Why the model cannot train on packed batches, or None if it can."""
    if config.model_type not in PACKABLE_MODEL_TYPES:
        return f"packing needs a {' or '.join(PACKABLE_MODEL_TYPES)} model, this one is {config.model_type}"
    if config._attn_implementation not in PACKABLE_ATTENTION:
        implementation = config._attn_implementation
        return f"packing needs {' or '.join(PACKABLE_ATTENTION)} attention, this model uses {implementation}"
    return None
