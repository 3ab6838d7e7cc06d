"""Many ranks learn exactly like one: two CPU processes (torchrun, gloo) and one process, at the same global batch
and seed, log the same loss and gradient norm at every step, end with the same weights, and every rank runs the
same bucket length at the same step (the batches are grouped by the global batch, not per device), or with
``--padding packed`` the same number of packed rows.

The tiny model's dropout is off for this comparison: dropout draws its masks per process, so with it on the two
runs would differ by design, not by a bug."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from safetensors.torch import load_file

from inference_assets.container.predictor import SentimentPredictor
from tests.training_assets.warm_python import WarmPython

ROOT = Path(__file__).resolve().parents[2]
RECORDER = ROOT / "tests" / "training_assets" / "rank_recorder.py"
TRAIN_ROWS = 240
EPOCHS = 2
GLOBAL_BATCH = 16
STEPS = EPOCHS * (TRAIN_ROWS // GLOBAL_BATCH)
SETTINGS = ["--epochs", str(EPOCHS), "--global-batch-size", str(GLOBAL_BATCH), "--learning-rate", "5e-3",
            "--max-seq-length", "32", "--logging-steps", "1", "--use-cpu"]  # fmt: skip
# Tolerances, from runs here: the two runs sum the same numbers in another order (each rank's half batch, then the
# gradient all-reduce), so they differ in the last float32 bits: 2.4e-7 in the loss and grad norm at most; after 30
# AdamW steps at 5e-3 the weights differ by 1.1e-5 at most (Adam divides by the gradients' root mean square, which
# magnifies the bits where a gradient is near zero). Before the fix the two-rank loss was 2x the one-process loss.
LOSS_TOLERANCE = 1e-5
WEIGHT_TOLERANCE = 1e-4


def _run(python: WarmPython, processes: int, arguments: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    launcher = [python.executable]
    if processes > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
    return subprocess.run([*launcher, str(RECORDER), *arguments], cwd=cwd, env=python.env(), capture_output=True,
                          text=True, timeout=600, check=False)  # fmt: skip


@pytest.fixture(scope="module")
def runs(tiny_model_without_dropout: Path, sample_data: Path, tmp_path_factory: pytest.TempPathFactory,
         warm_python: WarmPython) -> dict[int, Path]:  # fmt: skip
    """{processes: output folder} of the same training with one process and with two (each writes its shapes)."""
    root = tmp_path_factory.mktemp("ranks")
    outputs = {}
    for processes in (1, 2):
        output = root / f"processes-{processes}"
        arguments = ["--record-dir", str(output / "shapes"), "--model", str(tiny_model_without_dropout),
                     "--dataset", str(sample_data), "--output-dir", str(output), *SETTINGS]  # fmt: skip
        result = _run(warm_python, processes, arguments, root)
        if result.returncode and "Gloo connectFullMesh failed" in result.stderr:
            result = _run(warm_python, processes, arguments, root)  # this sandbox's loopback (test_checkpoints.py)
        assert result.returncode == 0, result.stderr[-4000:]
        # Only rank 0 prints the epochs' lines.
        assert result.stdout.count("epoch 1.0:") == 1
        outputs[processes] = output
    return outputs


@pytest.fixture(scope="module")
def packed_ranks(tiny_model_without_dropout: Path, sample_data: Path, tmp_path_factory: pytest.TempPathFactory,
                 warm_python: WarmPython) -> Path:  # fmt: skip
    """The shapes folder of a two-rank run with --padding packed (one epoch: the shapes are what is compared)."""
    root = tmp_path_factory.mktemp("packed-ranks")
    arguments = ["--record-dir", str(root / "shapes"), "--model", str(tiny_model_without_dropout), "--dataset",
                 str(sample_data), "--output-dir", str(root / "output"), *SETTINGS, "--epochs", "1", "--padding",
                 "packed"]  # fmt: skip
    result = _run(warm_python, 2, arguments, root)
    if result.returncode and "Gloo connectFullMesh failed" in result.stderr:
        result = _run(warm_python, 2, arguments, root)
    assert result.returncode == 0, result.stderr[-4000:]
    return root / "shapes"


def _metrics(output: Path) -> dict:
    return json.loads((output / "metrics.json").read_text())


@pytest.mark.slow
def test_two_ranks_log_the_loss_and_gradient_norm_of_one_process(runs: dict[int, Path]) -> None:
    one, two = _metrics(runs[1]), _metrics(runs[2])
    assert (one["device"]["world_size"], two["device"]["world_size"]) == (1, 2)
    assert len(one["train_loss_log"]) == len(two["train_loss_log"]) == STEPS
    for single, double in zip(one["train_loss_log"], two["train_loss_log"], strict=True):
        assert single["step"] == double["step"]
        assert double["loss"] == pytest.approx(single["loss"], abs=LOSS_TOLERANCE), single["step"]
        assert double["grad_norm"] == pytest.approx(single["grad_norm"], abs=LOSS_TOLERANCE), single["step"]
    # The per-epoch rows of metrics.json too: the train loss of each epoch, and the evaluation loss over every
    # validation row once (60 rows on two ranks: accelerate fills the last batch up with repeated rows).
    for single, double in zip(one["epochs"], two["epochs"], strict=True):
        assert double["train_loss"] == pytest.approx(single["train_loss"], abs=LOSS_TOLERANCE)
        assert double["eval_loss"] == pytest.approx(single["eval_loss"], abs=LOSS_TOLERANCE)
        assert double["eval_accuracy"] == single["eval_accuracy"]
    assert two["epochs"][-1]["train_loss"] < two["epochs"][0]["train_loss"]


@pytest.mark.slow
def test_two_ranks_end_with_the_weights_of_one_process(runs: dict[int, Path], tiny_model_without_dropout: Path) -> None:
    single = load_file(runs[1] / "saved_model" / "model.safetensors")
    double = load_file(runs[2] / "saved_model" / "model.safetensors")
    assert single.keys() == double.keys()
    worst = max((single[name] - double[name]).abs().max().item() for name in single)
    assert worst <= WEIGHT_TOLERANCE
    # The runs moved the weights far more than they differ: the comparison is not between two untrained models.
    start = load_file(tiny_model_without_dropout / "model.safetensors")
    assert max((single[name] - start[name]).abs().max().item() for name in single) > 100 * WEIGHT_TOLERANCE


@pytest.mark.slow
def test_every_rank_runs_the_same_bucket_length_at_the_same_step(runs: dict[int, Path]) -> None:
    one = json.loads((runs[1] / "shapes" / "rank-0.json").read_text())
    ranks = [json.loads((runs[2] / "shapes" / f"rank-{rank}.json").read_text()) for rank in (0, 1)]
    assert len(one) == len(ranks[0]) == len(ranks[1]) == STEPS
    assert ranks[0] == ranks[1]
    # Each step's global batch is one bucket, cut in two: the one process pads the same step to the same length.
    assert [shape[1] for shape in ranks[0]] == [shape[1] for shape in one]
    assert {shape[0] for shape in ranks[0]} == {GLOBAL_BATCH // 2} and {shape[0] for shape in one} == {GLOBAL_BATCH}
    assert len({shape[1] for shape in one}) > 1  # several bucket lengths: the agreement is not trivial


@pytest.mark.slow
def test_only_rank_zero_reports_and_writes(runs: dict[int, Path]) -> None:
    metrics = _metrics(runs[2])
    assert metrics["throughput"]["samples_per_step"] == GLOBAL_BATCH
    assert metrics["throughput"]["measured_steps"] == STEPS - 1
    assert sorted(p.name for p in runs[2].iterdir()) == ["metrics.json", "saved_model", "shapes"]
    assert SentimentPredictor(runs[2] / "saved_model").predict("The update is amazing!")[0].label


@pytest.mark.slow
def test_every_rank_packs_the_same_number_of_rows_at_the_same_step(packed_ranks: Path) -> None:
    ranks = [json.loads((packed_ranks / f"rank-{rank}.json").read_text()) for rank in (0, 1)]
    own = [json.loads((packed_ranks / f"rank-{rank}.rows.json").read_text()) for rank in (0, 1)]
    steps = TRAIN_ROWS // GLOBAL_BATCH
    assert len(ranks[0]) == len(ranks[1]) == steps
    assert ranks[0] == ranks[1]
    # Each step's rows are the most either rank's texts pack into by themselves: no more padding than that.
    assert [shape[0] for shape in ranks[0]] == [max(pair) for pair in zip(own[0][:steps], own[1][:steps], strict=True)]
    assert {shape[1] for shape in ranks[0]} == {32}  # max_seq_length: the packed rows' width
    # The ranks' own row counts differ on some steps: without the agreement they would run different shapes.
    assert any(a != b for a, b in zip(own[0][:steps], own[1][:steps], strict=True))
