"""``deployment.py`` of model.tar.gz: the Ray Serve application that ``config.yaml`` names (``deployment:app``).

The contract of AWS's Ray Serve DLC (aws/deep-learning-containers, scripts/docker/ray/sagemaker_entrypoint.sh):
the archive is unpacked at /opt/ml/model, PYTHONPATH holds /opt/ml/model (this file) and /opt/ml/model/code (the
``sentiment_serving`` package, which every Ray worker, replicas included, imports by that name), and
``serve run /opt/ml/model/config.yaml`` builds the application below. The model files sit beside this file.
"""

from pathlib import Path

from sentiment_serving.ray_deployment import build_app

app = build_app(Path(__file__).resolve().parent)
