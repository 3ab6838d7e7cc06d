"""The archive's Ray Serve deployment class, loaded in-process from the unpacked archive (``code/sentiment_serving``)
and called without Ray: what one batch of ``@serve.batch`` hands it, and the paths it answers without batching.

The batching itself (requests queued by Ray Serve, ``max_batch_size``, the wait) runs only inside a replica (Ray 2.57's
``_BatchQueue`` asks ``serve.get_replica_context()``), so test_ray_server.py checks it on the real server.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from starlette.requests import Request

from .archive_modules import forget_modules
from .forward_passes import FAILURE, counted_forward_passes, failing_forward_passes
from .request_table import GOOD, REQUESTS, TEST_LIMITS, check_answer, headers

LIMITS_ENV = TEST_LIMITS.environment()


@pytest.fixture(scope="module")
def archive_module(unpacked_model: Path) -> Iterator[ModuleType]:
    """``sentiment_serving.ray_deployment`` as the replica imports it: from the archive's code/ on the path."""
    saved = list(sys.path)
    forget_modules("sentiment_serving")
    sys.path.insert(0, str(unpacked_model / "code"))
    try:
        yield importlib.import_module("sentiment_serving.ray_deployment")
    finally:
        sys.path[:] = saved
        forget_modules("sentiment_serving")


@pytest.fixture(scope="module")
def replica(archive_module: ModuleType, unpacked_model: Path):
    """The replica, constructed as Ray constructs it; ``torch_threads`` records the threads it set for its process,
    and torch's threads go back to what they were when the module is done (the setting stays with these tests)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(3)  # neither this machine's share nor the settings': the replica must set its own
    with pytest.MonkeyPatch.context() as patch:
        for name, value in LIMITS_ENV.items():
            patch.setenv(name, value)
        settings = importlib.import_module("sentiment_serving.ray_settings").ServeSettings(threads=1)
        # The user class behind the @serve.deployment wrapper, constructed as a replica constructs it.
        made = archive_module.SentimentDeployment.func_or_class(str(unpacked_model), settings)
        made.torch_threads = torch.get_num_threads()
        try:
            yield made
        finally:
            torch.set_num_threads(before)


@pytest.fixture
def forward_passes(replica) -> Iterator[list[int]]:
    """How many texts each forward pass of the replica gets."""
    with counted_forward_passes(replica) as sizes:
        yield sizes


def _http(replica, method: str, path: str, body: bytes = b""):
    scope = {"type": "http", "method": method, "path": path, "headers": [], "query_string": b""}

    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    return asyncio.run(replica(Request(scope, receive)))


@pytest.mark.parametrize(("body", "content_type", "accept", "status", "fragment"), REQUESTS)
def test_each_request_alone(replica, body, content_type, accept, status, fragment) -> None:
    (answer,) = replica.answer_together([(body, headers(content_type, accept, lower_case=True), "request-0")])
    check_answer(answer, status, fragment)


def test_the_whole_table_in_one_batch_is_one_forward_pass_with_per_request_answers(replica, forward_passes) -> None:
    rows = [param.values for param in REQUESTS]
    items = [
        (body, headers(ct, accept, lower_case=True), f"request-{n}") for n, (body, ct, accept, _, _) in enumerate(rows)
    ]
    batch = replica.answer_together(items)
    for answer, (_, _, _, status, fragment) in zip(batch, rows, strict=True):
        check_answer(answer, status, fragment)
    good_texts = sum(len(answer.json()) for answer in batch if answer.status == 200)
    assert forward_passes == [good_texts]
    # Batch invariance: the same requests one by one give the same labels and (up to padding noise) scores.
    for answer, item, (_, _, _, status, _) in zip(batch, items, rows, strict=True):
        if status == 200:
            (alone,) = replica.answer_together([item])
            assert [p["label"] for p in answer.json()] == [p["label"] for p in alone.json()]
            for got, want in zip(answer.json(), alone.json(), strict=True):
                assert got["scores"] == pytest.approx(want["scores"], abs=1e-4)


def test_a_batch_of_only_bad_requests_runs_no_forward_pass(replica, forward_passes) -> None:
    answers = replica.answer_together(
        [(b"{", {"content-type": "application/json"}, "a"), (b"x", {"content-type": "text/csv"}, "b")]
    )
    assert [a.status for a in answers] == [400, 415]
    assert forward_passes == []


def test_a_failing_forward_pass_is_a_clean_500_and_the_replica_keeps_serving(replica, caplog) -> None:
    with failing_forward_passes(replica):
        answers = replica.answer_together(
            [(b"fine", {"content-type": "text/plain"}, "req-7"), (b"", {"content-type": "text/plain"}, "req-8")]
        )
    assert [a.status for a in answers] == [500, 400]
    assert "cheese" not in answers[0].body.decode() and "req-7" in answers[0].json()["error"]
    assert FAILURE in caplog.text
    body, ct, accept, _, _ = GOOD[0].values
    assert replica.answer_together([(body, headers(ct, accept, lower_case=True), "req-9")])[0].status == 200


def test_ping_is_an_empty_200_and_unknown_paths_a_json_404(replica) -> None:
    ping = _http(replica, "GET", "/ping")
    assert (ping.status_code, ping.body) == (200, b"")
    missing = _http(replica, "POST", "/models/m1/invoke", b'{"inputs": "x"}')
    assert missing.status_code == 404 and missing.headers["content-type"] == "application/json"
    assert b"\n" not in missing.body


def test_the_replica_takes_its_threads_from_the_settings_not_from_ray(replica) -> None:
    """Ray sets OMP_NUM_THREADS=1 in a worker where it is unset; the replica sets torch's threads itself (read when
    it was constructed: the test session resets torch's threads between tests, tests/conftest.py)."""
    assert replica.predictor.options.threads == replica.settings.threads == replica.torch_threads == 1


