"""Serve a model.tar.gz on localhost with the server the Graviton endpoint runs: Ray Serve, through the archive's
own ``config.yaml`` + ``deployment.py`` (the serving contract of AWS's Ray Serve DLC, see
``inference_assets/container/ray_deployment.py``).

The container runs ``python -m sentiment_serving.ray_server`` with the archive unpacked at /opt/ml/model and
PYTHONPATH=/opt/ml/model:/opt/ml/model/code; here the archive is unpacked under a private work directory and the
same module, the archive's own copy, runs with the same PYTHONPATH and the endpoint's environment
(``endpoint_environment()``). What differs from the container, and why:

- Ray Serve listens on 127.0.0.1 and a free port instead of 0.0.0.0:8080, and Ray's own ports are the free ones
  Ray picks for a local instance: several servers (tests, the benchmark, other sessions) run on one host.
- ``TMPDIR`` is private to the server: Ray keeps its session directory, sockets and logs there (its default
  /tmp/ray is shared host-wide), so no server finds or touches another's Ray.
- ``RAY_ADDRESS`` is removed and ``address="local"`` starts a new Ray instance: never another session's.

The launcher's Ray Serve mode is the container's too (``ray_server.LAUNCHER_DEFAULTS``: throughput-optimized, and
with one replica that replica listens on the port itself, direct ingress); ``environment_overrides`` can set Ray
Serve's variables for experiments (``RAY_SERVE_THROUGHPUT_OPTIMIZED=0``: Ray's proxy in front, as before).

    python -m inference_assets.local.local_server --model model.tar.gz   # serves until Ctrl-C or SIGTERM
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import sys
import tarfile
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inference_assets.container.contract import Limits
from inference_assets.local.server_process import GRACEFUL_STOP, ServerCommand, ServerProcess, StopStep, free_port
from inference_assets.local.shutdown import stop_signals_as_interrupt
from inference_assets.tools.endpoint_environment import endpoint_environment

# The launcher shuts Serve and Ray down on SIGTERM (as SageMaker stops a container); the group is stopped after.
RAY_STOP = (StopStep(signal.SIGTERM, 30.0, leader_only=True), *GRACEFUL_STOP)
# What the container runs (the image's command), here from the unpacked archive's code/ folder.
SERVER_MODULE = "sentiment_serving.ray_server"


class ContainerRequests:
    """Requests to the SageMaker routes of a serving container listening on 127.0.0.1:``port``."""

    port: int

    def request(
        self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        finally:
            connection.close()

    def ping(self) -> int:
        return self.request("GET", "/ping")[0]

    def invoke(
        self, body: bytes, *, content_type: str | None = "application/json", accept: str | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        headers = {}
        if content_type is not None:
            headers["Content-Type"] = content_type
        if accept is not None:
            headers["Accept"] = accept
        return self.request("POST", "/invocations", body, headers)


class LocalRayServer(ContainerRequests):
    """Ray Serve serving one model archive on 127.0.0.1, started as the endpoint's container starts it.

    ``with LocalRayServer(archive, workers=1) as server: server.invoke(b'{"inputs": "hi"}')``
    """

    def __init__(
        self,
        model: Path,
        *,
        vcpus: int | None = None,
        environment_overrides: Mapping[str, str | None] | None = None,
        startup_timeout_s: float = 240.0,
        **serving_options: Any,
    ) -> None:
        """``serving_options`` are endpoint_environment()'s keywords (workers, batch_size, max_batch_delay_ms, limits,
        fast paths); unset ones take the endpoint's defaults, so the local server runs as the endpoint does."""
        self.model = Path(model)
        self.environment = endpoint_environment(vcpus=vcpus or os.cpu_count() or 1, **serving_options)
        # Experiments only (e.g. the benchmark's OMP_WAIT_POLICY comparison); None removes a variable.
        overrides = dict(environment_overrides or {})
        self.environment.update({name: value for name, value in overrides.items() if value is not None})
        self._unset = [name for name, value in overrides.items() if value is None]
        self.startup_timeout_s = startup_timeout_s
        self.port = 0
        self.workdir: Path | None = None
        self._server: ServerProcess | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "server.log"

    @property
    def model_dir(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "opt_ml" / "model"

    def _unpack(self, model_dir: Path) -> None:
        model_dir.mkdir(parents=True)
        if self.model.is_dir():
            shutil.copytree(self.model, model_dir, dirs_exist_ok=True)
            return
        with tarfile.open(self.model) as tar:
            tar.extractall(model_dir, filter="data")

    def start(self) -> LocalRayServer:
        if not self.model.exists():
            raise FileNotFoundError(f"no model archive or directory at {self.model}")
        self.workdir = Path(tempfile.mkdtemp(prefix="ray-serve-local-"))
        self._unpack(self.model_dir)
        (self.workdir / "tmp").mkdir()
        self.port = free_port()
        environment = {
            **os.environ,
            **self.environment,
            "PYTHONPATH": f"{self.model_dir}{os.pathsep}{self.model_dir / 'code'}",  # as the image sets it
            "SM_MODEL_DIR": str(self.model_dir),
            "TMPDIR": str(self.workdir / "tmp"),
            "RAY_USAGE_STATS_ENABLED": "0",  # no usage report leaves the host (the endpoint has no egress either)
        }
        environment.pop("RAY_ADDRESS", None)
        for name in self._unset:
            environment.pop(name, None)
        self._server = ServerProcess(
            ServerCommand(
                argv=[sys.executable, "-m", SERVER_MODULE, "serve", "--host", "127.0.0.1", "--port", str(self.port)],
                # The deployment answers /ping itself: 200 means a replica holds the model.
                ready=lambda: self.ping() == 200,
                environment=environment,
                cwd=self.workdir,
                log_path=self.log_path,
                startup_timeout_s=self.startup_timeout_s,
                stop_steps=RAY_STOP,
            )
        )
        try:
            self._server.start()
        except BaseException:
            self.stop()
            raise
        return self

    def log_tail(self, lines: int = 40) -> str:
        return self._server.log_tail(lines) if self._server is not None else "(no log)"

    @property
    def process_group(self) -> int:
        """The server's process group: the launcher (Ray's driver), Ray's GCS, raylet and agents. Ray's workers
        (Serve's controller, proxy and replicas) run in groups of their own, as children of the raylet."""
        assert self._server is not None, "the server is not running"
        return self._server.group

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def __enter__(self) -> LocalRayServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="model.tar.gz (or an unpacked model directory)")
    parser.add_argument("--workers", type=int, help="model replicas (default: the endpoint's rule, cores / 4)")
    parser.add_argument("--batch-size", type=int, help="requests per forward pass (default: the endpoint's)")
    parser.add_argument("--max-batch-delay-ms", type=int, help="how long a batch waits (default: the endpoint's)")
    # An environment's endpoint settings may set the request limits (max_request_batch, max_request_bytes).
    parser.add_argument("--max-request-batch", type=int, help="texts per request (default: the serving contract's)")
    parser.add_argument("--max-request-bytes", type=int, help="body bytes per request (default: the contract's)")
    parser.add_argument("--text", help="send this text once, print the answer and stop (instead of serving)")
    args = parser.parse_args(argv)
    options: dict[str, Any] = {
        name: value
        for name, value in (
            ("workers", args.workers),
            ("batch_size", args.batch_size),
            ("max_batch_delay_ms", args.max_batch_delay_ms),
        )
        if value is not None
    }
    limits = {"max_request_batch": args.max_request_batch, "max_request_bytes": args.max_request_bytes}
    if any(value is not None for value in limits.values()):
        try:
            options["limits"] = Limits(**{name: value for name, value in limits.items() if value is not None})
        except ValueError as error:
            parser.error(str(error))
    try:
        with stop_signals_as_interrupt(), LocalRayServer(args.model, **options) as server:
            if args.text is not None:
                body = json.dumps({"inputs": args.text}).encode()
                print(f"POST {server.url}/invocations {body.decode()}")
                status, _, answer = server.invoke(body)
                print(f"HTTP {status} {answer.decode()}")
                return 0 if status == 200 else 1
            print(f"serving {args.model} at {server.url} (/ping, /invocations); work dir {server.workdir}", flush=True)
            print("Ctrl-C or SIGTERM stops it", flush=True)
            while server.ping() == 200:
                time.sleep(2)
            return 1  # the server stopped answering by itself
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
