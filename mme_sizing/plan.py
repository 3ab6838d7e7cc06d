"""Predictions for an environment's multi-model endpoint: ``pytorch-platform mme-plan`` (or ``make mme-plan``).

For each environment of cdk.json: the instance count autoscaling settles on at the planned request rate, the three
traffic patterns of AWS's multi-model blog post simulated on it (uniform, one hot model taking 90%, ten models taking
8 of 9 requests), the smallest instance count at which every pattern keeps up, and what to change in cdk.json when a
pattern falls behind. The same plan is printed by the ops review (from the synthesized template's metadata) and
``cdk synth`` warns when the minimum capacity cannot hold the hot set resident (``hot_set_resident``).

Everything here takes plain values (``SizingInputs``) so that the CLI (from the settings), the stack and the review
(from the template) share one code path. Only the standard library and the sizing package are imported (never the
stacks: the command's entry point, stacks/mme_plan.py, reads the settings): it runs after ``make install-synth``,
without torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Protocol

from mme_sizing import costs
from mme_sizing.simulation import (
    HOT_SET,
    HOT_SET_SHARE,
    HOT_SHARE,
    PATTERNS,
    Fleet,
    ModelCost,
    ModelServer,
    Prediction,
    Workload,
)
from mme_sizing.simulation import simulate as simulate_fleet
from platform_facts.instances import UnknownInstanceType, instance_type


class _Autoscaling(Protocol):
    @property
    def min_capacity(self) -> int: ...
    @property
    def max_capacity(self) -> int: ...
    @property
    def target_invocations_per_instance(self) -> int: ...


class _Sizing(Protocol):
    @property
    def models(self) -> int: ...
    @property
    def requests_per_second(self) -> float: ...
    @property
    def model_weights_mib(self) -> float: ...
    @property
    def warm_latency_ms(self) -> float: ...
    @property
    def download_mib_per_second(self) -> float: ...
    @property
    def p99_objective_ms(self) -> float: ...
    @property
    def max_idle_time_seconds(self) -> float: ...


class EndpointSettings(Protocol):
    """What the plan reads of an environment's ``multi_model_endpoint`` settings (the settings model in the stacks
    layer has these fields; the sizing package never imports it)."""

    @property
    def enabled(self) -> bool: ...
    @property
    def instance_type(self) -> str: ...
    @property
    def autoscaling(self) -> _Autoscaling: ...
    @property
    def sizing(self) -> _Sizing: ...


# The multi-model endpoint's model server: DJL Serving, the one the settings offer (TorchServe's images ended patching).
MODEL_SERVER: ModelServer = "djl"
# DJL's minimum workers per loaded model (the simulation's Fleet.workers_per_model).
WORKERS_PER_MODEL = 1
# The simulated time: a warm-up from the prewarmed steady state (DJL adds workers, evictions start), then the measured
# window. Long enough for a stable p99 at a few requests per second, short enough that a review of three
# environments (parity search included) takes seconds.
WARMUP_S = 30.0
WINDOW_S = 60.0
SEED = 0  # every plan is deterministic: the parity search and the advice run this seed
# The table's rows also run seeds SEED..SEEDS-1 and show their spread: a pattern that keeps up on one seed and not on
# another is at the edge of its capacity, and the plan says so.
SEEDS = 3
# "Keeps up": within 10% of uniform's throughput (the parity rule), uniform itself serving 90% of the offered
# rate, and p99 within the objective.
PARITY_SHARE = 0.9
SERVED_SHARE = 0.9
# The parity search looks up to this multiple of max_capacity.
SEARCH_FACTOR = 2
METADATA_KEY = "pytorch-platform:mme-sizing"
NOTHING_TO_CHANGE = "Nothing to change: every pattern keeps up."
SETTINGS_PREFIX = "multi_model_endpoint"


@dataclass(frozen=True)
class SizingInputs:
    """Everything a prediction depends on besides the measured model costs (mme_sizing/measured_costs.json)."""

    instance_type: str
    min_capacity: int
    max_capacity: int
    target_invocations_per_instance: int  # SageMakerVariantInvocationsPerInstance: per instance per minute
    workers_per_model: int
    models: int
    requests_per_second: float
    model_weights_mib: float
    warm_latency_ms: float
    download_mib_per_second: float
    p99_objective_ms: float
    max_idle_time_seconds: float

    @classmethod
    def from_settings(cls, endpoint: EndpointSettings) -> SizingInputs:
        scaling, sizing = endpoint.autoscaling, endpoint.sizing
        return cls(
            instance_type=endpoint.instance_type,
            min_capacity=scaling.min_capacity,
            max_capacity=scaling.max_capacity,
            target_invocations_per_instance=scaling.target_invocations_per_instance,
            workers_per_model=WORKERS_PER_MODEL,
            models=sizing.models,
            requests_per_second=sizing.requests_per_second,
            model_weights_mib=sizing.model_weights_mib,
            warm_latency_ms=sizing.warm_latency_ms,
            download_mib_per_second=sizing.download_mib_per_second,
            p99_objective_ms=sizing.p99_objective_ms,
            max_idle_time_seconds=sizing.max_idle_time_seconds,
        )

    @classmethod
    def from_metadata(cls, metadata: dict[str, Any]) -> SizingInputs:
        """The inputs the endpoint stack wrote into its template (``as_metadata``)."""
        return cls(**{field.name: metadata[field.name] for field in dataclasses.fields(cls)})

    def as_metadata(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def service_s(self) -> float:
        return self.warm_latency_ms / 1000


def sizing_inputs(endpoint: SizingInputs | EndpointSettings) -> SizingInputs:
    return endpoint if isinstance(endpoint, SizingInputs) else SizingInputs.from_settings(endpoint)


@dataclass(frozen=True)
class SeedSpread:
    """One pattern over ``seeds`` seeds: the standard deviations of its figures and how many seeds keep up."""

    seeds: int
    throughput_sd: float
    hit_ratio_sd: float
    keeping_up: int

    @classmethod
    def of(cls, runs: list[tuple[Prediction, bool]]) -> SeedSpread:
        def sd(values: list[float]) -> float:
            return statistics.stdev(values) if len(values) > 1 else 0.0

        return cls(
            seeds=len(runs),
            throughput_sd=sd([prediction.throughput_rps for prediction, _ in runs]),
            hit_ratio_sd=sd([prediction.hit_ratio for prediction, _ in runs]),
            keeping_up=sum(keeps for _, keeps in runs),
        )


@dataclass(frozen=True)
class PatternPlan:
    pattern: str
    prediction: Prediction  # seed SEED
    keeps_up: bool
    spread: SeedSpread  # over SEEDS seeds


@dataclass(frozen=True)
class EndpointPlan:
    """The predicted behaviour of one endpoint and what to change."""

    inputs: SizingInputs
    instances: int  # simulated (the autoscaled count unless chosen)
    autoscaled_instances: int
    patterns: tuple[PatternPlan, ...]
    parity_instances: int | None  # None: no count up to search_limit keeps every pattern up
    search_limit: int
    advice: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "inputs": self.inputs.as_metadata(),
            "instances": self.instances,
            "autoscaled_instances": self.autoscaled_instances,
            "patterns": [
                {
                    **dataclasses.asdict(row.prediction),
                    "vs_uniform": _vs_uniform(self, row),
                    "keeps_up": row.keeps_up,
                    "seeds": dataclasses.asdict(row.spread),
                }
                for row in self.patterns
            ],
            "parity_instances": self.parity_instances,
            "search_limit": self.search_limit,
            "advice": list(self.advice),
        }


# --- the model's inputs ----------------------------------------------------------------------------------------------


def autoscaled_instances(endpoint: SizingInputs | EndpointSettings) -> int:
    """The instance count target tracking settles on at the planned rate (its target is per instance per minute)."""
    inputs = sizing_inputs(endpoint)
    wanted = math.ceil(inputs.requests_per_second * 60 / inputs.target_invocations_per_instance)
    return min(max(wanted, inputs.min_capacity), inputs.max_capacity)


def _fleet(inputs: SizingInputs, instances: int) -> Fleet:
    return costs.fleet(
        inputs.instance_type,
        instances,
        MODEL_SERVER,
        workers_per_model=inputs.workers_per_model,
        max_idle_s=inputs.max_idle_time_seconds,
    )


def _model_cost(inputs: SizingInputs) -> ModelCost:
    return costs.model_cost(
        weights_mib=inputs.model_weights_mib,
        warm_latency_ms=inputs.warm_latency_ms,
        download_mib_per_second=inputs.download_mib_per_second,
    )


def simulate_pattern(inputs: SizingInputs, instances: int, pattern: str, seed: int = SEED) -> Prediction:
    """One pattern, open loop at the planned rate, from the prewarmed steady state (cached per process)."""
    workload = Workload(pattern, inputs.models, requests_per_second=inputs.requests_per_second)
    return _simulated(_fleet(inputs, instances), _model_cost(inputs), workload, seed)


@cache
def _simulated(fleet: Fleet, cost: ModelCost, workload: Workload, seed: int) -> Prediction:
    """The simulation, cached on what it reads rather than on simulate_pattern's arguments, whose cache simulated
    again when only the seed's spelling differed (given or defaulted: 3 of a plan's 12 runs) or only settings the
    simulation does not read (the p99 objective, the scaling target): 27 of the sizing tests' 120 runs. Safe to
    cache: simulate is a pure function of these frozen, hashable inputs (its own random.Random(seed), no clock, no
    I/O) and returns a frozen Prediction."""
    return simulate_fleet(fleet, cost, workload, duration_s=WINDOW_S, warmup_s=WARMUP_S, seed=seed)


def _seed_spread(inputs: SizingInputs, instances: int, pattern: str) -> SeedSpread:
    runs = []
    for seed in range(SEED, SEED + SEEDS):
        uniform = simulate_pattern(inputs, instances, "uniform", seed)
        prediction = simulate_pattern(inputs, instances, pattern, seed)
        runs.append((prediction, keeps_up(inputs, prediction, uniform)))
    return SeedSpread.of(runs)


def keeps_up(inputs: SizingInputs, prediction: Prediction, uniform: Prediction) -> bool:
    """The issue's "within 10% of uniform", plus two conditions without which an equally overloaded fleet would
    count: uniform serves at least 90% of the offered rate, and the pattern's p99 is within the objective."""
    return (
        prediction.throughput_rps >= PARITY_SHARE * uniform.throughput_rps
        and uniform.throughput_rps >= SERVED_SHARE * inputs.requests_per_second
        and prediction.p99_ms <= inputs.p99_objective_ms  # False for NaN (nothing answered)
    )


