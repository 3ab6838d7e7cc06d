"""What mutation testing of protocol.py (docs/testing.md) found no test for: header parameters and lists as clients
really send them, JSON whose brackets sit inside strings or side by side, bodies a server hands over already decoded,
the 500 answers and the log lines that name the request, and the exact sentence of every refusal (a snapshot: a
change alarm for what clients read, beside the tests above that check each refusal's status and meaning)."""

from __future__ import annotations

import logging

import pytest
from syrupy.extensions.json import JSONSnapshotExtension

from inference_assets.container import protocol
from inference_assets.container.protocol import MAX_JSON_DEPTH, ClientError, answer_batch, parse_request
from tests.inference_assets.request_table import BAD, TEST_LIMITS

JSON = {"Content-Type": "application/json"}


def _status(body: object, headers: dict[str, str]) -> int:
    try:
        parse_request(body, headers, TEST_LIMITS)
    except ClientError as error:
        return int(error.status)
    return 200


@pytest.mark.parametrize(
    ("content_type", "status"),
    [
        ('text/plain; charset="utf-8"', 200),  # a quoted parameter value (RFC 9110 allows it)
        ("text/plain; charset=UTF8", 200),
        ("text/plain;charset=utf-8;format=flowed", 200),
        ("text/plain; charset=utf-8=x", 415),  # the value is everything after the first '='
        ("text/plain; charset", 415),
    ],
)
def test_content_type_parameters_as_clients_send_them(content_type: str, status: int) -> None:
    assert _status(b"a text", {"Content-Type": content_type}) == status


@pytest.mark.parametrize(
    ("accept", "status"),
    [
        ("text/csv,application/json", 200),  # a list without spaces
        ("text/csv, application/json;q=0.001", 200),
        ("application/json;q=0, text/csv", 406),
        ("application/json;q=nan", 406),
        ("application/json;q=high", 406),
    ],
)
def test_accept_lists_and_qualities(accept: str, status: int) -> None:
    assert _status(b'{"inputs": "x"}', {**JSON, "Accept": accept}) == status


def test_a_client_value_in_a_message_keeps_printable_ascii_and_is_cut_after_60_characters() -> None:
    def shown(content_type: str) -> str:
        with pytest.raises(ClientError) as refused:
            protocol.check_content_type(content_type)
        return str(refused.value).split("content type ")[1].split(" is not")[0]

    sixty = "a/" + " ~" * 29  # the printable range's ends, exactly 60 characters
    assert shown(sixty) == repr(sixty)
    assert shown(sixty + "x") == repr(sixty + "...")
    assert shown("a/\x1f\x7fé") == repr("a/???")


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        # Brackets inside strings, escaped quotes included, are text: depth 1, refused for what they are.
        (b'{"inputs": 3, "x": "' + b"[" * 40 + b'"}', "unknown key 'x'"),
        (b'{"inputs": 3, "x": "a\\"' + b"[" * 40 + b'"}', "unknown key 'x'"),
        (b'{"inputs": 3, "x": "a\\\\"}', "unknown key 'x'"),
        # Side by side, lists are as deep as one of them.
        (b"[" + b"[], " * 40 + b"[]]", 'an object with "inputs"'),
        (
            b'{"inputs": ' + b"[" * (MAX_JSON_DEPTH - 1) + b"]" * (MAX_JSON_DEPTH - 1) + b"}",
            "must be a string, not a list",
        ),
    ],
)
def test_json_depth_counts_nesting_not_brackets(body: bytes, fragment: str) -> None:
    with pytest.raises(ClientError) as refused:
        parse_request(body, JSON, TEST_LIMITS)
    assert int(refused.value.status) == 400 and fragment in str(refused.value)
    assert "nests deeper" not in str(refused.value)


def test_bodies_a_server_decoded_already() -> None:
    assert parse_request('{"inputs": "café"}', JSON, TEST_LIMITS) == ["café"]
    assert parse_request({"inputs": ["a", "b"]}, JSON, TEST_LIMITS) == ["a", "b"]
    with pytest.raises(ClientError, match="the body is empty"):
        parse_request(None, JSON, TEST_LIMITS)
    with pytest.raises(ClientError, match="carries no body"):
        parse_request(42, JSON, TEST_LIMITS)
    # A str with a lone surrogate (a server's decode with surrogateescape): a 400, never an encoding crash.
    (answer,) = answer_batch([('{"inputs": "a\ud800"}', JSON)], _labelled, TEST_LIMITS)
    assert answer.status == 400 and "not valid UTF-8" in answer.json()["error"]  # type: ignore[index]


def _labelled(texts: list[str]) -> list[dict]:
    return [{"label": text, "score": 1.0, "scores": {text: 1.0}} for text in texts]


def test_a_parsing_bug_costs_only_its_own_request_a_500_that_names_it(monkeypatch, caplog) -> None:
    real = protocol.parse_request

    def parse(body, headers, limits):
        if body == b"boom":
            raise KeyError("bug")
        return real(body, headers, limits)

    monkeypatch.setattr(protocol, "parse_request", parse)
    requests = [(b"boom", JSON), (b'{"inputs": "after"}', JSON), (b"{", JSON)]
    with caplog.at_level(logging.INFO, logger=protocol.log.name):
        answers = answer_batch(requests, _labelled, TEST_LIMITS, ["r-1", "r-2", "r-3"])
    assert [answer.status for answer in answers] == [500, 200, 400]
    assert answers[0].json() == {
        "code": 500,
        "message": "Internal Server Error",
        "error": "the model failed to answer (request r-1); see the server log",
    }
    lines = [record.getMessage() for record in caplog.records]
    assert "request r-1: parsing failed" in lines
    assert any(line.startswith("request r-3 refused: 400 the body is not valid JSON") for line in lines)


