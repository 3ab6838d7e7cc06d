"""The archive served by the real SageMaker PyTorch toolkit + TorchServe on localhost, as in the container.

One server for the module (start-up costs ~15-25 s): predictions must equal the in-process predictor's, every bad
request must get its 4xx with a clear first line, and the server must keep answering afterwards.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from inference_assets.container.predictor import SentimentPredictor
from inference_assets.local.local_server import LocalToolkitServer, _group_alive

MAX_REQUEST_BATCH = 4
pytestmark = pytest.mark.slow

SAMPLE_DATA = Path(__file__).resolve().parents[2] / "training_assets" / "sample_data" / "validation.jsonl"


@pytest.fixture(scope="module")
def server(model_archive: Path) -> Iterator[LocalToolkitServer]:
    local = LocalToolkitServer(model_archive, workers=1, max_request_batch=MAX_REQUEST_BATCH)
    local.start()
    group = local._process.pid
    try:
        yield local
    finally:
        local.stop()
    assert not _group_alive(group), "TorchServe, java or a worker outlived stop()"


@pytest.fixture(scope="module")
def predictor(tiny_model_dir: Path) -> SentimentPredictor:
    return SentimentPredictor(tiny_model_dir, max_batch_size=MAX_REQUEST_BATCH)


@pytest.fixture(scope="module")
def texts() -> list[str]:
    rows = [json.loads(line) for line in SAMPLE_DATA.read_text().splitlines() if line.strip()]
    return [row["text"] for row in rows[:MAX_REQUEST_BATCH]]


def _expected(predictor: SentimentPredictor, texts: list[str]) -> list[dict]:
    return [prediction.as_dict() for prediction in predictor.predict(texts)]


def _assert_same_predictions(served: list[dict], expected: list[dict]) -> None:
    assert [p["label"] for p in served] == [p["label"] for p in expected]
    for got, want in zip(served, expected, strict=True):
        assert got["scores"] == pytest.approx(want["scores"], abs=1e-5)
        assert got["score"] == pytest.approx(want["score"], abs=1e-5)


def test_ping_answers(server: LocalToolkitServer) -> None:
    assert server.ping() == 200


def test_the_toolkit_serves_the_archive_from_its_own_model_dir(server: LocalToolkitServer) -> None:
    model_dir = server.workdir / "opt_ml" / "model"
    assert (model_dir / "code" / "inference.py").is_file()
    log = server.log_path.read_text()
    # The toolkit's own TorchServe command line: its generated config and the default model at our model dir.
    assert "'--ts-config', '/etc/sagemaker-ts.properties'" in log
    assert f"'--models', 'model={model_dir}'" in log


def test_single_text_matches_the_in_process_predictor(
    server: LocalToolkitServer, predictor: SentimentPredictor, texts: list[str]
) -> None:
    status, headers, body = server.invoke(json.dumps({"inputs": texts[0]}).encode())
    assert status == 200, body
    assert headers["content-type"] == "application/json"
    _assert_same_predictions(json.loads(body), _expected(predictor, [texts[0]]))


def test_batch_matches_the_in_process_predictor_in_order(
    server: LocalToolkitServer, predictor: SentimentPredictor, texts: list[str]
) -> None:
    status, _, body = server.invoke(json.dumps({"inputs": texts}).encode())
    assert status == 200, body
    served = json.loads(body)
    assert len(served) == len(texts)
    _assert_same_predictions(served, _expected(predictor, texts))


@pytest.mark.parametrize("content_type", ["text/plain", "text/plain; charset=utf-8"])
def test_plain_text_is_one_input(
    server: LocalToolkitServer, predictor: SentimentPredictor, texts: list[str], content_type: str
) -> None:
    status, _, body = server.invoke(texts[1].encode(), content_type=content_type)
    assert status == 200, body
    _assert_same_predictions(json.loads(body), _expected(predictor, [texts[1]]))


@pytest.mark.parametrize("accept", ["application/json", "*/*", "application/json, text/plain;q=0.5"])
def test_json_compatible_accept_headers_are_served(server: LocalToolkitServer, accept: str) -> None:
    status, _, body = server.invoke(b'{"inputs": "fine"}', accept=accept)
    assert status == 200, body


BAD_REQUESTS = [
    pytest.param(b"{not json", "application/json", None, 400, "not valid JSON", id="malformed-json"),
    pytest.param(b'{"text": "hi"}', "application/json", None, 400, 'object with "inputs"', id="missing-inputs"),
    pytest.param(b'["hi"]', "application/json", None, 400, 'object with "inputs"', id="not-an-object"),
    pytest.param(b'{"inputs": ["ok", 3]}', "application/json", None, 400, '"inputs"[1] must be a string', id="non-str"),
    pytest.param(b'{"inputs": 3}', "application/json", None, 400, "a string or a list of strings", id="number"),
    pytest.param(b'{"inputs": []}', "application/json", None, 400, "must not be an empty list", id="empty-list"),
    pytest.param(
        json.dumps({"inputs": ["x"] * (MAX_REQUEST_BATCH + 1)}).encode(),
        "application/json",
        None,
        413,
        f"at most {MAX_REQUEST_BATCH} are allowed",
        id="batch-above-limit",
    ),
    pytest.param(b"\xff\xfe", "text/plain", None, 400, "not valid UTF-8", id="bad-utf8"),
    pytest.param(b"   ", "text/plain", None, 400, "body is empty", id="empty-text"),
    pytest.param(b"a,b", "text/csv", None, 415, "'text/csv' is not supported", id="csv"),
    pytest.param(b'{"inputs": "hi"}', None, None, 415, "'(none)' is not supported", id="no-content-type"),
    pytest.param(b"hi", "text/plain; charset=latin-1", None, 415, "charset 'latin-1'", id="latin-1"),
    pytest.param(b'{"inputs": "hi"}', "application/json", "text/csv", 406, "accept 'text/csv'", id="accept-csv"),
]


@pytest.mark.parametrize(("body", "content_type", "accept", "status", "message"), BAD_REQUESTS)
def test_bad_requests_get_their_4xx_and_the_server_keeps_serving(
    server: LocalToolkitServer, body: bytes, content_type: str | None, accept: str | None, status: int, message: str
) -> None:
    got_status, _, answer = server.invoke(body, content_type=content_type, accept=accept)
    assert got_status == status, answer
    # The toolkit sends the exception message first, then the traceback of the raise.
    assert message in answer.decode().splitlines()[0]
    assert server.ping() == 200
    assert server.invoke(b'{"inputs": "still here?"}')[0] == 200


def test_stopping_one_server_leaves_no_process_behind(model_archive: Path, server: LocalToolkitServer) -> None:
    """A second server on the same host starts, serves and stops without touching the module's server."""
    with LocalToolkitServer(model_archive, workers=1) as other:
        assert other.port != server.port
        assert other.invoke(b'{"inputs": "two servers"}')[0] == 200
        group = other._process.pid  # start_new_session: the group id is the supervisor pid
    assert not _group_alive(group)
    assert server.ping() == 200
