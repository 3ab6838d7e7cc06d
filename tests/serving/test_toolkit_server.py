"""The archive served by the real SageMaker PyTorch toolkit + TorchServe on localhost, as in the container.

One server for the module (start-up costs ~15-25 s), with TorchServe batching on: predictions must equal the
in-process predictor's; TorchServe must call the archive's own handler (MAR-INF/MANIFEST.json), which answers a
batch of concurrent requests with one forward pass and a status and Content-Type per request; every request of the
shared table (tests/serving/request_table.py) must get its status with a one-line JSON body and no traceback or
path, and the server must keep answering afterwards.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from inference_assets.container.predictor import SentimentPredictor
from inference_assets.local.local_server import LocalToolkitServer
from inference_assets.local.server_process import group_alive

from .request_table import REQUESTS, TEST_LIMITS

MAX_REQUEST_BATCH = TEST_LIMITS.max_request_batch
BATCH_SIZE = 4
LEAKS = ("Traceback", 'File "', "/opt/", "/tmp/", "/work/", "site-packages", ".py")
pytestmark = pytest.mark.slow

SAMPLE_DATA = Path(__file__).resolve().parents[2] / "training_assets" / "sample_data" / "validation.jsonl"


@pytest.fixture(scope="module")
def server(model_archive: Path) -> Iterator[LocalToolkitServer]:
    local = LocalToolkitServer(
        model_archive,
        workers=1,
        batch_size=BATCH_SIZE,
        max_batch_delay_ms=300,  # long, so that concurrent test requests reliably share a batch
        limits=TEST_LIMITS,
    )
    local.start()
    group = local.process_group
    try:
        yield local
    finally:
        local.stop()
    assert not group_alive(group), "TorchServe, java or a worker outlived stop()"


@pytest.fixture(scope="module")
def predictor(tiny_model_dir: Path) -> SentimentPredictor:
    return SentimentPredictor(tiny_model_dir)


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


def _model_log(server: LocalToolkitServer) -> str:
    return "\n".join(path.read_text(errors="replace") for path in (server.workdir / "logs").glob("model_log*.log"))


def test_torchserve_runs_the_handler_the_manifest_names(server: LocalToolkitServer) -> None:
    assert server.invoke(b'{"inputs": "which handler?"}')[0] == 200
    manifest = server.workdir / "opt_ml" / "model" / "MAR-INF" / "MANIFEST.json"
    assert json.loads(manifest.read_text())["model"]["handler"] == "code/inference.py:handle"
    assert "batch of 1 requests answered with one forward pass" in _model_log(server)


@pytest.mark.parametrize(("body", "content_type", "accept", "status", "fragment"), REQUESTS)
def test_every_request_gets_its_status_and_one_line_of_json(
    server: LocalToolkitServer, body: bytes, content_type: str | None, accept: str | None, status: int, fragment: str
) -> None:
    got_status, headers, answer = server.invoke(body, content_type=content_type, accept=accept)
    assert got_status == status, answer
    assert headers["content-type"] == "application/json"
    assert answer.count(b"\n") == 0 and not [leak for leak in LEAKS if leak in answer.decode()]
    if status != 200:
        assert json.loads(answer) == {"code": status, "message": json.loads(answer)["message"], "error": ANY_TEXT}
        assert fragment in json.loads(answer)["error"]
    assert server.invoke(b'{"inputs": "still here?"}')[0] == 200


class _AnyText:
    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and bool(other)


ANY_TEXT = _AnyText()


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH"])
def test_other_methods_on_invocations_get_a_4xx_json_answer(server: LocalToolkitServer, method: str) -> None:
    """TorchServe hands any method on /invocations to the model; the handler sees no body and answers 4xx."""
    for headers in ({}, {"Content-Type": "application/json"}):
        status, answer_headers, answer = server.request(method, "/invocations", headers=headers)
        assert 400 <= status < 500, (method, status, answer)
        assert answer_headers["content-type"] == "application/json" and b"\n" not in answer
    assert server.ping() == 200


def test_a_body_over_sagemakers_payload_cap_is_a_4xx_and_the_server_keeps_serving(server: LocalToolkitServer) -> None:
    """Bodies over the handler's cap get its 413 (the request table); beyond SageMaker's 6 MB cap TorchServe's own
    max_request_size (6,553,500 bytes by default; the toolkit leaves it) refuses them before any Python runs."""
    try:
        status, _, answer = server.invoke(json.dumps({"inputs": "x" * 7_000_000}).encode())
    except ConnectionError:  # Netty may close the connection after its 413 while the client still sends
        status, answer = 413, b""
    assert 400 <= status < 500, answer[:200]
    assert server.invoke(b'{"inputs": "still here?"}')[0] == 200


def test_a_multipart_form_is_refused_with_415(server: LocalToolkitServer) -> None:
    body = b'--xx\r\nContent-Disposition: form-data; name="inputs"\r\n\r\nhello\r\n--xx--\r\n'
    status, _, answer = server.invoke(body, content_type="multipart/form-data; boundary=xx")
    assert status == 415, answer


def test_concurrent_requests_share_one_forward_pass_and_keep_their_own_answers(
    server: LocalToolkitServer, predictor: SentimentPredictor, texts: list[str]
) -> None:
    requests = [
        (json.dumps({"inputs": texts[:2]}).encode(), "application/json", 200),
        (b"{broken", "application/json", 400),
        (texts[2].encode(), "text/plain", 200),
        (b"a,b", "text/csv", 415),
    ]
    before = _model_log(server).count("answered with one forward pass")
    with ThreadPoolExecutor(len(requests)) as pool:
        answers = list(pool.map(lambda r: server.invoke(r[0], content_type=r[1]), requests))
    for (_, _, expected_status), (status, headers, body) in zip(requests, answers, strict=True):
        assert status == expected_status, body
        assert headers["content-type"] == "application/json"
    _assert_same_predictions(json.loads(answers[0][2]), _expected(predictor, texts[:2]))
    _assert_same_predictions(json.loads(answers[2][2]), _expected(predictor, [texts[2]]))
    time.sleep(0.5)  # the worker's log reaches the file asynchronously
    batches = re.findall(r"batch of (\d+) requests answered", _model_log(server))[before:]
    assert max(int(size) for size in batches) > 1, batches  # TorchServe batched them; one forward pass per batch


def test_stopping_one_server_leaves_no_process_behind(model_archive: Path, server: LocalToolkitServer) -> None:
    """A second server on the same host starts, serves and stops without touching the module's server."""
    with LocalToolkitServer(model_archive, workers=1) as other:
        assert other.port != server.port
        assert other.invoke(b'{"inputs": "two servers"}')[0] == 200
        group = other.process_group  # start_new_session: the group id is the supervisor pid
    assert not group_alive(group)
    assert server.ping() == 200
