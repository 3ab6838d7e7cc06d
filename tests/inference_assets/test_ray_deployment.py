"""The Ray Serve deployment class, constructed in-process on the unpacked archive's model and called without Ray:
its queue (the batching: which requests share a forward pass, and when a pass starts), admission, and the paths it
answers without batching.

The class is imported from the tree (``inference_assets.container.ray_deployment``), which the archive carries byte
for byte as ``code/sentiment_serving/ray_deployment.py``: the first test imports the archive's copy the way a replica
does and compares the two. (Imported from the tree, the module is the one mutation testing mutates: mutmut switches a
mutant on by the module's name, and the archive's copy has another one; tests/mutation/plan.py.)

test_ray_server.py checks the batching on the real server too.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http import HTTPStatus
from pathlib import Path
from types import ModuleType

import pytest
from starlette.requests import Request

from tests.inference_assets.archive_modules import forget_modules
from tests.inference_assets.forward_passes import FAILURE, counted_forward_passes, failing_forward_passes
from tests.inference_assets.request_table import GOOD, REQUESTS, TEST_LIMITS, check_answer, headers

LIMITS_ENV = TEST_LIMITS.environment()


def test_the_archive_carries_this_deployment_and_a_replica_imports_it_from_there(unpacked_model: Path) -> None:
    """``sentiment_serving.ray_deployment`` as the replica imports it (the archive's code/ on the path, its sibling
    modules imported from there) is the tree's module, byte for byte, with its settings and its application."""
    from inference_assets.container import ray_deployment

    saved = list(sys.path)
    forget_modules("sentiment_serving")
    sys.path.insert(0, str(unpacked_model / "code"))
    try:
        archived = importlib.import_module("sentiment_serving.ray_deployment")
        settings = importlib.import_module("sentiment_serving.ray_settings")
        assert archived.__file__ is not None and ray_deployment.__file__ is not None
        assert Path(archived.__file__).parent == unpacked_model / "code" / "sentiment_serving"
        assert Path(archived.__file__).read_bytes() == Path(ray_deployment.__file__).read_bytes()
        assert archived.SentimentDeployment.func_or_class is archived.SentimentReplica
        assert archived.ServeSettings is settings.ServeSettings
    finally:
        sys.path[:] = saved
        forget_modules("sentiment_serving")


@pytest.fixture(scope="module")
def deployment_module() -> ModuleType:
    return importlib.import_module("inference_assets.container.ray_deployment")


