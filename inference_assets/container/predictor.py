"""The sentiment predictor every model server shares (SageMaker PyTorch toolkit, DJL Serving, local harnesses).

It knows nothing about HTTP: adapters parse requests, call ``predict`` and serialise its result.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


class BadRequest(ValueError):
    """The request cannot be served as sent; adapters turn it into a 4xx answer."""


class BatchTooLarge(BadRequest):
    """More texts in one request than ``max_batch_size``; HTTP adapters answer 413."""


@dataclass(frozen=True)
class Prediction:
    label: str
    score: float
    scores: dict[str, float]

    def as_dict(self) -> dict:
        return {"label": self.label, "score": self.score, "scores": self.scores}


def _configure_threads() -> None:
    """Use the cores the server gives each worker, not every core of the host.

    TorchServe runs several workers per model; each defaulting to all cores oversubscribes the CPU.
    ``OMP_NUM_THREADS`` (set by the endpoint's environment) wins; otherwise one worker takes all cores.
    """
    import torch

    threads = int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1)
    torch.set_num_threads(max(1, threads))


class SentimentPredictor:
    """Loads a sequence-classification model and its tokenizer from a directory and labels batches of texts."""

    def __init__(self, model_dir: str | os.PathLike[str], *, max_batch_size: int = 32) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        _configure_threads()
        self.model_dir = Path(model_dir)
        self.max_batch_size = max_batch_size
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.model = AutoModelForSequenceClassification.from_pretrained(self.model_dir).eval()
        self.labels = [self.model.config.id2label[i] for i in range(self.model.config.num_labels)]
        # The tokenizer may claim a longer limit than the position embeddings allow (RoBERTa reserves 2).
        limits = [self.tokenizer.model_max_length]
        positions = getattr(self.model.config, "max_position_embeddings", None)
        if positions:
            limits.append(positions - 2 if self.model.config.model_type in ("roberta", "xlm-roberta") else positions)
        self.max_length = min(limits)
        self._torch = torch

    def validate(self, texts: object) -> list[str]:
        """Return ``texts`` as a list of strings, or raise :class:`BadRequest` saying what is wrong."""
        if isinstance(texts, str):
            texts = [texts]
        if not isinstance(texts, list):
            raise BadRequest('"inputs" must be a string or a list of strings')
        if not texts:
            raise BadRequest('"inputs" must not be an empty list')
        if len(texts) > self.max_batch_size:
            raise BatchTooLarge(
                f'"inputs" holds {len(texts)} texts; at most {self.max_batch_size} are allowed per request'
            )
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise BadRequest(f'"inputs"[{i}] must be a string, got {type(text).__name__}')
        return texts

    def predict(self, texts: object) -> list[Prediction]:
        batch = self.validate(texts)
        encoded = self.tokenizer(batch, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt")
        with self._torch.inference_mode():
            probabilities = self.model(**encoded).logits.float().softmax(dim=-1).tolist()
        predictions = []
        for row in probabilities:
            best = max(range(len(row)), key=row.__getitem__)
            predictions.append(
                Prediction(
                    label=self.labels[best],
                    score=round(row[best], 6),
                    scores={label: round(p, 6) for label, p in zip(self.labels, row, strict=True)},
                )
            )
        return predictions
