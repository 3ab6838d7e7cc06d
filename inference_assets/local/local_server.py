"""Serve a model.tar.gz on localhost with the real SageMaker PyTorch toolkit + TorchServe, as the container does.

The container runs ``serving.main()`` with the archive unpacked at /opt/ml/model; here the archive is unpacked under
a private work directory and the toolkit is pointed at it with its own variables (``SAGEMAKER_BASE_DIR``,
``SAGEMAKER_BIND_TO_PORT``). What differs from the container, and why:

- TorchServe keeps its pid file in ``$TMPDIR`` and its model store under the working directory: both are private
  per server, so several servers (tests, benchmark, another helper's) can run on one host.
- TorchServe's inference, management, metrics and gRPC listeners are bound to 127.0.0.1 on free ports through
  ``TS_*`` variables (the toolkit turns ``enable_envvars_config`` on); the container binds 0.0.0.0:8080 and the
  fixed gRPC ports 7070/7071, which a second TorchServe on the host would collide with.
- The toolkit writes /etc/sagemaker-ts.properties (a fixed path) just before TorchServe reads it; a host-wide lock
  serialises that window between servers started through this module.
- The toolkit pip-installs ``code/requirements.txt`` at start-up, as in the container; ``PIP_NO_INDEX`` makes that
  a check against the installed packages (the pins equal requirements-dev.txt) that never changes this venv.
- The toolkit's supervisor insists on being the only TorchServe on the host; if another one runs, it gives up after
  10 s while its TorchServe keeps serving, or it adopts the other server's TorchServe if that one was up first. So
  health is judged by ``/ping`` and the worker status, the supervisor is killed without running its SIGTERM handler
  (which would stop the TorchServe it adopted), and then the whole process group is stopped (never a bare
  ``torchserve --stop``, which stops whatever the global pid file names).

    python -m inference_assets.local.local_server --model model.tar.gz   # serves until Ctrl-C or SIGTERM
"""

from __future__ import annotations

import argparse
import fcntl
import http.client
import json
import os
import shutil
import sys
import tarfile
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inference_assets.local.server_process import ServerCommand, ServerProcess, free_port
from inference_assets.local.shutdown import stop_signals_as_interrupt
from inference_assets.tools.endpoint_environment import endpoint_environment

_TOOLKIT_MAIN = "from sagemaker_pytorch_serving_container import serving; serving.main()"
_CONFIG_LOCK = Path(tempfile.gettempdir()) / "sagemaker-ts-properties.lock"


class LocalToolkitServer:
    """One TorchServe started through the SageMaker PyTorch toolkit, serving one model archive on 127.0.0.1.

    ``with LocalToolkitServer(archive, workers=1) as server: server.invoke(b'{"inputs": "hi"}')``
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
        self.management_port = 0
        self.workdir: Path | None = None
        self._server: ServerProcess | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "server.log"

    def _unpack(self, model_dir: Path) -> None:
        model_dir.mkdir(parents=True)
        if self.model.is_dir():
            shutil.copytree(self.model, model_dir, dirs_exist_ok=True)
            return
        with tarfile.open(self.model) as tar:
            tar.extractall(model_dir, filter="data")

    def start(self) -> LocalToolkitServer:
        if not self.model.exists():
            raise FileNotFoundError(f"no model archive or directory at {self.model}")
        self.workdir = Path(tempfile.mkdtemp(prefix="sagemaker-local-"))
        base_dir = self.workdir / "opt_ml"
        self._unpack(base_dir / "model")
        (self.workdir / "tmp").mkdir()
        self.port, self.management_port = free_port(), free_port()
        loopback = "http://127.0.0.1:{}".format
        environment = {
            **os.environ,
            **self.environment,
            # The venv's torchserve/java launcher must be the first on PATH.
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "SAGEMAKER_BASE_DIR": str(base_dir),
            "SAGEMAKER_BIND_TO_PORT": str(self.port),
            "TMPDIR": str(self.workdir / "tmp"),
            "LOG_LOCATION": str(self.workdir / "logs"),
            "METRICS_LOCATION": str(self.workdir / "logs"),
            "TS_INFERENCE_ADDRESS": loopback(self.port),
            "TS_MANAGEMENT_ADDRESS": loopback(self.management_port),
            "TS_METRICS_ADDRESS": loopback(free_port()),
            "TS_GRPC_INFERENCE_ADDRESS": "127.0.0.1",
            "TS_GRPC_INFERENCE_PORT": str(free_port()),
            "TS_GRPC_MANAGEMENT_ADDRESS": "127.0.0.1",
            "TS_GRPC_MANAGEMENT_PORT": str(free_port()),
            "PIP_NO_INDEX": "1",
        }
        environment.pop("PYTHONPATH", None)  # the toolkit sets it to the model's code dir, as in the container
        for name in self._unset:
            environment.pop(name, None)
        self._server = ServerProcess(
            ServerCommand(
                argv=[sys.executable, "-c", _TOOLKIT_MAIN],
                # /ping answers 200 as soon as the frontend is up; the model is ready when all its workers are.
                ready=lambda: self.ping() == 200 and self.workers_ready(),
                environment=environment,
                cwd=self.workdir,
                log_path=self.log_path,
                startup_timeout_s=self.startup_timeout_s,
                # The toolkit's supervisor looks for "the" TorchServe host-wide and, on SIGTERM, kills what it found,
                # which can be another server's TorchServe: it is killed outright, then our own group stopped.
                kill_leader_first=True,
            )
        )
        with open(_CONFIG_LOCK, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                self._server.start()
            except BaseException:
                self.stop()
                raise
        return self

    def workers_ready(self) -> bool:
        """Whether every worker of the toolkit's model ("model") is READY (TorchServe management API)."""
        connection = http.client.HTTPConnection("127.0.0.1", self.management_port, timeout=10)
        try:
            connection.request("GET", "/models/model")
            response = connection.getresponse()
            if response.status != 200:
                return False
            (description,) = json.loads(response.read())
        finally:
            connection.close()
        workers = description.get("workers", [])
        return len(workers) >= description.get("minWorkers", 1) and all(w.get("status") == "READY" for w in workers)

    def log_tail(self, lines: int = 40) -> str:
        return self._server.log_tail(lines) if self._server is not None else "(no log)"

    @property
    def process_group(self) -> int:
        """The server's process group (TorchServe, its Java frontend and workers, and the toolkit's supervisor)."""
        assert self._server is not None, "the server is not running"
        return self._server.group

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def __enter__(self) -> LocalToolkitServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="model.tar.gz (or an unpacked model directory)")
    parser.add_argument("--workers", type=int, help="TorchServe workers (default: the endpoint's rule, cores / 4)")
    parser.add_argument("--batch-size", type=int, help="TorchServe batch size (default: the endpoint's)")
    parser.add_argument("--max-batch-delay-ms", type=int, help="TorchServe batch delay (default: the endpoint's)")
    parser.add_argument("--text", help="send this text once, print the answer and stop (instead of serving)")
    args = parser.parse_args(argv)
    options = {
        name: value
        for name, value in (
            ("workers", args.workers),
            ("batch_size", args.batch_size),
            ("max_batch_delay_ms", args.max_batch_delay_ms),
        )
        if value is not None
    }
    try:
        with stop_signals_as_interrupt(), LocalToolkitServer(args.model, **options) as server:
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
            return 1  # TorchServe stopped answering by itself
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