@contextmanager
def _constructed(deployment_module: ModuleType, unpacked_model: Path, wait: float = 0.005):
    """A replica, constructed as Ray constructs it; ``torch_threads`` records the threads it set for its process,
    and torch's threads go back to what they were when the block ends (the setting stays with these tests)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(3)  # neither this machine's share nor the settings': the replica must set its own
    with pytest.MonkeyPatch.context() as patch:
        for name, value in LIMITS_ENV.items():
            patch.setenv(name, value)
        # Passes of 8 (not the default): the tests fill max_invocations (8 passes' worth) and count passes; a wait
        # that is neither Ray's default nor the settings' default.
        settings = importlib.import_module("inference_assets.container.ray_settings").ServeSettings(
            threads=1, max_batch_size=8, batch_wait_timeout_s=wait
        )
        # The user class behind the @serve.deployment wrapper, constructed as a replica constructs it.
        made = deployment_module.SentimentDeployment.func_or_class(str(unpacked_model), settings)
        made.torch_threads = torch.get_num_threads()
        try:
            yield made
        finally:
            torch.set_num_threads(before)


@pytest.fixture(scope="module")
def replica(deployment_module: ModuleType, unpacked_model: Path):
    with _constructed(deployment_module, unpacked_model) as made:
        yield made


@pytest.fixture
def forward_passes(replica) -> Iterator[list[int]]:
    """How many texts each forward pass of the replica gets."""
    with counted_forward_passes(replica) as sizes:
        yield sizes


def _request(method: str, path: str, body: bytes = b"", content_type: str = "text/plain") -> Request:
    headers = [(b"content-type", content_type.encode())]
    scope = {"type": "http", "method": method, "path": path, "headers": headers, "query_string": b""}

    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    return Request(scope, receive)


def _http(replica, method: str, path: str, body: bytes = b""):
    return asyncio.run(replica(_request(method, path, body)))


def _answer_together(replica, items: list) -> list:
    """What the replica answers ``items`` (body, headers, request id) with, as its __call__ gets there: each request
    admitted (parsed, tokenized, checked) on its own, the admitted ones answered in one forward pass."""
    admitted = [replica.admit(body, headers, request_id) for body, headers, request_id in items]
    passing = [item for item in admitted if not hasattr(item, "status")]  # an Answer (a refusal) has a status
    answers = iter(replica.answer_together(passing) if passing else [])
    return [item if hasattr(item, "status") else next(answers) for item in admitted]


@pytest.mark.parametrize(("body", "content_type", "accept", "status", "fragment"), REQUESTS)
def test_each_request_alone(replica, body, content_type, accept, status, fragment) -> None:
    (answer,) = _answer_together(replica, [(body, headers(content_type, accept, lower_case=True), "request-0")])
    check_answer(answer, status, fragment)


def test_the_whole_table_in_one_batch_is_one_forward_pass_with_per_request_answers(replica, forward_passes) -> None:
    rows = [param.values for param in REQUESTS]
    items = [
        (body, headers(ct, accept, lower_case=True), f"request-{n}") for n, (body, ct, accept, _, _) in enumerate(rows)
    ]
    batch = _answer_together(replica, items)
    for answer, (_, _, _, status, fragment) in zip(batch, rows, strict=True):
        check_answer(answer, status, fragment)
    good_texts = sum(len(answer.json()) for answer in batch if answer.status == 200)
    assert forward_passes == [good_texts]
    # Batch invariance: the same requests one by one give the same labels and (up to padding noise) scores.
    for answer, item, (_, _, _, status, _) in zip(batch, items, rows, strict=True):
        if status == 200:
            (alone,) = _answer_together(replica, [item])
            assert [p["label"] for p in answer.json()] == [p["label"] for p in alone.json()]
            for got, want in zip(answer.json(), alone.json(), strict=True):
                assert got["scores"] == pytest.approx(want["scores"], abs=1e-4)


def test_a_batch_of_only_bad_requests_runs_no_forward_pass(replica, forward_passes) -> None:
    answers = _answer_together(
        replica, [(b"{", {"content-type": "application/json"}, "a"), (b"x", {"content-type": "text/csv"}, "b")]
    )
    assert [a.status for a in answers] == [400, 415]
    assert forward_passes == []


def test_each_forward_pass_logs_its_texts_and_time_as_the_topology_benchmark_reads_them(replica, caplog) -> None:
    """The topology benchmark's forward-thread share comes from these lines (serving_topology.pass_totals)."""
    from proving_ground.benchmarks.serving_topology import pass_totals

    caplog.set_level(logging.INFO, logger="ray.serve")
    json_body = json.dumps({"inputs": ["two", "three"]}).encode()
    _answer_together(
        replica, [(b"one", {"content-type": "text/plain"}, "a"), (json_body, {"content-type": "application/json"}, "b")]
    )
    texts, seconds = pass_totals([caplog.text])
    assert texts == 3 and 0 <= seconds < 60


def test_a_failing_forward_pass_is_a_clean_500_and_the_replica_keeps_serving(replica, caplog) -> None:
    with failing_forward_passes(replica):
        answers = _answer_together(
            replica,
            [(b"fine", {"content-type": "text/plain"}, "req-7"), (b"", {"content-type": "text/plain"}, "req-8")],
        )
    assert [a.status for a in answers] == [500, 400]
    assert "cheese" not in answers[0].body.decode() and "req-7" in answers[0].json()["error"]
    assert FAILURE in caplog.text
    body, ct, accept, _, _ = GOOD[0].values
    assert _answer_together(replica, [(body, headers(ct, accept, lower_case=True), "req-9")])[0].status == 200


