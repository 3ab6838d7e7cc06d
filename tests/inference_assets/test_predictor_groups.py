"""A forward pass groups its texts by length: no text is padded to a much longer neighbour's length, each group is
one call of the model, and the predictions are those of each text alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from inference_assets.container.predictor import MIN_GROUP_LENGTH, SentimentPredictor, length_groups


def test_lengths_fall_into_power_of_two_bands_shortest_first() -> None:
    assert length_groups([3, 64, 17, 16, 40, 33], 64) == [[0, 3], [2], [1, 4, 5]]
    assert length_groups([], 512) == []
    assert length_groups([600], 512) == [[0]]  # never beyond the model's window
    # No text is padded to more than twice its length (or the shortest band).
    lengths = list(range(1, 513))
    for group in length_groups(lengths, 512):
        longest = max(lengths[i] for i in group)
        assert all(longest <= max(2 * lengths[i], MIN_GROUP_LENGTH) for i in group)


@pytest.fixture(scope="module")
def predictor(tiny_model_dir: Path) -> SentimentPredictor:
    return SentimentPredictor(tiny_model_dir)


def test_a_pass_calls_the_model_once_per_length_group_padded_to_that_group(predictor: SentimentPredictor) -> None:
    calls: list[tuple[int, int]] = []
    model = predictor._forward

    def recording(**inputs):
        calls.append(tuple(inputs["input_ids"].shape))
        return model(**inputs)

    texts = ["ok", "a long review that goes on and on about the film " * 10, "fine", "quite good overall"]
    predictor._forward = recording
    try:
        together = predictor.predict(texts)
    finally:
        predictor._forward = model
    widths = {len(ids) for ids in predictor.encode(texts)}
    assert len(calls) == len(length_groups(sorted(widths), predictor.max_length)) >= 2
    assert sum(rows for rows, _ in calls) == len(texts)
    assert max(width for _, width in calls) == predictor.max_length  # only the long one is padded that far
    assert min(width for _, width in calls) <= MIN_GROUP_LENGTH
    for text, prediction in zip(texts, together, strict=True):
        (alone,) = predictor.predict([text])
        assert prediction.label == alone.label
        assert prediction.scores == pytest.approx(alone.scores, abs=1e-4)
