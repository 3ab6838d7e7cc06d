"""The request protocol on its own (no model): the shared request table, limits, Accept, batches of answers."""

from __future__ import annotations

import json

import pytest

from inference_assets.container import protocol
from inference_assets.container.protocol import ClientError, Limits, answer_batch, parse_request
from tests.inference_assets.request_table import BAD, GOOD, LEAKS, REQUESTS, TEST_LIMITS, headers


@pytest.mark.parametrize(("body", "content_type", "accept", "status", "fragment"), GOOD)
def test_good_requests_parse_to_texts(body, content_type, accept, status, fragment):
    texts = parse_request(body, headers(content_type, accept), TEST_LIMITS)
    assert texts and all(isinstance(text, str) and text.strip() for text in texts)


@pytest.mark.parametrize(("body", "content_type", "accept", "status", "fragment"), BAD)
def test_bad_requests_raise_their_status_and_reason(body, content_type, accept, status, fragment):
    with pytest.raises(ClientError) as raised:
        parse_request(body, headers(content_type, accept), TEST_LIMITS)
    assert int(raised.value.status) == status
    assert fragment in str(raised.value)


@pytest.mark.parametrize(("body", "content_type", "accept", "status", "fragment"), REQUESTS)
def test_every_answer_is_one_line_of_json_without_internals(body, content_type, accept, status, fragment):
    (answer,) = answer_batch([(body, headers(content_type, accept))], _echo, TEST_LIMITS)
    assert (answer.status, answer.content_type) == (status, "application/json")
    assert b"\n" not in answer.body
    if status != 200:
        assert answer.json() == {"code": status, "message": answer.json()["message"], "error": answer.json()["error"]}
        assert not [leak for leak in LEAKS if leak in answer.body.decode()]


def _echo(texts: list[str]) -> list[dict]:
    return [{"label": "positive", "score": 1.0, "scores": {"positive": 1.0}, "chars": len(text)} for text in texts]


def test_a_batch_is_one_predict_call_and_each_request_gets_its_own_answer():
    calls = []

    def predict(texts: list[str]) -> list[dict]:
        calls.append(list(texts))
        return _echo(texts)

    requests = [
        (b'{"inputs": ["a", "bb"]}', {"Content-Type": "application/json"}),
        (b"{", {"Content-Type": "application/json"}),
        (b"ccc", {"content-type": "text/plain"}),  # header names are case-insensitive
        (b'{"inputs": "x"}', {"Content-Type": "application/json", "Accept": "text/csv"}),
        (b'{"inputs": "dddd"}', {"Content-Type": "application/json"}),
    ]
    answers = answer_batch(requests, predict, TEST_LIMITS)
    assert calls == [["a", "bb", "ccc", "dddd"]]  # one forward pass over every valid request's texts
    assert [answer.status for answer in answers] == [200, 400, 200, 406, 200]
    assert [[p["chars"] for p in answers[i].json()] for i in (0, 2, 4)] == [[1, 2], [3], [4]]


def test_a_failing_forward_pass_is_a_500_without_detail_for_the_requests_that_took_part(caplog):
    def broken(texts: list[str]) -> list[dict]:
        raise RuntimeError("secret detail at /opt/ml/model/code/x.py")

    answers = answer_batch(
        [(b"ok", {"Content-Type": "text/plain"}), (b"", {"Content-Type": "text/plain"})],
        broken,
        TEST_LIMITS,
        ["r1", "r2"],
    )
    assert [answer.status for answer in answers] == [500, 400]
    assert "secret" not in answers[0].body.decode() and "request r1" in answers[0].json()["error"]
    assert "secret detail" in caplog.text  # the detail goes to the server log


def test_a_predictor_returning_the_wrong_count_is_a_500():
    answers = answer_batch([(b"ok", {"Content-Type": "text/plain"})], lambda texts: [], TEST_LIMITS)
    assert answers[0].status == 500


@pytest.mark.parametrize(
    ("accept", "acceptable"),
    [
        (None, True),
        ("", True),
        ("application/json", True),
        ("APPLICATION/JSON; charset=utf-8", True),
        ("text/plain, */*;q=0.1", True),
        ("application/json;q=0", False),
        ("application/json;q=abc", False),
        ("application/json;q=nan", False),
        ("text/html", False),
        ("\x00garbage", False),
    ],
)
def test_accept_negotiation(accept, acceptable):
    if acceptable:
        protocol.check_accept(accept)
    else:
        with pytest.raises(ClientError):
            protocol.check_accept(accept)


def test_client_values_in_messages_are_printable_and_short():
    with pytest.raises(ClientError) as raised:
        protocol.check_content_type("application/\x1b[31m" + "x" * 500)
    message = str(raised.value)
    assert "\x1b" not in message and len(message) < 200


def test_limits_come_from_the_environment_and_bad_values_are_refused():
    limits = Limits.from_environment({"SENTIMENT_MAX_REQUEST_BATCH": "8", "SENTIMENT_MAX_REQUEST_BYTES": "2048"})
    assert limits == Limits(max_request_batch=8, max_request_bytes=2048)
    assert Limits.from_environment({}) == Limits()
    with pytest.raises(ValueError, match="SENTIMENT_MAX_REQUEST_BYTES must be an integer, got 'lots'"):
        Limits.from_environment({"SENTIMENT_MAX_REQUEST_BYTES": "lots"})
    with pytest.raises(ValueError, match="max_request_batch must be an integer from 1 to 1024, got 0"):
        Limits(max_request_batch=0)
    # InvokeEndpoint's Body is at most 6,291,456 bytes (SageMaker Runtime API reference): no cap may exceed it.
    with pytest.raises(ValueError, match="max_request_bytes must be an integer from 1024 to 6291456"):
        Limits(max_request_bytes=6_291_457)


def test_a_text_of_any_length_is_accepted_for_the_predictor_to_cut():
    """The Hugging Face inference toolkit truncates to the model's window; the protocol refuses no long text."""
    body = json.dumps({"inputs": ["x" * 100_000, "short"]}).encode()
    texts = protocol.parse_request(body, {"Content-Type": "application/json"}, Limits())
    assert [len(text) for text in texts] == [100_000, 5]


def test_a_body_the_server_already_decoded_is_read_the_same():
    headers = {"Content-Type": "application/json"}
    assert parse_request({"inputs": ["a"]}, headers, TEST_LIMITS) == ["a"]
    assert parse_request('{"inputs": "b"}', headers, TEST_LIMITS) == ["b"]
    with pytest.raises(ClientError):
        parse_request(12, headers, TEST_LIMITS)


def test_json_error_bodies_are_valid_json_for_any_client_input():
    nasty = b'{"inputs": "\\ud800"}'
    (answer,) = answer_batch([(nasty, {"Content-Type": "application/json"})], _echo, TEST_LIMITS)
    assert json.loads(answer.body)["code"] == 400
