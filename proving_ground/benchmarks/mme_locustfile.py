"""Locust users for the multi-model endpoint: the three traffic patterns of AWS's multi-model blog post over N models.

    UniformUser   every model equally often
    HotModelUser  one hot model takes 90% (task weights 9:1)
    TopTenUser    the top 10 models take 8/9 ~ 89% (task weights 8:1)

Against a deployed endpoint (boto3 ``invoke_endpoint`` with ``TargetModel``, no SDK retries: they hide failures):

    locust -f proving_ground/benchmarks/mme_locustfile.py --headless -u 50 -r 10 -t 5m --csv out/hot \\
        --endpoint-name <EndpointName output> --models 1000 HotModelUser

Against the local harness, run ``python -m proving_ground.benchmarks.mme_load_test`` (it starts the server and sets
``target``).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from locust import User, between, events, task

from proving_ground.benchmarks.mme_request import CONTENT_TYPE, REQUEST_BODY

DEFAULT_NAME_TEMPLATE = "sentiment-{index:04d}.tar.gz"
HOT_SET = 10


class InvokeError(RuntimeError):
    """A request that failed: an error answer or a refused call (counted, never retried)."""


# Set by the runner (local harness) or from the command line (deployed endpoint): invoke(model) -> (cold, size);
# raises InvokeError (or OSError for the network) when the request fails.
target: Callable[[str], tuple[bool | None, int]] | None = None
models = 1000
name_template = DEFAULT_NAME_TEMPLATE


@events.init_command_line_parser.add_listener
def _arguments(parser: Any) -> None:
    parser.add_argument("--endpoint-name", default="", help="SageMaker endpoint (stack output EndpointName)")
    parser.add_argument("--region", default=None, help="AWS region of the endpoint")
    parser.add_argument("--models", type=int, default=1000, help="how many models the endpoint has")
    parser.add_argument("--name-template", default=DEFAULT_NAME_TEMPLATE, help="TargetModel of model {index}")


@events.init.add_listener
def _configure(environment: Any, **_: Any) -> None:
    global target, models, name_template
    options = environment.parsed_options
    if options is None or target is not None:  # the runner configured us
        return
    if not options.endpoint_name:
        raise SystemExit(
            "--endpoint-name is required (or run proving_ground/benchmarks/mme_load_test.py for the local harness)"
        )
    models, name_template = options.models, options.name_template
    target = sagemaker_target(options.endpoint_name, options.region)


def sagemaker_target(endpoint_name: str, region: str | None) -> Callable[[str], tuple[bool | None, int]]:
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    runtime = boto3.client(
        "sagemaker-runtime", region_name=region, config=Config(retries={"max_attempts": 1, "mode": "standard"})
    )

    def invoke(model: str) -> tuple[bool | None, int]:
        try:
            answer = runtime.invoke_endpoint(
                EndpointName=endpoint_name, TargetModel=model, ContentType=CONTENT_TYPE, Body=REQUEST_BODY
            )
        except (BotoCoreError, ClientError) as error:
            raise InvokeError(str(error)) from error
        return None, len(answer["Body"].read())  # the endpoint does not say whether it loaded the model

    return invoke


def model_name(index: int) -> str:
    return name_template.format(index=index)


class PatternUser(User):
    abstract = True
    wait_time = between(0, 0)  # closed loop: each user sends its next request when the last one returns
    pattern = ""

    def _invoke(self, index: int) -> None:
        if target is None:
            raise RuntimeError(
                "mme_locustfile.target is not set: proving_ground.benchmarks.mme_load_test sets it before a run"
            )
        name = model_name(index)
        started = time.perf_counter()
        cold, size, error = None, 0, None
        try:
            cold, size = target(name)
        except (InvokeError, OSError) as failure:  # counted as errors, never retried
            error = failure
        events.request.fire(
            request_type=self.pattern,
            name={True: "cold", False: "warm", None: "invoke"}[cold],
            response_time=(time.perf_counter() - started) * 1000,
            response_length=size,
            exception=error,
            context={"model": name},
        )


class UniformUser(PatternUser):
    """Every model equally often (the blog post's ``locust_distributed.py``)."""

    pattern = "uniform"

    @task
    def any_model(self) -> None:
        self._invoke(random.randrange(models))


class HotModelUser(PatternUser):
    """Model 0 takes 9 of 10 requests (the blog post's ``locust_script_one.py``)."""

    pattern = "hot-model"

    @task(9)
    def hot_model(self) -> None:
        self._invoke(0)

    @task(1)
    def other_model(self) -> None:
        self._invoke(random.randrange(1, models))


class TopTenUser(PatternUser):
    """Models 0-9 take 8 of 9 requests (the blog post's ``locust_top_n.py``)."""

    pattern = "top-10"

    @task(8)
    def top_model(self) -> None:
        self._invoke(random.randrange(min(HOT_SET, models)))

    @task(1)
    def tail_model(self) -> None:
        self._invoke(random.randrange(HOT_SET, models) if models > HOT_SET else random.randrange(models))


PATTERNS: dict[str, type[PatternUser]] = {cls.pattern: cls for cls in (UniformUser, HotModelUser, TopTenUser)}
