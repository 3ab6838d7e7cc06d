"""Each request limit at, just under and just over its exact value (inference_assets/container/protocol.py and
contract.py): an off-by-one in a comparison (``>=`` for ``>``, a bound moved by one) fails here, where a request far
from the limit would pass either way."""

from __future__ import annotations

import json

import pytest

from inference_assets.container.contract import MAX_KEY_BYTES, Limits, validate_model_name
from inference_assets.container.protocol import MAX_INT_DIGITS, MAX_JSON_DEPTH, ClientError, parse_request
from tests.inference_assets.request_table import GOOD, TEST_LIMITS

JSON = {"Content-Type": "application/json"}
CAP = TEST_LIMITS.max_request_bytes
TEXTS = TEST_LIMITS.max_request_batch


def _body_of(size: int, texts: int = 1) -> bytes:
    """A valid JSON body of exactly ``size`` bytes holding ``texts`` texts."""
    frame = len(json.dumps({"inputs": [""] * texts}).encode())
    first = size - frame - (texts - 1)
    body = json.dumps({"inputs": ["y" * first] + ["z"] * (texts - 1)}).encode()
    assert len(body) == size
    return body


def _status(body: bytes, limits: Limits = TEST_LIMITS) -> int:
    try:
        parse_request(body, JSON, limits)
    except ClientError as error:
        return int(error.status)
    return 200


@pytest.mark.parametrize(("size", "status"), [(CAP - 1, 200), (CAP, 200), (CAP + 1, 413)])
def test_the_byte_cap_admits_a_body_of_exactly_the_cap(size: int, status: int) -> None:
    assert _status(_body_of(size)) == status


def test_the_byte_cap_is_counted_in_bytes_not_characters() -> None:
    # "é" is two bytes in UTF-8: this body is CAP bytes but far fewer characters; one more byte is over the cap.
    frame = len(json.dumps({"inputs": ""}).encode())
    text = "é" * ((CAP - frame) // 2) + "y" * ((CAP - frame) % 2)
    at_cap = json.dumps({"inputs": text}, ensure_ascii=False).encode()
    over = json.dumps({"inputs": text + "y"}, ensure_ascii=False).encode()
    assert (len(at_cap), len(over)) == (CAP, CAP + 1) and len(over.decode()) < CAP
    assert (_status(at_cap), _status(over)) == (200, 413)


@pytest.mark.parametrize(("texts", "status"), [(TEXTS - 1, 200), (TEXTS, 200), (TEXTS + 1, 413)])
def test_the_text_count_admits_exactly_max_request_batch(texts: int, status: int) -> None:
    assert _status(json.dumps({"inputs": ["t"] * texts}).encode()) == status


def test_the_at_every_limit_request_of_the_shared_table_is_exactly_at_both_caps() -> None:
    (row,) = [param for param in GOOD if param.id == "at-every-limit"]
    body = row.values[0]
    assert len(body) == CAP and len(json.loads(body)["inputs"]) == TEXTS
    assert _status(body) == 200


def test_a_body_at_every_limit_at_once_is_served_and_one_byte_more_is_not() -> None:
    assert _status(_body_of(CAP, TEXTS)) == 200
    assert _status(_body_of(CAP + 1, TEXTS)) == 413


def _nested(depth: int) -> bytes:
    # {"inputs": [[...]]}: the object is level 1, so depth - 1 lists.
    return b'{"inputs": ' + b"[" * (depth - 1) + b'"x"' + b"]" * (depth - 1) + b"}"


@pytest.mark.parametrize(("depth", "refused_for"), [(MAX_JSON_DEPTH - 1, "must be a string"),
                                                     (MAX_JSON_DEPTH, "must be a string"),
                                                     (MAX_JSON_DEPTH + 1, "nests deeper than")])  # fmt: skip
def test_json_nesting_is_parsed_up_to_the_depth_limit(depth: int, refused_for: str) -> None:
    with pytest.raises(ClientError, match=refused_for):
        parse_request(_nested(depth), JSON, TEST_LIMITS)


@pytest.mark.parametrize(("digits", "refused_for"), [(MAX_INT_DIGITS - 1, "must be a string"),
                                                     (MAX_INT_DIGITS, "must be a string"),
                                                     (MAX_INT_DIGITS + 1, "more than 20 digits")])  # fmt: skip
@pytest.mark.parametrize("sign", ["", "-"])
def test_integers_are_parsed_up_to_the_digit_limit(digits: int, refused_for: str, sign: str) -> None:
    body = b'{"inputs": ' + sign.encode() + b"9" * digits + b"}"
    with pytest.raises(ClientError, match=refused_for):
        parse_request(body, JSON, TEST_LIMITS)


@pytest.mark.parametrize(
    ("field", "low", "high"),
    [(name, *bounds) for name, bounds in Limits.BOUNDS.items()],
)
def test_each_limit_setting_is_accepted_at_its_bounds_and_refused_past_them(field: str, low: int, high: int) -> None:
    for value in (low, low + 1, high - 1, high):
        assert getattr(Limits(**{field: value}), field) == value
    for value in (low - 1, high + 1):
        with pytest.raises(ValueError, match=f"{field} must be an integer from {low} to {high}, got {value}"):
            Limits(**{field: value})
    with pytest.raises(ValueError, match="must be an integer"):
        Limits(**{field: True})  # a bool is an int to Python, not to the settings


@pytest.mark.parametrize("prefix", ["", "models/"])
def test_a_model_key_of_exactly_the_s3_key_limit_is_valid_and_one_byte_more_is_not(prefix: str) -> None:
    def name(length: int) -> str:
        return "m" * (length - len(prefix) - len(".tar.gz")) + ".tar.gz"

    assert validate_model_name(name(MAX_KEY_BYTES - 1), prefix)
    assert validate_model_name(name(MAX_KEY_BYTES), prefix)
    with pytest.raises(ValueError, match=f"longer than {MAX_KEY_BYTES} bytes"):
        validate_model_name(name(MAX_KEY_BYTES + 1), prefix)


def test_an_empty_limit_variable_keeps_the_default_and_a_name_that_is_no_string_is_refused() -> None:
    assert Limits.from_environment({"SENTIMENT_MAX_REQUEST_BATCH": "", "SENTIMENT_MAX_REQUEST_BYTES": ""}) == Limits()
    for name in (123, None, ["a.tar.gz"]):
        with pytest.raises(ValueError, match="is not valid: use letters, digits"):
            validate_model_name(name)  # type: ignore[arg-type]


@pytest.mark.parametrize(("field", "low", "high"), [(name, *bounds) for name, bounds in Limits.BOUNDS.items()])
def test_a_limit_variable_past_its_bounds_is_refused_not_taken_for_unset(field: str, low: int, high: int) -> None:
    """A container given 0 (or one past the top) for a limit stops with the rule, rather than serving the default."""
    variable = Limits.ENVIRONMENT[field]
    assert getattr(Limits.from_environment({variable: str(low)}), field) == low
    for value in (low - 1, high + 1):
        with pytest.raises(ValueError, match=f"{field} must be an integer from {low} to {high}, got {value}"):
            Limits.from_environment({variable: str(value)})
        if field in Limits.PROPERTIES:
            with pytest.raises(ValueError, match=f"{field} must be an integer from {low}"):
                Limits.from_properties({Limits.PROPERTIES[field]: str(value)})
