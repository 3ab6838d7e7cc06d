"""Where the fleet model's numbers come from: EC2's instance facts (as moto ships them) and the measured costs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mme_sizing import costs

ROOT = Path(__file__).resolve().parents[2]
MEASURED = {
    "frontend_rss_mib": 100.0,
    "unload_s": 0.02,
    "fits": {
        "worker_uss_mib": {"intercept": 300.0, "per_weights_mib": 1.0},
        "first_load_s": {"intercept": 3.5, "per_archive_mib": 0.002},
        "reload_s": {"intercept": 3.0, "per_archive_mib": 0.001},
    },
}


def test_an_unknown_instance_type_is_refused_with_the_file_to_extend() -> None:
    with pytest.raises(ValueError, match=r"'ml\.x9\.large' is not in the platform's instance facts .*instances\.json"):
        costs.fleet("ml.x9.large", 1, "djl", measured=MEASURED)


def test_model_cost_holds_the_weights_once_and_the_runtime_per_worker() -> None:
    cost = costs.model_cost(weights_mib=500, warm_latency_ms=80, download_mib_per_second=100, measured=MEASURED)
    assert cost.model_memory_mib == 500 and cost.worker_memory_mib == 300
    assert cost.footprint_mib(3) == 500 + 3 * 300
    assert cost.load_s == pytest.approx(3.0 + 0.5)  # the reload fit at 500 MiB
    assert cost.download_s == pytest.approx(5.0 + (4.5 - 3.5))  # 500 MiB at 100 MiB/s, plus unpacking
    assert cost.service_s == pytest.approx(0.08) and cost.unload_s == pytest.approx(0.02)


def test_a_fleet_plans_with_the_memory_below_the_alarm_less_the_frontend() -> None:
    fleet = costs.fleet("ml.c5d.18xlarge", 4, "djl", measured=MEASURED)
    assert (fleet.instances, fleet.vcpus) == (4, 72)
    assert fleet.memory_mib == pytest.approx(147456 * costs.MEMORY_PLANNING_SHARE - 100)


def test_the_sizing_data_is_the_measurement_it_names() -> None:
    """Re-measuring changes the predictions only deliberately: record the new results file with
    `python -m proving_ground.benchmarks.mme_model_cost --record-from
    proving_ground/benchmarks/results/mme_model_cost.json`."""
    data = json.loads(costs.MEASURED_COSTS_FILE.read_text())
    provenance = data["provenance"]
    assert {"command", "date", "machine", "server", "source"} <= provenance.keys()
    result = json.loads((ROOT / provenance["source"]).read_text())
    assert data == costs.sizing_data(result, source=provenance["source"], date=provenance["date"]), (
        f"{costs.MEASURED_COSTS_FILE.name} is not the measurement in {provenance['source']}: record it with "
        f"python -m proving_ground.benchmarks.mme_model_cost --record-from {provenance['source']}"
    )


def test_sizing_data_takes_the_fits_the_median_unload_and_the_provenance() -> None:
    result = {
        "command": "python -m proving_ground.benchmarks.mme_model_cost --quick",
        "host": {"cpus": 2},
        "server": "TorchServe",
        "frontend_rss_mib": 100.0,
        "sizes": [{"unload_s": 0.01, "archive_mib": 2.0}, {"unload_s": 0.05, "archive_mib": 40.0},
                  {"unload_s": 0.02, "archive_mib": 12.0}],
        "fits": {**MEASURED["fits"], "worker_rss_mib": {"intercept": 400.0, "per_weights_mib": 1.0}},
    }  # fmt: skip
    data = costs.sizing_data(result, source="results.json", date="2026-12-03")
    assert data["unload_s"] == 0.02 and data["largest_archive_mib"] == 40.0
    assert data["fits"] == MEASURED["fits"]  # what the model reads, nothing more
    assert data["provenance"] == {"command": "python -m proving_ground.benchmarks.mme_model_cost --quick",
                                  "date": "2026-12-03", "machine": "2 CPUs (the result records no more)",
                                  "server": "TorchServe",
                                  "source": "results.json"}  # fmt: skip
    dated = costs.sizing_data({**result, "date": "2027-01-02", "machine": "x"}, source="r.json", date="2026-12-03")
    assert (dated["provenance"]["date"], dated["provenance"]["machine"]) == ("2027-01-02", "x")


SIZING_IMPORTS = """
import builtins, sys
opened = []
sys.addaudithook(lambda event, args: opened.append(str(args[0])) if event == "open" else None)
from mme_sizing import plan
inputs = plan.SizingInputs("ml.c5.2xlarge", 1, 2, 1000, 1, 12, 5.0, 476.0, 100.0, 100.0, 1000.0, 600.0)
plan.predict(inputs)
plan.hot_set_resident(inputs)
print(sorted(name for name in sys.modules if name.split(".")[0] in ("stacks", "proving_ground")))
print([path for path in opened if "proving_ground" in path])
"""


def test_sizing_imports_no_stacks_and_reads_no_benchmark_output() -> None:
    result = subprocess.run([sys.executable, "-c", SIZING_IMPORTS], cwd=ROOT, capture_output=True, text=True,
                            timeout=300, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["[]", "[]"]


def test_the_committed_measurement_has_what_the_model_reads() -> None:
    measured = costs.measured_costs()
    cost = costs.model_cost(weights_mib=476, warm_latency_ms=100, download_mib_per_second=100, measured=measured)
    assert cost.worker_memory_mib > 0 and cost.model_memory_mib > 0 and cost.load_s > 0
