"""The Graviton endpoint's request limits (graviton_endpoint.max_request_*) are accepted at both bounds of the serving
contract and refused one past either, in one sentence naming the key: a value the container would refuse at start
stops synth instead."""

from __future__ import annotations

import pytest

from inference_assets.container.contract import Limits
from stacks.settings import SettingsError, parse_environment
from tests.stacks.settings.test_settings import environment_with

# The largest Graviton instance, one replica on all its cores: the most tokens a request may cost within
# InvokeEndpoint's 60 s (a rule of its own, which refuses max_request_tokens' upper bound on dev's ml.c7g.xlarge).
ROOMY = {"graviton_endpoint__instance_type": "ml.c7g.16xlarge", "graviton_endpoint__workers_per_model": 1}


@pytest.mark.parametrize("key", sorted(Limits.BOUNDS))
def test_each_request_limit_is_accepted_at_its_bounds_and_refused_one_past_them(key: str) -> None:
    low, high = Limits.BOUNDS[key]
    for value in (low, high):
        raw = environment_with("dev", **ROOMY, **{f"graviton_endpoint__{key}": value})
        assert getattr(parse_environment("dev", raw).graviton_endpoint, key) == value
    for value in (low - 1, high + 1):
        with pytest.raises(SettingsError, match=rf"graviton_endpoint\.{key}\b") as refused:
            parse_environment("dev", environment_with("dev", **ROOMY, **{f"graviton_endpoint__{key}": value}))
        assert len(str(refused.value).strip().splitlines()) == 1, str(refused.value)
