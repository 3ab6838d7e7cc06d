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

Each request is admitted first (``protocol.admit_request``: parsed, checked, tokenized; a bad request gets its 4xx
there, 413 above ``max_request_tokens``): on the event loop when its body is small (``INLINE_ADMISSION_BYTES``), on a
thread of its own otherwise. Then dynamic batching, the replica's own queue: concurrent requests wait up to
``batch_wait_timeout_s`` for up to ``max_batch_size`` requests, and ONE forward pass answers them, at most
``max_request_tokens`` tokens together (so no pass costs more than the worst request the contract admits), its texts
grouped by length inside it (``predictor.length_groups``). Health is separate from the queue: /ping answers on the
event loop, the replica refuses invocations itself (503) beyond ``max_invocations`` so that Ray's own limit always
leaves /ping a slot, and a replica whose passes keep failing (or one stuck) answers /ping 503 and fails Ray's health
check. How the queue forms a pass, measured with proving_ground/benchmarks/serving_latency.py and
serving_topology.py (single-text clients against full forward passes):

- The forward pass, when free, takes ALL requests waiting by then (up to ``max_batch_size``): what arrived during a
  pass is the next pass, as a TorchServe worker pulls its batch when free. (Ray's ``@serve.batch``, which this queue
  replaced, forms the next batch while the current one runs and would cut what arrives during a pass into batches of
  one wait window each, queued behind it.)
- A pass waits for as many requests as the last round brought (the requests the last forward pass answered plus
  those that queued during it, at most ``max_batch_size``), up to ``batch_wait_timeout_s``: clients that send again
  as soon as they are answered come back spread over some milliseconds, and starting on the first of them splits
  every round into two half-full passes (measured: 0.57 of the batch-8 throughput with a fixed 2 ms wait, as
  TorchServe measured; 3.9 requests per pass at 8 clients with merging alone). A lone client is expected alone
  and never waits; when traffic shrinks, one pass waits out the timeout and the expectation follows.
- Between two passes of a closed loop of clients the forward thread waits for the answers to go out and the next
  round to come in, all of it on the event loop, one request after another: what the loop spends per request is
  that wait. Small requests are admitted on the loop itself (~0.04-0.1 ms for a tweet, measured on the 2-core host)
  rather than handed to the admission thread and back (two thread switches, each waiting for the GIL while the loop
  reads the next requests: measured at 32 clients, the last request of a round was admitted 3-7 ms after it
  arrived); and each request goes straight into the queue, without Ray's ``@serve.batch`` in between (per request
  a signature inspection and a future, per batch a task and metrics, and a warning line per pass when the expected
  size was passed on to it; proving_ground/benchmarks/results/serving_gap.md).

The forward pass runs on one dedicated thread, so the replica's event loop keeps taking requests (and /ping) while
it runs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ray import serve
from ray.serve import Application
from starlette.requests import Request
from starlette.responses import Response

from .predictor import RuntimeOptions, SentimentPredictor
from .protocol import (
    JSON,
    Answer,
    ClientError,
    Limits,
    admit_request,
    error_answer,
    internal_error_answer,
    success_answer,
)
from .ray_settings import ServeSettings

log = logging.getLogger("ray.serve")  # Ray Serve writes this logger to the replica's log, with the request id

INVOCATION_PATHS = ("/", "/invocations")
PING_PATH = "/ping"
# Bodies up to this many bytes are admitted on the event loop (parsing and tokenizing them costs ~0.1 ms at 100
# bytes, ~0.4 ms at 1,000 on the 2-core host, so /ping waits at most that per request ahead of it); larger ones, up to
# InvokeEndpoint's 6 MB, on the admission thread, where their cost is theirs alone.
INLINE_ADMISSION_BYTES = 1024
# Consecutive failed forward passes after which the replica says it cannot serve (/ping 503, Ray's health check
# fails and Ray replaces the replica); one failure may be one bad input, three in a row are the model.
FAILED_PASSES_UNHEALTHY = 3
# A forward pass running this long is stuck: twice InvokeEndpoint's 60 s, which the worst admitted pass stays far
# inside (docs/serving.md, "Work per call").
STALLED_PASS_S = 120.0


@dataclass(frozen=True)
class Admitted:
    """One request that passed every check: its texts, their token ids (cut to the model's window) and its id."""

    texts: list[str]
    encodings: list[list[int]]
    request_id: str

    @property
    def tokens(self) -> int:
        return sum(len(ids) for ids in self.encodings)


def _json_answer(status: int, phrase: str, error: str) -> Answer:
    return Answer(status, json.dumps({"code": status, "message": phrase, "error": error}).encode())