def _drain(replica, bodies: list[bytes]) -> list:
    """Queue ``bodies`` (text/plain) at once, as Ray's batches leave them, and get the answers of the replica's forward
    passes."""
    items = [(body, {"content-type": "text/plain"}, f"r{n}") for n, body in enumerate(bodies)]
    return asyncio.run(replica.queue(items))


def test_requests_waiting_for_the_model_share_passes_of_at_most_max_batch_size(replica, forward_passes) -> None:
    """What queued while a pass ran is the next pass: ten waiting requests are two passes (8 + 2), not ten."""
    answers = _drain(replica, [f"text {n}".encode() for n in range(10)])
    assert [answer.status for answer in answers] == [200] * 10
    assert forward_passes == [replica.settings.max_batch_size, 10 - replica.settings.max_batch_size]


def test_each_queued_request_gets_the_answer_to_its_own_text(replica) -> None:
    """Mixed lengths, merged into passes of at most max_batch_size: every answer is its own request's (the forward
    pass is replaced by one that names the text it answers)."""
    original = replica.predictor.predict_dicts
    replica.predictor.predict_dicts = lambda texts: [{"label": t, "score": 1.0, "scores": {t: 1.0}} for t in texts]
    try:
        bodies = [("x" * length).encode() for length in (40, 2, 300, 1, 17, 2, 90, 5, 60, 3, 11)]
        answers = _drain(replica, bodies)
    finally:
        replica.predictor.predict_dicts = original
    assert [answer.json()[0]["label"].encode() for answer in answers] == bodies


def test_a_batch_expects_what_the_last_round_brought(replica, forward_passes) -> None:
    """The next batch waits (up to the timeout) for as many requests as the last pass answered plus those that queued
    meanwhile; Ray's own batching is told the same number."""
    # What Ray's batching is told: Ray 2.57's batch wrapper has a public setter and only this private getter.
    expected = replica.answer._get_max_batch_size
    _drain(replica, [b"one", b"two", b"three"])
    assert expected() == replica.expected_requests == 3
    _drain(replica, [b"alone"])
    assert expected() == 1  # a lone client: its next request starts at once
    started = time.monotonic()
    _drain(replica, [b"alone again"])
    assert time.monotonic() - started < 1  # no wait (the test settings' timeout is 2 ms anyway)
    _drain(replica, [f"burst {n}".encode() for n in range(12)])  # a pass takes 8 at most: 8, then the other 4
    assert forward_passes == [3, 1, 1, 8, 4]
    assert expected() == 4


def test_the_launcher_serves_the_archive_config_on_the_port_given(unpacked_model: Path, tmp_path: Path) -> None:
    from inference_assets.container.ray_server import serve_config

    config = serve_config(unpacked_model, "0.0.0.0", 8080)
    assert config["http_options"] == {"host": "0.0.0.0", "port": 8080}
    assert config["applications"][0]["import_path"] == "deployment:app"
    with pytest.raises(SystemExit, match="no Ray Serve config"):
        serve_config(tmp_path, "0.0.0.0", 8080)
    (tmp_path / "config.yaml").write_text("applications: []\n")
    with pytest.raises(SystemExit, match="names no applications"):
        serve_config(tmp_path, "0.0.0.0", 8080)


def test_the_launcher_takes_sagemakers_serve_argument_and_nothing_else(tmp_path: Path) -> None:
    from inference_assets.container.ray_server import main

    with pytest.raises(SystemExit, match="no Ray Serve config"):  # "serve" accepted: it got as far as the config
        main(["serve", "--model-dir", str(tmp_path)])
    with pytest.raises(SystemExit) as refused:
        main(["train"])
    assert refused.value.code == 2


def test_the_launcher_gives_one_replica_the_sagemaker_port_and_several_the_proxy() -> None:
    from inference_assets.container.ray_server import ingress_environment

    one = ingress_environment({"SENTIMENT_SERVE_REPLICAS": "1"}, 8080)
    assert one["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "1"
    # Ray hands out range(MIN, MAX): 8080 and nothing else.
    assert (one["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"], one["RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT"]) == (
        "8080",
        "8081",
    )
    several = ingress_environment({"SENTIMENT_SERVE_REPLICAS": "2"}, 8080)
    assert several["RAY_SERVE_ENABLE_DIRECT_INGRESS"] == "0"
    assert "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT" not in several
    # An operator's choice stands: Ray Serve's defaults (the proxy on the port), or direct ingress turned off.
    for choice in ({"RAY_SERVE_THROUGHPUT_OPTIMIZED": "0"}, {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "0"}):
        kept = ingress_environment(choice, 8080)
        assert not set(choice) & set(kept)
        assert "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT" not in kept
