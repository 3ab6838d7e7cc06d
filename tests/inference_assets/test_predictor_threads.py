"""The predictor computes on the threads it is given, else on every core (os.cpu_count(); one when unknown): a server
that runs several copies gives each its share, a single copy uses the machine. Each test puts torch's threads back."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from inference_assets.container.predictor import RuntimeOptions, SentimentPredictor


@pytest.fixture()
def torch_threads_restored() -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(("threads", "cores", "expected"), [(None, 6, 6), (None, None, 1), (1, 6, 1), (3, 6, 3)])
def test_the_predictor_runs_on_the_threads_given_else_on_every_core(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, torch_threads_restored: None,
    threads: int | None, cores: int | None, expected: int,
) -> None:  # fmt: skip
    import torch

    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    predictor = SentimentPredictor(tiny_model_dir, RuntimeOptions(threads=threads))
    assert predictor.threads == torch.get_num_threads() == expected
