"""The training benchmark's offline pieces (the RoBERTa-base-sized model, tweet-length texts) and a whole run on CPU
without the ``datasets`` package, which the GPU machine does not have."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, RobertaForSequenceClassification

from proving_ground.benchmarks import training_throughput
from training_assets.instance.throughput import ModelFlops

ROOT = Path(__file__).resolve().parents[2]


def test_the_roberta_base_sized_model_has_roberta_bases_size() -> None:
    """The issue's model: 124.6M parameters (word embeddings 50,265 x 768 = 38.6M of them), 514 positions; built
    on the meta device, so nothing is allocated."""
    config = training_throughput.roberta_base_config(pad_token_id=1, bos_token_id=0, eos_token_id=2)
    with torch.device("meta"):
        model = RobertaForSequenceClassification(config)
    assert sum(p.numel() for p in model.parameters()) == 124_647_939
    assert (config.vocab_size, config.max_position_embeddings, config.num_labels) == (50_265, 514, 3)
    flops = ModelFlops.from_config(config)
    assert flops is not None and flops.matmul_weights == 84_934_656


def test_synthetic_texts_are_tweet_length(tiny_model_dir: Path, tmp_path: Path) -> None:
    """~25 tokens on average as the issue's tweets, most short and a long tail, every label present."""
    folder = training_throughput.synthetic_tweets(tmp_path / "tweets", rows=2048)
    rows = [json.loads(line) for line in (folder / "train.jsonl").read_text().splitlines()]
    assert len(rows) == 2048 and len((folder / "validation.jsonl").read_text().splitlines()) == 256
    lengths = [
        len(ids) for ids in AutoTokenizer.from_pretrained(tiny_model_dir)([r["text"] for r in rows])["input_ids"]
    ]
    assert 22 <= statistics.mean(lengths) <= 28
    assert statistics.median(lengths) < statistics.mean(lengths) < max(lengths)  # a long tail
    assert {row["label"] for row in rows} == {0, 1, 2}
    assert (
        training_throughput.synthetic_tweets(tmp_path / "again", rows=2048).joinpath("train.jsonl").read_text()
        == (folder / "train.jsonl").read_text()
    )  # the same texts on every machine


def test_variant_names() -> None:
    assert training_throughput.variant_flags("fast_path@256") == ("fast_path", 256)
    assert training_throughput.variant_flags("baseline") == ("baseline", None)
    with pytest.raises(ValueError, match="unknown variant 'fast@x'"):
        training_throughput.variant_flags("fast@x")


# Python imports sitecustomize at start-up from the path (PYTHONPATH): in every process of the benchmark, `datasets`
# is then missing as on the GPU machine (find_spec finds nothing, importing fails).
HIDE_DATASETS = """
import importlib.abc, importlib.util, sys
_find_spec = importlib.util.find_spec
def _hidden(name):
    return name == "datasets" or name.startswith("datasets.")
def find_spec(name, package=None):
    return None if _hidden(name) else _find_spec(name, package)
importlib.util.find_spec = find_spec
class _Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if _hidden(name):
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by the test)", name=name)
        return None
sys.meta_path.insert(0, _Hide())
"""


@pytest.mark.slow
def test_the_benchmark_runs_without_datasets(tmp_path: Path) -> None:
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(HIDE_DATASETS)
    env = {**os.environ, "PYTHONPATH": f"{hide}{os.pathsep}{ROOT}", "TOKENIZERS_PARALLELISM": "false"}
    hidden = subprocess.run([sys.executable, "-c", "import datasets"], env=env, capture_output=True, text=True)
    assert hidden.returncode != 0 and "hidden by the test" in hidden.stderr

    output = tmp_path / "result.json"
    result = subprocess.run(
        [sys.executable, "-m", "proving_ground.benchmarks.training_throughput", "--synthetic-rows", "64",
         "--epochs", "1", "--batch-size", "8", "--max-seq-length", "64", "--rounds", "1",
         "--variants", "baseline,fast_path@4",
         "--output", str(output)],
        cwd=ROOT, env=env, check=False, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(output.read_text())
    baseline, fast = report["variants"]
    assert "error" not in baseline and "error" not in fast, report
    assert (baseline["per_device_batch_size"], fast["per_device_batch_size"]) == (8, 4)
    assert baseline["padding_fraction"] > 0.5 > fast["padding_fraction"]
    # The small model's FLOPs: 6 * 4 * (4 * 256**2 + 2 * 256 * 1024) per token plus attention over ~25 tokens.
    assert 6 * 3_145_728 < fast["model_flops_per_token"] < 6 * 3_145_728 + 12 * 4 * 256 * 64
    assert fast["non_padding_tokens_per_second"] > 0 and fast["model_tflops_per_second"] > 0
    assert "fraction_of_dense_bf16_peak" not in fast  # a CPU has no entry in the GPU peaks
    assert report["dataset"].startswith("64 synthetic tweet-length texts")
