"""The Graviton endpoint's settings keep every call inside the caller's time limit and every start inside
SageMaker's: the worst request the contract admits, scaled to the threads a replica gets on the instance, stays
within InvokeEndpoint's 60 s; the start-up timeout is SageMaker's range; compile mode, which the image cannot run,
is refused. Each refusal is one sentence naming the key."""

from __future__ import annotations

import copy

import pytest

from inference_assets.container.contract import (
    FORWARD_CORE_SECONDS_PER_TOKEN,
    INVOKE_TIMEOUT_S,
    Limits,
    max_request_tokens_within_timeout,
    worst_call_seconds,
)
from stacks.settings import SettingsError, parse_environment
from tests.conftest import cdk_context

RAW = cdk_context()["environments"]


def _prod(**graviton: object) -> dict:
    raw = copy.deepcopy(RAW["prod"])
    raw["graviton_endpoint"].update(graviton)
    return raw


def _one_sentence(message: str) -> None:
    assert message.count(". ") == 0 and message.endswith(".")


def test_every_environment_admits_its_worst_request_within_the_invoke_timeout() -> None:
    for name, raw in RAW.items():
        settings = parse_environment(name, raw).graviton_endpoint
        threads = settings.topology.threads
        assert worst_call_seconds(settings.max_request_tokens, threads) <= INVOKE_TIMEOUT_S, name


def test_the_default_token_limit_fits_even_one_thread_per_replica_of_two() -> None:
    """8,192 tokens: two passes of the worst request on 2 threads (ml.c7g.large's one replica) take about 31 s."""
    assert Limits().max_request_tokens == 8192
    assert worst_call_seconds(8192, 2) == pytest.approx(2 * 8192 * FORWARD_CORE_SECONDS_PER_TOKEN / 2)
    assert worst_call_seconds(8192, 2) < INVOKE_TIMEOUT_S < worst_call_seconds(8192, 1)
    assert worst_call_seconds(max_request_tokens_within_timeout(1), 1) <= INVOKE_TIMEOUT_S


def test_a_token_limit_the_instance_cannot_serve_in_time_is_refused() -> None:
    # 16 replicas of one thread each on ml.c7g.4xlarge: the default limit would take ~62 s.
    large = {"instance_type": "ml.c7g.4xlarge", "workers_per_model": 16}
    with pytest.raises(SettingsError) as error:
        parse_environment("prod", _prod(**large))
    message = str(error.value)
    assert message.startswith("environments.prod.graviton_endpoint: max_request_tokens (8192)")
    assert "InvokeEndpoint's 60 s" in message and f"allowed up to {max_request_tokens_within_timeout(1)}" in message
    _one_sentence(message)
    # The same topology with a limit it can serve passes.
    parse_environment("prod", _prod(**large, max_request_tokens=max_request_tokens_within_timeout(1)))


def test_compile_mode_is_refused_because_the_image_has_no_compiler() -> None:
    with pytest.raises(SettingsError) as error:
        parse_environment("prod", _prod(torch_compile=True))
    message = str(error.value)
    assert message.startswith("environments.prod.graviton_endpoint.torch_compile: must be false")
    assert "no C++ compiler" in message and "(allowed: false)" in message
    _one_sentence(message)


@pytest.mark.parametrize("seconds", [59, 3601])
def test_the_start_up_timeout_is_sagemakers_range(seconds: int) -> None:
    with pytest.raises(SettingsError, match=r"graviton_endpoint\.container_startup_timeout_seconds"):
        parse_environment("prod", _prod(container_startup_timeout_seconds=seconds))
    assert parse_environment("prod", _prod(container_startup_timeout_seconds=60)).graviton_endpoint.limits
