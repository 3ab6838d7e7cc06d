"""Every answer belongs to its request, whatever the lengths of the texts around it, and a huge text is cut before
the tokenizer sees it (inference_assets/container/protocol.py and predictor.py).

The fixtures mix lengths on purpose (long, short, longest, shortest...): a forward pass that sorts its texts by length
to save padding and forgets to put the answers back, or a batch that hands out answers in another order, returns
plausible predictions to the wrong clients, and only texts in an order that sorting changes can show it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from inference_assets.container.predictor import SentimentPredictor
from inference_assets.container.protocol import Limits, answer_batch

JSON = {"Content-Type": "application/json"}
# Lengths in an order no sort keeps: descending, ascending and repeated lengths all move under a sort by length.
MIXED = ["a" * 40, "bb", "c" * 300, "d", "e" * 17, "ff", "g" * 90]


def _labelled(texts: list[str]) -> list[dict[str, Any]]:
    """A predict whose answer names the text it was given."""
    return [{"label": text, "score": 1.0, "scores": {text: 1.0}} for text in texts]


def test_each_request_of_a_mixed_batch_gets_the_answers_to_its_own_texts() -> None:
    bodies = [MIXED[0:2], MIXED[2:3], ["bad", 3], MIXED[3:6], MIXED[6:7]]
    requests = [(json.dumps({"inputs": texts}).encode(), JSON) for texts in bodies]
    answers = answer_batch(requests, _labelled, Limits())
    assert [answer.status for answer in answers] == [200, 200, 400, 200, 200]
    for texts, answer in zip(bodies, answers, strict=True):
        if answer.status == 200:
            assert [prediction["label"] for prediction in answer.json()] == texts  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def predictor(tiny_model_dir: Path) -> SentimentPredictor:
    return SentimentPredictor(tiny_model_dir)


class _LengthLogits:
    """In place of the model: each row's logits say how many real tokens it has (its attention mask's sum), so an
    answer tells which text it was computed from."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch

    def __call__(self, input_ids: Any, attention_mask: Any, **_: Any) -> Any:
        lengths = attention_mask.sum(dim=1).float()
        logits = self.torch.stack([lengths / 10, self.torch.zeros_like(lengths), self.torch.zeros_like(lengths)], 1)
        return type("Output", (), {"logits": logits})()


def test_the_predictor_answers_each_text_in_the_order_it_was_given(
    predictor: SentimentPredictor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(predictor, "_forward", _LengthLogits(predictor._torch))
    words = [" ".join(["word"] * n) for n in (7, 1, 30, 2, 12, 1, 20)]  # mixed lengths, all inside the window
    batch = predictor.predict_dicts(words)
    alone = [predictor.predict_dicts([text])[0] for text in words]
    assert batch == alone
    assert len({prediction["score"] for prediction in batch}) == len(set(words))  # the fixture can tell them apart


def test_the_real_model_answers_a_text_in_a_mixed_batch_as_it_answers_it_alone(predictor: SentimentPredictor) -> None:
    texts = ["an awful, slow service and cold food", "fine", "what a great day " * 20, "bad", "so so"]
    batch = predictor.predict_dicts(texts)
    for text, prediction in zip(texts, batch, strict=True):
        (alone,) = predictor.predict_dicts([text])
        assert prediction["label"] == alone["label"]
        assert prediction["scores"] == pytest.approx(alone["scores"], abs=2e-6)


def test_a_huge_text_is_cut_before_the_tokenizer_sees_it(
    predictor: SentimentPredictor, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[int] = []
    tokenizer = predictor.tokenizer

    class Spy:
        def __call__(self, texts: list[str], **options: Any) -> Any:
            seen.extend(len(text) for text in texts)
            return tokenizer(texts, **options)

        def __getattr__(self, name: str) -> Any:  # pad and the rest: the real tokenizer's
            return getattr(tokenizer, name)

    monkeypatch.setattr(predictor, "tokenizer", Spy())
    huge = "a long review. " * 400_000  # 6 MB: SageMaker's payload cap
    (answer,) = predictor.predict_dicts([huge])
    assert seen == [predictor.max_chars] and predictor.max_chars < 10_000
    # Cutting keeps the tokens the whole text's truncation keeps: the same answer as the cut text's.
    monkeypatch.setattr(predictor, "tokenizer", tokenizer)
    assert predictor.predict_dicts([huge[: predictor.max_chars]]) == [answer]


def test_a_short_text_reaches_the_tokenizer_whole(
    predictor: SentimentPredictor, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []
    tokenizer = predictor.tokenizer

    class Spy:
        def __call__(self, texts: list[str], **options: Any) -> Any:
            seen.extend(texts)
            return tokenizer(texts, **options)

        def __getattr__(self, name: str) -> Any:  # pad and the rest: the real tokenizer's
            return getattr(tokenizer, name)

    monkeypatch.setattr(predictor, "tokenizer", Spy())
    exactly = "x" * predictor.max_chars
    predictor.predict_dicts(["short", exactly, exactly + "y"])
    assert seen == ["short", exactly, exactly]


def test_cutting_a_long_text_keeps_every_token_of_the_window(predictor: SentimentPredictor) -> None:
    """Texts made of the vocabulary's longest tokens (each covers many characters), and of short ones, over the
    window: the cut text's tokens are the whole text's first max_length tokens (a cut at a few characters per token
    would classify a shorter review than the model can read)."""
    tokenizer, window = predictor.tokenizer, predictor.max_length
    longest = sorted(tokenizer.get_vocab(), key=len, reverse=True)[:20]
    long_words = tokenizer.convert_tokens_to_string(longest)
    assert len(long_words) > 8 * len(longest)  # each of these tokens covers more than 8 characters
    for text in (long_words * 50, "ab" * 40_000, "word " * 5_000):
        whole = tokenizer([text], truncation=True, max_length=window)["input_ids"][0]
        assert len(whole) == window
        assert predictor.encode([text]) == [whole]
