"""The simulation's side of its validation against the local multi-model harness
(proving_ground/benchmarks/mme_fleet_validation.py):
what the model predicts for one measured window, over several seeds, and the verdict and report of predicted against
measured.

The harness is one instance whose TorchServe starts one worker per model, limited to a number of resident models
(not memory): each model counts one unit of memory. Its costs (a load's CPU, the time a request holds its worker, the
CPU a request takes outside the worker, unpacking, unloading) are measured by probes on the same server before the
runs (proving_ground/benchmarks/mme_fleet_validation.measure_costs), so nothing here is fitted to the pattern runs.
The host is
shared: the CPU a run had (its CPUs less what other processes took during its window) is measured with the run, and
the prediction shares that CPU between requests and loads.

A window starts from a steady state on both sides: the ``resident`` most requested models loaded (least requested
least recently used), then ``warmup_s`` of traffic that is not counted.

Verdict per figure: **inside** when the prediction (the mean over seeds) lies inside the measured 95% interval,
**within 20%** when it is outside the interval but within ACCEPTABLE_ERROR of the measured value, **outside**
otherwise. A run whose window stopped on a budget before its intervals were narrow enough is **inconclusive**: its
interval is too wide to tell a 20% error, whatever the verdict.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from mme_sizing.intervals import Interval
from mme_sizing.simulation import Fleet, ModelCost, Workload, simulate

ACCEPTABLE_ERROR = 0.20  # the bar: predictions within 20% of the measurement
SEEDS = 5
INSIDE, WITHIN, OUTSIDE = "inside", f"within {ACCEPTABLE_ERROR:.0%}", "outside"


def model_cost(costs: dict[str, Any]) -> ModelCost:
    """The simulation's costs of one harness model, from the probes' measurements."""
    return ModelCost(
        worker_memory_mib=1.0,  # the harness limits models by count: one unit of memory per model
        download_s=max(0.0, costs["first_load_s"] - costs["reload_s"]),  # unpacking, once per model
        load_s=costs["load_cpu_s"],  # CPU seconds of one load (measured, not wall time on a shared host)
        service_s=costs["worker_s"],
        unload_s=costs["unload_s"],
        frontend_s=costs["frontend_s"],
    )


def predict(
    costs: dict[str, Any],
    *,
    cores: float,
    models: int,
    resident: int,
    pattern: str,
    users: int,
    window_s: float,
    warmup_s: float,
    seeds: int = SEEDS,
) -> dict[str, Any]:
    """The window predicted with ``seeds`` seeds: per seed, and each figure's mean, standard deviation and range."""
    fleet = Fleet(instances=1, vcpus=max(1, math.ceil(cores)), cores=cores, memory_mib=float(resident),
                  model_server="torchserve")  # fmt: skip
    cost = model_cost(costs)
    runs = []
    for seed in range(seeds):
        prediction = simulate(fleet, cost, Workload(pattern, models, clients=users), duration_s=window_s,
                              warmup_s=warmup_s, prewarm=True, seed=seed)  # fmt: skip
        requests = prediction.requests
        runs.append({
            "tps": prediction.completed / window_s,
            "requests": requests,
            "loads": prediction.loads,
            "hit_ratio": 1 - prediction.loads / requests if requests else 0.0,
        })  # fmt: skip
    return {
        "seeds": seeds,
        "runs": runs,
        **{key: _spread([run[key] for run in runs]) for key in ("tps", "hit_ratio", "requests", "loads")},
    }


def predict_row(row: dict[str, Any], costs: dict[str, Any], *, users: int, warmup_s: float, seeds: int) -> None:
    """Predict a measured row's window (``predicted``) and its diagnosis (``diagnose_row``)."""
    row["predicted"] = predict(costs, **_window(row, users=users, warmup_s=warmup_s, seeds=seeds))
    diagnose_row(row, costs, users=users, warmup_s=warmup_s, seeds=seeds)


def _window(row: dict[str, Any], *, users: int, warmup_s: float, seeds: int) -> dict[str, Any]:
    return {"cores": row["cpu"]["cores_left"], "models": row["models"], "resident": row["resident"],
            "pattern": row["pattern"], "users": users, "window_s": row["window_s"], "warmup_s": warmup_s,
            "seeds": seeds}  # fmt: skip


def diagnose_row(row: dict[str, Any], costs: dict[str, Any], *, users: int, warmup_s: float, seeds: int) -> None:
    """The row's window predicted again with the load cost the run itself showed (``predicted_at_window_load_cost``):
    when only this one agrees, the simulation's physics hold and the probe's load cost was the input that did not."""
    window = _window(row, users=users, warmup_s=warmup_s, seeds=seeds)
    load_cpu_s = window_load_cpu_s(row, costs)
    row["predicted_at_window_load_cost"] = (
        None if math.isnan(load_cpu_s) else predict({**costs, "load_cpu_s": load_cpu_s}, **window)
    )


