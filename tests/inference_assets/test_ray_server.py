"""The archive served by Ray Serve on localhost, started as the endpoint's container starts it (the archive's own
``sentiment_serving.ray_server`` running its ``config.yaml`` + ``deployment.py``).

Both servers run as ``pytorch-platform serve`` runs from a script (``python -m inference_assets.local.local_server
... &``: a background job, SIGINT inherited ignored), and each test that stops one stops it with a signal on the
command's own pid, which must stop every process of its tree (issue 21: SIGTERM for the module's server, SIGINT for
the second; test_local_shutdown.py checks the multi-model harness). A Ray Serve start costs ~12 CPU-seconds and
20-40 s here, so there are two: the module's, with one replica and batching on, and a second beside it with two
replicas (the balancing and the stopping tests share it). Predictions must equal the in-process predictor's;
concurrent requests must share one forward pass (the replica's batching queue) and keep their own status and
Content-Type; every request of the shared table (tests/inference_assets/request_table.py) must get its status with a
one-line JSON body and no traceback or path, and the server must keep answering afterwards. Started as the endpoint
starts it, one replica serves the port itself (Ray Serve's throughput-optimized mode with direct ingress); with two,
Ray's proxy serves the port and spreads the requests.
"""

from __future__ import annotations

import http.client
import json
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import yaml

from inference_assets.container.predictor import SentimentPredictor
from inference_assets.local.local_server import ContainerRequests
from tests.inference_assets.harness_processes import harness_tree, kill_tree, start_harness, stop_and_check
from tests.inference_assets.request_table import LEAKS, REQUESTS, TEST_LIMITS

MAX_REQUEST_BATCH = TEST_LIMITS.max_request_batch
BATCH_SIZE = 4
pytestmark = pytest.mark.slow

SAMPLE_DATA = Path(__file__).resolve().parents[2] / "training_assets" / "sample_data" / "validation.jsonl"


@dataclass(frozen=True)
class _Harness(ContainerRequests):
    """The local server's command (``pytorch-platform serve``), run as a script's background job: its process, port
    and work directory, and requests to it."""

    process: subprocess.Popen
    port: int
    workdir: Path

    @property
    def model_dir(self) -> Path:
        return self.workdir / "opt_ml" / "model"

    @property
    def log_path(self) -> Path:
        return self.workdir / "server.log"

    def processes(self) -> list[psutil.Process]:
        """The container's command (``sentiment_serving.ray_server``, the harness's child) and what it started."""
        launcher = next(
            child for child in psutil.Process(self.process.pid).children()
            if "sentiment_serving.ray_server" in " ".join(child.cmdline())
        )  # fmt: skip
        return [launcher, *launcher.children(recursive=True)]

    def replica_logs(self) -> list[Path]:
        """What the replicas logged (Ray Serve writes each replica's log under the session's logs/serve/)."""
        return sorted((self.workdir / "tmp").glob("ray/session_latest/logs/serve/replica_*.log"))


_SERVING = re.compile(r"at http://127\.0\.0\.1:(\d+) \(/ping, /invocations\); work dir (\S+)\n")


@contextmanager
def _harness(model_archive: Path, log: Path, *options: str) -> Iterator[_Harness]:
    """``python -m inference_assets.local.local_server --model <archive> <options>`` as a background job, serving;
    killed with its tree afterwards if a test has not stopped it."""
    process, match = start_harness(["inference_assets.local.local_server", "--model", str(model_archive), *options],
                                   _SERVING, log)  # fmt: skip
    try:
        yield _Harness(process, int(match[1]), Path(match[2]))
    finally:
        if process.poll() is None:
            kill_tree(process, int(match[1]))