def _all_keep_up(inputs: SizingInputs, instances: int) -> bool:
    uniform = simulate_pattern(inputs, instances, "uniform")
    # Uniform first: when it falls short, no pattern keeps up and the others need no simulation.
    return all(keeps_up(inputs, simulate_pattern(inputs, instances, p), uniform) for p in PATTERNS)


@cache
def parity_instances(inputs: SizingInputs) -> int | None:
    """The smallest instance count (up to SEARCH_FACTOR x max_capacity) at which every pattern keeps up.

    The search starts at the autoscaled count (already simulated for the table), gallops up or bisects down, so it
    assumes that more instances never make a pattern fall behind: true of memory and cores, though the simulated
    routing could contradict it near the threshold."""
    limit = SEARCH_FACTOR * inputs.max_capacity
    cores = instance_type(inputs.instance_type).vcpus
    # Fewer instances than the busy cores need cannot keep up.
    failing = max(1, math.ceil(inputs.requests_per_second * inputs.service_s / cores)) - 1
    passing = min(max(autoscaled_instances(inputs), failing + 1), limit)
    step = 1
    while not _all_keep_up(inputs, passing):
        if passing == limit:
            return None
        failing, passing = passing, min(passing + step, limit)
        step *= 2
    while passing - failing > 1:
        middle = (failing + passing) // 2
        if _all_keep_up(inputs, middle):
            passing = middle
        else:
            failing = middle
    return passing


