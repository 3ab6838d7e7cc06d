"""The contract's default limits agree with what users send, through the TorchServe handler of the proving ground's
harness (the protocol and predictor every server runs).

The container gets no limit variables here, so it runs on ``Limits()``: 32 texts per request, a body of at most
SageMaker's own real-time payload cap (InvokeEndpoint ``Body``: "Maximum length of 6291456", SageMaker Runtime API
reference), and texts of any length cut to the model's window as the Hugging Face inference toolkit does
(``truncation=True``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from inference_assets.container.contract import Limits
from inference_assets.container.predictor import SentimentPredictor
from tests.inference_assets.torchserve_inprocess import loaded_service, predict

JSON = {"Content-Type": "application/json"}
SAMPLE_DATA = Path(__file__).resolve().parents[2] / "training_assets" / "sample_data" / "validation.jsonl"


@pytest.fixture(scope="module")
def service(torchserve_model: Path) -> Iterator:
    with pytest.MonkeyPatch.context() as patch:
        for name in Limits.ENVIRONMENT.values():
            patch.delenv(name, raising=False)
        with loaded_service(torchserve_model, batch_size=8) as loaded:
            yield loaded


def _review(chars: int) -> str:
    """Real review sentences repeated to ``chars`` characters."""
    rows = [json.loads(line)["text"] for line in SAMPLE_DATA.read_text().splitlines() if line.strip()]
    text = " ".join(rows)
    return (text * (chars // len(text) + 1))[:chars]


def test_twelve_texts_of_1500_characters_are_answered(service) -> None:
    texts = [_review(1_500)] * 12
    (answer,) = predict(service, [(json.dumps({"inputs": texts}).encode(), JSON)])
    assert answer.status == 200, answer.body
    assert len(answer.json()) == 12


def test_a_100000_character_review_is_answered_as_its_window(service, tiny_model_dir: Path) -> None:
    review = _review(100_000)
    (answer,) = predict(service, [(json.dumps({"inputs": review}).encode(), JSON)])
    assert answer.status == 200, answer.body
    # The answer is the model's on the text cut to its window (the tokenizer's truncation of the whole text).
    predictor = SentimentPredictor(tiny_model_dir)
    window = predictor.tokenizer(review, truncation=True, max_length=predictor.max_length)["input_ids"]
    cut = predictor.tokenizer.decode(window, skip_special_tokens=True)
    (served,) = answer.json()
    (expected,) = predictor.predict_dicts([cut])
    assert served["label"] == expected["label"]
    assert served["scores"] == pytest.approx(expected["scores"], abs=1e-4)


def test_the_predictor_cuts_long_texts_without_changing_the_tokens(tiny_model_dir: Path) -> None:
    """The character cut before tokenizing keeps exactly the tokens that truncation of the whole text keeps."""
    predictor = SentimentPredictor(tiny_model_dir)
    review = _review(predictor.max_chars * 3)
    whole = predictor.tokenizer(review, truncation=True, max_length=predictor.max_length)["input_ids"]
    cut = predictor.tokenizer(review[: predictor.max_chars], truncation=True, max_length=predictor.max_length)
    assert cut["input_ids"] == whole and len(whole) == predictor.max_length


def test_a_body_over_the_byte_cap_is_refused_and_the_worker_keeps_serving(service) -> None:
    cap = Limits().max_request_bytes
    assert cap == 6_291_456  # SageMaker's real-time payload cap
    oversized = json.dumps({"inputs": "x" * cap}).encode()
    good = json.dumps({"inputs": ["a fine day", "an awful day"]}).encode()
    refused, served = predict(service, [(oversized, JSON), (good, JSON)])
    assert refused.status == 413 and f"at most {cap} are allowed" in refused.json()["error"]
    assert served.status == 200 and len(served.json()) == 2
    (again,) = predict(service, [(good, JSON)])
    assert again.status == 200