@pytest.fixture(scope="module")
def server(model_archive: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Harness]:
    """The module's server, started by the local server's command as a script starts it: one replica, batches of at
    most BATCH_SIZE that wait up to 300 ms (long, so that concurrent test requests reliably share a batch), the
    request table's limits.

    When the module's tests are done, in whatever order they ran, ``kill <pid>`` (SIGTERM) on the command must stop
    it and every process of its tree and close its port: checked here, so that no test has to run last (a failed
    stop is an error of the module's last test)."""
    with _harness(
        model_archive, tmp_path_factory.mktemp("server") / "harness.out",
        "--workers", "1", "--batch-size", str(BATCH_SIZE), "--max-batch-delay-ms", "300",
        "--max-request-batch", str(TEST_LIMITS.max_request_batch),
        "--max-request-bytes", str(TEST_LIMITS.max_request_bytes),
    ) as harness:  # fmt: skip
        yield harness
        stop_and_check(harness.process, harness.port, signal.SIGTERM, "ray::ServeReplica")


@pytest.fixture(scope="module")
def predictor(tiny_model_dir: Path) -> SentimentPredictor:
    return SentimentPredictor(tiny_model_dir)


@pytest.fixture(scope="module")
def texts() -> list[str]:
    rows = [json.loads(line) for line in SAMPLE_DATA.read_text().splitlines() if line.strip()]
    return [row["text"] for row in rows[:MAX_REQUEST_BATCH]]


def _expected(predictor: SentimentPredictor, texts: list[str]) -> list[dict]:
    return [prediction.as_dict() for prediction in predictor.predict(texts)]


def _assert_same_predictions(served: list[dict], expected: list[dict]) -> None:
    assert [p["label"] for p in served] == [p["label"] for p in expected]
    for got, want in zip(served, expected, strict=True):
        assert got["scores"] == pytest.approx(want["scores"], abs=1e-5)
        assert got["score"] == pytest.approx(want["score"], abs=1e-5)


def _replica_log(server: _Harness) -> str:
    """What the replica logged."""
    return "\n".join(path.read_text(errors="replace") for path in server.replica_logs())


def test_ping_answers_with_an_empty_200(server: _Harness) -> None:
    status, _, body = server.request("GET", "/ping")
    assert (status, body) == (200, b"")


def test_ray_serve_runs_the_archive_config_and_deployment(server: _Harness) -> None:
    config = yaml.safe_load((server.model_dir / "config.yaml").read_text())
    assert config["applications"] == [{"name": "sentiment", "route_prefix": "/", "import_path": "deployment:app"}]
    assert (server.model_dir / "deployment.py").is_file()
    commands = [" ".join(process.cmdline()) for process in server.processes()]
    assert "-m sentiment_serving.ray_server serve" in commands[0]  # as SageMaker starts it: `<image> serve`
    assert any(command.startswith("ray::ServeReplica:sentiment:SentimentClassifier") for command in commands)
    assert f"Ray Serve: {server.model_dir}/config.yaml on http://127.0.0.1:{server.port}" in server.log_path.read_text()


def test_the_replica_runs_with_the_endpoint_threads_and_batch_settings(server: _Harness) -> None:
    log = _replica_log(server)
    threads = int(server.processes()[0].environ()["OMP_NUM_THREADS"])  # the endpoint's rule for the host's cores
    assert f"torch threads {threads})" in log, log[-2000:]
    assert f"ServeSettings(replicas=1, threads={threads}, max_batch_size={BATCH_SIZE}, batch_wait_timeout_s=0.3)" in log


def _listener(processes: list[psutil.Process], port: int) -> psutil.Process:
    """The process of a server's tree that listens on its port (the port SageMaker's requests arrive on)."""
    for process in processes:
        try:
            connections = process.net_connections(kind="tcp")
        except psutil.Error:
            continue
        if any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in connections):
            return process
    raise AssertionError(f"no process of the server listens on {port}")


def test_one_replica_serves_the_sagemaker_port_itself(server: _Harness, texts: list[str]) -> None:
    """Started as the endpoint starts it, the server runs Ray Serve's throughput-optimized mode with direct ingress:
    the replica that holds the model owns the port, and /ping and /invocations are answered there."""
    listener = _listener(server.processes(), server.port)
    assert listener.cmdline()[0].startswith("ray::ServeReplica:sentiment:SentimentClassifier")
    assert server.request("GET", "/ping")[::2] == (200, b"")
    status, _, body = server.invoke(json.dumps({"inputs": texts[0]}).encode())
    assert status == 200 and len(json.loads(body)) == 1, body