def _spread(values: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(values),
        "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
    }


def relative_error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured if measured else float("nan")


def verdict(predicted: float, measured: dict[str, Any] | None) -> str:
    """inside / within 20% / outside for a prediction against a measured interval (an Interval's as_dict)."""
    if measured is None:
        return OUTSIDE
    if Interval(**measured).contains(predicted):
        return INSIDE
    return WITHIN if abs(relative_error(predicted, measured["estimate"])) <= ACCEPTABLE_ERROR else OUTSIDE


def judge(row: dict[str, Any]) -> dict[str, Any]:
    """Add the verdicts of a row (measured window + ``predicted``): per figure, and whether the run passes."""
    predicted = row["predicted"]
    row["tps_verdict"] = verdict(predicted["tps"]["mean"], row["tps_interval"])
    row["hit_ratio_verdict"] = verdict(predicted["hit_ratio"]["mean"], row["hit_ratio_interval"])
    row["tps_error"] = relative_error(predicted["tps"]["mean"], row["tps"])
    row["hit_ratio_error"] = relative_error(predicted["hit_ratio"]["mean"], row["hit_ratio"] or 0.0)
    row["passes"] = OUTSIDE not in (row["tps_verdict"], row["hit_ratio_verdict"])
    return row


def _cell(row: dict[str, Any], key: str) -> str:
    interval = row[f"{key}_interval"]
    if interval is None:
        return "none"
    digits = 2 if key == "hit_ratio" or row[key] < 100 else 0
    return f"{row[key]:.{digits}f} [{interval['low']:.{digits}f}, {interval['high']:.{digits}f}]"


def _predicted(row: dict[str, Any], key: str) -> str:
    spread = row["predicted"][key]
    digits = 2 if key == "hit_ratio" or spread["mean"] < 100 else 0
    return f"{spread['mean']:.{digits}f} ± {spread['sd']:.{digits}f}"


def outcome(row: dict[str, Any]) -> str:
    """yes / NO for a conclusive run; an inconclusive one says so first (its interval cannot tell a 20% error)."""
    passes = "yes" if row["passes"] else "NO"
    return passes if row["conclusive"] else f"inconclusive ({passes.lower()})"


def summary(rows: list[dict[str, Any]]) -> dict[str, int]:
    conclusive = [row for row in rows if row["conclusive"]]
    return {
        "runs": len(rows),
        "conclusive": len(conclusive),
        "conclusive_pass": sum(row["passes"] for row in conclusive),
        "inconclusive_pass": sum(row["passes"] for row in rows if not row["conclusive"]),
        "tps_inside": sum(row["tps_verdict"] == INSIDE for row in rows),
        "tps_within": sum(row["tps_verdict"] == WITHIN for row in rows),
        "hit_ratio_inside": sum(row["hit_ratio_verdict"] == INSIDE for row in rows),
        "hit_ratio_within": sum(row["hit_ratio_verdict"] == WITHIN for row in rows),
    }


