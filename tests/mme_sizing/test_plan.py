"""mme_sizing.plan: the autoscaled count, the hot-set check, the advice and the `mme-plan` command.

Predictions depend on measured costs (mme_sizing/measured_costs.json) that change with each measurement, so
these tests assert the plan's rules and the command's behaviour, not particular predicted numbers."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math

import pytest

from mme_sizing import costs
from mme_sizing.plan import (
    SEEDS,
    PatternPlan,
    SeedSpread,
    SizingInputs,
    advice,
    autoscaled_instances,
    hot_set_resident,
    hot_set_workers,
    predict,
)
from mme_sizing.simulation import PATTERNS, Prediction
from stacks.mme_plan import main
from stacks.settings import MultiModelEndpointSettings
from tests.conftest import cdk_context

ENVIRONMENTS = cdk_context()["environments"]
BASE = SizingInputs.from_settings(MultiModelEndpointSettings())


def sizing(**changes: object) -> SizingInputs:
    return dataclasses.replace(BASE, **changes)


def rows(*, hot_model_keeps_up: bool = True) -> tuple[PatternPlan, ...]:
    prediction = Prediction("any", 100, 10.0, 1.0, 100.0, 200.0, 0.0, 0, 0, 0, 60.0)
    keeps = {p: p != "hot-model" or hot_model_keeps_up for p in PATTERNS}
    return tuple(PatternPlan(p, prediction, keeps[p], SeedSpread(SEEDS, 0.0, 0.0, SEEDS * keeps[p])) for p in PATTERNS)


@pytest.mark.parametrize(
    ("requests_per_second", "expected"),
    [(0.5, 2), (50, 5), (60, 6), (61, 7), (1000, 8)],  # 60 s x rate / 600 per instance per minute, clamped to 2..8
)
def test_autoscaled_instances_follow_the_per_minute_target_within_min_and_max(
    requests_per_second: float, expected: int
) -> None:
    inputs = sizing(min_capacity=2, max_capacity=8, target_invocations_per_instance=600)
    assert autoscaled_instances(dataclasses.replace(inputs, requests_per_second=requests_per_second)) == expected


def test_autoscaled_instances_of_the_cdk_json_settings() -> None:
    prod = MultiModelEndpointSettings.model_validate(ENVIRONMENTS["prod"]["multi_model_endpoint"])
    scaling = prod.autoscaling
    expected = math.ceil(prod.sizing.requests_per_second * 60 / scaling.target_invocations_per_instance)
    assert autoscaled_instances(prod) == min(max(expected, scaling.min_capacity), scaling.max_capacity)


def test_advice_names_the_key_and_value_when_parity_needs_more_than_max_capacity() -> None:
    inputs = sizing(min_capacity=1, max_capacity=4, target_invocations_per_instance=600, requests_per_second=100)
    lines = advice(inputs, rows(), autoscaled=4, parity=6)
    assert any("raise multi_model_endpoint.autoscaling.max_capacity to 6" in line for line in lines)
    # Autoscaling reaches only 4 at 100 requests/s: a target of 1000 (6000 per minute / 6) makes it reach 6.
    target_line = next(line for line in lines if "target_invocations_per_instance" in line)
    assert "target_invocations_per_instance to 1000 " in target_line


def test_advice_when_no_count_keeps_up_and_when_nothing_needs_changing() -> None:
    inputs = sizing(max_capacity=3)
    (line,) = [line for line in advice(inputs, rows(), autoscaled=3, parity=None) if "hot set" not in line]
    assert line.startswith(f"No count up to 6 x {BASE.instance_type}") and "multi_model_endpoint.instance_type" in line
    assert advice(sizing(requests_per_second=1), rows(), autoscaled=1, parity=1) == []


def test_hot_set_that_does_not_fit_min_capacity_names_the_numbers_and_the_key() -> None:
    inputs = sizing(instance_type="ml.c5.large", min_capacity=1, max_capacity=2, requests_per_second=2000)
    workers = hot_set_workers(inputs)["top-10"]  # ten models' weights: the larger hot set
    budget = costs.fleet("ml.c5.large", 1, "djl").memory_mib
    need = 10 * costs.model_memory_mib(inputs.model_weights_mib, 0) + workers * costs.model_memory_mib(0, 1)
    needed = math.ceil(need / budget)
    warning = hot_set_resident(inputs)
    assert warning is not None and warning.count(".") >= 1 and "\n" not in warning
    assert f"top-10 hot set keeps {workers} workers busy on 10 model(s)" in warning
    assert "min_capacity 1 x ml.c5.large" in warning
    assert f"raise multi_model_endpoint.autoscaling.min_capacity to {needed}" in warning
    assert hot_set_resident(dataclasses.replace(inputs, instance_type="ml.c5.4xlarge", requests_per_second=1)) is None


def test_hot_set_workers_follow_the_rate_and_the_warm_latency() -> None:
    inputs = sizing(requests_per_second=1000, warm_latency_ms=100)
    assert hot_set_workers(inputs) == {"hot-model": 90, "top-10": 10 * 9}  # 0.9 x 100 busy; 10 x ceil(8.9)


def test_an_instance_type_without_facts_is_a_warning_not_a_crash() -> None:
    warning = hot_set_resident(sizing(instance_type="ml.x9.xlarge"))
    assert warning is not None and "ml.x9.xlarge" in warning and "platform_facts/instances.json" in warning


def test_sizing_inputs_travel_through_template_metadata() -> None:
    assert SizingInputs.from_metadata(json.loads(json.dumps(BASE.as_metadata()))) == BASE


def test_plans_are_deterministic_and_cached() -> None:
    inputs = sizing(models=16, requests_per_second=2, min_capacity=1, max_capacity=1)
    plan = predict(inputs)
    assert predict(inputs) is plan  # cached: the review and the command do not simulate twice
    assert [row.pattern for row in plan.patterns] == list(PATTERNS)
    predict.cache_clear()
    assert predict(inputs) == plan  # same seed, same prediction


def test_a_pattern_at_the_edge_of_its_capacity_is_named_by_its_spread_over_seeds() -> None:
    """Near the rate one instance holds, seeds disagree: the table shows it and the advice says so, even where seed 0
    alone would call the plan fine."""
    edges = []
    for rate in (26, 30, 33, 36):  # dev's instance type, one instance: from comfortable to overloaded
        plan = predict(sizing(models=12, instance_type="ml.c5.2xlarge", min_capacity=1, max_capacity=1,
                              requests_per_second=rate))  # fmt: skip
        for row in plan.patterns:
            assert row.spread.seeds == SEEDS and 0 <= row.spread.keeping_up <= SEEDS
            assert row.spread.keeping_up > 0 if row.keeps_up else row.spread.keeping_up < SEEDS  # seed 0 is one of them
            at_edge = 0 < row.spread.keeping_up < SEEDS
            said = any(f"the {row.pattern} pattern keeps up in {row.spread.keeping_up} of" in line
                       for line in plan.advice)  # fmt: skip
            assert said == at_edge
            if at_edge:
                assert row.spread.throughput_sd > 0 or row.spread.hit_ratio_sd > 0
                edges.append((rate, row.pattern, row.keeps_up))
    assert edges, "no rate between comfortable and overloaded put a pattern at the edge"
    assert any(keeps for _, _, keeps in edges), "a single seed would have hidden an edge"


# --- the command -----------------------------------------------------------------------------------------------------


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(list(argv))
    return status, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def every_environment() -> tuple[int, str, str]:
    return run()


def test_command_prints_three_patterns_parity_and_advice_per_environment(
    every_environment: tuple[int, str, str],
) -> None:
    status, out, err = every_environment
    assert status == 0 and err == ""
    blocks = out.strip().split("\n\n")
    assert [block.split(":", 1)[0] for block in blocks] == ["dev", "staging", "prod"]
    for block in blocks:
        lines = block.splitlines()
        assert lines[1].split() == ["pattern", "instances", "throughput/s", "vs", "uniform", "hit", "ratio", "p50",
                                    "ms", "p99", "ms", "cold", "loads/min", "keeps", "up", "seeds", "keeping",
                                    "up"]  # fmt: skip
        assert [line.split()[0] for line in lines[2:5]] == list(PATTERNS)
        assert lines[5].startswith("Parity: ")
        assert all(line.startswith("- ") for line in lines[6:]) and len(lines) > 6


def test_json_output_parses_and_matches_the_table(every_environment: tuple[int, str, str]) -> None:
    status, out, _ = run("--json")  # the same plans: cached in this process
    plans = json.loads(out)
    assert status == 0 and list(plans) == ["dev", "staging", "prod"]
    for name, plan in plans.items():
        assert [row["pattern"] for row in plan["patterns"]] == list(PATTERNS)
        assert plan["inputs"]["models"] == ENVIRONMENTS[name]["multi_model_endpoint"]["sizing"]["models"]
        assert plan["instances"] == plan["autoscaled_instances"]
        assert all(isinstance(row["keeps_up"], bool) for row in plan["patterns"])


def test_rate_and_instance_count_can_be_chosen() -> None:
    status, out, _ = run("--env", "dev", "--requests-per-second", "2", "--instances", "2", "--json")
    (plan,) = json.loads(out).values()
    assert status == 0 and plan["inputs"]["requests_per_second"] == 2 and plan["instances"] == 2


def test_unknown_environment_is_one_sentence_and_exit_status_2() -> None:
    status, out, err = run("--env", "nope")
    assert (status, out) == (2, "")
    assert err == "mme-plan: --env nope: unknown environment; allowed values are dev, staging, prod.\n"


def test_bad_arguments_exit_with_status_2() -> None:
    with pytest.raises(SystemExit) as exit_:
        run("--instances", "0")
    assert exit_.value.code == 2


def test_a_chosen_count_below_parity_says_what_keeps_the_patterns_up() -> None:
    inputs = sizing(max_capacity=4)
    lines = advice(inputs, rows(hot_model_keeps_up=False), autoscaled=2, parity=2, simulated=1)
    assert lines == [
        "On 1 instance a pattern falls behind until autoscaling adds instances: if this rate can arrive at a fleet "
        "of that size, raise multi_model_endpoint.autoscaling.min_capacity to 2."
    ]