@pytest.fixture(scope="module")
def second_server(
    model_archive: Path, server: _Harness, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[_Harness]:
    """A second server on the same host, started while the module's serves, with two replicas (Ray's proxy on the
    port): one test balances over it, then stops it with SIGINT on its pid (one Ray start for both)."""
    with _harness(
        model_archive, tmp_path_factory.mktemp("second-server") / "harness.out",
        "--workers", "2", "--max-batch-delay-ms", "2",
    ) as harness:  # fmt: skip
        yield harness


def test_several_replicas_are_balanced_by_rays_proxy_and_stop_on_sigint(second_server: _Harness,
                                                                         server: _Harness) -> None:  # fmt: skip
    """One port reaches one replica: with two, Ray's proxy listens on the port and spreads the requests. Then the
    second server stops on ``kill -INT <pid>`` (a script's background job: SIGINT inherited ignored), leaving no
    process and a closed port, without touching the module's server. One test, so that no order is needed."""
    two = second_server
    assert two.port != server.port
    assert _listener(harness_tree(two.process.pid, two.port), two.port).cmdline()[0].startswith("ray::ProxyActor")
    assert two.invoke(b'{"inputs": "hi"}')[0] == 200  # one replica holds the model; the proxy routes only to those up
    deadline = time.monotonic() + 120
    while sum("sentiment model loaded" in path.read_text(errors="replace") for path in two.replica_logs()) < 2:
        assert time.monotonic() < deadline, "the second replica did not load the model"
        time.sleep(0.5)
    time.sleep(2)  # the controller tells the proxy's router about the new replica
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda n: two.invoke(f"text {n}".encode(), content_type="text/plain"), range(32)))
    assert [status for status, _, _ in answers] == [200] * 32
    logs = two.replica_logs()
    passes = [path.read_text(errors="replace").count("requests answered with one forward pass") for path in logs]
    assert len(passes) == 2 and min(passes) >= 1, passes
    stop_and_check(two.process, two.port, signal.SIGINT, "ray::ServeReplica")
    assert server.ping() == 200


def test_single_text_matches_the_in_process_predictor(
    server: _Harness, predictor: SentimentPredictor, texts: list[str]
) -> None:
    status, headers, body = server.invoke(json.dumps({"inputs": texts[0]}).encode())
    assert status == 200, body
    assert headers["content-type"] == "application/json"
    _assert_same_predictions(json.loads(body), _expected(predictor, [texts[0]]))


def test_batch_matches_the_in_process_predictor_in_order(
    server: _Harness, predictor: SentimentPredictor, texts: list[str]
) -> None:
    status, _, body = server.invoke(json.dumps({"inputs": texts}).encode())
    assert status == 200, body
    served = json.loads(body)
    assert len(served) == len(texts)
    _assert_same_predictions(served, _expected(predictor, texts))


def test_the_root_route_answers_as_invocations_does(server: _Harness, texts: list[str]) -> None:
    """AWS's Ray Serve DLC proxies /invocations to the application's route "/" (sagemaker_serve.py)."""
    body = json.dumps({"inputs": texts[:2]}).encode()
    via_root = server.request("POST", "/", body, {"Content-Type": "application/json"})
    via_invocations = server.invoke(body)
    assert via_root[0] == via_invocations[0] == 200
    assert json.loads(via_root[2]) == json.loads(via_invocations[2])


def test_other_paths_are_404_with_one_line_of_json(server: _Harness) -> None:
    status, headers, body = server.request("POST", "/predictions/model", b"{}", {"Content-Type": "application/json"})
    assert status == 404 and headers["content-type"] == "application/json" and b"\n" not in body
    assert json.loads(body)["code"] == 404


