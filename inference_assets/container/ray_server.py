"""The serving container's command: Ray Serve on the SageMaker port, running the archive's ``config.yaml``.

    PYTHONPATH=/opt/ml/model:/opt/ml/model/code python -m sentiment_serving.ray_server

It does what AWS's Ray Serve DLC entrypoint does (aws/deep-learning-containers,
scripts/docker/ray/sagemaker_entrypoint.sh: ``ray start --head --include-dashboard=False``, then
``serve run /opt/ml/model/config.yaml``), in one process and without the DLC's second HTTP hop: Ray Serve's own
proxy listens on SageMaker's port (``SAGEMAKER_BIND_TO_PORT``, else 8080) and the deployment answers ``/ping`` and
``/invocations`` itself (ray_deployment.py). Nothing is installed at start-up: the image holds every dependency
(the DLC pip-installs ``code/requirements.txt`` when it starts, which needs egress the endpoint does not have).

- A new Ray instance, local to the container (``address="local"``: never one found through RAY_ADDRESS or
  /tmp/ray), without the dashboard's web UI. Ray's processes inherit this process's environment, so every worker
  imports ``sentiment_serving`` through PYTHONPATH and reads the serving variables the endpoint sets.
- The archive's config.yaml, with ``http_options`` set to the host and port given here, run by Ray's own
  ``serve run`` (ray/serve/scripts.py) in this process: config features (per-deployment overrides, several
  applications) behave as in AWS's image.
- SIGTERM (SageMaker stopping the container) and SIGINT stop it as Ctrl-C stops ``serve run``: the applications
  are shut down, then Ray.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
from pathlib import Path
from types import FrameType

import yaml

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
    config = serve_config(model_dir, args.host, args.port)
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
    try:
        ray.init(address="local", namespace="serve", include_dashboard=False)
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
