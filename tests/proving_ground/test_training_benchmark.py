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
from tests.training_assets.warm_python import WarmPython
from training_assets.instance.throughput import ModelFlops

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "proving_ground" / "benchmarks" / "gpu_training_benchmark.sh"


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


def _hidden_datasets(tmp_path: Path) -> dict[str, str]:
    """An environment in which `datasets` cannot be imported, as on the GPU machine."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(HIDE_DATASETS)
    env = {**os.environ, "PYTHONPATH": f"{hide}{os.pathsep}{ROOT}", "TOKENIZERS_PARALLELISM": "false",
           "PYTHON": sys.executable}  # fmt: skip
    hidden = subprocess.run([sys.executable, "-c", "import datasets"], env=env, capture_output=True, text=True)
    assert hidden.returncode != 0 and "hidden by the test" in hidden.stderr
    return env


@pytest.mark.slow
def test_the_one_shot_gpu_check_runs_every_step_dry_on_cpu_without_datasets(tmp_path: Path) -> None:
    """gpu_training_benchmark.sh --dry: the device probe, every variant (buckets, packing, the seed's baseline), the
    per-variant files written as each ends, on CPU with the tiny model. Limits generous here: this checks what it
    does, not how fast a shared machine does it (docs/training-performance.md has the timing).

    Its `python3` and the variants' (PYTHON_EXEC) are forked from one interpreter that imported torch and
    transformers once, with `datasets` hidden (warm_python.py), in the environment the script gives them: what each
    process does is unchanged, four imports of torch and transformers are saved."""
    out = tmp_path / "out"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    hidden = _hidden_datasets(tmp_path)
    del hidden["PYTHON"]  # the script's default, `python3`, is the warm stand-in on PATH
    env = {**hidden, "VARIANT_SECONDS": "300", "DEADLINE_SECONDS": "600", "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "OMP_NUM_THREADS": "1", "TORCHINDUCTOR_CACHE_DIR": str(out / "inductor-cache")}  # fmt: skip
    # What the script exports for its processes (gpu_training_benchmark.sh): the warm interpreter starts with it.
    script_env = {**env, "PYTHONUNBUFFERED": "1", "PYTHONPATH": f"{ROOT}{os.pathsep}{env['PYTHONPATH']}"}
    warm = WarmPython(script_env)
    try:
        (bin_dir / "python3").symlink_to(warm.executable)
        result = subprocess.run(["bash", str(SCRIPT), "--dry", str(out)], cwd=tmp_path, env=warm.env(**env),
                                check=False, capture_output=True, text=True, timeout=900)  # fmt: skip
        forked = [line for line in warm.requests() if line.startswith("warm ")]
    finally:
        warm.close()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert len(forked) == 4, warm.requests()  # the benchmark and its three variants
    device = json.loads((out / "device.json").read_text())
    assert device["transformers"] == "5.23.0" and device["torch"] == torch.__version__
    assert device["measured_matmul_tflops"] > 0 and device["measured_copy_gb_per_second"] > 0
    summary = json.loads((out / "training_throughput_gpu.json").read_text())
    assert [row["variant"] for row in summary["variants"]] == ["fast_path@8", "packed@16", "baseline@8"]
    rows = {row["variant"]: row for row in summary["variants"]}
    for name, row in rows.items():
        assert "error" not in row, row
        stem = name.replace("@", "-b")
        assert json.loads((out / "variants" / f"{stem}.json").read_text()) == row  # its own file, as it ended
        assert (out / "variants" / f"{stem}.metrics.json").is_file()
        assert "train_sentiment: warning" in (out / "variants" / f"{stem}.log").read_text()  # its output, kept
        # Observed, not configured: what compiled and what CUDA graphs did (nothing, on CPU, and it says so).
        assert (row["graph_breaks"], row["cuda_graph_skips"], row["cuda_graph_rerecords"]) == (0, 0, 0)
        assert row["aten_ops_per_step"] > 0 and row["peak_memory_bytes"] > 0
        assert row["kernel_launches_per_step"] is None  # a CPU launches no kernels
    # Packing pads least; buckets less than the seed's padding to max_seq_length.
    assert rows["packed@16"]["padding_fraction"] < rows["fast_path@8"]["padding_fraction"] < 0.5
    assert rows["baseline@8"]["padding_fraction"] > 0.5
    for row in (rows["packed@16"], rows["fast_path@8"]):
        assert row["host_seconds_per_step"] > 0 and row["data_loader_wait_seconds"] is not None
    assert "fraction_of_dense_bf16_peak" not in rows["fast_path@8"]  # a CPU has no entry in the GPU peaks
    assert summary["dataset"].startswith("64 synthetic tweet-length texts")
    assert (out / "benchmark.log").read_text().count("wrote ") == 1


def test_a_variant_past_its_time_limit_is_stopped_and_recorded(tmp_path: Path) -> None:
    """--variant-seconds: the variant's process is stopped, the results say so, and its output is kept."""
    out = tmp_path / "results.json"
    result = subprocess.run(
        [sys.executable, "-m", "proving_ground.benchmarks.training_throughput", "--synthetic-rows", "64",
         "--model-size", "tiny", "--use-cpu", "--rounds", "1", "--variants", "baseline", "--variant-seconds", "0.5",
         "--output", str(out)],
        cwd=ROOT, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"}, check=False, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    (row,) = json.loads(out.read_text())["variants"]
    assert row["error"] == "stopped at its time limit of 1 s"  # at least 1 s
    assert json.loads((tmp_path / "results" / "baseline.json").read_text()) == row
    assert (tmp_path / "results" / row["log"]).is_file()  # beside the row
