"""The Ray Serve deployment of the sentiment model: the serving contract of AWS's Ray Serve DLC, batching by Ray.

The contract, as AWS publishes it (aws/deep-learning-containers: docs/ray/index.md "Model Package Structure",
docs/ray/deployment/sagemaker.md, scripts/docker/ray/sagemaker_entrypoint.sh and sagemaker_serve.py): model.tar.gz
is unpacked at /opt/ml/model and holds ``config.yaml`` (a Ray Serve config, ``applications:`` with
``import_path: deployment:app``) and ``deployment.py`` at its root, with the model files beside them; the
entrypoint puts /opt/ml/model and /opt/ml/model/code on PYTHONPATH and runs ``serve run /opt/ml/model/config.yaml``;
SageMaker's ``GET /ping`` and ``POST /invocations`` arrive on port 8080 (AWS's image proxies /invocations to the
application's route "/" on Ray's port 8000 and /ping to Ray's ``/-/healthz``).

This deployment answers all three paths itself, so the same package serves behind AWS's adapter (x86 image) and
with Ray Serve's own proxy on port 8080 (the platform's arm64 image, no second HTTP hop, and a /ping that answers
only once a replica holds the model):

    GET  /ping                    200, empty body
    POST /invocations and POST /  the request protocol (protocol.py), unchanged: status, one-line JSON body
    any other method there        handed to the protocol as the TorchServe handler was (no body: a 4xx)
    any other path                404, one-line JSON

Dynamic batching is ``@serve.batch``: concurrent requests wait up to ``batch_wait_timeout_s`` for up to
``max_batch_size`` requests, and ``protocol.answer_batch`` answers the batch with ONE forward pass (a bad request
gets its own 4xx and does not touch its neighbours). The forward pass runs on one dedicated thread, so the replica's
event loop keeps taking requests (and /ping) while it runs: the next batch fills during the current forward pass.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ray import serve
from ray.serve import Application
from starlette.requests import Request
from starlette.responses import Response

from .predictor import RuntimeOptions, SentimentPredictor
from .protocol import JSON, Answer, Limits, answer_batch
from .ray_settings import ServeSettings

log = logging.getLogger("ray.serve")  # Ray Serve writes this logger to the replica's log, with the request id

INVOCATION_PATHS = ("/", "/invocations")
PING_PATH = "/ping"
# (body, headers, request id): one queued request of a batch.
_Item = tuple[bytes, dict[str, str], str]


def _request_id() -> str:
    # The id Ray Serve's proxy gives the request (its X-Request-Id answer header and replica log lines carry it).
    # A private accessor: Ray 2.57 has no public one (ray/serve/context.py).
    try:
        return str(serve.context._get_serve_request_context().request_id)
    except Exception:  # the id only labels a 500's message; never fail a request over it
        return "unknown"


@serve.deployment(name="SentimentClassifier")
class SentimentDeployment:
    """One replica: the predictor, the request limits and the batch settings, all from the container environment."""

    def __init__(self, model_dir: str, settings: ServeSettings) -> None:
        self.settings = settings
        self.limits = Limits.from_environment(os.environ)
        options = RuntimeOptions.from_environment(os.environ)
        self.predictor = SentimentPredictor(
            model_dir, RuntimeOptions(options.precision, options.torch_compile, settings.threads)
        )
        # One thread: torch keeps one OpenMP team per calling thread, and batches run one after another anyway.
        self._forward = ThreadPoolExecutor(max_workers=1, thread_name_prefix="forward")
        # The setters @serve.batch attaches to its wrapper (ray/serve/batching.py); Ray's type hints omit them.
        self.answer.set_max_batch_size(settings.max_batch_size)  # type: ignore[attr-defined]
        self.answer.set_batch_wait_timeout_s(settings.batch_wait_timeout_s)  # type: ignore[attr-defined]
        import torch

        log.info(
            "sentiment model loaded from %s (%s, %s, %s, torch threads %d)",
            model_dir,
            settings,
            self.limits,
            self.predictor.options,
            torch.get_num_threads(),
        )

    def _answer_now(self, items: list[_Item]) -> list[Answer]:
        answers = answer_batch(
            [(body, headers) for body, headers, _ in items],
            self.predictor.predict_dicts,
            self.limits,
            [request_id for _, _, request_id in items],
        )
        log.info(
            "batch of %d requests answered with one forward pass (statuses %s)",
            len(answers),
            ",".join(str(answer.status) for answer in answers),
        )
        return answers

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.002)  # replaced in __init__ from the settings
    async def answer(self, items: list[_Item]) -> list[Answer]:
        return await asyncio.get_running_loop().run_in_executor(self._forward, self._answer_now, items)

    async def __call__(self, request: Request) -> Response:
        path = request.url.path
        if path == PING_PATH and request.method in ("GET", "HEAD"):
            return Response(status_code=200)
        if path not in INVOCATION_PATHS:
            body = {"code": 404, "message": "Not Found", "error": "POST to /invocations; GET /ping"}
            return Response(json.dumps(body).encode(), status_code=404, media_type=JSON)
        headers = dict(request.headers.items())  # starlette lower-cases the names; the protocol ignores case
        answer = await self.answer((await request.body(), headers, _request_id()))
        return Response(answer.body, status_code=answer.status, media_type=answer.content_type)


def build_app(model_dir: str | os.PathLike[str], environment: dict[str, Any] | None = None) -> Application:
    """The application config.yaml names (``deployment:app`` calls this with the archive's directory).

    Replicas, threads and batching come from the environment (:class:`ServeSettings`); each replica reserves its
    threads as Ray CPUs, so Ray never places more replicas than the host has cores for."""
    settings = ServeSettings.from_environment(os.environ if environment is None else environment)
    return SentimentDeployment.options(  # type: ignore[attr-defined]  # a Deployment at run time
        num_replicas=settings.replicas,
        max_ongoing_requests=settings.max_ongoing_requests,
        ray_actor_options={"num_cpus": settings.threads},
    ).bind(str(Path(model_dir)), settings)