def test_ping_is_an_empty_200_and_unknown_paths_a_json_404(replica) -> None:
    ping = _http(replica, "GET", "/ping")
    assert (ping.status_code, ping.body) == (200, b"")
    missing = _http(replica, "POST", "/models/m1/invoke", b'{"inputs": "x"}')
    assert missing.status_code == 404 and missing.headers["content-type"] == "application/json"
    assert b"\n" not in missing.body


def test_the_replica_takes_its_threads_from_the_settings_not_from_ray(replica) -> None:
    """Ray sets OMP_NUM_THREADS=1 in a worker where it is unset; the replica sets torch's threads itself (read when
    it was constructed: the test session resets torch's threads between tests, tests/conftest.py), and again in the
    thread its forward passes run on (a new thread starts with OpenMP's default, every core unless OMP_NUM_THREADS
    says otherwise, whatever the constructor set in its own thread)."""
    import torch

    def threads_of_a_forward_pass() -> int:
        replica.predictor.predict(["a text"])
        return torch.get_num_threads()

    in_forward_thread = replica._forward.submit(threads_of_a_forward_pass).result()
    assert replica.predictor.options.threads == replica.settings.threads == replica.torch_threads == 1
    assert in_forward_thread == 1


def _drain(replica, bodies: list[bytes]) -> list:
    """Queue ``bodies`` (text/plain) at once and get the answers of the replica's forward passes."""
    items = [replica.admit(body, {"content-type": "text/plain"}, f"r{n}") for n, body in enumerate(bodies)]
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
    replica.predictor.predict_dicts = lambda texts, *_: [{"label": t, "score": 1.0, "scores": {t: 1.0}} for t in texts]
    try:
        bodies = [("x" * length).encode() for length in (40, 2, 300, 1, 17, 2, 90, 5, 60, 3, 11)]
        answers = _drain(replica, bodies)
    finally:
        replica.predictor.predict_dicts = original
    assert [answer.json()[0]["label"].encode() for answer in answers] == bodies


def test_requests_of_several_texts_in_one_pass_each_get_the_answers_to_their_own_texts(replica) -> None:
    """Requests of 2, 3, 1 and 2 texts share one pass: each gets its own texts' answers, in its own order (a pass
    that hands out one slice per request instead of one per text gives the third request the second's texts)."""
    original = replica.predictor.predict_dicts
    replica.predictor.predict_dicts = lambda texts, *_: [{"label": t, "score": 1.0, "scores": {t: 1.0}} for t in texts]
    requests = [["a" * 40, "bb"], ["c" * 300, "d", "e" * 17], ["ff"], ["g" * 90, "h"]]
    json_headers = {"content-type": "application/json"}
    try:
        items = [replica.admit(json.dumps({"inputs": texts}).encode(), json_headers, f"m{n}")
                 for n, texts in enumerate(requests)]  # fmt: skip
        answers = asyncio.run(replica.queue(items))
    finally:
        replica.predictor.predict_dicts = original
    assert [[prediction["label"] for prediction in answer.json()] for answer in answers] == requests


def test_a_batch_expects_what_the_last_round_brought(replica, forward_passes) -> None:
    """The next batch waits (up to the timeout) for as many requests as the last pass answered plus those that queued
    meanwhile."""

    def expected() -> int:
        return int(replica.expected_requests)

    _drain(replica, [b"one", b"two", b"three"])
    assert expected() == 3
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


@pytest.fixture
def token_limit(replica) -> Iterator[int]:
    """The replica with max_request_tokens at its floor (512): eight texts of the tiny model's 64-token window."""
    saved = replica.limits
    replica.limits = type(saved)(
        max_request_batch=32, max_request_bytes=saved.max_request_bytes, max_request_tokens=512
    )
    try:
        yield replica.predictor.max_length
    finally:
        replica.limits = saved


def _full_window_texts(count: int) -> bytes:
    return json.dumps({"inputs": [f"review {n}: " + "great film " * 40 for n in range(count)]}).encode()


