"""What the predictor answers, against the model run by hand: each text's label is the class of its highest
probability, with that probability as its score and every class's probability (softmax of the logits, 6 decimals);
one text alone is one answer; encodings given are the ones answered; a text past the model's window is cut to it
(RoBERTa's positions minus its two reserved ones) and still answered; a thread count a library reset is set again;
bf16 autocast computes in bf16. Mutation testing (docs/testing.md) found these unchecked by the fast tests, which
compare the predictor's answers with its own."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from inference_assets.container.predictor import RuntimeOptions, SentimentPredictor

TEXTS = ["a wonderful film", "dull", "I did not like it at all, the plot was thin and the acting was worse"]


@pytest.fixture(scope="module")
def predictor(tiny_model_dir: Path) -> SentimentPredictor:
    return SentimentPredictor(tiny_model_dir, RuntimeOptions(threads=1))


def _by_hand(predictor: SentimentPredictor, text: str) -> list[float]:
    ids = predictor.tokenizer(text, return_tensors="pt")
    with torch.inference_mode():
        return predictor.model(**ids).logits.float().softmax(dim=-1)[0].tolist()


def test_each_answer_is_the_models_probabilities_with_the_likeliest_label(predictor: SentimentPredictor) -> None:
    labels = [predictor.model.config.id2label[i] for i in range(predictor.model.config.num_labels)]
    answers = predictor.predict(TEXTS)
    assert len(answers) == len(TEXTS)
    for text, answer in zip(TEXTS, answers, strict=True):
        probabilities = _by_hand(predictor, text)
        assert list(answer.scores) == labels
        assert list(answer.scores.values()) == pytest.approx(probabilities, abs=1e-6)
        assert all(value == round(value, 6) for value in [answer.score, *answer.scores.values()])
        best = max(range(len(labels)), key=probabilities.__getitem__)
        assert answer.label == labels[best] and answer.score == answer.scores[labels[best]]


def test_the_label_is_the_likeliest_class_wherever_it_is(predictor: SentimentPredictor, monkeypatch) -> None:
    """(The tiny model, untrained, finds every text positive, its last class: logits of one's own choosing.)"""
    logits = torch.tensor([[0.5, 3.0, -1.0], [4.0, 1.0, 0.0], [0.0, 1.0, 2.0]])
    monkeypatch.setattr(
        predictor, "_forward", lambda **inputs: SimpleNamespace(logits=logits[: len(inputs["input_ids"])])
    )
    answers = predictor.predict(["same length", "same lengths", "same length!"])
    assert [answer.label for answer in answers] == ["neutral", "negative", "positive"]
    expected = logits.softmax(dim=-1).tolist()
    assert [answer.score for answer in answers] == [round(max(row), 6) for row in expected]


def test_one_text_is_one_answer_and_given_encodings_are_the_ones_answered(predictor: SentimentPredictor) -> None:
    assert predictor.predict(TEXTS[2]) == predictor.predict([TEXTS[2]])
    others = predictor.encode(list(reversed(TEXTS)))
    assert predictor.predict_dicts(TEXTS, others) == [a.as_dict() for a in predictor.predict(list(reversed(TEXTS)))]
    assert predictor.predict_dicts(TEXTS) == [answer.as_dict() for answer in predictor.predict(TEXTS)]


def test_a_text_past_the_window_is_cut_to_it_and_answered(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A tokenizer that claims a longer window than the model's positions (RoBERTa reserves two of them)."""
    model_dir = shutil.copytree(tiny_model_dir, tmp_path / "model")
    settings = json.loads((model_dir / "tokenizer_config.json").read_text())
    (model_dir / "tokenizer_config.json").write_text(json.dumps({**settings, "model_max_length": 10_000}))
    predictor = SentimentPredictor(model_dir, RuntimeOptions(threads=1))
    config = predictor.model.config
    assert config.model_type == "roberta" and predictor.max_length == config.max_position_embeddings - 2
    assert predictor.tokenizer.model_max_length > predictor.max_length  # (the positions are the limit here)
    long = "the film goes on " * 2000
    (ids,) = predictor.encode([long])
    assert len(ids) == predictor.max_length and ids[-1] == predictor.tokenizer.eos_token_id
    (answer,) = predictor.predict([long])
    assert answer.scores == predictor.predict_encoded([ids])[0].scores


@pytest.mark.parametrize(("model_type", "reserved"), [("roberta", 2), ("xlm-roberta", 2), ("bert", 0)])
def test_the_window_is_the_positions_less_those_the_model_type_reserves(
    tiny_model_dir: Path, tmp_path: Path, model_type: str, reserved: int
) -> None:
    """RoBERTa and XLM-RoBERTa number positions from padding_idx + 1, so two of them hold no token; BERT numbers them
    from 0, and every one holds a token. The same tiny weights under each type, a tokenizer claiming a longer window."""
    model_dir = shutil.copytree(tiny_model_dir, tmp_path / "model")
    for name, change in (
        ("tokenizer_config.json", {"model_max_length": 10_000}),
        ("config.json", {"model_type": model_type}),
    ):
        path = model_dir / name
        path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    predictor = SentimentPredictor(model_dir, RuntimeOptions(threads=1))
    assert predictor.model.config.model_type == model_type
    assert predictor.max_length == predictor.model.config.max_position_embeddings - reserved


def test_a_thread_count_reset_by_a_library_is_set_again_before_a_pass(
    predictor: SentimentPredictor, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_to: list[int] = []
    monkeypatch.setattr(torch, "get_num_threads", lambda: predictor.threads + 3)
    monkeypatch.setattr(torch, "set_num_threads", set_to.append)
    predictor.predict(TEXTS[:1])
    assert set_to == [predictor.threads]


@pytest.mark.parametrize(("precision", "dtype"), [("fp32", torch.float32), ("bf16_autocast", torch.bfloat16)])
def test_the_precision_setting_is_the_one_the_model_computes_in(
    tiny_model_dir: Path, precision: str, dtype: torch.dtype
) -> None:
    predictor = SentimentPredictor(tiny_model_dir, RuntimeOptions(precision=precision, threads=1))
    seen: list[torch.dtype] = []
    linear = next(module for module in predictor.model.modules() if isinstance(module, torch.nn.Linear))
    hook = linear.register_forward_hook(lambda module, inputs, output: seen.append(output.dtype))
    try:
        (answer,) = predictor.predict(TEXTS[:1])
    finally:
        hook.remove()
    assert seen and set(seen) == {dtype}
    assert sum(answer.scores.values()) == pytest.approx(1.0, abs=1e-5)
