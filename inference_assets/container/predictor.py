"""The sentiment predictor every model server shares: texts in, one prediction per text out, one forward pass.

It knows nothing about HTTP or request validation (``protocol.py`` does that); it labels a list of texts.
Run-time options come from the container environment (the endpoint stack sets them from validated settings):

    OMP_NUM_THREADS             intra-op threads of this worker (workers x threads = the instance's cores)
    SENTIMENT_PRECISION         fp32 (default) or bf16_autocast: the forward pass under torch.autocast(bfloat16).
                                On Graviton the fp32 model with DNNL_DEFAULT_FPMATH_MODE=BF16 (oneDNN's bf16
                                fast-math GEMM kernels, read by oneDNN itself) is the recommended route; autocast
                                is the equivalent on x86 CPUs with AVX512-BF16/AMX, used to measure accuracy here.
    SENTIMENT_TORCH_COMPILE     1: torch.compile the model at load and warm it up (start-up cost: docs/benchmarks.md)
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .contract import PRECISION_ENV, PRECISIONS, TORCH_COMPILE_ENV

log = logging.getLogger(__name__)

WARM_UP_TEXT = "warm-up: the service is starting"


@dataclass(frozen=True)
class Prediction:
    label: str
    score: float
    scores: dict[str, float]

    def as_dict(self) -> dict:
        return {"label": self.label, "score": self.score, "scores": self.scores}


@dataclass(frozen=True)
class RuntimeOptions:
    """How the forward pass runs; ``threads=None`` means OMP_NUM_THREADS or every core."""

    precision: str = "fp32"
    torch_compile: bool = False
    threads: int | None = None

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"{PRECISION_ENV} must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")

    @classmethod
    def from_environment(cls, environment: Mapping[str, str]) -> RuntimeOptions:
        compile_flag = environment.get(TORCH_COMPILE_ENV, "0")
        if compile_flag not in ("0", "1"):
            raise ValueError(f"{TORCH_COMPILE_ENV} must be 0 or 1, got {compile_flag!r}")
        threads = environment.get("OMP_NUM_THREADS")
        return cls(
            precision=environment.get(PRECISION_ENV) or "fp32",
            torch_compile=compile_flag == "1",
            threads=int(threads) if threads and threads.isdigit() and int(threads) > 0 else None,
        )


class SentimentPredictor:
    """Loads a sequence-classification model and its tokenizer from a directory and labels lists of texts."""

    def __init__(self, model_dir: str | os.PathLike[str], options: RuntimeOptions | None = None) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.options = options or RuntimeOptions()
        # A server runs several copies of a model (DJL's workers, Ray Serve's replicas); each defaulting to all cores
        # would oversubscribe the CPU.
        self.threads = max(1, self.options.threads or os.cpu_count() or 1)
        torch.set_num_threads(self.threads)
        self.model_dir = Path(model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.model = AutoModelForSequenceClassification.from_pretrained(self.model_dir).eval()
        self.labels = [self.model.config.id2label[i] for i in range(self.model.config.num_labels)]
        # The tokenizer may claim a longer limit than the position embeddings allow (RoBERTa reserves 2).
        limits = [self.tokenizer.model_max_length]
        positions = getattr(self.model.config, "max_position_embeddings", None)
        if positions:
            limits.append(positions - 2 if self.model.config.model_type in ("roberta", "xlm-roberta") else positions)
        self.max_length = min(limits)
        # Texts of any length are accepted and cut to the model's window (truncation=True, as the Hugging Face
        # inference toolkit does). Tokenizing a whole 6 MB text only to keep its first tokens would cost seconds, so
        # a text is first cut to the characters that max_length tokens can cover at most: no token covers more
        # characters than its vocabulary entry has (byte-level BPE: one character per byte or more; WordPiece:
        # "##" prefixes, and words over 100 characters become one [UNK]).
        longest_token = max((len(token) for token in self.tokenizer.get_vocab()), default=1)
        self.max_chars = (self.max_length + 1) * max(longest_token, 100)
        self._torch = torch
        self._forward = self.model
        self.warm_up_seconds = 0.0
        if self.options.torch_compile:
            # dynamic=True: one graph for every batch size and sequence length, instead of a recompile per shape.
            self._forward = torch.compile(self.model, dynamic=True)
            started = time.perf_counter()
            for size in (1, 2, 3):  # the first calls compile; the later ones settle the dynamic-shape guards
                self.predict([WARM_UP_TEXT] * size)
            self.warm_up_seconds = time.perf_counter() - started
            log.info("torch.compile warm-up took %.1f s", self.warm_up_seconds)

    def _precision(self) -> contextlib.AbstractContextManager:
        if self.options.precision == "bf16_autocast":
            return self._torch.autocast("cpu", dtype=self._torch.bfloat16)
        return contextlib.nullcontext()

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's token ids, cut to the model's window (special tokens included), unpadded: what a forward pass
        costs is known before it runs (``tokens``)."""
        if not texts:
            return []
        cut = [text[: self.max_chars] for text in texts]
        return list(self.tokenizer(cut, truncation=True, max_length=self.max_length)["input_ids"])

    def predict(self, texts: str | Sequence[str]) -> list[Prediction]:
        """The predictions of ``texts``, in order (see ``predict_encoded``)."""
        return self.predict_encoded(self.encode([texts] if isinstance(texts, str) else texts))

    def predict_encoded(self, encodings: Sequence[Sequence[int]]) -> list[Prediction]:
        """One prediction per encoded text, in order. The texts are grouped by length (``length_groups``) and each
        group is one call of the model, padded to its own longest text: a tweet is never padded to a review's 512
        tokens, and a call's cost is bounded by its group's tokens."""
        predictions: list[Prediction | None] = [None] * len(encodings)
        if self._torch.get_num_threads() != self.threads:  # a library of the process reset it (measured: it happens)
            self._torch.set_num_threads(self.threads)
        for group in length_groups([len(ids) for ids in encodings], self.max_length):
            ids = [list(encodings[index]) for index in group]
            padded = self.tokenizer.pad({"input_ids": ids}, return_tensors="pt")
            with self._torch.inference_mode(), self._precision():
                rows = self._forward(**padded).logits.float().softmax(dim=-1).tolist()
            for index, row in zip(group, rows, strict=True):
                predictions[index] = self._prediction(row)
        return [prediction for prediction in predictions if prediction is not None]

    def _prediction(self, row: list[float]) -> Prediction:
        best = max(range(len(row)), key=row.__getitem__)
        return Prediction(
            label=self.labels[best],
            score=round(row[best], 6),
            scores={label: round(p, 6) for label, p in zip(self.labels, row, strict=True)},
        )

    def predict_dicts(self, texts: Sequence[str], encodings: Sequence[Sequence[int]] | None = None) -> list[dict]:
        """``predict`` as dicts; ``encodings`` (``encode(texts)``, when the caller has them already) skips the
        tokenizer."""
        predictions = self.predict(texts) if encodings is None else self.predict_encoded(encodings)
        return [prediction.as_dict() for prediction in predictions]


# The shortest group length: below it, padding costs less than another call of the model.
MIN_GROUP_LENGTH = 16


def length_groups(lengths: Sequence[int], max_length: int) -> list[list[int]]:
    """The indices of ``lengths`` grouped for forward passes: texts whose lengths fall in the same power-of-two band
    (up to 16, 17-32, 33-64, ... up to ``max_length``) share a call, shortest band first, so no text is padded to
    more than twice its own length (or 16 tokens), and there are at most log2(max_length / 16) + 1 calls."""
    bands: dict[int, list[int]] = {}
    for index, length in enumerate(lengths):
        band = MIN_GROUP_LENGTH
        while band < min(length, max_length):
            band *= 2
        bands.setdefault(band, []).append(index)
    return [bands[band] for band in sorted(bands)]
