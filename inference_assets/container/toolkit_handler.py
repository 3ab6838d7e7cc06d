"""SageMaker PyTorch serving-toolkit adapter (``code/inference.py`` in model.tar.gz) over the shared predictor.

The toolkit (sagemaker-inference ``Transformer.transform``) calls, per request, ``input_fn -> predict_fn ->
output_fn`` and turns exceptions into HTTP answers: a ``BaseInferenceToolkitError`` becomes its ``status_code``,
anything else becomes 500. So every client mistake is raised here as a ``GenericInferenceToolkitError`` with a 4xx:

    400  malformed JSON or UTF-8, no "inputs", non-string items, an empty list, an empty text/plain body
    406  an Accept header that does not allow application/json
    413  more texts than SENTIMENT_MAX_REQUEST_BATCH (the endpoint sets it from settings)
    415  a content type other than application/json or text/plain

Requests: ``{"inputs": "text"}`` or ``{"inputs": ["a", "b"]}`` as application/json, or one text as text/plain.
Answer: a JSON list with one ``{"label", "score", "scores"}`` object per input text, in order.
"""

from __future__ import annotations

import json
import os
from http import HTTPStatus

from sagemaker_inference.errors import GenericInferenceToolkitError

from .predictor import BadRequest, BatchTooLarge, SentimentPredictor

MAX_REQUEST_BATCH_ENV = "SENTIMENT_MAX_REQUEST_BATCH"
DEFAULT_MAX_REQUEST_BATCH = 32
JSON = "application/json"
TEXT = "text/plain"
_ACCEPTABLE = {JSON, "application/*", "*/*"}


def _client_error(status: HTTPStatus, message: str) -> GenericInferenceToolkitError:
    return GenericInferenceToolkitError(int(status), message, status.phrase)


def _max_request_batch() -> int:
    raw = os.environ.get(MAX_REQUEST_BATCH_ENV, str(DEFAULT_MAX_REQUEST_BATCH))
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{MAX_REQUEST_BATCH_ENV} must be a positive integer, got {raw!r}")
    return value


def model_fn(model_dir: str) -> SentimentPredictor:
    return SentimentPredictor(model_dir, max_batch_size=_max_request_batch())


def _media_type(content_type: str | None) -> tuple[str, str | None]:
    """``'application/json; charset=utf-8'`` -> ``('application/json', 'utf-8')``."""
    media_type, *params = (content_type or "").split(";")
    charset = None
    for param in params:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            charset = value.strip().strip('"').lower()
    return media_type.strip().lower(), charset


def _text(body: str | bytes | bytearray) -> str:
    # The toolkit decodes exactly "application/json" itself; every other spelling arrives as bytes.
    if isinstance(body, str):
        return body
    try:
        return bytes(body).decode("utf-8")
    except UnicodeDecodeError as error:
        raise _client_error(
            HTTPStatus.BAD_REQUEST,
            f"the request body is not valid UTF-8 ({error.reason})",
        ) from None


def input_fn(request_body: str | bytes, content_type: str | None) -> object:
    media_type, charset = _media_type(content_type)
    if media_type not in (JSON, TEXT):
        raise _client_error(
            HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
            f"content type {content_type or '(none)'!r} is not supported; send {JSON} or {TEXT}",
        )
    if charset not in (None, "utf-8", "utf8"):
        raise _client_error(
            HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
            f"charset {charset!r} is not supported; send utf-8",
        )
    text = _text(request_body)
    if media_type == TEXT:
        if not text.strip():
            raise _client_error(
                HTTPStatus.BAD_REQUEST,
                "the text/plain body is empty; send the text to classify",
            )
        return text
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as error:
        raise _client_error(HTTPStatus.BAD_REQUEST, f"the body is not valid JSON: {error}") from None
    if not isinstance(payload, dict) or "inputs" not in payload:
        raise _client_error(
            HTTPStatus.BAD_REQUEST,
            'the JSON body must be an object with "inputs": a string or a list of strings',
        )
    return payload["inputs"]


def predict_fn(inputs: object, predictor: SentimentPredictor) -> list[dict]:
    try:
        return [prediction.as_dict() for prediction in predictor.predict(inputs)]
    except BatchTooLarge as error:
        raise _client_error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, str(error)) from None
    except BadRequest as error:
        raise _client_error(HTTPStatus.BAD_REQUEST, str(error)) from None


def output_fn(predictions: list[dict], accept: str) -> tuple[str, str]:
    # The toolkit has already replaced a missing or */* Accept with the default (application/json).
    accepted = {media.split(";")[0].strip().lower() for media in accept.split(",")}
    if not accepted & _ACCEPTABLE:
        raise _client_error(
            HTTPStatus.NOT_ACCEPTABLE,
            f"accept {accept!r} is not supported; this model answers {JSON}",
        )
    return json.dumps(predictions), JSON