def test_a_request_over_the_token_limit_is_a_413_naming_it(replica, token_limit: int, forward_passes) -> None:
    assert token_limit * 8 == 512
    json_headers = {"content-type": "application/json"}
    (over, at) = [replica.admit(_full_window_texts(n), json_headers, f"r{n}") for n in (9, 8)]
    assert over.status == 413
    assert "576 tokens" in over.json()["error"] and "at most 512" in over.json()["error"]
    assert "(max_request_tokens)" in over.json()["error"]
    assert at.tokens == 512 and forward_passes == []  # admission alone runs no forward pass
    (answer,) = asyncio.run(replica.queue([at]))
    assert answer.status == 200 and forward_passes == [8]


def test_a_forward_pass_holds_at_most_max_request_tokens(replica, token_limit: int, forward_passes) -> None:
    """Three requests at the token limit are three passes; eight short ones share one (the batch size bounds it)."""
    json_headers = {"content-type": "application/json"}
    full = [replica.admit(_full_window_texts(8), json_headers, f"f{n}") for n in range(3)]
    short = [replica.admit(f"short {n}".encode(), {"content-type": "text/plain"}, f"s{n}") for n in range(8)]
    answers = asyncio.run(replica.queue(full + short))
    assert [answer.status for answer in answers] == [200] * 11
    assert forward_passes == [8, 8, 8, 8]


async def _saturate_and_ping(replica, release: threading.Event) -> tuple[list[int], float, int]:
    """Hold every invocation slot of the replica with requests whose forward pass waits for ``release``; then ping,
    and send one invocation more. (ping status..., ping seconds, the extra invocation's status)."""
    calls = [
        asyncio.create_task(replica(_request("POST", "/invocations", f"text {n}".encode())))
        for n in range(replica.settings.max_invocations)
    ]
    while replica._invocations < replica.settings.max_invocations:
        await asyncio.sleep(0.01)
    started = time.monotonic()
    pings = [await replica(_request("GET", "/ping")) for _ in range(3)]
    ping_seconds = time.monotonic() - started
    try:
        # refused at once; were it admitted instead, it would wait behind the held passes: a bound, not a timing
        extra = await asyncio.wait_for(replica(_request("POST", "/invocations", b"one more")), timeout=20)
    finally:
        release.set()
    assert "its limit" in _error(extra, 503)
    answered = await asyncio.gather(*calls)
    assert [response.status_code for response in answered] == [200] * len(calls)
    return [ping.status_code for ping in pings], ping_seconds, extra.status_code


def test_ping_answers_at_once_while_every_invocation_slot_is_held(replica, monkeypatch) -> None:
    """The queue full (max_invocations requests held, a forward pass running), /ping is 200 at once and the next
    invocation is refused with a 503 naming the limit, not queued behind the others."""
    release = threading.Event()
    original = replica.predictor.predict_dicts

    def slow(texts, *encodings):
        release.wait(30)
        return original(texts, *encodings)

    monkeypatch.setattr(replica.predictor, "predict_dicts", slow)
    statuses, seconds, extra = asyncio.run(_saturate_and_ping(replica, release))
    assert statuses == [200, 200, 200] and seconds < 0.5
    assert extra == 503
    # Each slot is given back when its request is answered: the same again.
    release.clear()
    assert asyncio.run(_saturate_and_ping(replica, release))[::2] == ([200, 200, 200], 503)
    # Ray's own limit leaves room for /ping beyond the invocations the replica holds itself.
    assert replica.settings.max_ongoing_requests > replica.settings.max_invocations


def test_a_replica_whose_forward_passes_keep_failing_says_it_cannot_serve(replica) -> None:
    with failing_forward_passes(replica):
        for n in range(3):
            assert _answer_together(replica, [(b"text", {"content-type": "text/plain"}, f"f{n}")])[0].status == 500
        ping = _http(replica, "GET", "/ping")
        assert ping.status_code == 503 and "the last 3 forward passes failed" in json.loads(ping.body)["error"]
        with pytest.raises(RuntimeError, match="forward passes failed"):
            replica.check_health()  # Ray's health check: Ray replaces the replica
    assert _answer_together(replica, [(b"text", {"content-type": "text/plain"}, "ok")])[0].status == 200
    assert _http(replica, "GET", "/ping").status_code == 200  # one good pass and it serves again
    replica.check_health()


