"""The forward passes of a loaded predictor (the TorchServe handler's and the Ray replica's), counted or failing."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def counted_forward_passes(holder: Any) -> Iterator[list[int]]:
    """How many texts each forward pass of ``holder.predictor`` gets while the block runs."""
    original = holder.predictor.predict_dicts
    sizes: list[int] = []

    def counting(texts, *encodings):  # the Ray replica hands the texts' token ids too
        sizes.append(len(texts))
        return original(texts, *encodings)

    holder.predictor.predict_dicts = counting
    try:
        yield sizes
    finally:
        holder.predictor.predict_dicts = original


# A failure inside the model, with a path the answer must not show the client.
FAILURE = "out of cheese at /opt/ml/model/code/sentiment_serving/predictor.py"


@contextmanager
def failing_forward_passes(holder: Any) -> Iterator[None]:
    """Every forward pass of ``holder.predictor`` raises (RuntimeError: FAILURE) while the block runs."""
    original = holder.predictor.predict_dicts

    def broken(*_):
        raise RuntimeError(FAILURE)

    holder.predictor.predict_dicts = broken
    try:
        yield
    finally:
        holder.predictor.predict_dicts = original
