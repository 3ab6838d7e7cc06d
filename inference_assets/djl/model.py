"""DJL Serving Python-engine entry point: ``handle(inputs)`` over the shared sentiment predictor.

DJL Serving unpacks each model archive into its own directory, reads ``serving.properties`` (``engine=Python``)
and calls ``handle`` with a ``djl_python.Input`` per request (or per dynamic batch). The first call after a
worker starts carries no content: it is the load signal, answered with ``None``. The predictor comes from
``code/sentiment_predictor.py`` in the same archive, the very module the SageMaker PyTorch toolkit handler
(``code/inference.py``) uses, so both model servers give identical answers.

Requests: ``application/json`` ``{"inputs": "text" | ["text", ...]}`` or ``text/plain`` (one text).
Answers: ``{"predictions": [{"label", "score", "scores"}, ...]}``; client errors are 400/415 JSON bodies.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

JSON = "application/json"
TEXT = "text/plain"
_predictor: Any = None
_bad_request: type[Exception] = ValueError


def _load(properties: dict[str, str]) -> None:
    """Load the predictor from the model directory DJL passes in the properties (``model_dir``)."""
    global _predictor, _bad_request
    model_dir = Path(properties["model_dir"])
    code_dir = str(model_dir / "code")
    if code_dir not in sys.path:
        sys.path.insert(0, code_dir)
    from sentiment_predictor import BadRequest, SentimentPredictor

    max_batch = int(properties.get("max_request_batch", "32"))
    _predictor = SentimentPredictor(model_dir, max_batch_size=max_batch)
    _bad_request = BadRequest
    log.info("loaded sentiment model from %s (labels %s)", model_dir, _predictor.labels)


def _media_type(value: str | None) -> str:
    return (value or JSON).split(";")[0].strip().lower()


def parse(request: Any) -> object:
    """The texts of one request (a ``djl_python.Input``); raise ``BadRequest`` for anything malformed."""
    media_type = _media_type(request.get_property("Content-Type"))
    body = request.get_as_bytes()
    if media_type == TEXT:
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError:
            raise _bad_request("the text/plain body is not valid UTF-8") from None
    if media_type != JSON:
        raise _UnsupportedMediaType(f"content type {media_type!r} is not supported; send {JSON} or {TEXT}")
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise _bad_request(f"the body is not valid JSON: {error}") from None
    if not isinstance(payload, dict) or "inputs" not in payload:
        raise _bad_request('the JSON body must be an object with an "inputs" key')
    return payload["inputs"]


class _UnsupportedMediaType(Exception):
    pass


def _answer(request: Any, output: Any, index: int | None) -> None:
    """Predict one request and add its answer (or its client error) to ``output``."""
    try:
        predictions = _predictor.predict(parse(request))
    except _UnsupportedMediaType as error:
        _add_error(output, 415, str(error), index)
    except _bad_request as error:
        _add_error(output, 400, str(error), index)
    else:
        body = {"predictions": [p.as_dict() for p in predictions]}
        if index is None:
            output.add_property("Content-Type", JSON).add_as_json(body)
        else:
            output.add(json.dumps(body), key="data", batch_index=index)


def _add_error(output: Any, code: int, message: str, index: int | None) -> None:
    log.info("client error %d: %s", code, message)
    if index is None:
        output.error(message, code=code, message="Bad Request" if code == 400 else "Unsupported Media Type")
    else:  # one bad request in a dynamic batch must not fail its neighbours
        output.add(json.dumps({"code": code, "error": message}), key="data", batch_index=index)


def handle(inputs: Any) -> Any:
    """DJL's entry point: ``None`` for the load call, else a ``djl_python.Output``."""
    from djl_python import Output  # only inside DJL Serving; not on PyPI

    if _predictor is None:
        _load(inputs.get_properties())
    if inputs.is_empty():
        return None
    output = Output()
    if inputs.is_batch():  # batch_size > 1 in serving.properties: DJL hands over several requests at once
        for index, request in enumerate(inputs.get_batches()):
            _answer(request, output, index)
    else:
        _answer(inputs, output, None)
    return output