# --- hot set -------------------------------------------------------------------------------------------------------


def hot_set_workers(inputs: SizingInputs) -> dict[str, int]:
    """Workers the hot models keep busy at the planned rate, per pattern (Little's law: rate x service time)."""
    rps, service = inputs.requests_per_second, inputs.service_s
    return {
        "hot-model": max(1, math.ceil(HOT_SHARE * rps * service)),
        "top-10": HOT_SET * max(1, math.ceil(rps * HOT_SET_SHARE / HOT_SET * service)),
    }


def hot_set_resident(endpoint: SizingInputs | EndpointSettings) -> str | None:
    """Without simulating: can min_capacity instances keep the hot set loaded with the workers it keeps busy?
    One sentence naming the numbers and the setting to change, or None."""
    inputs = sizing_inputs(endpoint)
    per_rate = f"{inputs.requests_per_second:g} requests/s"
    try:
        instance_type(inputs.instance_type)
    except UnknownInstanceType as error:
        return f"The hot set cannot be checked: {error}."
    per_instance_mib = _fleet(inputs, 1).memory_mib
    models = {"hot-model": 1, "top-10": HOT_SET}

    weights_mib, runtime_mib = costs.model_memory_mib(inputs.model_weights_mib, 0), costs.model_memory_mib(0, 1)

    def need(pattern: str, workers: int) -> float:  # the weights once per model, the runtime once per worker
        return models[pattern] * weights_mib + workers * runtime_mib

    pattern, workers = max(hot_set_workers(inputs).items(), key=lambda item: need(*item))
    need_mib = need(pattern, workers)
    have_mib = inputs.min_capacity * per_instance_mib
    if need_mib <= have_mib:
        return None
    instances = math.ceil(need_mib / per_instance_mib)
    return (
        f"At {per_rate} the {pattern} hot set keeps {workers} workers busy on {models[pattern]} model(s) "
        f"({need_mib:,.0f} MiB with their weights), but min_capacity {inputs.min_capacity} x {inputs.instance_type} "
        f"hold {have_mib:,.0f} MiB for models; raise {SETTINGS_PREFIX}.autoscaling.min_capacity to {instances} "
        f"or choose a {SETTINGS_PREFIX}.instance_type with more memory."
    )


