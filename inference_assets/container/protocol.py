"""The one request protocol of the sentiment model, for every model server (Ray Serve deployment, DJL adapter).

Model servers only move bytes and headers in and out; everything about a request is decided here:

    request   POST, Content-Type application/json (``{"inputs": "text"}`` or ``{"inputs": ["a", "b"]}``) or
              text/plain (one text); UTF-8 only (charset utf-8 or none), no byte-order mark
    answer    200 application/json: one ``{"label", "score", "scores"}`` object per text, in order
    errors    application/json ``{"code": 400, "message": "Bad Request", "error": "<one sentence>"}`` on one line:
              400 malformed body (encoding, BOM, JSON syntax, nesting, huge numbers, NaN, lone surrogates, wrong
                  keys or types, empty texts), 406 an Accept that excludes application/json,
              413 more bytes or texts than the limits (contract.py), 415 any other content type or charset,
              500 anything unexpected, e.g. a failed forward pass, or a prediction that is malformed or not a
                  finite number (for that request alone; the detail goes to the server log, never to the client)

Limits (``contract.Limits``) come from the container environment (the endpoint stack sets them from validated
settings) or from DJL's serving.properties (``option.*``). A text of any length is accepted: the predictor cuts it
to the model's window, so only the byte cap bounds what one text may cost before the tokenizer.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus

from .contract import Limits

log = logging.getLogger(__name__)

JSON = "application/json"
TEXT = "text/plain"
_JSON_RANGES = {JSON, "application/*", "*/*"}
_UTF8 = {"utf-8", "utf8"}
_BOMS = (b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff")
MAX_JSON_DEPTH = 16  # a valid body nests 2 deep; deeper documents are refused before they cost anything
MAX_INT_DIGITS = 20  # no integer belongs in a valid body; a 5,000-digit one must not reach int()


class ClientError(Exception):
    """A request the model cannot serve as sent; ``status`` is its 4xx, the message one sentence for the client."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Answer:
    """One HTTP answer: status, content type and body bytes (always JSON)."""

    status: int
    body: bytes
    content_type: str = JSON

    def json(self) -> object:
        return json.loads(self.body)


def _header(headers: Mapping[str, object], name: str) -> str | None:
    """A header by case-insensitive name; non-string entries (TorchServe mixes parameter metadata in) are skipped."""
    wanted = name.lower()
    for key, value in headers.items():
        if isinstance(key, str) and key.lower() == wanted and isinstance(value, str):
            return value
    return None


def _media_type(content_type: str) -> tuple[str, list[tuple[str, str]]]:
    """``'application/json; charset=utf-8'`` -> ``('application/json', [('charset', 'utf-8')])``."""
    media_type, *params = content_type.split(";")
    parsed = []
    for param in params:
        name, _, value = param.partition("=")
        parsed.append((name.strip().lower(), value.strip().strip('"').lower()))
    return media_type.strip().lower(), parsed


def check_content_type(content_type: str | None) -> str:
    """The media type (application/json or text/plain) of a supported Content-Type; else 415."""
    if not content_type:
        raise ClientError(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, f"no Content-Type; send {JSON} or {TEXT}")
    media_type, params = _media_type(content_type)
    if media_type not in (JSON, TEXT):
        raise ClientError(
            HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
            f"content type {_shown(media_type)} is not supported; send {JSON} or {TEXT}",
        )
    for name, value in params:
        if name == "charset" and value not in _UTF8:
            raise ClientError(
                HTTPStatus.UNSUPPORTED_MEDIA_TYPE, f"charset {_shown(value)} is not supported; send utf-8"
            )
    return media_type


def check_accept(accept: str | None) -> None:
    """406 unless the Accept header (absent = anything) allows application/json with a quality above 0."""
    if accept is None or not accept.strip():
        return
    for item in accept.split(","):
        media_type, params = _media_type(item)
        quality = 1.0
        for name, value in params:
            if name == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        if media_type in _JSON_RANGES and quality > 0 and math.isfinite(quality):
            return
    raise ClientError(HTTPStatus.NOT_ACCEPTABLE, f"accept {_shown(accept)} is not supported; this model answers {JSON}")


def _shown(value: str, limit: int = 60) -> str:
    """A client-supplied value for an error message: quoted, printable ASCII only, cut short."""
    text = "".join(c if " " <= c <= "~" else "?" for c in value[:limit])
    return repr(text + ("..." if len(value) > limit else ""))


def _decode(body: bytes) -> str:
    if body.startswith(_BOMS):
        raise ClientError(HTTPStatus.BAD_REQUEST, "the body starts with a byte-order mark; send UTF-8 without one")
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ClientError(
            HTTPStatus.BAD_REQUEST, f"the body is not valid UTF-8 ({error.reason} at byte {error.start})"
        ) from None