# Long: the JSON and the Markdown report of one validation run, table after table in the report's order
def write_results(result: dict[str, Any], output_dir: Path, name: str = "mme_fleet_validation") -> None:
    output_dir.mkdir(parents=True, exist_ok=True)
    rows = result["rows"]
    result["summary"] = summary(rows)
    (output_dir / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    costs, settings = result["costs"], result["settings"]
    counts = result["summary"]
    probed = (
        f"Inputs of the prediction, measured by the probes of `{costs['from']}` (not pattern runs): "
        if "from" in costs
        else "Inputs of the prediction, measured on the same server before the runs by probes that are not pattern "
        "runs: "
    )
    lines = [
        "# Fleet simulation against the local multi-model harness",
        "",
        f"```\n{result['command']}\n```",
        "",
        f"Host: {result['host']['machine']}, load average {result['host']['load_average_before']} before the run. "
        f"{settings['users']} closed-loop users. Each run starts from a steady state (the {_resident_words(rows)} most "
        f"requested models loaded), warms up {settings['warmup_s']:g} s, then measures until its 95% intervals' "
        f"half-widths are at most {settings['precision']:.0%} of the estimate (conclusive) or "
        f"{settings['max_requests']} requests or {settings['max_window_s']:g} s are spent (inconclusive). "
        f"Throughput interval: batch means over {settings['batch_s']:g} s batches (Student t); hit ratio (1 - model "
        "loads / requests) interval: Wilson, binomial over requests. The prediction is the simulation's mean over "
        f"{result['seeds']} seeds ± their standard deviation, on the CPU the run had (the host's CPUs less what other "
        "processes took during its window: column `cores`).",
        "",
        probed + f"a load takes {costs['load_cpu_s']:.2f} s of CPU ({settings['users']} reloads at once: "
        f"{costs['concurrent_reload_s']:.2f} s wall); a request holds its model's worker {costs['worker_s'] * 1000:.1f}"
        f" ms (its CPU and the Java frontend's) and takes {costs['frontend_s'] * 1000:.1f} ms of CPU outside it (the "
        "Locust client and the harness); unpacking "
        f"{max(0.0, costs['first_load_s'] - costs['reload_s']):.2f} s, unload {costs['unload_s']:.3f} s.",
        "",
        "| models | resident | pattern | requests | loads | measured TPS [95% CI] | predicted TPS | TPS verdict "
        "| measured hit ratio [95% CI] | predicted | hit verdict | cores | window | passes | predicted TPS at the "
        "window's load cost |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['models']} | {row['resident']} | {row['pattern']} | {row['requests']} | {row['model_loads']} | "
            f"{_cell(row, 'tps')} | {_predicted(row, 'tps')} | {row['tps_verdict']} ({row['tps_error']:+.0%}) | "
            f"{_cell(row, 'hit_ratio')} | {_predicted(row, 'hit_ratio')} | {row['hit_ratio_verdict']} | "
            f"{row['cpu']['cores_left']:.2f} | {row['window_s']:.0f} s{'' if row['conclusive'] else ', inconclusive'} "
            f"| {outcome(row)} | {_at_window_load_cost(row)} |"
        )
    lines += [
        "",
        f"{counts['conclusive']} of {counts['runs']} windows were conclusive; {counts['conclusive_pass']} of them pass "
        f"(the prediction inside the measured interval or within {ACCEPTABLE_ERROR:.0%}, for throughput and hit ratio "
        f"both). {counts['inconclusive_pass']} of the {counts['runs'] - counts['conclusive']} inconclusive runs have "
        "the prediction inside their (too wide) intervals. Throughput: "
        f"{counts['tps_inside']} inside the interval, {counts['tps_within']} outside it but within "
        f"{ACCEPTABLE_ERROR:.0%}. Hit ratio: {counts['hit_ratio_inside']} inside, {counts['hit_ratio_within']} within "
        f"{ACCEPTABLE_ERROR:.0%}.",
    ]
    if any("replay_loads" in row for row in rows):
        lines += [
            "",
            "What the harness held, per run: models resident on average (the harness's count | TorchServe's "
            "registered models), and the loads an ideal LRU cache of the limit would have made for the same "
            "requests in the same order:",
            "",
            "| models | resident limit | pattern | harness held | TorchServe registered | loads | ideal LRU loads | "
            f"load CPU s in the window (the prediction's: {costs['load_cpu_s']:.2f}) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for row in rows:
            samples = row.get("samples", {})
            lines.append(
                f"| {row['models']} | {row['resident']} | {row['pattern']} | {samples.get('resident', math.nan):.1f} "
                f"| {samples.get('registered', math.nan):.1f} | {row['model_loads']} | {row['replay_loads']} | "
                f"{window_load_cpu_s(row, costs):.2f} |"
            )
    (output_dir / f"{name}.md").write_text("\n".join(lines) + "\n")


def _at_window_load_cost(row: dict[str, Any]) -> str:
    again = row.get("predicted_at_window_load_cost")
    if not again:
        return "no loads"
    tps = again["tps"]["mean"]
    return f"{tps:.2f} ({verdict(tps, row['tps_interval'])}, {relative_error(tps, row['tps']):+.0%})"


def window_load_cpu_s(row: dict[str, Any], costs: dict[str, Any]) -> float:
    """What a load cost in the run's own window: the server's CPU (Java frontend and workers) less what its requests
    took at the probe's per-request cost, per load (NaN without loads). Set beside the probe's ``load_cpu_s`` (the
    prediction's input), it shows when the probe's cost does not hold for the run."""
    if not row["model_loads"]:
        return math.nan
    per_request = costs["own_models_cpu_per_request"]
    server_s = row["cpu"]["frontend_s"] + row["cpu"]["workers_s"]
    return (server_s - row["requests"] * (per_request["frontend_s"] + per_request["workers_s"])) / row["model_loads"]


def _resident_words(rows: list[dict[str, Any]]) -> str:
    limits = sorted({row["resident"] for row in rows})
    return "/".join(str(limit) for limit in limits) if limits else "resident"