@pytest.mark.parametrize("content_type", ["text/plain", "text/plain; charset=utf-8"])
def test_plain_text_is_one_input(
    server: _Harness, predictor: SentimentPredictor, texts: list[str], content_type: str
) -> None:
    status, _, body = server.invoke(texts[1].encode(), content_type=content_type)
    assert status == 200, body
    _assert_same_predictions(json.loads(body), _expected(predictor, [texts[1]]))


@pytest.mark.parametrize("accept", ["application/json", "*/*", "application/json, text/plain;q=0.5"])
def test_json_compatible_accept_headers_are_served(server: _Harness, accept: str) -> None:
    status, _, body = server.invoke(b'{"inputs": "fine"}', accept=accept)
    assert status == 200, body


@pytest.mark.parametrize(("body", "content_type", "accept", "status", "fragment"), REQUESTS)
def test_every_request_gets_its_status_and_one_line_of_json(
    server: _Harness, body: bytes, content_type: str | None, accept: str | None, status: int, fragment: str
) -> None:
    got_status, headers, answer = server.invoke(body, content_type=content_type, accept=accept)
    assert got_status == status, answer
    assert headers["content-type"] == "application/json"
    assert answer.count(b"\n") == 0 and not [leak for leak in LEAKS if leak in answer.decode()]
    if status != 200:
        assert json.loads(answer) == {"code": status, "message": json.loads(answer)["message"], "error": ANY_TEXT}
        assert fragment in json.loads(answer)["error"]
    assert server.invoke(b'{"inputs": "still here?"}')[0] == 200


class _AnyText:
    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and bool(other)


ANY_TEXT = _AnyText()


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH"])
def test_other_methods_on_invocations_get_a_4xx_json_answer(server: _Harness, method: str) -> None:
    """Any method on /invocations reaches the protocol, as TorchServe's did: no body is a 4xx, not a 500."""
    for headers in ({}, {"Content-Type": "application/json"}):
        status, answer_headers, answer = server.request(method, "/invocations", headers=headers)
        assert 400 <= status < 500, (method, status, answer)
        assert answer_headers["content-type"] == "application/json" and b"\n" not in answer
    assert server.ping() == 200


def test_a_multipart_form_is_refused_with_415(server: _Harness) -> None:
    body = b'--xx\r\nContent-Disposition: form-data; name="inputs"\r\n\r\nhello\r\n--xx--\r\n'
    status, _, answer = server.invoke(body, content_type="multipart/form-data; boundary=xx")
    assert status == 415, answer


def _batches(server: _Harness) -> list[int]:
    """The size of every batch the replica logged, once its log has stopped growing (it is written asynchronously)."""
    sizes: list[int] = []
    for _ in range(20):
        again = [int(size) for size in re.findall(r"batch of (\d+) requests answered", _replica_log(server))]
        if again == sizes and sizes:
            break
        sizes = again
        time.sleep(0.5)
    return sizes