def _json_depth(text: str) -> int:
    """The deepest nesting of [ and { outside strings (linear, no recursion)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _no_constant(name: str) -> float:
    raise ClientError(HTTPStatus.BAD_REQUEST, f"the body is not valid JSON: {name} is not a JSON number")


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise ClientError(HTTPStatus.BAD_REQUEST, f"the body holds a number with more than {MAX_INT_DIGITS} digits")
    return int(digits)


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ClientError(HTTPStatus.BAD_REQUEST, "the JSON body names a key twice")
    return dict(pairs)


def _parse_json(text: str) -> object:
    if _json_depth(text) > MAX_JSON_DEPTH:
        raise ClientError(HTTPStatus.BAD_REQUEST, f"the JSON body nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        return json.loads(text, parse_constant=_no_constant, parse_int=_bounded_int, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as error:
        raise ClientError(
            HTTPStatus.BAD_REQUEST,
            f"the body is not valid JSON ({error.msg} at line {error.lineno} column {error.colno})",
        ) from None
    except RecursionError:  # cannot happen below MAX_JSON_DEPTH; kept so no input can turn into a 500
        raise ClientError(HTTPStatus.BAD_REQUEST, "the JSON body nests too deeply") from None


def _check_text(text: str, where: str) -> str:
    if not text.strip():
        raise ClientError(HTTPStatus.BAD_REQUEST, f"{where} is empty; send the text to classify")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ClientError(HTTPStatus.BAD_REQUEST, f"{where} holds a lone surrogate (invalid Unicode)") from None
    return text


def texts_of(payload: object, limits: Limits) -> list[str]:
    """The texts of a parsed JSON body, or 400/413 saying what is wrong."""
    if not isinstance(payload, dict) or "inputs" not in payload:
        raise ClientError(
            HTTPStatus.BAD_REQUEST, 'the JSON body must be an object with "inputs": a string or a list of strings'
        )
    if extra := sorted(set(payload) - {"inputs"}):
        raise ClientError(HTTPStatus.BAD_REQUEST, f'unknown key {_shown(extra[0])}; the body holds only "inputs"')
    inputs = payload["inputs"]
    if isinstance(inputs, str):
        return [_check_text(inputs, '"inputs"')]
    if not isinstance(inputs, list):
        raise ClientError(
            HTTPStatus.BAD_REQUEST, f'"inputs" must be a string or a list of strings, not {_json_type(inputs)}'
        )
    if not inputs:
        raise ClientError(HTTPStatus.BAD_REQUEST, '"inputs" must not be an empty list')
    if len(inputs) > limits.max_request_batch:
        raise ClientError(
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
            f'"inputs" holds {len(inputs)} texts; at most {limits.max_request_batch} are allowed per request',
        )
    texts = []
    for index, text in enumerate(inputs):
        if not isinstance(text, str):
            raise ClientError(HTTPStatus.BAD_REQUEST, f'"inputs"[{index}] must be a string, not {_json_type(text)}')
        texts.append(_check_text(text, f'"inputs"[{index}]'))
    return texts


def _json_type(value: object) -> str:
    return {
        dict: "an object",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
    }.get(type(value), "null")


def _kind(value: object) -> str:
    """What a value of the model's answer is, for the server log: its JSON type, or its Python type."""
    if value is None or type(value) in (dict, list, str, bool, int, float):
        return _json_type(value)
    return f"a {type(value).__name__}"


def parse_request(body: object, headers: Mapping[str, object], limits: Limits) -> list[str]:
    """The texts of one request (body bytes + headers), or :class:`ClientError` with its status and reason.

    Checked in this order, cheapest first: size (413), Content-Type (415), Accept (406), empty body, encoding and
    syntax (400),
    then the document (400 / 413).
    """
    if body is None:
        body = b""
    if isinstance(body, (dict, list)):  # a server that decoded JSON itself (TorchServe decode_input_request=true)
        body = json.dumps(body).encode()
    if isinstance(body, str):  # a server that decoded the body already (or a query parameter named "body")
        body = body.encode("utf-8", errors="surrogatepass")
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise ClientError(HTTPStatus.BAD_REQUEST, "the request carries no body; POST the JSON or text to classify")
    body = bytes(body)
    if len(body) > limits.max_request_bytes:
        raise ClientError(
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
            f"the body holds {len(body)} bytes; at most {limits.max_request_bytes} are allowed",
        )
    media_type = check_content_type(_header(headers, "Content-Type"))
    check_accept(_header(headers, "Accept"))
    if not body.strip():  # also what a GET or DELETE on /invocations delivers: the servers pass any method on
        raise ClientError(HTTPStatus.BAD_REQUEST, "the body is empty; POST the JSON or text to classify")
    text = _decode(body)
    if media_type == TEXT:
        return [_check_text(text, "the text/plain body")]
    return texts_of(_parse_json(text), limits)


