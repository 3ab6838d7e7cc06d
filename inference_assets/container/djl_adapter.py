"""DJL Serving Python-engine adapter: ``handle(inputs)`` over the shared request protocol and predictor.

DJL Serving unpacks each model archive into its own directory, reads ``serving.properties`` (``engine=Python``,
``option.entryPoint=model.py``) and calls ``handle`` with a ``djl_python.Input``. The first call of a worker is the
load call: it carries the properties (``option.*`` without the prefix, plus ``model_dir``) and is answered with
``None``. Requests, answers and errors are those of ``protocol.py``, exactly as in the Ray Serve deployment.

Batches: DJL Serving 0.36's Python engine gives every request of a dynamic batch the batch Output's status code and
properties (``PyPredictor.java`` of tag v0.36.0), so per-request statuses and Content-Types cannot be expressed:
a bad request would come back 200, or good ones with its 4xx. The archive's serving.properties therefore always
says ``batch_size=1`` (``DjlModelSettings`` refuses more) and the load call refuses ``batch_size`` > 1. With
``batch_size=1`` DJL may still hand over a batch of one (``is_batch()`` is true whenever ``batch_size`` is set):
that one request gets its own status, Content-Type and body.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from pathlib import Path
from typing import Any

from .contract import Limits
from .predictor import RuntimeOptions, SentimentPredictor
from .protocol import Answer, answer_batch

log = logging.getLogger(__name__)

_state: dict[str, Any] = {}


def _load(properties: dict[str, str]) -> None:
    batch_size = int(properties.get("batch_size") or 1)
    if batch_size > 1:
        raise ValueError(
            f"batch_size={batch_size}: DJL Serving 0.36 gives every request of a batch the batch's status and "
            "headers, so batched answers cannot be correct; set batch_size=1 (DjlModelSettings refuses more)"
        )
    model_dir = Path(properties["model_dir"])
    _state["limits"] = Limits.from_properties(properties)
    _state["predictor"] = SentimentPredictor(model_dir, RuntimeOptions())
    log.info("loaded sentiment model from %s (%s)", model_dir, _state["limits"])


def _headers(request: Any) -> dict[str, str]:
    return {key: value for key, value in request.get_properties().items() if isinstance(value, str)}


def _output(answer: Answer) -> Any:
    from djl_python import Output  # provided by DJL Serving's Python engine; not on PyPI

    output = Output()
    output.set_code(answer.status)
    output.set_message(HTTPStatus(answer.status).phrase)
    output.add_property("Content-Type", answer.content_type)
    output.add(answer.body)
    return output


def handle(inputs: Any) -> Any:
    """DJL's entry point: ``None`` for the load call, else a ``djl_python.Output`` with this request's answer."""
    if "predictor" not in _state:
        _load(inputs.get_properties())
        if inputs.is_empty():
            return None  # the load call (DJL answers it 204)
    # After the load call, no content is a request with an empty body (a 400 below), not another load call.
    requests = inputs.get_batches() if inputs.is_batch() else [inputs]
    if len(requests) != 1:  # refused at load; kept so that a hand-edited serving.properties cannot mislabel answers
        log.error("a DJL batch of %d requests; serving.properties must say batch_size=1", len(requests))
        raise RuntimeError("batch_size must be 1 for this model (see the server log)")
    (answer,) = answer_batch(
        [(request.get_as_bytes(), _headers(request)) for request in requests],
        _state["predictor"].predict_dicts,
        _state["limits"],
    )
    return _output(answer)
