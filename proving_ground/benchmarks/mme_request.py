"""The one request every multi-model benchmark sends. Its own module: importing Locust
(proving_ground.benchmarks.mme_locustfile)
monkey-patches the interpreter with gevent, which the model-cost benchmark must not do."""

from __future__ import annotations

import json

REQUEST_BODY = json.dumps({"inputs": ["the delivery was quick and the staff were lovely"]}).encode()
CONTENT_TYPE = "application/json"