def test_a_prediction_that_is_not_a_number_fails_only_its_request_and_the_replica_keeps_serving(
    replica, monkeypatch
) -> None:
    """One text whose scores come out NaN (what a broken input or kernel gives) is a 500 for its request alone; the
    requests in the same forward pass are answered, /ping stays 200; a model that answers NaN for every request
    counts as failing (three such passes and the replica says it cannot serve)."""
    original = replica.predictor.predict_dicts

    def nan_for(poisoned: set[str]):
        def predict(texts, *encodings):
            answers = original(texts, *encodings)
            return [{**a, "score": float("nan")} if t in poisoned else a for t, a in zip(texts, answers, strict=True)]

        return predict

    plain = {"content-type": "text/plain"}
    monkeypatch.setattr(replica.predictor, "predict_dicts", nan_for({"poisoned"}))
    answers = _answer_together(replica, [(b"fine", plain, "n-1"), (b"poisoned", plain, "n-2"), (b"good", plain, "n-3")])
    assert [answer.status for answer in answers] == [200, 500, 200]
    error = "the model's prediction is not a finite number (request n-2); see the server log"
    assert answers[1].json()["error"] == error
    assert _http(replica, "GET", "/ping").status_code == 200
    monkeypatch.setattr(replica.predictor, "predict_dicts", nan_for({"a", "b", "c"}))
    for text in ("a", "b", "c"):
        assert _answer_together(replica, [(text.encode(), plain, text)])[0].status == 500
    assert "the last 3 forward passes failed" in json.loads(_http(replica, "GET", "/ping").body)["error"]
    monkeypatch.setattr(replica.predictor, "predict_dicts", original)
    assert _answer_together(replica, [(b"fine", plain, "n-4")])[0].status == 200
    assert _http(replica, "GET", "/ping").status_code == 200


def test_the_launcher_keeps_ray_off_the_network() -> None:
    """No usage report (the endpoint has no egress); the dashboard and the node address are ray_server.main's
    ray.init arguments (include_dashboard=False, _node_ip_address=127.0.0.1)."""
    from inference_assets.container.ray_server import ingress_environment

    assert ingress_environment({}, 8080)["RAY_USAGE_STATS_ENABLED"] == "0"
    assert "RAY_USAGE_STATS_ENABLED" not in ingress_environment({"RAY_USAGE_STATS_ENABLED": "0"}, 8080)


def test_the_object_store_fits_shared_memory_or_goes_to_disk_saying_so(tmp_path: Path, monkeypatch) -> None:
    from inference_assets.container import ray_server

    mib = 1024 * 1024

    def free(size: int):
        return lambda path: type("Usage", (), {"free": size})()

    monkeypatch.setattr(ray_server.shutil, "disk_usage", free(64 * mib))  # Docker's default /dev/shm
    assert ray_server.object_store(spill=str(tmp_path)) == (ray_server.OBJECT_STORE_MIN_BYTES, str(tmp_path))
    monkeypatch.setattr(ray_server.shutil, "disk_usage", free(400 * mib))
    assert ray_server.object_store() == (200 * mib, None)  # half of what /dev/shm has free
    monkeypatch.setattr(ray_server.shutil, "disk_usage", free(64 * 1024 * mib))
    assert ray_server.object_store() == (ray_server.OBJECT_STORE_MAX_BYTES, None)


# ------------------------------------------------------- what mutation testing of ray_deployment.py found unchecked


@pytest.fixture
def fresh_replica(deployment_module: ModuleType, unpacked_model: Path):
    """A replica as Ray starts it, before any request (the module's replica has answered many by then)."""
    with _constructed(deployment_module, unpacked_model) as made:
        yield made


def _error(response, status: int) -> str:
    """The protocol's error body (one line of JSON: the status, its HTTP phrase and one sentence) of ``response``,
    checked; its sentence."""
    assert response.status_code == status and response.headers["content-type"] == "application/json"
    assert b"\n" not in response.body
    body = json.loads(response.body)
    assert set(body) == {"code", "message", "error"}
    assert (body["code"], body["message"]) == (status, HTTPStatus(status).phrase)
    return body["error"]