def _request_id() -> str:
    # The id Ray Serve's proxy gives the request (its X-Request-Id answer header and replica log lines carry it).
    # A private accessor: Ray 2.57 has no public one (ray/serve/context.py).
    try:
        return str(serve.context._get_serve_request_context().request_id)
    except Exception:  # the id only labels a 500's message; never fail a request over it
        return "unknown"


class SentimentReplica:
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
        # Parsing and tokenizing a large request (up to 6 MB of text) runs off the event loop, which answers /ping,
        # and beside the forward pass, so the next pass's token count is known before it starts.
        self._admission = ThreadPoolExecutor(max_workers=1, thread_name_prefix="admission")
        # (request, its answer, when it arrived) in arrival order; a forward pass takes them from the front.
        self._waiting: list[tuple[Admitted, asyncio.Future[Answer], float]] = []
        self._invocations = 0  # invocations this replica holds (admitted, queued or in a forward pass)
        self._failed_passes = 0  # consecutive forward passes that raised
        self._pass_started: float | None = None  # time.monotonic() of the running forward pass
        self._draining: asyncio.Task[None] | None = None
        self._arrived: asyncio.Event | None = None
        self._arrived_loop: asyncio.AbstractEventLoop | None = None
        self._expected = 1  # nothing known yet: the first request starts at once
        import torch

        log.info(
            "sentiment model loaded from %s (%s, %s, %s, torch threads %d)",
            model_dir,
            settings,
            self.limits,
            self.predictor.options,
            torch.get_num_threads(),
        )

    def admit(self, body: bytes, headers: dict[str, str], request_id: str) -> Admitted | Answer:
        """A request's texts and tokens, or its 4xx (a 500 if parsing itself fails): every check but the model."""
        try:
            texts, encodings = admit_request(body, headers, self.limits, self.predictor.encode)
        except ClientError as error:
            log.info("request %s refused: %d %s", request_id, int(error.status), error)
            return error_answer(error)
        except Exception:  # a bug in parsing must not cost the replica its health
            log.exception("request %s: parsing failed", request_id)
            return internal_error_answer(request_id)
        return Admitted(texts, encodings, request_id)

    def answer_together(self, items: list[Admitted]) -> list[Answer]:
        """Answer ``items`` with one forward pass over their texts (grouped by length inside it), each request with
        its own answer; if the pass fails, each gets a 500 without detail."""
        texts = [text for item in items for text in item.texts]
        encodings = [ids for item in items for ids in item.encodings]
        started = self._pass_started = time.monotonic()
        try:
            predictions = self.predictor.predict_dicts(texts, encodings)
            if len(predictions) != len(texts):
                raise RuntimeError(f"{len(predictions)} predictions for {len(texts)} texts")
        except Exception:
            self._failed_passes += 1
            log.exception("forward pass over %d texts of %d requests failed", len(texts), len(items))
            return [internal_error_answer(item.request_id) for item in items]
        finally:
            self._pass_started = None
        answers, start = [], 0
        for item in items:
            # A prediction that is malformed or not a finite number is a 500 for its own request only.
            answers.append(success_answer(predictions[start : start + len(item.texts)], item.request_id))
            start += len(item.texts)
        # A pass that answered no request with a valid prediction counts as failed (a model that gives NaN for
        # everything cannot serve); one bad prediction among good ones is that input's, not the model's.
        valid = any(answer.status == 200 for answer in answers)
        self._failed_passes = 0 if valid else self._failed_passes + 1
        tokens = sum(map(len, encodings))
        log.info(
            "batch of %d requests answered with one forward pass (%d texts, %d tokens) in %.3f s",
            len(items),
            len(texts),
            tokens,
            time.monotonic() - started,
        )
        return answers

    def unhealthy(self) -> str | None:
        """Why this replica cannot serve (one sentence), or None."""
        if self._failed_passes >= FAILED_PASSES_UNHEALTHY:
            return f"the last {self._failed_passes} forward passes failed; see the replica's log"
        started = self._pass_started
        if started is not None and (running := time.monotonic() - started) > STALLED_PASS_S:
            return f"a forward pass has run for {running:.0f} s (more than {STALLED_PASS_S:.0f} s)"
        return None

    def check_health(self) -> None:
        """Ray Serve's periodic replica health check: a replica that cannot serve fails it and Ray replaces it."""
        if (reason := self.unhealthy()) is not None:
            raise RuntimeError(reason)

    def _expect(self, requests: int) -> None:
        """How many requests the next forward pass waits for (up to the wait): what the last round brought."""
        self._expected = max(1, min(self.settings.max_batch_size, requests))

    def _arrival(self) -> asyncio.Event:
        loop = asyncio.get_running_loop()
        if self._arrived is None or self._arrived_loop is not loop:
            self._arrived, self._arrived_loop = asyncio.Event(), loop
        return self._arrived

    @property
    def expected_requests(self) -> int:
        """How many requests the next forward pass waits for (up to ``batch_wait_timeout_s``)."""
        return self._expected

    async def answer(self, item: Admitted) -> Answer:
        """One admitted request's answer, from the forward pass that takes it."""
        (answer,) = await self.queue([item])
        return answer

    async def queue(self, items: list[Admitted]) -> list[Answer]:
        """Queue ``items`` for the forward pass, which takes them with the other requests waiting (up to
        max_batch_size and max_request_tokens), and wait for their answers."""
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

    def _take(self) -> list[tuple[Admitted, asyncio.Future[Answer], float]]:
        """The next forward pass: the waiting requests from the front, at most max_batch_size of them and at most
        max_request_tokens tokens together (always the first: it alone is within the limit, which admission checked),
        so no pass costs more than the worst request the contract admits."""
        taken: list[tuple[Admitted, asyncio.Future[Answer], float]] = []
        tokens = 0
        for entry in self._waiting[: self.settings.max_batch_size]:
            if taken and tokens + entry[0].tokens > self.limits.max_request_tokens:
                break
            taken.append(entry)
            tokens += entry[0].tokens
        return taken

    async def _drain(self) -> None:
        """Forward passes, one after another, while requests wait: each takes all of them, up to max_batch_size."""
        try:
            await self._drain_waiting()
        except BaseException as error:  # never leave a caller waiting on a future nobody will set
            for _, future, _ in self._waiting:
                if not future.done():
                    future.set_exception(error)
            self._waiting.clear()
            raise

    async def _drain_waiting(self) -> None:
        loop = asyncio.get_running_loop()
        free_since = loop.time()
        while self._waiting:
            await self._until_expected(free_since)
            taken = self._take()
            del self._waiting[: len(taken)]
            items = [item for item, _, _ in taken]
            try:
                answers = await loop.run_in_executor(self._forward, self.answer_together, items)
            except Exception as error:  # answer_together answers failures itself: this is the executor failing
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
            # Answered on the event loop, never queued: the forward pass and the admission of large requests run on
            # threads of their own (a small request holds the loop ~0.1 ms), and PING_RESERVE of the replica's Ray
            # slots are left to /ping (ServeSettings.max_ongoing_requests).
            if (reason := self.unhealthy()) is None:
                return Response(status_code=200)
            return _response(_json_answer(503, "Service Unavailable", f"this replica cannot serve: {reason}"))
        if path not in INVOCATION_PATHS:
            missing = {"code": 404, "message": "Not Found", "error": "POST to /invocations; GET /ping"}
            return Response(json.dumps(missing).encode(), status_code=404, media_type=JSON)
        limit = self.settings.max_invocations
        if self._invocations >= limit:
            # Refused at once, not queued: a request past the limit would wait longer than callers do.
            busy = f"this replica holds {limit} requests, its limit (8 x server_batch_size); retry"
            return _response(_json_answer(503, "Service Unavailable", busy))
        self._invocations += 1
        try:
            headers = dict(request.headers.items())  # starlette lower-cases the names; the protocol ignores case
            body, request_id = await request.body(), _request_id()
            if len(body) <= INLINE_ADMISSION_BYTES:
                admitted = self.admit(body, headers, request_id)
            else:
                loop = asyncio.get_running_loop()
                admitted = await loop.run_in_executor(self._admission, self.admit, body, headers, request_id)
            answer = admitted if isinstance(admitted, Answer) else await self.answer(admitted)
            return _response(answer)
        finally:
            self._invocations -= 1


# Ray Serve's deployment of the replica class, ``@serve.deployment`` called rather than written above the class: the
# class stays a class of this module, which mutation testing adds its mutants to (tests/mutation/plan.py).
SentimentDeployment = serve.deployment(name="SentimentClassifier")(SentimentReplica)


def _response(answer: Answer) -> Response:
    return Response(answer.body, status_code=answer.status, media_type=answer.content_type)


def build_app(model_dir: str | os.PathLike[str], environment: dict[str, Any] | None = None) -> Application:
    """The application config.yaml names (``deployment:app`` calls this with the archive's directory).

    Replicas, threads and batching come from the environment (:class:`ServeSettings`); each replica reserves its
    threads as Ray CPUs, so Ray never places more replicas than the host has cores for."""
    settings = ServeSettings.from_environment(os.environ if environment is None else environment)
    return SentimentDeployment.options(
        num_replicas=settings.replicas,
        max_ongoing_requests=settings.max_ongoing_requests,
        ray_actor_options={"num_cpus": settings.threads},
    ).bind(str(Path(model_dir)), settings)
