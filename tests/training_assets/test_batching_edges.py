"""batching.py at its edges, without a model: the smallest bucket table and batch, every rank of a global batch padded
to the same length, the counts summed over ranks on the device the all-reduce needs, and the refusals' sentences
(written from what mutation testing of batching.py left alive: docs/testing.md)."""

from __future__ import annotations

from typing import cast

import pytest
import torch

from training_assets.instance.batching import (
    BucketCollator,
    Counts,
    LengthBucketSampler,
    PaddedIndex,
    TokenCounter,
    bucket_lengths,
    total,
)
from training_assets.instance.train_sentiment import TokenizedSplit


def test_the_smallest_max_length_is_one_token_and_zero_is_refused() -> None:
    assert bucket_lengths(1) == (1,)
    assert bucket_lengths(8) == (8,) and bucket_lengths(9) == (8, 9)
    with pytest.raises(ValueError, match=r"^max_length must be at least 1, got 0$"):
        bucket_lengths(0)


def test_a_global_batch_of_one_text_is_allowed_and_of_none_refused() -> None:
    torch.manual_seed(0)
    order = [cast(PaddedIndex, index) for index in LengthBucketSampler([5, 12, 30], bucket_lengths(32), batch_size=1)]
    assert sorted(order) == [0, 1, 2]
    assert {int(index): index.padded_length for index in order} == {0: 8, 1: 16, 2: 32}  # each its own batch
    with pytest.raises(ValueError, match=r"^batch_size must be at least 1, got 0$"):
        LengthBucketSampler([5], bucket_lengths(32), batch_size=0)


def test_the_collator_refuses_a_padding_it_does_not_do() -> None:
    with pytest.raises(ValueError, match=r"^the collator pads 'bucketed' or 'max_length', got 'packed'$"):
        BucketCollator(pad_token_id=1, buckets=(8,), padding="packed")


@pytest.mark.parametrize("per_rank", [1, 4])
def test_every_rank_pads_its_share_of_a_global_batch_to_the_global_batchs_bucket(per_rank: int) -> None:
    """A global batch at the border of two buckets: the ranks whose rows are all short pad them as long as the
    longest row of the whole global batch, so every rank runs the same shape at the step (one compiled graph)."""
    lengths = [5] * per_rank + [12] * per_rank  # buckets 8 and 16
    split = TokenizedSplit([[7] * length for length in lengths], [0] * len(lengths))
    torch.manual_seed(0)
    order = list(LengthBucketSampler(split.lengths, bucket_lengths(64), batch_size=2 * per_rank))
    collate = BucketCollator(pad_token_id=1, buckets=bucket_lengths(64))
    # accelerate deals consecutive per-device batches of the global batch to the ranks in turn (BatchSamplerShard)
    shares = [order[rank * per_rank : (rank + 1) * per_rank] for rank in range(2)]
    assert sorted(lengths[i] for i in shares[0]) == [5] * per_rank  # the sampler put the short rows together
    for share in shares:
        batch = collate([split[index] for index in share])
        assert tuple(batch["input_ids"].shape) == (per_rank, 16)
        assert batch["attention_mask"].sum(dim=1).tolist() == [lengths[i] for i in share]
    # Rows without a global batch's length (evaluation's plain indices) pad to their own bucket.
    assert tuple(collate([split[int(index)] for index in shares[0]])["input_ids"].shape) == (per_rank, 8)


def test_the_counts_of_every_step_are_summed_over_the_ranks_on_the_counters_device(monkeypatch) -> None:
    """One all-reduce for all steps, of a tensor on the counter's device (NCCL reduces GPU tensors only; the meta
    device stands in for the GPU this machine lacks): what it holds is what read() gives back."""
    reduced: list[torch.Tensor] = []

    class Reduced(Exception):
        pass

    def all_reduce(values: torch.Tensor) -> None:
        reduced.append(values)
        raise Reduced  # a meta tensor holds no values to read back

    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "all_reduce", all_reduce)
    counter = TokenCounter("meta")
    counter.add(5, 13, (2, 4))
    counter.add(1, 1, (1, 4))
    with pytest.raises(Reduced):
        counter.read()
    (values,) = reduced
    assert values.device == torch.device("meta") and tuple(values.shape) == (2, 3) and values.dtype == torch.long
    # On the CPU, one rank: the sum over the ranks is this rank's counts (the all-reduce really runs, on gloo).
    monkeypatch.undo()
    store = torch.distributed.HashStore()
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        cpu = TokenCounter()
        cpu.add(5, 13, (2, 4))
        cpu.add(1, 1, (1, 4))
        steps = cpu.read()
    finally:
        torch.distributed.destroy_process_group()
    assert steps == [Counts(5, 13, 8), Counts(1, 1, 4)]
    assert total(steps) == Counts(6, 14, 12) and total([]) == Counts(0, 0, 0)


def test_a_row_index_keeps_its_global_batchs_length_in_a_dataloader_worker() -> None:
    """DataLoader worker processes get the sampler's indices pickled: the padded length travels with the index."""
    import pickle

    index = pickle.loads(pickle.dumps(PaddedIndex(3, 16)))
    assert (type(index), int(index), index.padded_length) == (PaddedIndex, 3, 16)


def test_the_batch_holding_the_one_longest_text_comes_first() -> None:
    """One text of 60 tokens among 31 of 30: whichever batch it falls into (a batch of 32-token texts otherwise) is
    the first step, so an out-of-memory error shows at once, not somewhere in the epoch."""
    lengths = [30] * 31 + [60]
    for seed in range(8):
        torch.manual_seed(seed)
        order = list(LengthBucketSampler(lengths, bucket_lengths(64), batch_size=8))
        assert 31 in order[:8], seed
        assert {cast(PaddedIndex, index).padded_length for index in order[:8]} == {64}, seed