def test_concurrent_requests_share_one_forward_pass_and_keep_their_own_answers(
    server: _Harness, predictor: SentimentPredictor, texts: list[str]
) -> None:
    requests = [
        (json.dumps({"inputs": texts[:2]}).encode(), "application/json", 200),
        (b"{broken", "application/json", 400),
        (texts[2].encode(), "text/plain", 200),
        (b"a,b", "text/csv", 415),
        # Bad requests are refused at admission and never reach a batch: two more good ones keep the rounds large
        # enough to share passes (a round of one good request is answered alone by design).
        (texts[3].encode(), "text/plain", 200),
        (texts[0].encode(), "text/plain", 200),
    ]

    def burst() -> list[tuple[int, dict[str, str], bytes]]:
        # Connected first, then sent at once: the replica serves the port itself (no proxy between), and requests
        # that reach it more than a (tiny model's) forward pass apart are rounds of their own by design.
        together = threading.Barrier(len(requests))

        def send(request: tuple[bytes, str, int]) -> tuple[int, dict[str, str], bytes]:
            connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
            try:
                connection.connect()
                together.wait(timeout=30)
                connection.request("POST", "/invocations", body=request[0], headers={"Content-Type": request[1]})
                response = connection.getresponse()
                return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
            finally:
                connection.close()

        with ThreadPoolExecutor(len(requests)) as pool:
            return list(pool.map(send, requests))

    # A batch waits (here up to 300 ms) for as many requests as the last forward pass answered (plus those that
    # queued during it): after the lone requests of the tests before, a burst's first request runs alone and the
    # others queue during its pass, so the pass after it takes them together, and the next burst is awaited whole.
    # On a loaded host the senders can straggle by more than a (tiny model's) pass, and a burst ends in a pass of
    # one: bursts until one ends in a shared pass (a few at most), then the burst that is checked.
    for _ in range(5):
        before = len(_batches(server))
        burst()
        if _batches(server)[before:][-1:] > [1]:
            break
    before = len(_batches(server))
    answers = burst()
    for (_, _, expected_status), (status, headers, body) in zip(requests, answers, strict=True):
        assert status == expected_status, body
        assert headers["content-type"] == "application/json"
    _assert_same_predictions(json.loads(answers[0][2]), _expected(predictor, texts[:2]))
    _assert_same_predictions(json.loads(answers[2][2]), _expected(predictor, [texts[2]]))
    batches = _batches(server)[before:]
    # The two good requests shared a forward pass; the bad ones were refused at admission, before any batch.
    good = sum(1 for _, _, status in requests if status == 200)
    assert sum(batches) == good and max(batches) > 1, batches


def test_a_batch_never_exceeds_the_configured_size(server: _Harness) -> None:
    before = len(_batches(server))
    with ThreadPoolExecutor(3 * BATCH_SIZE) as pool:
        answers = list(pool.map(lambda n: server.invoke(f"text {n}".encode(), content_type="text/plain"), range(12)))
    statuses = [status for status, _, _ in answers]
    assert statuses == [200] * 12
    batches = _batches(server)[before:]
    assert sum(batches) == 12 and max(batches) <= BATCH_SIZE, batches


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [("--max-request-batch", "0", "max_request_batch"), ("--max-request-bytes", "100", "max_request_bytes")],
)
def test_the_command_refuses_limits_out_of_bounds(
    option: str, value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from inference_assets.local.local_server import main

    with pytest.raises(SystemExit) as exit_:
        main(["--model", "model.tar.gz", option, value])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_ping_stays_quick_while_the_queue_is_full(server: _Harness) -> None:
    """Many more clients than the replica holds (max_invocations: 8 x BATCH_SIZE), each sending the most texts a
    request may carry: the queue fills (the surplus is refused with a 503 naming the limit, not queued), and /ping,
    asked all along, answers 200 within 2 s every time."""
    limit = 8 * BATCH_SIZE
    body = json.dumps({"inputs": ["a long review of a long film " * 40] * MAX_REQUEST_BATCH}).encode()
    stop = threading.Event()
    pings: list[tuple[int, float]] = []

    def pinging() -> None:
        while not stop.is_set():
            started = time.monotonic()
            pings.append((server.ping(), time.monotonic() - started))
            time.sleep(0.05)

    pinger = threading.Thread(target=pinging)
    pinger.start()
    try:
        with ThreadPoolExecutor(3 * limit) as pool:
            answers = list(pool.map(lambda _: server.invoke(body), range(6 * limit)))
    finally:
        stop.set()
        pinger.join()
    statuses = [status for status, _, _ in answers]
    refused = [json.loads(answer)["error"] for status, _, answer in answers if status == 503]
    assert set(statuses) <= {200, 503} and statuses.count(200) >= limit, statuses
    assert refused and all(f"holds {limit} requests, its limit" in error for error in refused)
    assert pings and all(status == 200 and seconds < 2 for status, seconds in pings), pings
    assert server.ping() == 200 and server.invoke(b"after the load", content_type="text/plain")[0] == 200
