"""Call the deployed sentiment endpoint: ``invoke`` for people, ``smoke-test`` for people and the promotion pipeline.

    python -m inference_assets.tools.endpoint_client invoke --endpoint-name <name> "Covid cases are increasing fast!"
    python -m inference_assets.tools.endpoint_client smoke-test --endpoint-name <name> --region us-west-2 \
        --expect-labels negative,neutral,positive --exact-label negative

``smoke-test`` waits until the endpoint is InService, sends one prediction and checks the answer's shape and that
its label is in the expected set; it exits 0 when all holds and 1 (with the reason on stderr) otherwise.
The endpoint name is the GravitonEndpoint stack's ``EndpointName`` output.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

DEFAULT_TEXT = "Covid cases are increasing fast!"
DEFAULT_LABELS = ("negative", "neutral", "positive")
JSON = "application/json"


class SmokeTestFailed(RuntimeError):
    """The endpoint is not serving as expected; the message says what was seen."""


def invoke(runtime: Any, endpoint_name: str, texts: Sequence[str]) -> list[dict]:
    """One request carrying ``texts``; returns one ``{"label", "score", "scores"}`` per text."""
    response = runtime.invoke_endpoint(
        EndpointName=endpoint_name,
        ContentType=JSON,
        Accept=JSON,
        Body=json.dumps({"inputs": list(texts)}).encode(),
    )
    return json.loads(response["Body"].read())


def wait_in_service(sagemaker: Any, endpoint_name: str, *, timeout_s: float, poll_s: float = 30.0) -> None:
    """Return once the endpoint is InService; raise SmokeTestFailed if it failed or the time ran out."""
    deadline = time.monotonic() + timeout_s
    while True:
        description = sagemaker.describe_endpoint(EndpointName=endpoint_name)
        status = description["EndpointStatus"]
        if status == "InService":
            return
        if status in ("Failed", "OutOfService", "Deleting"):
            reason = description.get("FailureReason", "no failure reason given")
            raise SmokeTestFailed(f"endpoint {endpoint_name} is {status}: {reason}")
        if time.monotonic() + poll_s > deadline:
            raise SmokeTestFailed(f"endpoint {endpoint_name} still {status} after {timeout_s:.0f} s")
        print(f"endpoint {endpoint_name} is {status}; waiting", file=sys.stderr)
        time.sleep(poll_s)


def check_prediction(answer: object, labels: Sequence[str], expected_label: str | None) -> dict:
    """The answer for one text: a list of one prediction whose label is known and whose scores are probabilities."""
    if not isinstance(answer, list) or len(answer) != 1 or not isinstance(answer[0], dict):
        raise SmokeTestFailed(f"expected a list with one prediction, got {answer!r}")
    prediction = answer[0]
    label, score, scores = prediction.get("label"), prediction.get("score"), prediction.get("scores")
    if label not in labels:
        raise SmokeTestFailed(f"label {label!r} is not one of {', '.join(labels)}")
    if expected_label is not None and label != expected_label:
        raise SmokeTestFailed(f"label {label!r} is not the expected {expected_label!r} (scores {scores})")
    if not isinstance(scores, dict) or set(scores) != set(labels):
        raise SmokeTestFailed(f"scores must name exactly the labels {', '.join(labels)}, got {scores!r}")
    if not isinstance(score, int | float) or not 0.0 <= score <= 1.0 or abs(sum(scores.values()) - 1.0) > 1e-3:
        raise SmokeTestFailed(f"score {score!r} and scores {scores!r} are not probabilities")
    return prediction


def smoke_test(
    sagemaker: Any,
    runtime: Any,
    endpoint_name: str,
    *,
    text: str = DEFAULT_TEXT,
    labels: Sequence[str] = DEFAULT_LABELS,
    expected_label: str | None = None,
    timeout_s: float = 1800.0,
    poll_s: float = 30.0,
) -> dict:
    wait_in_service(sagemaker, endpoint_name, timeout_s=timeout_s, poll_s=poll_s)
    try:
        answer = invoke(runtime, endpoint_name, [text])
    except json.JSONDecodeError as error:
        raise SmokeTestFailed(f"the endpoint answered something other than JSON: {error}") from None
    except runtime.exceptions.ModelError as error:
        # The model container answered an error: the toolkit's first line is the reason.
        message = str(error.response.get("OriginalMessage") or error).splitlines()[0]
        raise SmokeTestFailed(f"the model answered {error.response.get('OriginalStatusCode')}: {message}") from None
    return check_prediction(answer, labels, expected_label)


def main(argv: list[str] | None = None, *, session: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--endpoint-name", required=True, help="the GravitonEndpoint stack's EndpointName output")
    common.add_argument("--region", help="AWS region of the endpoint (default: the session's)")
    commands = parser.add_subparsers(dest="command", required=True)
    invoke_parser = commands.add_parser("invoke", parents=[common], help="classify texts and print the JSON answer")
    invoke_parser.add_argument("texts", nargs="+", help="one or more texts (one request)")
    smoke = commands.add_parser(
        "smoke-test", parents=[common], help="InService + one prediction with a label from the expected set"
    )
    smoke.add_argument("--text", default=DEFAULT_TEXT)
    smoke.add_argument(
        "--expect-labels", default=",".join(DEFAULT_LABELS), help="comma-separated label set the answer must use"
    )
    smoke.add_argument("--exact-label", help="the one label this text must get (e.g. negative)")
    smoke.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for InService")
    smoke.add_argument("--poll", type=float, default=30.0, help="seconds between status checks")
    args = parser.parse_args(argv)

    if session is None:
        import boto3

        session = boto3.session.Session(region_name=args.region)
    runtime = session.client("sagemaker-runtime")
    if args.command == "invoke":
        try:
            print(json.dumps(invoke(runtime, args.endpoint_name, args.texts), indent=2))
        except runtime.exceptions.ModelError as error:
            message = str(error.response.get("OriginalMessage") or error).splitlines()[0]
            print(f"error: the model answered {error.response.get('OriginalStatusCode')}: {message}", file=sys.stderr)
            return 1
        return 0

    labels = [label.strip() for label in args.expect_labels.split(",") if label.strip()]
    if args.exact_label is not None and args.exact_label not in labels:
        parser.error(f"--exact-label {args.exact_label!r} is not in --expect-labels {','.join(labels)}")
    try:
        prediction = smoke_test(
            session.client("sagemaker"),
            runtime,
            args.endpoint_name,
            text=args.text,
            labels=labels,
            expected_label=args.exact_label,
            timeout_s=args.timeout,
            poll_s=args.poll,
        )
    except SmokeTestFailed as failure:
        print(f"smoke test FAILED: {failure}", file=sys.stderr)
        return 1
    print(f"smoke test passed: {args.endpoint_name} -> {json.dumps(prediction)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