def test_a_new_replica_waits_for_no_second_request_and_serves_until_its_third_failed_pass(
    fresh_replica, deployment_module: ModuleType
) -> None:
    """Before any request it expects one (the first is answered at once); it says it cannot serve after
    FAILED_PASSES_UNHEALTHY failed passes in a row, not one sooner."""
    unhealthy_after = deployment_module.FAILED_PASSES_UNHEALTHY
    assert fresh_replica.expected_requests == 1
    assert _http(fresh_replica, "GET", "/ping").status_code == 200
    with failing_forward_passes(fresh_replica):
        for n in range(unhealthy_after):
            assert _http(fresh_replica, "GET", "/ping").status_code == 200
            assert (
                _answer_together(fresh_replica, [(b"text", {"content-type": "text/plain"}, f"f{n}")])[0].status == 500
            )
    reason = _error(_http(fresh_replica, "GET", "/ping"), 503)
    assert (
        reason == f"this replica cannot serve: the last {unhealthy_after} forward passes failed; see the replica's log"
    )


def test_a_forward_pass_running_past_the_stall_limit_makes_the_replica_unhealthy(
    replica, deployment_module: ModuleType, monkeypatch
) -> None:
    """A pass that has run STALLED_PASS_S is still healthy; a second more and /ping is 503 and Ray's health check
    fails (the replica's clock is moved on while the pass runs); the pass done, the replica serves again."""
    limit = deployment_module.STALLED_PASS_S

    class Clock:
        now = 1000.0

        def monotonic(self) -> float:
            return self.now

    clock = Clock()
    monkeypatch.setattr(deployment_module, "time", clock)
    original = replica.predictor.predict_dicts
    seen: list[object] = []

    def stuck(texts, *encodings):
        clock.now = 1000.0 + limit
        seen.append(replica.unhealthy())
        clock.now = 1000.0 + limit + 1
        seen.append(_error(_http(replica, "GET", "/ping"), 503))
        return original(texts, *encodings)

    monkeypatch.setattr(replica.predictor, "predict_dicts", stuck)
    (answer,) = _answer_together(replica, [(b"slow", {"content-type": "text/plain"}, "s")])
    assert answer.status == 200
    assert seen == [
        None,
        f"this replica cannot serve: a forward pass has run for {limit + 1:.0f} s (more than {limit:.0f} s)",
    ]
    assert replica.unhealthy() is None


def test_every_answer_the_replica_gives_over_http_has_its_content_type_and_errors_the_protocols_shape(
    replica, monkeypatch
) -> None:
    """200s and the protocol's errors keep their content type through the HTTP entry; the replica's own errors
    (unknown path, unhealthy) are the protocol's JSON too; a 500 names the request id Ray's proxy gave it."""
    from ray.serve.context import _RequestContext, _serve_request_context

    fine = _http(replica, "POST", "/invocations", b"a fine film")
    assert fine.status_code == 200 and fine.headers["content-type"] == "application/json"
    assert "/invocations" in _error(_http(replica, "POST", "/models/m1/invoke", b"x"), 404)
    # GET is /ping's alone: on /invocations it goes to the protocol (no body: a 400), on /ping HEAD answers too.
    _error(_http(replica, "GET", "/invocations"), 400)
    head = _http(replica, "HEAD", "/ping")
    assert (head.status_code, head.body) == (200, b"")

    async def with_proxy_id(request_id: str):
        # (the id Ray's proxy sets for a request; Ray declares the variable without its type)
        _serve_request_context.set(_RequestContext(request_id=request_id))  # type: ignore[arg-type]
        return await replica(_request("POST", "/invocations", b"a fine film"))

    with failing_forward_passes(replica):
        assert "request proxy-7" in _error(asyncio.run(with_proxy_id("proxy-7")), 500)
        for n in range(2):
            _answer_together(replica, [(b"text", {"content-type": "text/plain"}, f"f{n}")])
        assert _error(_http(replica, "GET", "/ping"), 503).startswith("this replica cannot serve: ")
    assert _http(replica, "POST", "/invocations", b"a fine film").status_code == 200


