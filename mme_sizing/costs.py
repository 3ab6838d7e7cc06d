"""What the fleet simulation needs to know about instances and models, and where each number comes from.

* Instance types: vCPUs and memory from the platform's one table of instance facts (platform_facts/instances.json,
  from EC2's DescribeInstanceTypes data; an ``ml.<type>`` has the hardware of the EC2 ``<type>``).
* Model costs: measured on the local multi-model server by ``python -m proving_ground.benchmarks.mme_model_cost`` and
recorded, with
  the measurement's provenance (command, date, machine, results file), in ``measured_costs.json`` next to this module.
  Synthesis and the plan read that checked-in data, never a benchmark's output; re-measuring changes the predictions
  only when the new measurement is recorded (``python -m proving_ground.benchmarks.mme_model_cost --record-from
  <results>``), and a
  test fails while the data and the results file it names disagree. A loaded model's memory is its weights times
  the fit's slope, once per instance (its workers share the mapped weights), plus the worker runtime (the fit's
  intercept) for every worker; loading a model into a worker takes the reload fit at the archive's size (measured
  up to ``largest_archive_mib``: larger ones are an extrapolation).
* What cannot be measured here is a setting with a stated default: the S3 download rate and the warm latency of
  the real model on one core of the real instance (``multi_model_endpoint.sizing`` in cdk.json).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from mme_sizing.simulation import Fleet, ModelCost, ModelServer
from platform_facts.instances import instance_type

ROOT = Path(__file__).resolve().parents[1]
MEASURED_COSTS_FILE = Path(__file__).with_name("measured_costs.json")
# Plan to stay below the endpoint's MemoryUtilization alarm (stacks/multi_model_endpoint.py): above it models are
# evicted under pressure and the alarm fires.
MEMORY_PLANNING_SHARE = 0.85


@cache
def measured_costs(path: Path = MEASURED_COSTS_FILE) -> dict[str, Any]:
    """The recorded measurement of the local multi-model server (``sizing_data`` of
    proving_ground/benchmarks/mme_model_cost.py's
    result)."""
    return json.loads(path.read_text())


def sizing_data(result: dict[str, Any], *, source: str, date: str) -> dict[str, Any]:
    """What the sizing model reads from a model-cost measurement (the result of
    proving_ground/benchmarks/mme_model_cost.py), with
    where it comes from: ``source`` is the results file (relative to the repository), ``date`` the measurement's day
    when the result does not carry one."""
    host = result["host"]
    return {
        "provenance": {
            "command": result["command"],
            "date": result.get("date", date),
            "machine": result.get("machine", f"{host['cpus']} CPUs (the result records no more)"),
            "server": result["server"],
            "source": source,
        },
        "frontend_rss_mib": result["frontend_rss_mib"],
        "unload_s": _median(size["unload_s"] for size in result["sizes"]),
        # Loads are measured up to this archive size: larger models' load times are an extrapolation of the fit.
        "largest_archive_mib": max(size["archive_mib"] for size in result["sizes"]),
        "fits": {name: result["fits"][name] for name in ("worker_uss_mib", "first_load_s", "reload_s")},
    }


def model_memory_mib(weights_mib: float, workers: int = 1, measured: dict[str, Any] | None = None) -> float:
    """Memory of a model with ``workers`` workers on one instance, by the measured fit of a worker's own pages (USS)."""
    fit = (measured or measured_costs())["fits"]["worker_uss_mib"]
    return fit["per_weights_mib"] * weights_mib + workers * fit["intercept"]


def model_cost(
    *,
    weights_mib: float,
    warm_latency_ms: float,
    download_mib_per_second: float,
    archive_mib: float | None = None,
    measured: dict[str, Any] | None = None,
) -> ModelCost:
    """The simulation's costs of one model of ``weights_mib`` (archive about the same size: weights barely compress)."""
    measured = measured or measured_costs()
    archive = weights_mib if archive_mib is None else archive_mib
    fits = measured["fits"]
    reload_s = fits["reload_s"]["intercept"] + fits["reload_s"]["per_archive_mib"] * archive
    first_load_s = fits["first_load_s"]["intercept"] + fits["first_load_s"]["per_archive_mib"] * archive
    unpack_s = max(0.0, first_load_s - reload_s)
    return ModelCost(
        worker_memory_mib=fits["worker_uss_mib"]["intercept"],
        model_memory_mib=fits["worker_uss_mib"]["per_weights_mib"] * weights_mib,
        download_s=archive / download_mib_per_second + unpack_s,
        load_s=max(reload_s, 0.0),
        service_s=warm_latency_ms / 1000,
        unload_s=measured["unload_s"],
    )


def fleet(
    instance_type_name: str,
    instances: int,
    model_server: ModelServer,
    *,
    workers_per_model: int = 1,
    max_idle_s: float = 600.0,
    measured: dict[str, Any] | None = None,
) -> Fleet:
    """``instances`` of a type, with the memory left for model workers once the model server's frontend runs."""
    kind = instance_type(instance_type_name)  # the platform's instance facts (platform_facts/instances.json)
    frontend = (measured or measured_costs())["frontend_rss_mib"]
    return Fleet(
        instances=instances,
        vcpus=kind.vcpus,
        memory_mib=kind.memory_mib * MEMORY_PLANNING_SHARE - frontend,
        model_server=model_server,
        workers_per_model=workers_per_model,
        max_idle_s=max_idle_s,
    )


def _median(values: Any) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
