"""The predictor with serving's ``torch_compile`` option: TorchDynamo traces the model with dynamic shapes during the
warm-up, so that no request after it waits for a compile, whatever its batch size or length. The tracing is real; its
graphs run eagerly (``backend="eager"``): what TorchInductor builds from a graph is test_compiled_run.py's concern, and
costs ~50 CPU-s on an empty cache."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from inference_assets.container.predictor import RuntimeOptions, SentimentPredictor


@pytest.fixture
def traced_eagerly(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **options: compile_(model, backend="eager", **options))
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


@pytest.mark.usefixtures("traced_eagerly")
def test_the_warm_up_compiles_every_graph_that_later_requests_use(tiny_model_dir: Path) -> None:
    predictor = SentimentPredictor(tiny_model_dir, RuntimeOptions(torch_compile=True, threads=1))
    compiled = counters["stats"]["unique_graphs"]
    assert compiled >= 1 and predictor.warm_up_seconds > 0
    # batch sizes and lengths the warm-up never sent, one alone among them (size 1 is a shape of its own to TorchDynamo)
    for size, words in ((1, 2), (4, 9), (7, 25), (2, 40), (1, 30)):
        answers = predictor.predict([" ".join(["great"] * words)] * size)
        assert len(answers) == size
    assert counters["stats"]["unique_graphs"] == compiled