def test_small_requests_are_admitted_on_the_event_loop_and_large_ones_one_at_a_time_on_a_thread_of_their_own(
    replica, deployment_module: ModuleType, monkeypatch
) -> None:
    """A request of up to INLINE_ADMISSION_BYTES is admitted (parsed, tokenized) on the event loop; larger ones one at
    a time on one thread that is neither the event loop's (which answers /ping) nor the forward pass's, and /ping
    answers while one is admitted."""
    admitting: list[tuple[int, threading.Thread]] = []
    forwarding: list[threading.Thread] = []
    forwarded: list[tuple[list[str], list[list[int]]]] = []
    admit, predict = replica.admit, replica.predictor.predict_dicts
    inline = deployment_module.INLINE_ADMISSION_BYTES
    bodies = [b"x" * (inline - n) for n in range(3)] + [b"y" * (inline + 1 + n) for n in range(3)]
    pings: list[int] = []

    def recorded_admit(body, *args):
        admitting.append((len(body), threading.current_thread()))
        if len(body) > inline:
            time.sleep(0.005)  # the next request arrives while this one is admitted
        return admit(body, *args)

    def recorded_predict(texts, encodings):
        forwarding.append(threading.current_thread())
        forwarded.append((texts, encodings))
        return predict(texts, encodings)

    monkeypatch.setattr(replica, "admit", recorded_admit)
    monkeypatch.setattr(replica.predictor, "predict_dicts", recorded_predict)

    async def together() -> list:
        calls = [asyncio.create_task(replica(_request("POST", "/", body))) for body in bodies]
        await asyncio.sleep(0.002)  # a large request is being admitted now
        pings.append((await replica(_request("GET", "/ping"))).status_code)
        return await asyncio.gather(*calls)

    assert [response.status_code for response in asyncio.run(together())] == [200] * len(bodies)
    assert pings == [200]
    on_loop = {thread for size, thread in admitting if size <= inline}
    on_thread = {thread for size, thread in admitting if size > inline}
    assert len(admitting) == len(bodies) and on_loop == {threading.current_thread()} and len(on_thread) == 1
    assert on_thread.isdisjoint(forwarding) and on_thread != on_loop
    # The passes run on the replica's forward thread (whose torch threads the replica sets), with admission's ids.
    assert set(forwarding) == {replica._forward.submit(threading.current_thread).result()}
    assert all(encodings is not None and len(encodings) == len(texts) for texts, encodings in forwarded)


def test_a_parsing_failure_is_a_500_naming_the_request_and_the_replica_keeps_serving(
    replica, deployment_module: ModuleType, monkeypatch
) -> None:
    """A bug in admission (parsing raising something the protocol does not refuse with) costs its request a 500 that
    names the request id Ray's proxy gave it, not the replica its health."""
    from ray.serve.context import _RequestContext, _serve_request_context

    def broken(*_):
        raise KeyError("a bug")

    async def with_proxy_id():
        _serve_request_context.set(_RequestContext(request_id="proxy-9"))  # type: ignore[arg-type]
        return await replica(_request("POST", "/invocations", b"a fine film"))

    monkeypatch.setattr(deployment_module, "admit_request", broken)
    assert "request proxy-9" in _error(asyncio.run(with_proxy_id()), 500)
    monkeypatch.undo()
    assert _http(replica, "GET", "/ping").status_code == 200


def _full_window_requests(replica, counts: list[int]) -> list:
    return [replica.admit(_full_window_texts(n), {"content-type": "application/json"}, f"w{n}") for n in counts]


