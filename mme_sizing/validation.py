"""The simulation's side of its validation against the local multi-model harness (benchmarks/mme_fleet_validation.py):
what the model predicts for one harness run, and the side-by-side report of predicted against measured.

The harness is one instance whose TorchServe starts one worker per model, with the host's cores, limited to a number
of resident models (not memory): each model counts one unit of memory. Its costs (first load, reload, unload, the
time a request holds the worker, the CPU it takes outside the worker) are measured by probes on the same server just
before the runs (benchmarks/mme_fleet_validation.measure_costs), so nothing here is fitted to the pattern runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mme_sizing.simulation import Fleet, ModelCost, Workload, simulate

ACCEPTABLE_ERROR = 0.20  # the bar: predictions within 20% of the measurement


def predict(costs: dict[str, float], *, cpus: int, models: int, resident: int, pattern: str, users: int,
            duration_s: float) -> dict[str, float]:  # fmt: skip
    cost = ModelCost(
        worker_memory_mib=1.0,  # the harness limits models by count: one unit of memory per model
        download_s=max(0.0, costs["first_load_s"] - costs["reload_s"]),  # unpacking, once per model
        load_s=costs["load_work_s"],  # measured with loads sharing the cores, as they do in the pattern runs
        service_s=costs["worker_s"],
        unload_s=costs["unload_s"],
        frontend_s=costs["frontend_s"],
    )
    fleet = Fleet(instances=1, vcpus=cpus, memory_mib=float(resident), model_server="torchserve")
    prediction = simulate(fleet, cost, Workload(pattern, models, clients=users), duration_s=duration_s, prewarm=False)
    return {
        "tps": prediction.throughput_rps,
        "requests": prediction.requests,
        "loads": prediction.loads,
        "hit_ratio": 1 - prediction.loads / prediction.requests if prediction.requests else 0.0,
    }


def relative_error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured if measured else float("nan")


def write_results(result: dict[str, Any], output_dir: Path) -> None:
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "mme_fleet_validation.json").write_text(json.dumps(result, indent=1) + "\n")
    rows = result["rows"]
    worst_tps = max(abs(row["tps_error"]) for row in rows)
    worst_hit = max(abs(row["hit_ratio_error"]) for row in rows)
    worst_hit_points = max(abs(row["predicted_hit_ratio"] - row["measured_hit_ratio"]) for row in rows) * 100
    within = sum(abs(row["tps_error"]) <= ACCEPTABLE_ERROR for row in rows)
    costs, users = result["costs"], result["users"]
    lines = [
        "# Fleet simulation against the local multi-model harness",
        "",
        f"```\n{result['command']}\n```",
        "",
        f"Host: {result['host']['cpus']} CPUs, load average {result['host']['load_average_before']} before the run. "
        f"{result['users']} closed-loop users, {result['duration_s']:.0f} s per pattern, every pattern starting cold. "
        "Inputs of the prediction, measured on the same server just before by probes that are not pattern runs: "
        f"first load {costs['first_load_s']:.2f} s, reload {costs['reload_s']:.2f} s, "
        f"unload {costs['unload_s']:.2f} s, a warm request alone {costs['warm_request_s'] * 1000:.1f} ms "
        f"(sequential medians); {users} reloads at once took {costs['concurrent_reload_s']:.2f} s, so a reload's "
        f"CPU work is {costs['load_work_s']:.2f} s; a request holds its model's worker {costs['worker_s'] * 1000:.1f} "
        f"ms ({users} clients on one model: {costs['one_model_rps']:.0f} rps) and takes "
        f"{costs['frontend_s'] * 1000:.1f} ms of CPU outside it ({users} clients on their own models: "
        f"{costs['own_models_rps']:.0f} rps on {result['host']['cpus']} CPUs). "
        "Hit ratio here = 1 - model loads / requests on both sides.",
        "",
        "| models | resident | pattern | measured TPS | predicted TPS | error | measured hits | predicted | error |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['models']} | {row['resident']} | {row['pattern']} | {row['measured_tps']:.2f} | "
            f"{row['predicted_tps']:.2f} | {row['tps_error']:+.0%} | {row['measured_hit_ratio']:.2f} | "
            f"{row['predicted_hit_ratio']:.2f} | {row['hit_ratio_error']:+.0%} |"
        )
    lines += [
        "",
        f"Throughput within {ACCEPTABLE_ERROR:.0%} in {within} of {len(rows)} runs; largest throughput error "
        f"{worst_tps:.0%}, largest hit-ratio error {worst_hit:.0%} ({worst_hit_points:.0f} percentage points).",
    ]
    (output_dir / "mme_fleet_validation.md").write_text("\n".join(lines) + "\n")