# --- the plan --------------------------------------------------------------------------------------------------------


def advice(
    inputs: SizingInputs,
    plan_rows: tuple[PatternPlan, ...],
    autoscaled: int,
    parity: int | None,
    simulated: int | None = None,
) -> list[str]:
    """One sentence per change that would let the patterns keep up, each naming the cdk.json key and value
    (``simulated``: the instance count of ``plan_rows`` when it was chosen instead of the autoscaled one)."""
    lines = []
    if hot_set := hot_set_resident(inputs):
        lines.append(hot_set)
    limit = SEARCH_FACTOR * inputs.max_capacity
    if parity is None:
        lines.append(
            f"No count up to {limit} x {inputs.instance_type} keeps every pattern up: choose a "
            f"{SETTINGS_PREFIX}.instance_type with more memory and cores, or fewer models per endpoint "
            f"({SETTINGS_PREFIX}.sizing.models)."
        )
        return lines
    if parity > inputs.max_capacity:
        lines.append(
            f"Every pattern keeps up from {_instances(parity)}: raise {SETTINGS_PREFIX}.autoscaling.max_capacity "
            f"to {parity} (or choose a larger {SETTINGS_PREFIX}.instance_type)."
        )
    if autoscaled < parity:
        target = max(1, math.floor(inputs.requests_per_second * 60 / parity))
        lines.append(
            f"Autoscaling settles on {_instances(autoscaled)} at {inputs.requests_per_second:g} requests/s: lower "
            f"{SETTINGS_PREFIX}.autoscaling.target_invocations_per_instance to {target} so that it reaches {parity}."
        )
    count = autoscaled if simulated is None else simulated
    for row in plan_rows:
        if 0 < row.spread.keeping_up < row.spread.seeds:
            lines.append(
                f"On {_instances(count)} the {row.pattern} pattern keeps up in {row.spread.keeping_up} of "
                f"{row.spread.seeds} seeds: the rate is at the edge of what this count holds; leave a margin with a "
                f"higher {SETTINGS_PREFIX}.autoscaling.min_capacity or a lower "
                f"{SETTINGS_PREFIX}.autoscaling.target_invocations_per_instance."
            )
    if simulated is not None and simulated < parity and not all(row.keeps_up for row in plan_rows):
        lines.append(
            f"On {_instances(simulated)} a pattern falls behind until autoscaling adds instances: if this rate can "
            f"arrive at a fleet of that size, raise {SETTINGS_PREFIX}.autoscaling.min_capacity to {parity}."
        )
    return lines


@cache
def predict(inputs: SizingInputs, instances: int | None = None) -> EndpointPlan:
    """The three patterns on ``instances`` (default: the autoscaled count), the parity count and the advice."""
    autoscaled = autoscaled_instances(inputs)
    count = autoscaled if instances is None else instances
    uniform = simulate_pattern(inputs, count, "uniform")
    rows = tuple(
        PatternPlan(pattern, prediction, keeps_up(inputs, prediction, uniform), _seed_spread(inputs, count, pattern))
        for pattern in PATTERNS
        for prediction in [simulate_pattern(inputs, count, pattern)]
    )
    parity = parity_instances(inputs)
    return EndpointPlan(
        inputs=inputs,
        instances=count,
        autoscaled_instances=autoscaled,
        patterns=rows,
        parity_instances=parity,
        search_limit=SEARCH_FACTOR * inputs.max_capacity,
        advice=tuple(advice(inputs, rows, autoscaled, parity, None if instances is None else count)),
    )


# --- output ----------------------------------------------------------------------------------------------------------

TABLE_HEADERS = (
    "pattern",
    "instances",
    "throughput/s",
    "vs uniform",
    "hit ratio",
    "p50 ms",
    "p99 ms",
    "cold loads/min",
    "keeps up",
    "seeds keeping up",
)


