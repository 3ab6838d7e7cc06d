"""The validation benchmark's prediction side, verdicts and report (fast); its harness side is the measured window."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mme_sizing.intervals import batch_means, wilson
from proving_ground.sizing_validation import (
    INSIDE,
    OUTSIDE,
    WITHIN,
    judge,
    predict,
    predict_row,
    verdict,
    window_load_cpu_s,
    write_results,
)

ROOT = Path(__file__).resolve().parents[2]
COSTS = {"first_load_s": 4.2, "reload_s": 4.0, "unload_s": 0.03, "warm_request_s": 0.007, "one_model_rps": 250.0,
         "own_models_rps": 180.0, "worker_s": 0.004, "frontend_s": 0.007, "concurrent_reload_s": 9.0,
         "load_cpu_s": 4.5, "own_models_cpu_per_request": {"client_s": 0.001, "frontend_s": 0.002,
                                                           "workers_s": 0.002}}  # fmt: skip
WINDOW = {"users": 4, "window_s": 120.0, "warmup_s": 10.0}


def test_with_every_model_resident_nothing_loads_and_every_request_hits() -> None:
    predicted = predict(COSTS, cores=2.0, models=16, resident=16, pattern="uniform", seeds=3, **WINDOW)
    assert predicted["loads"]["max"] == 0 and predicted["hit_ratio"]["min"] == 1.0
    # CPU-bound: 2 cores over 4 ms in the worker + 7 ms outside it per request.
    assert predicted["tps"]["mean"] == pytest.approx(2 / 0.011, rel=0.02)


def test_fewer_resident_models_mean_fewer_hits_and_less_throughput() -> None:
    few, many = (
        predict(COSTS, cores=2.0, models=16, resident=resident, pattern="uniform", seeds=3, **WINDOW)
        for resident in (4, 12)
    )
    assert few["hit_ratio"]["mean"] < many["hit_ratio"]["mean"] and few["tps"]["mean"] < many["tps"]["mean"]
    # Thrashing under uniform traffic: the hit ratio is about the resident share.
    assert few["hit_ratio"]["mean"] == pytest.approx(4 / 16, abs=0.08)


def test_the_prediction_reports_its_spread_over_seeds() -> None:
    predicted = predict(COSTS, cores=2.0, models=16, resident=4, pattern="uniform", seeds=4, **WINDOW)
    assert predicted["seeds"] == 4 and len(predicted["runs"]) == 4
    tps = [run["tps"] for run in predicted["runs"]]
    assert predicted["tps"]["min"] == min(tps) < max(tps) == predicted["tps"]["max"]  # seeds differ
    assert predicted["tps"]["sd"] > 0


def test_less_cpu_left_by_the_host_predicts_less_throughput() -> None:
    full, shared = (
        predict(COSTS, cores=cores, models=16, resident=4, pattern="uniform", seeds=2, **WINDOW) for cores in (2.0, 1.0)
    )
    assert shared["tps"]["mean"] < 0.7 * full["tps"]["mean"]  # loads are CPU-bound


def test_verdict_is_inside_the_interval_then_within_20_percent_then_outside() -> None:
    interval = batch_means([9.0, 10.0, 11.0, 10.0, 10.0]).as_dict()  # 10 +- 1.0
    assert verdict(10.8, interval) == INSIDE
    assert verdict(11.9, interval) == WITHIN  # outside the interval, 19% above
    assert verdict(12.5, interval) == OUTSIDE
    wide = wilson(5, 20).as_dict()  # 0.25 [0.11, 0.47]: a prediction 60% off is still inside
    assert verdict(0.4, wide) == INSIDE


def _row(measured_tps: list[float], hits: int, requests: int, predicted_tps: float, predicted_hits: float) -> dict:
    tps, hit_ratio = batch_means(measured_tps), wilson(hits, requests)
    return {
        "models": 16, "resident": 4, "pattern": "uniform", "requests": requests, "model_loads": requests - hits,
        "tps": tps.estimate, "tps_interval": tps.as_dict(), "hit_ratio": hit_ratio.estimate,
        "hit_ratio_interval": hit_ratio.as_dict(), "window_s": 50.0, "conclusive": True,
        "cpu": {"cores_left": 1.6, "frontend_s": 0.5, "workers_s": 300.0},
        "samples": {"resident": 3.9, "registered": 4.0}, "replay_loads": 60,
        "predicted": {"tps": {"mean": predicted_tps, "sd": 0.05}, "hit_ratio": {"mean": predicted_hits, "sd": 0.01}},
    }  # fmt: skip


def test_report_shows_intervals_predictions_verdicts_and_what_the_harness_held(tmp_path: Path) -> None:
    passing = judge(_row([1.0, 1.1, 0.9, 1.0, 1.0], 25, 100, 1.05, 0.27))
    failing = judge({**_row([1.0, 1.1, 0.9, 1.0, 1.0], 25, 100, 1.5, 0.25), "conclusive": False})
    assert passing["passes"] and (passing["tps_verdict"], passing["hit_ratio_verdict"]) == (INSIDE, INSIDE)
    assert not failing["passes"] and failing["tps_verdict"] == OUTSIDE
    result = {"command": "python -m proving_ground.benchmarks.mme_fleet_validation", "costs": COSTS, "seeds": 5,
              "host": {"machine": "2 CPUs", "cpus": 2, "load_average_before": 0.1}, "rows": [passing, failing],
              "settings": {"users": 4, "warmup_s": 10.0, "precision": 0.2, "max_requests": 1500,
                           "max_window_s": 150.0, "batch_s": 10.0}}  # fmt: skip
    write_results(result, tmp_path)
    report = (tmp_path / "mme_fleet_validation.md").read_text()
    assert (
        "| 16 | 4 | uniform | 100 | 75 | 1.00 [0.91, 1.09] | 1.05 ± 0.05 | inside (+5%) | 0.25 [0.18, 0.34] | "
        "0.27 ± 0.01 | inside | 1.60 | 50 s | yes |"
    ) in report
    assert "| 1.50 ± 0.05 | outside (+50%) |" in report and "50 s, inconclusive | inconclusive (no) |" in report
    assert "1 of 2 windows were conclusive; 1 of them pass" in report
    assert "0 of the 1 inconclusive runs have the prediction inside" in report
    assert "| 16 | 4 | uniform | 3.9 | 4.0 | 75 | 60 | 4.00 |" in report  # (300.5 - 100 x 4 ms) / 75 loads
    assert "(the prediction's: 4.50)" in report
    assert "Wilson" in report and "batch means" in report
    saved = json.loads((tmp_path / "mme_fleet_validation.json").read_text())
    assert saved["summary"]["conclusive_pass"] == 1 and saved["rows"][1]["tps_verdict"] == OUTSIDE


def test_the_diagnosis_predicts_again_at_the_load_cost_the_run_had() -> None:
    """A run whose loads cost less CPU than the probe said: the prediction from the probe misses, the same prediction
    at the window's own load cost does not, which puts the miss on the input, not on the simulation."""
    window = {"cores": 2.0, "models": 16, "resident": 8, "pattern": "uniform", "users": 4, "window_s": 120.0,
              "warmup_s": 10.0}  # fmt: skip
    run = predict({**COSTS, "load_cpu_s": 3.0}, seeds=1, **window)["runs"][0]  # the "measured" run
    requests, loads = run["requests"], run["loads"]
    per_request = COSTS["own_models_cpu_per_request"]
    row = {"models": 16, "resident": 8, "pattern": "uniform", "window_s": 120.0, "requests": requests,
           "model_loads": loads, "tps": run["tps"], "tps_interval": batch_means([run["tps"] * f for f in
           (0.95, 1.0, 1.05, 1.0, 1.0)]).as_dict(), "hit_ratio": run["hit_ratio"],
           "hit_ratio_interval": wilson(requests - loads, requests).as_dict(),
           "cpu": {"cores_left": 2.0, "frontend_s": requests * per_request["frontend_s"],
                   "workers_s": loads * 3.0 + requests * per_request["workers_s"]}}  # fmt: skip
    assert window_load_cpu_s(row, COSTS) == pytest.approx(3.0)
    predict_row(row, COSTS, users=4, warmup_s=10.0, seeds=3)  # COSTS: a load takes 4.5 s
    judge(row)
    again = row["predicted_at_window_load_cost"]["tps"]["mean"]
    assert row["tps_verdict"] == OUTSIDE and row["predicted"]["tps"]["mean"] < 0.8 * run["tps"]
    assert verdict(again, row["tps_interval"]) != OUTSIDE


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--models", "8"], "must exceed 10"), (["--resident", "20"], "between 1 and --models"),
     (["--resident", "2", "--users", "4"], "at least --users"),
     (["--max-window", "15", "--batch-seconds", "10"], "must hold two batches"),
     (["--costs-from", "no-such-results.json"], "no results file at no-such-results.json")],
)  # fmt: skip
def test_bad_arguments_stop_before_any_server_starts(argv: list[str], message: str) -> None:
    result = subprocess.run([sys.executable, "-m", "proving_ground.benchmarks.mme_fleet_validation", *argv],
                            cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert result.returncode == 2 and message in result.stderr, result.stderr
