"""A local multi-model endpoint: the real SageMaker PyTorch toolkit + TorchServe in multi-model mode on localhost.

Two layers, as on SageMaker:

* :class:`LocalModelServer` is the container: TorchServe with ``SAGEMAKER_MULTI_MODEL=true`` and the toolkit's
  handler service, serving the load / invoke / unload contract of an MME container (management API
  ``POST /models``, ``DELETE /models/<name>``; inference ``POST /models/<name>/invoke``).
* :class:`LocalMultiModelEndpoint` is the platform in front of it: requests name a ``TargetModel`` (an archive in
  a local "S3 prefix" directory); a model is unpacked and loaded on its first request, and the least recently used
  model is unloaded when more than ``max_resident_models`` would be loaded, so cold loads happen as on an MME.

The toolkit's own multi-model start-up is not used: toolkit 2.0.25 writes a broken properties file and puts the
management API on the inference port (see FACTS.md), so this module writes its own properties file. Each server
gets its own TMPDIR (TorchServe keeps a global pid file there) and free ports, and is stopped by its process group.

    python -m proving_ground.torchserve_mme.local_mme   # start a server, print its addresses, serve till Ctrl-C/SIGTERM
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tarfile
import tempfile
import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import requests

from inference_assets.container.contract import validate_model_name
from inference_assets.local.server_process import ServerCommand, ServerProcess, StopStep, free_port
from inference_assets.local.shutdown import default_stop_signals, stop_signals_as_interrupt

HANDLER_SERVICE = "sagemaker_pytorch_serving_container.handler_service:handle"


def _shield_from_sigterm() -> None:
    """Run in the server's process before exec: ignore SIGTERM (inherited by the JVM, which -Xrs leaves alone) and
    give SIGINT its default action back (the way this server is stopped, even when the harness inherited it ignored).

    The SageMaker toolkit finds "its" TorchServe by scanning every process for the Java main class and, when it is
    stopped, sends that process SIGTERM: a toolkit server started on the same machine while this one runs adopts
    this Java process and kills it on exit. This server is stopped with SIGINT / SIGKILL to its process group.
    """
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    default_stop_signals()


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    content_type: str

    def json(self) -> Any:
        return json.loads(self.body)


class ModelServerError(RuntimeError):
    """The model server refused a management call; the message carries its answer."""


class LocalModelServer:
    """TorchServe + the SageMaker PyTorch toolkit in multi-model mode, on two free 127.0.0.1 ports."""

    def __init__(self, work_dir: Path, *, response_timeout_s: int = 60, startup_timeout_s: float = 180) -> None:
        self.work_dir = Path(work_dir)
        self.response_timeout_s = response_timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.inference_url = ""
        self.management_url = ""
        self._server: ServerProcess | None = None
        self._session = requests.Session()

    # --- lifecycle ----------------------------------------------------------------------------------------------

    # Long: TorchServe's whole configuration file, one line per property with the reason beside it, then its process
    def start(self) -> Self:
        if self._server is not None:
            raise RuntimeError("the model server is already running")
        inference_port, management_port = free_port(), free_port()
        self.inference_url = f"http://127.0.0.1:{inference_port}"
        self.management_url = f"http://127.0.0.1:{management_port}"
        logs = self.work_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        # A short private temp dir: it holds the pid file and the workers' unix sockets (paths max 107 bytes).
        self._tmp = tmp = Path(tempfile.mkdtemp(prefix="ts-"))
        properties = self.work_dir / "config.properties"
        properties.write_text(
            "\n".join(
                [
                    "model_store=/",  # models are registered by absolute directory path
                    f"inference_address={self.inference_url}",
                    f"management_address={self.management_url}",
                    # gRPC listens too (7070/7071 by default, which a second server cannot bind): own free ports.
                    "grpc_inference_address=127.0.0.1",
                    f"grpc_inference_port={free_port()}",
                    "grpc_management_address=127.0.0.1",
                    f"grpc_management_port={free_port()}",
                    "enable_metrics_api=false",
                    "disable_system_metrics=true",
                    f"default_service_handler={HANDLER_SERVICE}",
                    "enable_model_api=true",
                    "disable_token_authorization=true",
                    "decode_input_request=false",
                    "default_workers_per_model=1",
                    # A synchronous load (POST /models; SageMaker's JSON body is synchronous by default:
                    # RegisterModelRequest()) blocks the Netty thread that reads it until the worker is up
                    # (ApiUtils.updateModelWorkers ends in future.get(), called on that thread from
                    # ManagementRequestHandler.handleRegisterModel), and the inference and management ports share
                    # one pool of Netty threads (ModelServer.startRESTserver, ServerGroups.childGroup; default 2 x
                    # CPUs). Every request on a connection that shares the loading thread then waits for the whole
                    # load (pytorch/serve 62c4d6a). Enough threads that no connection of this harness shares one.
                    "number_of_netty_threads=32",
                    f"default_response_timeout={self.response_timeout_s}",
                    "install_py_dep_per_model=false",
                    # Worker sockets go to java.io.tmpdir (/tmp by default, whatever TMPDIR says): two servers would
                    # both bind /tmp/.ts.sock.9000.
                    # -Xrs: the JVM keeps the SIGTERM disposition it inherits (ignored, see _shield_from_sigterm).
                    f"vmargs=-Djava.io.tmpdir={tmp} -Xmx1g -Xrs",
                ]
            )
            + "\n"
        )
        python_bin = str(Path(sys.executable).parent)
        environment = {
            **os.environ,
            "SAGEMAKER_MULTI_MODEL": "true",
            "TMPDIR": str(tmp),  # TorchServe's pid file lives here: one per server
            "LOG_LOCATION": str(logs),
            "METRICS_LOCATION": str(logs),
            "PATH": f"{python_bin}{os.pathsep}{os.environ.get('PATH', '')}",
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),  # one thread per worker: no oversubscription
        }
        self._server = ServerProcess(
            ServerCommand(
                argv=[
                    str(Path(python_bin) / "torchserve"),
                    "--start",
                    "--foreground",
                    "--ncs",
                    "--ts-config",
                    str(properties),
                    "--disable-token-auth",
                ],
                ready=lambda: self._session.get(f"{self.inference_url}/ping", timeout=2).status_code == 200,
                environment=environment,
                cwd=self.work_dir,
                log_path=logs / "server.out",
                startup_timeout_s=self.startup_timeout_s,
                # SIGINT: TorchServe's own shutdown (the JVM ignores SIGTERM here, see _shield_from_sigterm).
                stop_steps=(StopStep(signal.SIGINT, 30.0), StopStep(signal.SIGKILL, 10.0)),
                preexec=_shield_from_sigterm,
            )
        )
        try:
            self._server.start()
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def process_group(self) -> int:
        """The server's process group: the torchserve launcher, its Java frontend and the model workers."""
        if self._server is None:
            raise RuntimeError("the model server is not running")
        return self._server.group

    def stop(self) -> None:
        """End TorchServe, its Java frontend and every Python worker: the whole process group."""
        server, self._server = self._server, None
        if server is None:
            return
        server.stop()
        self._session.close()
        shutil.rmtree(self._tmp, ignore_errors=True)

    def check_alive(self) -> None:
        """Raise if TorchServe is gone (its Java frontend included), with the end of its log."""
        alive = self._server is not None and self._server.running()
        if alive:
            try:
                alive = self._session.get(f"{self.inference_url}/ping", timeout=10).status_code == 200
            except requests.ConnectionError:
                alive = False
        if not alive:
            log = self.work_dir / "logs" / "ts_log.log"
            tail = log.read_text(errors="replace").splitlines()[-5:] if log.exists() else []
            raise ModelServerError("TorchServe is not running any more; last log lines:\n" + "\n".join(tail))

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None):
        self.stop()

    # --- the MME container contract -----------------------------------------------------------------------------

    def load(self, name: str, model_dir: Path, *, workers: int = 1) -> None:
        """Register an unpacked model directory under ``name`` and wait until its workers are up."""
        params: dict[str, str | int] = {
            "url": str(Path(model_dir).resolve()),
            "model_name": name,
            "initial_workers": workers,
            "synchronous": "true",
        }
        answer = self._session.post(f"{self.management_url}/models", params=params, timeout=self.startup_timeout_s)
        if answer.status_code != 200:
            raise ModelServerError(f"loading {name} failed with {answer.status_code}: {answer.text.strip()}")

    def unload(self, name: str) -> None:
        answer = self._session.delete(f"{self.management_url}/models/{name}", timeout=self.startup_timeout_s)
        if answer.status_code != 200:
            raise ModelServerError(f"unloading {name} failed with {answer.status_code}: {answer.text.strip()}")

    def loaded(self) -> list[str]:
        answer = self._session.get(f"{self.management_url}/models", params={"limit": 1000}, timeout=10)
        answer.raise_for_status()
        return sorted(model["modelName"] for model in answer.json()["models"])

    def invoke(self, name: str, body: bytes, content_type: str = "application/json") -> Answer:
        """``POST /models/<name>/invoke``: the path SageMaker's front end calls on an MME container."""
        answer = self._session.post(
            f"{self.inference_url}/models/{name}/invoke",
            data=body,
            headers={"Content-Type": content_type, "Accept": "application/json"},
            timeout=self.response_timeout_s + 5,
        )
        return Answer(answer.status_code, answer.content, answer.headers.get("Content-Type", ""))


