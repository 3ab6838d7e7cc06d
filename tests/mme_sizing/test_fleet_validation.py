"""The validation benchmark's prediction side and report (fast); its harness side is the load test's runner."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mme_sizing.validation import predict, write_results

ROOT = Path(__file__).resolve().parents[2]
COSTS = {"first_load_s": 4.2, "reload_s": 4.0, "unload_s": 0.03, "warm_request_s": 0.007, "one_model_rps": 250.0,
         "own_models_rps": 180.0, "worker_s": 0.004, "frontend_s": 0.007, "concurrent_reload_s": 9.0,
         "load_work_s": 4.5}  # fmt: skip


def test_prediction_with_every_model_resident_loads_each_model_once() -> None:
    predicted = predict(COSTS, cpus=2, models=16, resident=16, pattern="uniform", users=4, duration_s=60)
    assert predicted["loads"] == 16
    assert predicted["hit_ratio"] == pytest.approx(1 - 16 / predicted["requests"])


def test_fewer_resident_models_mean_fewer_hits_and_less_throughput() -> None:
    few, many = (
        predict(COSTS, cpus=2, models=16, resident=resident, pattern="uniform", users=4, duration_s=120)
        for resident in (4, 12)
    )
    assert few["hit_ratio"] < many["hit_ratio"] and few["tps"] < many["tps"]


def test_report_puts_measured_and_predicted_side_by_side(tmp_path: Path) -> None:
    row = {"models": 16, "resident": 4, "pattern": "uniform", "measured_tps": 0.5, "predicted_tps": 0.55,
           "tps_error": 0.1, "measured_hit_ratio": 0.2, "predicted_hit_ratio": 0.25,
           "hit_ratio_error": 0.25}  # fmt: skip
    result = {"command": "python -m benchmarks.mme_fleet_validation", "costs": COSTS, "users": 4, "duration_s": 60.0,
              "host": {"cpus": 2, "load_average_before": 0.1}, "rows": [row]}  # fmt: skip
    write_results(result, tmp_path)
    report = (tmp_path / "mme_fleet_validation.md").read_text()
    assert "| 16 | 4 | uniform | 0.50 | 0.55 | +10% | 0.20 | 0.25 | +25% |" in report
    assert "within 20% in 1 of 1 runs" in report
    assert (tmp_path / "mme_fleet_validation.json").is_file()


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--models", "8"], "must exceed 10"), (["--resident", "20"], "between 1 and --models"),
     (["--resident", "2", "--users", "4"], "at least --users")],
)  # fmt: skip
def test_bad_arguments_stop_before_any_server_starts(argv: list[str], message: str) -> None:
    result = subprocess.run([sys.executable, "-m", "benchmarks.mme_fleet_validation", *argv],
                            cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert result.returncode == 2 and message in result.stderr, result.stderr
