"""The serving container's command: Ray Serve on the SageMaker port, running the archive's ``config.yaml``.

    PYTHONPATH=/opt/ml/model:/opt/ml/model/code python -m sentiment_serving.ray_server

It does what AWS's Ray Serve DLC entrypoint does (aws/deep-learning-containers,
scripts/docker/ray/sagemaker_entrypoint.sh: ``ray start --head --include-dashboard=False``, then
``serve run /opt/ml/model/config.yaml``), in one process and without the DLC's second HTTP hop: with one replica
the replica itself listens on SageMaker's port (``SAGEMAKER_BIND_TO_PORT``, else 8080: Ray Serve's direct ingress),
with several Ray Serve's proxy does; the deployment answers ``/ping`` and ``/invocations`` itself
(ray_deployment.py). Nothing is installed at start-up: the image holds every dependency (the DLC pip-installs
``code/requirements.txt`` when it starts, which needs egress the endpoint does not have).

- A new Ray instance, local to the container (``address="local"``: never one found through RAY_ADDRESS or
  /tmp/ray), without the dashboard's web UI. Ray's processes inherit this process's environment, so every worker
  imports ``sentiment_serving`` through PYTHONPATH and reads the serving variables the endpoint sets.
- The archive's config.yaml, with ``http_options`` set to the host and port given here, run by Ray's own
  ``serve run`` (ray/serve/scripts.py) in this process: config features (per-deployment overrides, several
  applications) behave as in AWS's image.
- Ray Serve's throughput-optimized mode (``RAY_SERVE_THROUGHPUT_OPTIMIZED=1``, unless the environment sets it;
  ray/serve/_private/constants.py, end of file): user code and router on the replica's own event loop, request-path
  logs buffered and not copied to stderr (both set back here: ``LAUNCHER_DEFAULTS``), the garbage collector frozen
  after start-up, and direct ingress. With
  direct ingress the ingress replica runs its own HTTP server (ray/serve/_private/replica.py
  ``_maybe_start_direct_ingress_servers``) on a port the controller hands out from
  ``RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT``..``MAX`` (30000-31000 by default), while Ray's proxy stays on
  ``http_options.port`` (controller.py: "enabling proxy on head node only"). So the range is pinned to SageMaker's
  port and the proxy is moved to a free port beside it: /ping and /invocations reach the replica with no proxy
  actor and no second Ray call in between, and /ping answers only once the replica holds the model (the server
  starts after the deployment's constructor, replica.py ``_on_initialized``). One port reaches one replica, so with
  several replicas direct ingress is turned off (``RAY_SERVE_ENABLE_DIRECT_INGRESS=0``) and Ray's proxy balances them
  on SageMaker's port, with the rest of the mode kept. Ray holds a direct-ingress replica open for 30 s at
  shutdown, and keeps a released port out of use for 150 s, so that an external load balancer can deregister it;
  none sits in front of this port (SageMaker routes to the container), and a replica Ray restarts must get the port
  back, so both are 0 unless set (``RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S``, ``RAY_SERVE_PORT_QUARANTINE_S``).
- SIGTERM (SageMaker stopping the container) and SIGINT stop it as Ctrl-C stops ``serve run``: the applications
  are shut down, then Ray.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import sys
import tempfile
from pathlib import Path
from types import FrameType

import yaml

from .ray_settings import THROUGHPUT_OPTIMIZED_ENV, ServeSettings, direct_ingress

DEFAULT_MODEL_DIR = "/opt/ml/model"
DEFAULT_PORT = 8080  # SageMaker's container contract; SAGEMAKER_BIND_TO_PORT overrides it where the image allows


def serve_config(model_dir: Path, host: str, port: int) -> dict:
    """The archive's Ray Serve config with the HTTP listener set to ``host``:``port``."""
    path = model_dir / "config.yaml"
    if not path.is_file():
        raise SystemExit(f"no Ray Serve config at {path}: the model archive must hold config.yaml + deployment.py")
    config = yaml.safe_load(path.read_text()) or {}
    if not isinstance(config, dict) or not config.get("applications"):
        raise SystemExit(f"{path} names no applications (a Ray Serve config with applications: [...])")
    config["http_options"] = {**(config.get("http_options") or {}), "host": host, "port": port}
    return config


# Throughput-optimized mode, but with the replica's log lines (errors, the forward passes) written at once and copied
# to the container's output as without it: SageMaker sends only the container's stdout/stderr to CloudWatch, and a
# 1000-line buffer would hold them back (or lose them with the replica). Measured: no throughput cost beyond the
# benchmark's noise (docs/benchmarks.md, "Ray Serve ingress").
# The Serve controller's loop every 1 s instead of 0.1 s: it is the largest idle CPU of a Ray Serve instance (a third
# of ~0.08 CPU s/s here), paid per second whatever the traffic; a fixed-size endpoint does not autoscale, so only
# start-up and replacing a failed replica wait up to a second longer.
LAUNCHER_DEFAULTS = {
    # No usage report leaves the container (ray/_private/usage/usage_lib.py reads it; the endpoint has no egress).
    "RAY_USAGE_STATS_ENABLED": "0",
    THROUGHPUT_OPTIMIZED_ENV: "1",
    "RAY_SERVE_LOG_TO_STDERR": "1",
    "RAY_SERVE_REQUEST_PATH_LOG_BUFFER_SIZE": "1",
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "1",
}