def test_a_failed_forward_pass_is_a_500_for_each_request_that_took_part(caplog) -> None:
    def broken(texts: list[str]) -> list[dict]:
        return _labelled(texts)[:-1]  # one answer short

    with caplog.at_level(logging.INFO, logger=protocol.log.name):
        answers = answer_batch([(b"a", {"Content-Type": "text/plain"}), (b"{", JSON)], broken, TEST_LIMITS)
    assert [answer.status for answer in answers] == [500, 400]
    assert answers[0].json()["error"] == "the model failed to answer; see the server log"  # type: ignore[index]
    assert "0 predictions for 1 texts" in caplog.text


def _good(text: str) -> dict:
    return {"label": "positive", "score": 0.9, "scores": {"negative": 0.1, "positive": 0.9}, "text": text}


@pytest.mark.parametrize(
    ("bad", "reason", "logged"),
    [
        ({**_good("x"), "score": float("nan")}, "not a finite number", "score is nan, not a finite number"),
        ({**_good("x"), "scores": {"positive": float("inf")}}, "not a finite number", "scores['positive'] is inf"),
        ({**_good("x"), "score": -float("inf")}, "not a finite number", "score is -inf"),
        ({**_good("x"), "extra": [float("nan")]}, "malformed", "cannot be written as JSON"),
        ({**_good("x"), "score": "0.9"}, "malformed", "score is a string, not a number"),
        ({**_good("x"), "score": None}, "malformed", "score is null, not a number"),
        ({**_good("x"), "score": True}, "malformed", "score is a boolean, not a number"),
        ({**_good("x"), "extra": object()}, "malformed", "cannot be written as JSON"),
        ({"score": 0.9, "scores": {}}, "malformed", "label is not a string"),
        ({**_good("x"), "scores": [0.9]}, "malformed", "scores are not an object of labels"),
        (0.9, "malformed", "a prediction is a number, not an object"),
        (complex(1, 1), "malformed", "a prediction is a complex, not an object"),
    ],
)
def test_a_prediction_that_is_malformed_or_not_a_finite_number_fails_only_its_own_request(
    bad: object, reason: str, logged: str, caplog
) -> None:
    """The request whose prediction the model got wrong gets a 500 that says so; the requests answered by the same
    forward pass get theirs, and nothing raises (the server keeps serving)."""

    def predict(texts: list[str]) -> list:
        return [bad if text == "bad" else _good(text) for text in texts]

    plain = {"Content-Type": "text/plain"}
    requests = [(b"first", plain), (b'{"inputs": ["ok", "bad"]}', JSON), (b"last", plain)]
    with caplog.at_level(logging.INFO, logger=protocol.log.name):
        answers = answer_batch(requests, predict, TEST_LIMITS, ["r-1", "r-2", "r-3"])
    assert [answer.status for answer in answers] == [200, 500, 200]
    assert answers[0].json() == [_good("first")] and answers[2].json() == [_good("last")]
    assert answers[1].json() == {
        "code": 500,
        "message": "Internal Server Error",
        "error": f"the model's prediction is {reason} (request r-2); see the server log",
    }
    assert b"\n" not in answers[1].body
    (record,) = [record for record in caplog.records if record.levelno == logging.ERROR]
    assert record.getMessage().startswith("request r-2: the model's answer is not a valid prediction: a prediction")
    assert logged in record.getMessage()


@pytest.fixture
def snapshot_json(snapshot):
    return snapshot.use_extension(JSONSnapshotExtension)


def test_the_sentence_of_every_refusal(snapshot_json) -> None:
    """A change alarm for what clients read (update with --snapshot-update after an intended change)."""
    sentences = {}
    for row in BAD:
        body, content_type, accept = row.values[:3]
        headers = {k: v for k, v in (("Content-Type", content_type), ("Accept", accept)) if v is not None}
        (answer,) = answer_batch([(body, headers)], _labelled, TEST_LIMITS)
        sentences[row.id] = answer.json()
    assert sentences == snapshot_json


@pytest.mark.parametrize(
    ("body", "content_type", "error"),
    [
        (b'{"inputs": {"a": 1}}', "application/json", '"inputs" must be a string or a list of strings, not an object'),
        (b'{"inputs": 1.5}', "application/json", '"inputs" must be a string or a list of strings, not a number'),
        (b'{"inputs": ["ok", 2.5]}', "application/json", '"inputs"[1] must be a string, not a number'),
        # Only Unicode whitespace: the bytes are not blank, the text is.
        ("\u3000\u00a0".encode(), "text/plain", "the text/plain body is empty; send the text to classify"),
        (b"a", "text/plain; charset=utf-8X", "charset 'utf-8x' is not supported; send utf-8"),
    ],
)
def test_the_exact_sentence_of_refusals_outside_the_shared_table(body: bytes, content_type: str, error: str) -> None:
    with pytest.raises(ClientError) as refused:
        parse_request(body, {"Content-Type": content_type}, TEST_LIMITS)
    assert str(refused.value) == error and int(refused.value.status) in (400, 415)


def test_a_body_of_no_known_kind_is_a_400_that_says_so() -> None:
    with pytest.raises(ClientError) as refused:
        parse_request(42, JSON, TEST_LIMITS)
    assert int(refused.value.status) == 400
    assert str(refused.value) == "the request carries no body; POST the JSON or text to classify"
