"""The predictor computes on the threads it is given, else on every core (os.cpu_count(); one when unknown): a server
that runs several copies gives each its share, a single copy uses the machine. torch's setting is recorded, not
changed: this process's threads stay as they are."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from inference_assets.container.predictor import RuntimeOptions, SentimentPredictor


@pytest.mark.parametrize(("threads", "cores", "expected"), [(None, 6, 6), (None, None, 1), (1, 6, 1), (3, 6, 3)])
def test_the_predictor_runs_on_the_threads_given_else_on_every_core(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, threads: int | None, cores: int | None, expected: int
) -> None:
    import torch

    set_to: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", set_to.append)
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    predictor = SentimentPredictor(tiny_model_dir, RuntimeOptions(threads=threads))
    assert predictor.threads == expected and set_to == [expected]


def test_a_precision_it_does_not_know_or_no_threads_is_refused_in_one_sentence() -> None:
    """(The container's own guard behind the settings' check: the sentence an operator reads in the endpoint's log.)"""
    with pytest.raises(ValueError) as refused:
        RuntimeOptions(precision="fp16")
    assert str(refused.value) == "SENTIMENT_PRECISION must be one of fp32, bf16_autocast, got 'fp16'"
    with pytest.raises(ValueError) as refused:
        RuntimeOptions(threads=0)
    assert str(refused.value) == "threads must be >= 1, got 0"
