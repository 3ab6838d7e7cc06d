"""Counting the forward passes of a loaded predictor: the TorchServe handler's and the Ray replica's."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def counted_forward_passes(holder: Any) -> Iterator[list[int]]:
    """How many texts each forward pass of ``holder.predictor`` gets while the block runs."""
    original = holder.predictor.predict_dicts
    sizes: list[int] = []

    def counting(texts):
        sizes.append(len(texts))
        return original(texts)

    holder.predictor.predict_dicts = counting
    try:
        yield sizes
    finally:
        holder.predictor.predict_dicts = original