def _vs_uniform(plan: EndpointPlan, row: PatternPlan) -> float:
    uniform = plan.patterns[0].prediction.throughput_rps
    return row.prediction.throughput_rps / uniform if uniform else math.nan


def _instances(count: int) -> str:
    return f"{count} instance{'' if count == 1 else 's'}"


def table_rows(plan: EndpointPlan) -> list[list[str]]:
    """The plan's table (TABLE_HEADERS), formatted: shared by the command and the ops review."""
    return [
        [
            row.pattern,
            str(plan.instances),
            f"{row.prediction.throughput_rps:.1f} ± {row.spread.throughput_sd:.1f}",
            f"{_vs_uniform(plan, row):.2f}",
            f"{row.prediction.hit_ratio:.1%} ± {row.spread.hit_ratio_sd:.1%}",
            f"{row.prediction.p50_ms:.0f}",
            f"{row.prediction.p99_ms:.0f}",
            f"{row.prediction.cold_loads_per_minute:.1f}",
            "yes" if row.keeps_up else "NO",
            f"{row.spread.keeping_up}/{row.spread.seeds}",
        ]
        for row in plan.patterns
    ]


def summary(plan: EndpointPlan) -> str:
    inputs = plan.inputs
    return (
        f"{inputs.models} models at {inputs.requests_per_second:g} requests/s on {inputs.instance_type} "
        f"({MODEL_SERVER}); autoscaling {inputs.min_capacity}..{inputs.max_capacity} at "
        f"{inputs.target_invocations_per_instance} invocations/instance/minute settles on "
        f"{_instances(plan.autoscaled_instances)}; p99 objective {inputs.p99_objective_ms:g} ms."
    )


def parity_line(plan: EndpointPlan) -> str:
    if plan.parity_instances is None:
        return f"Parity: no instance count up to {plan.search_limit} keeps every pattern up."
    return (
        f"Parity: every pattern keeps up from {_instances(plan.parity_instances)} (searched up to {plan.search_limit})."
    )


def text_table(headers: tuple[str, ...], rows: list[list[str]]) -> list[str]:
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows, strict=True)]
    return ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
            for line in (list(headers), *rows)]  # fmt: skip


def format_plan(name: str, plan: EndpointPlan) -> list[str]:
    lines = [f"{name}: {summary(plan)}", *("  " + line for line in text_table(TABLE_HEADERS, table_rows(plan)))]
    lines.append(parity_line(plan))
    lines += [f"- {line}" for line in plan.advice] or [f"- {NOTHING_TO_CHANGE}"]
    return lines


# --- command (the entry point, stacks/mme_plan.py, hands it each environment's validated settings) ---------------


def command_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pytorch-platform mme-plan",
        description="Predict each environment's multi-model endpoint for the uniform, hot-model and top-10 patterns.",
    )
    parser.add_argument("--env", help="one environment of cdk.json (default: all of them)")
    parser.add_argument("--requests-per-second", type=float, help="planned rate instead of sizing.requests_per_second")
    parser.add_argument("--instances", type=int, help="simulate this instance count instead of the autoscaled one")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument(
        "--cdk-json", type=Path, default=costs.ROOT / "cdk.json", help="settings file (default: %(default)s)"
    )
    return parser


def parse_command(argv: list[str] | None) -> argparse.Namespace:
    parser = command_parser()
    args = parser.parse_args(argv)
    if args.requests_per_second is not None and not args.requests_per_second > 0:
        parser.error("--requests-per-second must be positive")
    if args.instances is not None and args.instances < 1:
        parser.error("--instances must be at least 1")
    return args


def print_plans(args: argparse.Namespace, endpoints: dict[str, EndpointSettings]) -> int:
    """Predict and print the plan of each environment's endpoint (``endpoints``: by environment name)."""
    plans: dict[str, EndpointPlan | None] = {}
    for name, endpoint in endpoints.items():
        if not endpoint.enabled:
            plans[name] = None
            continue
        inputs = SizingInputs.from_settings(endpoint)
        if args.requests_per_second is not None:
            inputs = dataclasses.replace(inputs, requests_per_second=args.requests_per_second)
        try:
            plans[name] = predict(inputs, args.instances)
        except ValueError as error:  # an instance type without facts
            print(f"mme-plan: {name}: cannot predict: {error}.", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps({name: plan and plan.as_dict() for name, plan in plans.items()}, indent=2))
        return 0
    for index, (name, plan) in enumerate(plans.items()):
        lines = [f"{name}: no multi-model endpoint (multi_model_endpoint.enabled is false)."]
        print(("\n" if index else "") + "\n".join(format_plan(name, plan) if plan else lines))
    return 0
