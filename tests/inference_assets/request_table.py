"""One table of requests for every path that serves the model: the protocol itself, the TorchServe handler
(in-process and behind the real toolkit + TorchServe), and the DJL adapter. Same request, same status, everywhere.

Each row: id, body, Content-Type (None = no header), Accept (None = no header), status, a fragment of the error.
The limits are small so that every limit is reachable with small bodies (archives and servers get ``TEST_LIMITS``).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from inference_assets.container.contract import Limits

TEST_LIMITS = Limits(max_request_batch=4, max_request_bytes=16_384)
JSON = "application/json"
# What an error answer must never show a caller: a stack trace or the server's paths.
LEAKS = ("Traceback", 'File "', "/opt/", "/tmp/", "/work/", "site-packages", ".py")


def _row(id_: str, body: bytes, content_type: str | None, accept: str | None, status: int, fragment: str = ""):
    return pytest.param(body, content_type, accept, status, fragment, id=id_)


GOOD = [
    _row("list", b'{"inputs": ["great day", "awful service"]}', JSON, None, 200),
    _row("one-text", b'{"inputs": "just one text"}', JSON, None, 200),
    _row("unicode-charset", '{"inputs": "café ☕ 😀"}'.encode(), "application/json; charset=UTF-8", None, 200),
    _row("escaped-unicode", b'{"inputs": "caf\\u00e9 \\ud83d\\ude00"}', JSON, None, 200),  # a valid surrogate pair
    _row("plain-text", b"a plain text request", "text/plain", None, 200),
    _row("plain-text-utf8", "naïve text".encode(), "text/plain; charset=utf-8", None, 200),
    _row("accept-any", b'{"inputs": "x"}', JSON, "*/*", 200),
    _row("accept-app-wildcard", b'{"inputs": "x"}', JSON, "application/*", 200),
    _row("accept-list", b'{"inputs": "x"}', JSON, "text/html, application/json;q=0.1", 200),
    # Exactly 16,384 bytes (4 x 4,089 + 28 of JSON) and 4 texts: both caps of TEST_LIMITS (test_exact_limits.py).
    _row("at-every-limit", json.dumps({"inputs": ["y" * 4089] * 4}).encode(), JSON, None, 200),
    # Longer than the model's window: cut to it, as the Hugging Face toolkit's truncation does, not refused.
    _row("long-text", json.dumps({"inputs": "a long review. " * 1000}).encode(), JSON, None, 200),
    _row("long-plain-text", b"z" * 16_000, "text/plain", None, 200),
]

BAD = [
    _row("malformed-json", b"{not json", JSON, None, 400, "not valid JSON"),
    _row("truncated-json", b'{"inputs": ', JSON, None, 400, "not valid JSON"),
    _row("missing-inputs", b'{"text": "hi"}', JSON, None, 400, 'object with "inputs"'),
    _row("not-an-object", b'["hi"]', JSON, None, 400, 'object with "inputs"'),
    _row("json-null", b"null", JSON, None, 400, 'object with "inputs"'),
    _row("unknown-key", b'{"inputs": "hi", "parameters": {}}', JSON, None, 400, "unknown key 'parameters'"),
    _row("duplicate-key", b'{"inputs": "a", "inputs": "b"}', JSON, None, 400, "names a key twice"),
    _row("non-str-item", b'{"inputs": ["ok", 3]}', JSON, None, 400, '"inputs"[1] must be a string'),
    _row("nested-list", b'{"inputs": [["x"]]}', JSON, None, 400, '"inputs"[0] must be a string, not a list'),
    _row("number", b'{"inputs": 3}', JSON, None, 400, "a string or a list of strings"),
    _row("boolean", b'{"inputs": true}', JSON, None, 400, "not a boolean"),
    _row("null-inputs", b'{"inputs": null}', JSON, None, 400, "not null"),
    _row("empty-list", b'{"inputs": []}', JSON, None, 400, "must not be an empty list"),
    _row("empty-string", b'{"inputs": ""}', JSON, None, 400, "is empty"),
    _row("blank-item", b'{"inputs": ["ok", "  "]}', JSON, None, 400, '"inputs"[1] is empty'),
    _row("too-many-texts", json.dumps({"inputs": ["t"] * 5}).encode(), JSON, None, 413, "at most 4 are allowed"),
    _row("body-too-large", b" " * 16_385, JSON, None, 413, "at most 16384 are allowed"),
    # Pathological JSON
    _row("deep-nesting", b"[" * 5000 + b"]" * 5000, JSON, None, 400, "nests deeper than"),
    _row("deep-nesting-unclosed", b'{"inputs": ' + b"[" * 8000, JSON, None, 400, "nests deeper than"),
    _row("5000-digit-int", b'{"inputs": ' + b"9" * 5000 + b"}", JSON, None, 400, "more than 20 digits"),
    _row("nan", b'{"inputs": NaN}', JSON, None, 400, "NaN is not a JSON number"),
    _row("infinity", b'{"inputs": [-Infinity]}', JSON, None, 400, "-Infinity is not a JSON number"),
    _row("lone-surrogate-escape", b'{"inputs": "a\\ud800b"}', JSON, None, 400, "lone surrogate"),
    # Encodings, under every content type the model takes
    _row("invalid-utf8-json", b'{"inputs": "\xff"}', JSON, None, 400, "not valid UTF-8"),
    _row("invalid-utf8-text", b"\xc3\x28", "text/plain", None, 400, "not valid UTF-8"),
    _row("surrogate-bytes-json", b'{"inputs": "\xed\xa0\x80"}', JSON, None, 400, "not valid UTF-8"),
    _row("overlong-utf8", b'{"inputs": "\xc0\xaf"}', JSON, None, 400, "not valid UTF-8"),
    _row("utf8-bom-json", b'\xef\xbb\xbf{"inputs": "x"}', JSON, None, 400, "byte-order mark"),
    _row("utf8-bom-text", b"\xef\xbb\xbfhello", "text/plain", None, 400, "byte-order mark"),
    _row("utf16-bom-json", '{"inputs": "x"}'.encode("utf-16"), JSON, None, 400, "byte-order mark"),
    _row(
        "utf16-no-bom-json", '{"inputs": "x"}'.encode("utf-16-le"), JSON, None, 400, "not valid JSON"
    ),  # NULs are UTF-8
    _row("utf16-charset", '{"inputs": "x"}'.encode("utf-16"), "application/json; charset=utf-16", None, 415, "charset"),
    _row("latin-1-charset", b"caf\xe9", "text/plain; charset=latin-1", None, 415, "charset 'latin-1'"),
    # Empty bodies, wrong types
    _row("empty-json", b"", JSON, None, 400, "body is empty"),
    _row("blank-json", b" \n ", JSON, None, 400, "body is empty"),
    _row("blank-text", b"   ", "text/plain", None, 400, "body is empty"),
    _row("no-content-type", b'{"inputs": "hi"}', None, None, 415, "no Content-Type"),
    _row("csv", b"a,b", "text/csv", None, 415, "'text/csv' is not supported"),
    _row("octet-stream", b"\x00\xff\xfe", "application/octet-stream", None, 415, "is not supported"),
    _row("form", b"inputs=hi", "application/x-www-form-urlencoded", None, 415, "is not supported"),
    _row("accept-csv", b'{"inputs": "hi"}', JSON, "text/csv", 406, "accept 'text/csv'"),
    _row("accept-q0", b'{"inputs": "hi"}', JSON, "application/json;q=0", 406, "is not supported"),
]

REQUESTS = GOOD + BAD


def headers(content_type: str | None, accept: str | None, *, lower_case: bool = False) -> dict[str, str]:
    """The row's headers as a server hands them to the code (Starlette lower-cases names; TorchServe does not)."""
    names = ("content-type", "accept") if lower_case else ("Content-Type", "Accept")
    return {k: v for k, v in zip(names, (content_type, accept), strict=True) if v is not None}


def check_answer(answer: Any, status: int, fragment: str) -> None:
    """One JSON line with the row's status: predictions for a 200, else the error with its fragment and no leak."""
    assert (answer.status, answer.content_type) == (status, JSON), answer
    assert b"\n" not in answer.body
    body = answer.json()
    if status == 200:
        assert isinstance(body, list) and body
        assert all(set(p) == {"label", "score", "scores"} for p in body)
    else:
        assert body["code"] == status and fragment in body["error"]
        assert not [leak for leak in LEAKS if leak in answer.body.decode()]
