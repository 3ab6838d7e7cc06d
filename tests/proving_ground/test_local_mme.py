"""The local multi-model harness: real TorchServe + SageMaker toolkit in multi-model mode, serving real archives."""

from __future__ import annotations

import json
import shutil
import tarfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from proving_ground.torchserve_mme.local_mme import LocalModelServer, LocalMultiModelEndpoint, ModelNotFound

pytestmark = pytest.mark.slow  # a real TorchServe + toolkit server

GOOD = json.dumps({"inputs": ["what a great day", "this is awful"]}).encode()
TENANT = LocalMultiModelEndpoint.server_name("sentiment-0000.tar.gz")  # the endpoint run's model in service


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    server = LocalModelServer(tmp_path_factory.mktemp("local-mme"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def models_dir(torchserve_archive: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local stand-in for the endpoint's S3 prefix: three copies of the archive, as publish_models.py names them."""
    models = tmp_path_factory.mktemp("prefix")
    for index in range(3):
        shutil.copy(torchserve_archive, models / f"sentiment-{index:04d}.tar.gz")
    return models


def test_load_and_invoke_by_name(server, tenant):
    assert tenant in server.loaded()
    answer = server.invoke(tenant, GOOD)
    assert answer.status == 200 and answer.content_type.startswith("application/json")
    predictions = answer.json()
    assert len(predictions) == 2 and {p["label"] for p in predictions} <= {"negative", "neutral", "positive"}
    assert all(abs(sum(p["scores"].values()) - 1) < 1e-3 for p in predictions)


def test_unknown_model_is_a_clear_not_found(server):
    answer = server.invoke("no-such-model", GOOD)
    assert answer.status == 404
    assert answer.json()["type"] == "ModelNotFoundException"
    assert "no-such-model" in answer.json()["message"]


def test_bad_requests_get_4xx_and_the_server_keeps_serving(server, tenant):
    bad = {
        (b'{"inputs": ', "application/json"): 400,
        (b'{"text": "no inputs key"}', "application/json"): 400,
        (b"<xml/>", "application/xml"): 415,
        (json.dumps({"inputs": ["t"] * 33}).encode(), "application/json"): 413,  # the toolkit's default limit, 32
    }
    for (body, content_type), status in bad.items():
        answer = server.invoke(tenant, body, content_type)
        assert answer.status == status, (body, answer.body[:200])
    assert server.invoke(tenant, GOOD).status == 200


@dataclass
class _EndpointRun:
    endpoint: LocalMultiModelEndpoint
    calls: list[tuple[int, bool]]  # (status, cold) of each request, in order
    together: list[tuple[int, bool]]  # the four first requests of a model sent at once
    cold_loads_before: int
    server_loaded: list[str]
    during_load: list[int]  # statuses of the requests to loaded 0000, each on a new connection, during 0002's load
    load_ran_throughout: bool  # 0002's load had not returned when the last of them was answered


@pytest.fixture(scope="module")
def endpoint_run(server, models_dir) -> Iterator[_EndpointRun]:
    """One run of the endpoint at two resident models (a cold load starts a worker process that imports torch and
    the model, so the least-recently-used, the concurrent-first-requests and the load-does-not-hold-up tests share
    it): 0000 cold, then warm, 0001 cold, 0000 again (now the most recently used), then four first requests of 0002
    at once, over the cap; once 0002 is registered (its worker starting, its load not answered yet), eight requests
    to 0000, each on a new connection, straight to the server."""
    endpoint = LocalMultiModelEndpoint(server, models_dir, max_resident_models=2)
    calls = []
    for name in ("sentiment-0000.tar.gz", "sentiment-0000.tar.gz", "sentiment-0001.tar.gz", "sentiment-0000.tar.gz"):
        answer, cold = endpoint.invoke(name, GOOD)
        calls.append((answer.status, cold))
    cold_loads_before = endpoint.cold_loads
    together = []

    def call() -> None:
        answer, cold = endpoint.invoke("sentiment-0002.tar.gz", GOOD)
        together.append((answer.status, cold))

    threads = [threading.Thread(target=call) for _ in range(4)]
    during_load = []
    try:
        for thread in threads:
            thread.start()
        while "sentiment-0002" not in server.loaded():  # registered: its worker is starting, its POST not answered yet
            assert any(thread.is_alive() for thread in threads), "the load ended before it was listed"
        for _ in range(8):
            with requests.Session() as connection:  # a new connection, on the next Netty thread
                answer = connection.post(f"{server.inference_url}/models/{TENANT}/invoke", data=GOOD,
                                         headers={"Content-Type": "application/json"}, timeout=120)  # fmt: skip
            during_load.append(answer.status_code)
        load_ran_throughout = endpoint.cold_loads == cold_loads_before  # counted once server.load returns
    finally:
        for thread in threads:
            thread.join()
    try:
        yield _EndpointRun(
            endpoint, calls, together, cold_loads_before, server.loaded(), during_load, load_ran_throughout
        )
    finally:
        loaded = server.loaded()
        for name in endpoint.resident():
            if endpoint.server_name(name) in loaded:
                server.unload(endpoint.server_name(name))


@pytest.fixture(scope="module")
def tenant(endpoint_run) -> str:
    """One model loaded for the module (each load starts a worker process that imports torch and the model): the
    endpoint run's 0000, which the endpoint registered with server.load under its server name; the tests that need a
    loaded model share it."""
    assert TENANT in endpoint_run.server_loaded
    return TENANT


def test_endpoint_loads_on_first_use_and_unloads_the_least_recently_used(endpoint_run):
    assert endpoint_run.calls[:3] == [(200, True), (200, False), (200, True)]  # 0000 cold, warm; 0001 cold
    assert (200, True) in endpoint_run.together  # 0002, over the cap: 0001 goes
    assert endpoint_run.endpoint.resident() == ["sentiment-0000.tar.gz", "sentiment-0002.tar.gz"]
    assert "sentiment-0001" not in endpoint_run.server_loaded
    assert (endpoint_run.endpoint.cold_loads, endpoint_run.endpoint.unloads) == (3, 1)


def test_concurrent_first_requests_load_a_model_once(endpoint_run):
    assert sorted(endpoint_run.together) == [(200, False)] * 3 + [(200, True)]
    assert endpoint_run.endpoint.cold_loads == endpoint_run.cold_loads_before + 1


def test_endpoint_refuses_unknown_and_invalid_target_models(server, models_dir):
    endpoint = LocalMultiModelEndpoint(server, models_dir, max_resident_models=1)
    with pytest.raises(ModelNotFound, match=r"sentiment-9999\.tar\.gz"):
        endpoint.invoke("sentiment-9999.tar.gz", GOOD)
    with pytest.raises(ValueError, match="model name"):
        endpoint.invoke("../escape.tar.gz", GOOD)
    with pytest.raises(ValueError, match="max_resident_models"):
        LocalMultiModelEndpoint(server, models_dir, max_resident_models=0)


def test_a_model_load_does_not_hold_up_requests_to_loaded_models(endpoint_run):
    """TorchServe runs a synchronous load on the Netty thread that read it (the endpoint's load of 0002 here), and
    inference shares those threads: with its default (2 x CPUs) one of these eight new connections would wait for the
    whole load."""
    assert endpoint_run.during_load == [200] * 8
    assert endpoint_run.load_ran_throughout  # every request was answered while the load was still running


def test_an_unloaded_model_is_gone_and_its_name_unknown(server, models_dir, tmp_path):
    """A model of its own, so that the module's shared one stays loaded for the other tests, whatever their order."""
    unpacked = tmp_path / "model"
    with tarfile.open(models_dir / "sentiment-0001.tar.gz") as archive:
        archive.extractall(unpacked, filter="data")
    server.load("unload-me", unpacked)
    assert "unload-me" in server.loaded()
    server.unload("unload-me")
    assert "unload-me" not in server.loaded()
    assert server.invoke("unload-me", GOOD).status == 404
