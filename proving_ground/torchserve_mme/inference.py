"""``code/inference.py`` of the local TorchServe harness's archives (``archive.py``): TorchServe's batch in, ONE
forward pass, one answer per request, over the serving package the archive carries (``code/sentiment_serving``).

No endpoint runs it: the Graviton endpoint serves with Ray Serve, the multi-model endpoint with DJL Serving. The local
multi-model harness (``local_mme.py``: TorchServe 0.12 + the SageMaker PyTorch toolkit in multi-model mode) serves
it, so that the sizing model and the model costs are measured on a real multi-model server on this machine. How it
gets to run, read in TorchServe's and the toolkit's source rather than assumed:

- TorchServe reads ``MAR-INF/MANIFEST.json`` of a model directory (ModelArchive.java ``load``) and uses the default
  service handler only when the manifest names none (ModelManager.java ``createModelArchive``: ``if (handler !=
  null) ... else if (archive.getHandler() == null || ...isEmpty()) model.setHandler(getTsDefaultServiceHandler())``).
  ``archive.py`` writes a manifest whose handler is ``code/inference.py:handle``, so TorchServe calls this module
  with the whole batch, and the toolkit's ``Transformer.transform`` (which loops over a batch request by request,
  decodes bodies before user code, appends tracebacks to error bodies and sets the content type of answer 0 only)
  is not on the request path at all, in multi-model mode (``POST /models?url=<dir>``) as in single-model mode.
- TorchServe puts the handler's folder (``code``) on the worker's PYTHONPATH and starts the worker in the model
  directory (EnvironmentUtils.java ``getEnvString``, WorkerLifeCycle.java), so ``sentiment_serving`` imports.
- ``handle(None, context)`` is the load call (ts/model_loader.py ``_get_function_entry_point``); per-request
  status and content type go through ``context.set_response_status(code, phrase, idx)`` and
  ``context.set_response_content_type(idx, ...)``, which TorchServe sends per request (ts/protocol/
  otf_message_handler.py ``create_predict_response``). Bodies arrive as bytes because the harness's config sets
  ``decode_input_request=false``; headers come per request (``context.get_all_request_header(idx)``).
"""

from __future__ import annotations

import logging
import os
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the same modules, by their name in the repository (for the type checker)
    from inference_assets.container.contract import Limits
    from inference_assets.container.predictor import RuntimeOptions, SentimentPredictor
    from inference_assets.container.protocol import answer_batch
else:  # inside the archive: code/sentiment_serving, on the worker's path
    from sentiment_serving.contract import Limits
    from sentiment_serving.predictor import RuntimeOptions, SentimentPredictor
    from sentiment_serving.protocol import answer_batch

log = logging.getLogger(__name__)


class BatchHandler:
    """Loads the predictor once per worker and answers TorchServe batches."""

    def __init__(self) -> None:
        self.predictor: SentimentPredictor | None = None
        self.limits = Limits()

    def initialize(self, context: Any) -> None:
        model_dir = context.system_properties["model_dir"]
        self.limits = Limits.from_environment(os.environ)
        self.predictor = SentimentPredictor(model_dir, RuntimeOptions.from_environment(os.environ))
        log.info("sentiment model loaded from %s (%s, %s)", model_dir, self.limits, self.predictor.options)

    def handle(self, data: list[dict[str, Any]], context: Any) -> list[bytes]:
        assert self.predictor is not None, "handle() before initialize()"
        requests = [
            (row.get("body") if isinstance(row, dict) else None, context.get_all_request_header(index))
            for index, row in enumerate(data)
        ]
        ids = [context.get_request_id(index) for index in range(len(data))]
        answers = answer_batch(requests, self.predictor.predict_dicts, self.limits, ids)
        log.info(
            "batch of %d requests answered with one forward pass (statuses %s)",
            len(answers),
            ",".join(str(answer.status) for answer in answers),
        )
        for index, answer in enumerate(answers):
            context.set_response_status(answer.status, HTTPStatus(answer.status).phrase, index)
            context.set_response_content_type(index, answer.content_type)
        return [answer.body for answer in answers]


# The worker's one handler: TorchServe imports this module once per worker.
batch_handler = BatchHandler()


def handle(data: list[dict[str, Any]] | None, context: Any) -> list[bytes] | None:
    """TorchServe's entry point (``code/inference.py:handle`` in the archive's MANIFEST.json)."""
    if data is None:  # the load call
        batch_handler.initialize(context)
        return None
    return batch_handler.handle(data, context)