def ingress_environment(environment: dict[str, str] | os._Environ[str], port: int) -> dict[str, str]:
    """The Ray Serve variables this launcher adds to ``environment`` before Ray starts (every Ray process reads them
    at import), for SageMaker's ``port``: ``LAUNCHER_DEFAULTS`` where unset, and with direct ingress the replica's
    HTTP port range pinned to ``port``. Variables the environment sets itself are kept, except the port range, which
    must be SageMaker's."""
    added = {name: value for name, value in LAUNCHER_DEFAULTS.items() if name not in environment}
    merged = {**environment, **added}
    if ServeSettings.from_environment(merged).replicas > 1 and "RAY_SERVE_ENABLE_DIRECT_INGRESS" not in merged:
        added["RAY_SERVE_ENABLE_DIRECT_INGRESS"] = "0"  # one port cannot reach several replicas: the proxy does
        merged.update(added)
    if direct_ingress(merged):
        # The controller hands out range(MIN, MAX) (ray/serve/_private/node_port_manager.py PortAllocator): MAX is
        # excluded, so the range [port, port + 1) is SageMaker's port alone.
        added["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"] = str(port)
        added["RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT"] = str(port + 1)
        for name in ("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", "RAY_SERVE_PORT_QUARANTINE_S"):
            # No load balancer deregisters the replica, and a replica Ray restarts must get the port back at once
            # (the quarantine, 150 s by default, would leave the range empty).
            added[name] = merged.get(name, "0")
    return added


# Ray's floor for the object store (ray/_private/ray_constants.py OBJECT_STORE_MINIMUM_MEMORY_BYTES) and the most
# this server gives it: Ray Serve moves request bodies (at most InvokeEndpoint's 6 MB) and answers through it, no
# tensors, so the default (30% of the host's memory) would only take memory from the replicas.
OBJECT_STORE_MIN_BYTES = 75 * 1024 * 1024
OBJECT_STORE_MAX_BYTES = 512 * 1024 * 1024


def object_store(shm: Path = Path("/dev/shm"), spill: str | None = None) -> tuple[int, str | None]:
    """(bytes, directory) of Ray's object store: in shared memory when half of ``shm``'s free space holds at least
    Ray's floor (at most OBJECT_STORE_MAX_BYTES), else Ray's floor in ``spill`` (the temporary directory). Docker's
    default /dev/shm is 64 MB, below the floor: Ray would then fall back to /tmp by itself with a warning at every
    start; chosen here, the start says which and why."""
    try:
        free = shutil.disk_usage(shm).free
    except OSError:
        free = 0
    if free // 2 >= OBJECT_STORE_MIN_BYTES:
        return min(OBJECT_STORE_MAX_BYTES, free // 2), None
    return OBJECT_STORE_MIN_BYTES, spill or tempfile.gettempdir()


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # SageMaker starts a serving container as `docker run <image> serve` (the image's entrypoint gets "serve").
    parser.add_argument("command", nargs="?", choices=["serve"], help="what SageMaker passes; nothing else is taken")
    parser.add_argument("--model-dir", type=Path, default=Path(os.environ.get("SM_MODEL_DIR") or DEFAULT_MODEL_DIR))
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=int(os.environ.get("SAGEMAKER_BIND_TO_PORT") or DEFAULT_PORT))
    args = parser.parse_args(argv)
    model_dir = args.model_dir.resolve()
    os.environ.update(ingress_environment(os.environ, args.port))
    # With direct ingress the replica listens on SageMaker's port; Ray's proxy (still started) takes a free one.
    proxy_port = _free_port(args.host) if direct_ingress(os.environ) else args.port
    config = serve_config(model_dir, args.host, proxy_port)
    # Ray's workers (replicas included) inherit this environment: deployment.py and code/sentiment_serving import.
    paths = [str(model_dir), str(model_dir / "code"), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    sys.path[:0] = [path for path in paths[:2] if path not in sys.path]
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _interrupt)

    import ray
    from ray.serve.scripts import cli

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="serve-config-", delete=False) as merged:
        yaml.safe_dump(config, merged)
    store_bytes, store_directory = object_store()
    try:
        # A node of its own on the loopback address (Ray would otherwise find its IP by routing towards a public
        # address), no dashboard, no usage report (LAUNCHER_DEFAULTS): nothing that needs a network.
        ray.init(
            address="local",
            namespace="serve",
            include_dashboard=False,
            object_store_memory=store_bytes,
            _plasma_directory=store_directory,
            _node_ip_address="127.0.0.1",
        )
        where = store_directory or "/dev/shm"
        print(f"Ray object store: {store_bytes // 2**20} MiB in {where}", flush=True)
        print(f"Ray Serve: {model_dir}/config.yaml on http://{args.host}:{args.port}", flush=True)
        # Blocks until KeyboardInterrupt, then shuts the applications down and exits (SystemExit).
        cli.main(args=["run", merged.name], prog_name="serve", standalone_mode=False)
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        ray.shutdown()
        Path(merged.name).unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