class ModelNotFound(LookupError):
    """No archive of that name under the models directory (SageMaker answers 404 ``ModelError``... not found)."""


class LocalMultiModelEndpoint:
    """SageMaker's side of an MME on one instance: load on first use; above ``max_resident_models`` (models loaded or
    loading), unload the least recently used model that no request is using, as SageMaker unloads unused models."""

    def __init__(self, server: LocalModelServer, models_dir: Path, *, max_resident_models: int) -> None:
        if max_resident_models < 1:
            raise ValueError(f"max_resident_models must be at least 1, got {max_resident_models}")
        self.server = server
        self.models_dir = Path(models_dir)
        self.max_resident_models = max_resident_models
        self._unpacked = server.work_dir / "unpacked"
        self._resident: OrderedDict[str, None] = OrderedDict()  # loaded or loading, least recently used first
        self._loading: dict[str, threading.Event] = {}  # set when the load ends (either way)
        self._unloading: dict[str, threading.Event] = {}  # set when TorchServe has unregistered the model
        self._in_flight: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.cold_loads = 0
        self.unloads = 0

    @staticmethod
    def server_name(target_model: str) -> str:
        """TorchServe's name of a model: the archive name without .tar.gz, '/' -> '--'."""
        return target_model.removesuffix(".tar.gz").replace("/", "--")

    def invoke(self, target_model: str, body: bytes, content_type: str = "application/json") -> tuple[Answer, bool]:
        """Invoke ``target_model``; return the answer and whether this request had to load the model (cold)."""
        validate_model_name(target_model)
        with self._lock:
            self._in_flight[target_model] += 1  # from here on the model is not unloaded under this request
        try:
            cold = self._ensure_loaded(target_model)
            return self.server.invoke(self.server_name(target_model), body, content_type), cold
        finally:
            with self._lock:
                self._in_flight[target_model] -= 1

    def _ensure_loaded(self, target_model: str) -> bool:
        with self._lock:
            pending = self._loading.get(target_model)
            if target_model in self._resident:
                self._resident.move_to_end(target_model)
                if pending is None:
                    return False
            else:
                archive = self.models_dir / target_model
                if not archive.is_file():
                    raise ModelNotFound(f"model {target_model!r} is not under {self.models_dir}")
                victims = self._choose_victims(target_model)
                for victim in victims:
                    self._unloading[victim] = threading.Event()
                # Unloaded a moment ago by another request: TorchServe refuses (409) to register it until that ends.
                still_unloading = self._unloading.get(target_model)
                self._resident[target_model] = None  # counts against the limit while it loads
                self._loading[target_model] = done = threading.Event()
        if pending is not None:  # another request is loading it: wait for that load
            pending.wait()
            with self._lock:
                if target_model not in self._resident:
                    raise ModelServerError(f"loading {target_model} failed (see the request that loaded it)")
            return False
        try:
            for victim in victims:
                try:
                    self.server.unload(self.server_name(victim))
                    with self._lock:
                        self.unloads += 1
                finally:
                    with self._lock:
                        self._unloading.pop(victim).set()
            if still_unloading is not None:
                still_unloading.wait()
            self.server.load(self.server_name(target_model), self._unpack(target_model, archive))
            with self._lock:
                self.cold_loads += 1
        except BaseException:
            with self._lock:
                self._resident.pop(target_model, None)
            raise
        finally:
            with self._lock:
                del self._loading[target_model]
            done.set()
        return True

    def _choose_victims(self, target_model: str) -> list[str]:
        """Under the lock: take least recently used idle models off the resident set until one more fits."""
        victims: list[str] = []
        while len(self._resident) >= self.max_resident_models:
            victim = next(
                (name for name in self._resident if not self._in_flight[name] and name not in self._loading), None
            )
            if victim is None:
                for name in victims:  # put them back: nothing is unloaded
                    self._resident[name] = None
                    self._resident.move_to_end(name, last=False)
                raise ModelServerError(
                    f"cannot load {target_model}: all {self.max_resident_models} resident models are in use"
                )
            del self._resident[victim]
            victims.append(victim)
        return victims

    def _unpack(self, target_model: str, archive: Path) -> Path:
        """Unpack once to local disk (SageMaker keeps downloaded models on the instance's disk, too)."""
        target = self._unpacked / self.server_name(target_model)
        if not target.is_dir():
            partial = target.with_name(target.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            with tarfile.open(archive) as tar:
                tar.extractall(partial, filter="data")
            partial.rename(target)
        return target

    def unload_all(self) -> None:
        """Unload every resident model (a cold start for whatever comes next); call it with no request in flight."""
        with self._lock:
            victims, self._resident = list(self._resident), OrderedDict()
        for name in victims:
            self.server.unload(self.server_name(name))
            with self._lock:
                self.unloads += 1

    def resident(self) -> list[str]:
        with self._lock:
            return list(self._resident)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve a local multi-model endpoint until interrupted.")
    parser.add_argument("--work-dir", type=Path, help="server files and logs (default: a temporary directory)")
    args = parser.parse_args(argv)
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="local-mme-"))
    try:
        with stop_signals_as_interrupt(), LocalModelServer(work_dir) as server:
            print(f"inference {server.inference_url}  management {server.management_url}  logs {work_dir / 'logs'}")
            print("load:   curl -X POST '<management>/models?url=<unpacked model dir>&model_name=m1&synchronous=true'")
            print("invoke: curl -X POST <inference>/models/m1/invoke -H 'Content-Type: application/json' "
                  "-d '{\"inputs\": \"great\"}'", flush=True)  # fmt: skip
            while True:
                signal.pause()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
