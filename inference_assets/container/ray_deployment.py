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
``max_batch_size`` requests, and ``protocol.answer_batch`` answers them with ONE forward pass (a bad request gets its
own 4xx and does not touch its neighbours). Two things are added to what ``@serve.batch`` does by itself, both
measured with proving_ground/benchmarks/serving_latency.py (8 single-text clients against full batch-8 forward passes):

- Ray forms the next batch while the current one runs (ray/serve/batching.py ``_process_batches`` calls
  ``wait_for_batch`` again at once; ``max_concurrent_batches`` gates only the execution), so requests that arrive
  during a forward pass would be cut into batches of one wait window each and queue behind it. Here every batch Ray
  forms is handed over at once and the forward pass, when free, takes ALL requests waiting by then (up to
  ``max_batch_size``): what arrived during a pass is the next pass, as a TorchServe worker pulls its batch when free.
- A batch waits for as many requests as the last round brought (the requests the last forward pass answered plus
  those that queued during it, at most ``max_batch_size``), up to ``batch_wait_timeout_s``: clients that send again
  as soon as they are answered come back spread over some milliseconds, and starting on the first of them splits
  every round into two half-full passes (measured: 0.57 of the batch-8 throughput with a fixed 2 ms wait, as
  TorchServe measured; 3.9 requests per pass at 8 clients with merging alone). A lone client is expected alone
  and never waits; when traffic shrinks, one pass waits out the timeout and the expectation follows.

The forward pass runs on one dedicated thread, so the replica's event loop keeps taking requests (and /ping) while
it runs.
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
# Batches Ray may hand over while a forward pass runs: each holds at least one ongoing request, and a replica holds
# at most max_ongoing_requests = 2 x max_batch_size (settings allow up to 256), so this never holds one back.
_FORMING_BATCHES = 512


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
        # (request, its answer, when it arrived) in arrival order; a forward pass takes them from the front.
        self._waiting: list[tuple[_Item, asyncio.Future[Answer], float]] = []
        self._draining: asyncio.Task[None] | None = None
        self._arrived: asyncio.Event | None = None
        self._arrived_loop: asyncio.AbstractEventLoop | None = None
        # The setters @serve.batch attaches to its wrapper (ray/serve/batching.py); Ray's type hints omit them.
        self.answer.set_batch_wait_timeout_s(settings.batch_wait_timeout_s)  # type: ignore[attr-defined]
        self._expect(1)  # nothing known yet: the first request starts at once
        import torch

        log.info(
            "sentiment model loaded from %s (%s, %s, %s, torch threads %d)",
            model_dir,
            settings,
            self.limits,
            self.predictor.options,
            torch.get_num_threads(),
        )

    def answer_together(self, items: list[_Item]) -> list[Answer]:
        """Answer ``items`` with one forward pass over their good texts, each request with its own answer."""
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

    def _expect(self, requests: int) -> None:
        """How many requests the next forward pass waits for (up to the wait): what the last round brought. Ray's
        batching is told how many of them are still to come, so that it hands them over as they complete the
        round instead of holding them for a full batch of its own."""
        self._expected = max(1, min(self.settings.max_batch_size, requests))
        still_to_come = max(1, self._expected - len(self._waiting))
        self.answer.set_max_batch_size(still_to_come)  # type: ignore[attr-defined]  # read as a batch starts

    def _arrival(self) -> asyncio.Event:
        loop = asyncio.get_running_loop()
        if self._arrived is None or self._arrived_loop is not loop:
            self._arrived, self._arrived_loop = asyncio.Event(), loop
        return self._arrived

    @property
    def expected_requests(self) -> int:
        """How many requests the next forward pass waits for (up to ``batch_wait_timeout_s``)."""
        return self._expected

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.002, max_concurrent_batches=_FORMING_BATCHES)
    async def answer(self, items: list[_Item]) -> list[Answer]:
        """One batch as Ray forms it (size and wait replaced from the settings)."""
        return await self.queue(items)

    async def queue(self, items: list[_Item]) -> list[Answer]:
        """Queue ``items`` for the forward pass, which may merge them with batches formed while the model was busy,
        and wait for their answers: what every batch Ray forms goes through (tests call it without Ray, whose
        batching runs only inside a replica)."""
        loop = asyncio.get_running_loop()
        waiting = [(item, loop.create_future(), loop.time()) for item in items]
        self._waiting.extend(waiting)
        self._arrival().set()
        if self._draining is None or self._draining.done():
            self._draining = loop.create_task(self._drain())
        return list(await asyncio.gather(*(future for _, future, _ in waiting)))

    async def _until_expected(self, free_since: float) -> None:
        """Wait until the expected requests are here, or batch_wait_timeout_s has passed since the model was free
        and a request was waiting (requests that queued during the last pass have waited for the model, not for the
        rest of their round)."""
        loop = asyncio.get_running_loop()
        deadline = max(self._waiting[0][2], free_since) + self.settings.batch_wait_timeout_s
        arrival = self._arrival()
        while len(self._waiting) < self._expected and (remaining := deadline - loop.time()) > 0:
            arrival.clear()
            try:
                await asyncio.wait_for(arrival.wait(), remaining)
            except TimeoutError:
                return

    async def _drain(self) -> None:
        """Forward passes, one after another, while requests wait: each takes all of them, up to max_batch_size."""
        loop = asyncio.get_running_loop()
        free_since = loop.time()
        while self._waiting:
            await self._until_expected(free_since)
            taken = self._waiting[: self.settings.max_batch_size]
            del self._waiting[: len(taken)]
            items = [item for item, _, _ in taken]
            try:
                answers = await loop.run_in_executor(self._forward, self.answer_together, items)
            except Exception as error:  # answer_batch answers failures itself: this is the executor failing
                for _, future, _ in taken:
                    if not future.done():
                        future.set_exception(error)
            else:
                for (_, future, _), answer in zip(taken, answers, strict=True):
                    if not future.done():  # done: the request was cancelled (its client went away)
                        future.set_result(answer)
            # The clients just answered, and those that queued meanwhile, are the next round.
            self._expect(len(taken) + len(self._waiting))
            free_since = loop.time()

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