def admit_request(
    body: object,
    headers: Mapping[str, object],
    limits: Limits,
    encode: Callable[[list[str]], list[list[int]]],
) -> tuple[list[str], list[list[int]]]:
    """The texts of one request and their token ids (``encode``), or :class:`ClientError`: ``parse_request``'s checks,
    then 413 when the texts hold more than ``limits.max_request_tokens`` tokens, naming that limit."""
    texts = parse_request(body, headers, limits)
    encodings = encode(texts)
    try:
        limits.check_tokens(sum(len(ids) for ids in encodings))
    except ValueError as error:
        raise ClientError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, str(error)) from None
    return texts, encodings


def error_answer(error: ClientError) -> Answer:
    """The one-line JSON body of a client error."""
    status = HTTPStatus(error.status)
    body = {"code": int(status), "message": status.phrase, "error": str(error)}
    return Answer(int(status), json.dumps(body).encode())


def internal_error_answer(request_id: str | None = None) -> Answer:
    """A 500 without detail for the client (the caller logs the exception)."""
    where = f" (request {request_id})" if request_id else ""
    body = {
        "code": 500,
        "message": "Internal Server Error",
        "error": f"the model failed to answer{where}; see the server log",
    }
    return Answer(500, json.dumps(body).encode())


def _invalid_prediction(prediction: object) -> str | None:
    """Why ``prediction`` is not one the protocol answers with (``{"label": str, "score": number, "scores": {str:
    number}}``, numbers finite; other keys are passed on), or None."""
    if not isinstance(prediction, Mapping):
        return f"a prediction is {_kind(prediction)}, not an object"
    if not isinstance(prediction.get("label"), str):
        return "a prediction's label is not a string"
    scores = prediction.get("scores")
    if not isinstance(scores, Mapping) or not all(isinstance(label, str) for label in scores):
        return "a prediction's scores are not an object of labels"
    for name, value in (("score", prediction.get("score")), *((f"scores[{k!r}]", v) for k, v in scores.items())):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"a prediction's {name} is {_kind(value)}, not a number"
        if not math.isfinite(value):
            return f"a prediction's {name} is {value}, not a finite number"
    return None


def success_answer(predictions: Sequence[object], request_id: str | None = None) -> Answer:
    """A 200 with one request's predictions; or, if the model gave one that is malformed or not a finite number
    (NaN, infinity), a 500 for this request alone that says so (the values go to the server log), never a body a
    client cannot parse and never an exception that would cost the requests beside it their answers."""
    problem = next(filter(None, map(_invalid_prediction, predictions)), None)
    if problem is None:
        try:
            return Answer(200, json.dumps(list(predictions), allow_nan=False).encode())
        except (TypeError, ValueError) as error:  # an extra key the model added that JSON cannot carry
            problem = f"a prediction cannot be written as JSON ({error})"
    log.error("request %s: the model's answer is not a valid prediction: %s: %.2000r", request_id, problem, predictions)
    where = f" (request {request_id})" if request_id else ""
    reason = "not a finite number" if "finite" in problem else "malformed"
    body = {
        "code": 500,
        "message": "Internal Server Error",
        "error": f"the model's prediction is {reason}{where}; see the server log",
    }
    return Answer(500, json.dumps(body).encode())


Request = tuple[object, Mapping[str, object]]  # (body, headers) as the model server hands them over


def answer_batch(
    requests: Sequence[Request],
    predict: Callable[[list[str]], list[dict]],
    limits: Limits,
    request_ids: Sequence[str | None] | None = None,
) -> list[Answer]:
    """One answer per request of a server batch, with ONE ``predict`` call over the texts of every valid request.

    A bad request gets its own 4xx and does not touch its neighbours; if the forward pass itself fails, the requests
    that took part get a 500 without detail and the exception goes to the log.
    """
    ids = list(request_ids or [None] * len(requests))
    answers: list[Answer | None] = [None] * len(requests)
    texts: list[str] = []
    spans: list[tuple[int, int, int]] = []  # (request index, first text, end)
    for index, (body, headers) in enumerate(requests):
        try:
            request_texts = parse_request(body, headers, limits)
        except ClientError as error:
            log.info("request %s refused: %d %s", ids[index], int(error.status), error)
            answers[index] = error_answer(error)
            continue
        except Exception:  # a bug in parsing must not cost the neighbours their answers
            log.exception("request %s: parsing failed", ids[index])
            answers[index] = internal_error_answer(ids[index])
            continue
        spans.append((index, len(texts), len(texts) + len(request_texts)))
        texts.extend(request_texts)
    if texts:
        try:
            predictions = predict(texts)
            if len(predictions) != len(texts):
                raise RuntimeError(f"{len(predictions)} predictions for {len(texts)} texts")
        except Exception:
            log.exception("forward pass over %d texts of %d requests failed", len(texts), len(spans))
            for index, _, _ in spans:
                answers[index] = internal_error_answer(ids[index])
        else:
            for index, start, end in spans:
                answers[index] = success_answer(predictions[start:end], ids[index])
    return [answer or internal_error_answer(ids[index]) for index, answer in enumerate(answers)]
