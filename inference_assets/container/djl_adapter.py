"""DJL Serving Python-engine entry point: ``handle(inputs)`` over the shared sentiment predictor.

DJL Serving unpacks each model archive into its own directory, reads ``serving.properties`` (``engine=Python``)
and calls ``handle`` with a ``djl_python.Input`` per request, or per dynamic batch when ``batch_size`` > 1. The
first call of a worker carries no content: it loads the model and is answered with ``None``. The predictor is
``code/sentiment_serving/predictor.py`` of the same archive, the module the SageMaker PyTorch toolkit handler
(``code/inference.py``) uses, and requests and answers are the same as there:

    request   application/json {"inputs": "text" | ["text", ...]}, or text/plain (one text), UTF-8
    answer    200 application/json [{"label", "score", "scores"}, ...], one object per text, in order
    errors    400 malformed body, 413 more texts than ``option.max_request_batch``, 415 other content types,
              each as {"code", "message", "error"} JSON; the worker keeps serving
"""

from __future__ import annotations

import json
import logging
from http import HTTPStatus
from pathlib import Path
from typing import Any

from .predictor import BadRequest, BatchTooLarge, SentimentPredictor

log = logging.getLogger(__name__)

JSON = "application/json"
TEXT = "text/plain"
DEFAULT_MAX_REQUEST_BATCH = 32
_predictor: Any = None


class ClientError(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def _load(properties: dict[str, str]) -> None:
    """Load the predictor from the model directory DJL names in the properties (``model_dir``)."""
    global _predictor
    model_dir = Path(properties["model_dir"])
    max_batch = int(properties.get("max_request_batch", DEFAULT_MAX_REQUEST_BATCH))
    _predictor = SentimentPredictor(model_dir, max_batch_size=max_batch)
    log.info("loaded sentiment model from %s", model_dir)


def parse(request: Any) -> object:
    """The texts of one request (a ``djl_python.Input``); raise :class:`ClientError` for anything malformed."""
    content_type = request.get_property("Content-Type") or JSON
    media_type, *params = content_type.split(";")
    media_type = media_type.strip().lower()
    charsets = [value.strip().strip('"').lower() for name, _, value in (p.partition("=") for p in params)
                if name.strip().lower() == "charset"]  # fmt: skip
    if media_type not in (JSON, TEXT) or any(charset not in ("utf-8", "utf8") for charset in charsets):
        raise ClientError(
            HTTPStatus.UNSUPPORTED_MEDIA_TYPE, f"content type {content_type!r} is not supported; send {JSON} or {TEXT}"
        )
    try:
        text = bytes(request.get_as_bytes() or b"").decode("utf-8")
    except UnicodeDecodeError as error:
        raise ClientError(HTTPStatus.BAD_REQUEST, f"the request body is not valid UTF-8 ({error.reason})") from None
    if media_type == TEXT:
        if not text.strip():
            raise ClientError(HTTPStatus.BAD_REQUEST, "the text/plain body is empty; send the text to classify")
        return text
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as error:
        raise ClientError(HTTPStatus.BAD_REQUEST, f"the body is not valid JSON: {error}") from None
    if not isinstance(payload, dict) or "inputs" not in payload:
        raise ClientError(
            HTTPStatus.BAD_REQUEST, 'the JSON body must be an object with "inputs": a string or a list of strings'
        )
    return payload["inputs"]


def predict(request: Any) -> list[dict]:
    """Predictions of one request as JSON-ready dicts; client mistakes raise :class:`ClientError`."""
    try:
        return [prediction.as_dict() for prediction in _predictor.predict(parse(request))]
    except BatchTooLarge as error:
        raise ClientError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, str(error)) from None
    except BadRequest as error:
        raise ClientError(HTTPStatus.BAD_REQUEST, str(error)) from None


def handle(inputs: Any) -> Any:
    """DJL's entry point: ``None`` for the load call, else a ``djl_python.Output``."""
    from djl_python import Output  # provided by DJL Serving's Python engine; not on PyPI

    if _predictor is None:
        _load(inputs.get_properties())
    if inputs.is_empty():
        return None
    output = Output()
    if not inputs.is_batch():
        try:
            return output.add_property("Content-Type", JSON).add_as_json(predict(inputs))
        except ClientError as error:
            log.info("client error %d: %s", error.status, error)
            return output.error(str(error), code=int(error.status), message=error.status.phrase)
    # A dynamic batch: one answer per request; a bad request must not fail its neighbours.
    for index, request in enumerate(inputs.get_batches()):
        try:
            body = predict(request)
        except ClientError as error:
            body = {"code": int(error.status), "message": error.status.phrase, "error": str(error)}
        output.add(json.dumps(body), key="data", batch_index=index)
    return output