def test_requests_share_a_pass_up_to_exactly_max_request_tokens(replica, token_limit: int, forward_passes) -> None:
    """Two requests of half the token limit each share one pass (at the limit); a third waits for the next pass;
    a request one text over what is left goes to the next pass too."""
    assert [item.tokens for item in _full_window_requests(replica, [4])] == [256]
    asyncio.run(replica.queue(_full_window_requests(replica, [4, 4, 4])))
    assert forward_passes == [8, 4]
    forward_passes.clear()
    asyncio.run(replica.queue(_full_window_requests(replica, [4, 5])))
    assert forward_passes == [4, 5]


def test_a_request_that_does_not_fit_the_pass_ends_it_and_leads_the_next(
    replica, token_limit: int, forward_passes
) -> None:
    """Requests of 4, 5 and 1 full-window texts: the 5 do not fit beside the 4, so the pass ends there and the 1
    waits behind them (arrival order), rather than jumping the queue into the first pass (which would also take the
    wrong requests off the queue and leave one unanswered)."""
    items = _full_window_requests(replica, [4, 5, 1])
    # (60 s: a guard against a hang, not a limit)
    answers = asyncio.run(asyncio.wait_for(replica.queue(items), 60))
    assert [answer.status for answer in answers] == [200] * 3
    assert [len(answer.json()) for answer in answers] == [4, 5, 1]
    assert forward_passes == [4, 6]


def test_a_pass_waits_for_the_round_and_starts_when_it_is_complete(
    deployment_module: ModuleType, unpacked_model: Path
) -> None:
    """A round of three answered, the next three requests, arriving 10 ms apart, share one pass (the wait, 300 ms,
    is counted from the first); the fourth, arriving after the round is complete, goes to the next pass."""
    plain = {"content-type": "text/plain"}
    with _constructed(deployment_module, unpacked_model, wait=0.3) as waiting, counted_forward_passes(waiting) as sizes:
        _drain(waiting, [b"one", b"two", b"three"])

        async def staggered() -> list:
            calls = []
            for n in range(4):
                calls.append(asyncio.create_task(waiting.queue([waiting.admit(f"late {n}".encode(), plain, f"l{n}")])))
                await asyncio.sleep(0.01)
            return await asyncio.gather(*calls)

        assert [answer.status for (answer,) in asyncio.run(staggered())] == [200] * 4
    assert sizes == [3, 3, 1]


def test_a_failing_drain_or_forward_executor_fails_its_callers_instead_of_leaving_them_waiting(fresh_replica) -> None:
    """Whatever fails in the queue itself, a caller gets the error (and Ray a 500), never a wait without end."""
    item = fresh_replica.admit(b"text", {"content-type": "text/plain"}, "q")

    def broken_take():
        raise RuntimeError("a bug in the queue")

    fresh_replica._take = broken_take
    with pytest.raises(RuntimeError, match="a bug in the queue"):
        asyncio.run(asyncio.wait_for(fresh_replica.queue([item]), 60))  # (60 s: a guard against a hang, not a limit)
    del fresh_replica._take
    fresh_replica._forward.shutdown()
    with pytest.raises(RuntimeError, match="after shutdown"):
        asyncio.run(asyncio.wait_for(fresh_replica.queue([item]), 60))


def test_the_replica_hands_the_predictor_the_environments_precision_and_compile_and_the_settings_threads(
    deployment_module: ModuleType, unpacked_model: Path, monkeypatch
) -> None:
    """What the predictor is built with (a stand-in records it: compiling the real one costs ~50 CPU-s)."""
    from inference_assets.container.contract import PRECISION_ENV, PRECISIONS, TORCH_COMPILE_ENV
    from inference_assets.container.predictor import RuntimeOptions

    built: list[tuple[str, RuntimeOptions]] = []

    class Recorded:
        def __init__(self, model_dir: str, options: RuntimeOptions) -> None:
            built.append((model_dir, options))
            self.options = options

    precision = PRECISIONS[-1]
    monkeypatch.setattr(deployment_module, "SentimentPredictor", Recorded)
    monkeypatch.setenv(PRECISION_ENV, precision)
    monkeypatch.setenv(TORCH_COMPILE_ENV, "1")
    with _constructed(deployment_module, unpacked_model):
        pass
    assert built == [(str(unpacked_model), RuntimeOptions(precision, True, 1))]
