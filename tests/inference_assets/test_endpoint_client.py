"""The endpoint client against botocore's Stubber: the exact API calls, the checks and the exit codes."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import boto3
import pytest
from botocore.response import StreamingBody
from botocore.stub import Stubber

from inference_assets.tools import endpoint_client

ENDPOINT = "Endpoint-a1b2c3"
GOOD = [{"label": "negative", "score": 0.8, "scores": {"negative": 0.8, "neutral": 0.15, "positive": 0.05}}]


class FakeSession:
    """Hands out real boto3 clients whose calls are answered by Stubbers."""

    def __init__(self) -> None:
        credentials = {"aws_access_key_id": "test", "aws_secret_access_key": "test", "region_name": "us-west-2"}
        self.clients = {name: boto3.client(name, **credentials) for name in ("sagemaker", "sagemaker-runtime")}
        self.stubs = {name: Stubber(client) for name, client in self.clients.items()}

    def client(self, name: str):
        return self.clients[name]


@pytest.fixture
def session() -> Iterator[FakeSession]:
    fake = FakeSession()
    for stub in fake.stubs.values():
        stub.activate()
    yield fake
    for stub in fake.stubs.values():
        stub.assert_no_pending_responses()
        stub.deactivate()


def _status(session: FakeSession, status: str, reason: str | None = None) -> None:
    response = {
        "EndpointName": ENDPOINT,
        "EndpointArn": f"arn:aws:sagemaker:us-west-2:111122223333:endpoint/{ENDPOINT.lower()}",
        "EndpointConfigName": "EndpointConfig-x",
        "EndpointStatus": status,
        "CreationTime": "2026-12-02T10:00:00Z",
        "LastModifiedTime": "2026-12-02T10:00:00Z",
    }
    if reason:
        response["FailureReason"] = reason
    session.stubs["sagemaker"].add_response("describe_endpoint", response, {"EndpointName": ENDPOINT})


def _answer(session: FakeSession, texts: list[str], answer: object) -> None:
    body = json.dumps(answer).encode()
    session.stubs["sagemaker-runtime"].add_response(
        "invoke_endpoint",
        {"Body": StreamingBody(io.BytesIO(body), len(body)), "ContentType": "application/json"},
        {
            "EndpointName": ENDPOINT,
            "ContentType": "application/json",
            "Accept": "application/json",
            "Body": json.dumps({"inputs": texts}).encode(),
        },
    )


def _smoke(session: FakeSession, *extra: str) -> int:
    return endpoint_client.main(["smoke-test", "--endpoint-name", ENDPOINT, "--poll", "0", *extra], session=session)


def test_invoke_prints_the_predictions(session: FakeSession, capsys: pytest.CaptureFixture[str]) -> None:
    answer = GOOD + GOOD
    _answer(session, ["bad news", "worse news"], answer)
    assert endpoint_client.main(["invoke", "--endpoint-name", ENDPOINT, "bad news", "worse news"], session=session) == 0
    assert json.loads(capsys.readouterr().out) == answer


def test_invoke_reports_the_model_error_line(session: FakeSession, capsys: pytest.CaptureFixture[str]) -> None:
    session.stubs["sagemaker-runtime"].add_client_error(
        "invoke_endpoint",
        service_error_code="ModelError",
        service_message="Received client error (413) from primary",
        http_status_code=424,
        modeled_fields={"OriginalStatusCode": 413, "OriginalMessage": "at most 32 are allowed\nTraceback ..."},
    )
    assert endpoint_client.main(["invoke", "--endpoint-name", ENDPOINT, "x"], session=session) == 1
    assert "the model answered 413: at most 32 are allowed" in capsys.readouterr().err


def test_smoke_test_waits_for_in_service_then_checks_one_prediction(
    session: FakeSession, capsys: pytest.CaptureFixture[str]
) -> None:
    _status(session, "Creating")
    _status(session, "Updating")
    _status(session, "InService")
    _answer(session, [endpoint_client.DEFAULT_TEXT], GOOD)
    assert (
        _smoke(
            session,
            "--region",
            "us-west-2",
            "--expect-labels",
            "negative,neutral,positive",
            "--exact-label",
            "negative",
        )
        == 0
    )
    assert "smoke test passed" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("answer", "extra", "reason"),
    [
        ([{**GOOD[0], "label": "LABEL_0"}], [], "label 'LABEL_0' is not one of negative, neutral, positive"),
        (GOOD, ["--exact-label", "positive"], "is not the expected 'positive'"),
        (GOOD, ["--expect-labels", "neg,neu,pos"], "label 'negative' is not one of neg, neu, pos"),
        ([], [], "expected a list with one prediction"),
        ({"label": "negative"}, [], "expected a list with one prediction"),
        ([{**GOOD[0], "scores": {"negative": 1.0}}], [], "scores must name exactly the labels"),
        ([{**GOOD[0], "score": 1.7}], [], "are not probabilities"),
    ],
)
def test_smoke_test_fails_on_a_wrong_answer(
    session: FakeSession, capsys: pytest.CaptureFixture[str], answer: object, extra: list[str], reason: str
) -> None:
    _status(session, "InService")
    _answer(session, [endpoint_client.DEFAULT_TEXT], answer)
    assert _smoke(session, *extra) == 1
    assert reason in capsys.readouterr().err


def test_smoke_test_fails_when_the_endpoint_failed(session: FakeSession, capsys: pytest.CaptureFixture[str]) -> None:
    _status(session, "Creating")
    _status(session, "Failed", "The primary container for production variant AllTraffic did not pass the ping")
    assert _smoke(session) == 1
    err = capsys.readouterr().err
    assert "is Failed" in err and "did not pass the ping" in err


def test_smoke_test_gives_up_after_the_timeout(session: FakeSession, capsys: pytest.CaptureFixture[str]) -> None:
    _status(session, "Creating")
    assert endpoint_client.main(
        ["smoke-test", "--endpoint-name", ENDPOINT, "--timeout", "5", "--poll", "10"], session=session
    )
    assert "still Creating after 5 s" in capsys.readouterr().err


def test_smoke_test_fails_on_a_model_error(session: FakeSession, capsys: pytest.CaptureFixture[str]) -> None:
    _status(session, "InService")
    session.stubs["sagemaker-runtime"].add_client_error(
        "invoke_endpoint",
        service_error_code="ModelError",
        service_message="Received server error (500) from primary",
        http_status_code=424,
        modeled_fields={"OriginalStatusCode": 500, "OriginalMessage": "No module named 'transformers'"},
    )
    assert _smoke(session) == 1
    assert "the model answered 500: No module named 'transformers'" in capsys.readouterr().err


def test_expected_label_must_be_in_the_label_set(session: FakeSession) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _smoke(session, "--exact-label", "angry")
    assert exit_info.value.code == 2
