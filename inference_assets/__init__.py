"""Serving assets of the sentiment model.

- ``container``: what ships inside model.tar.gz and runs in the model server (request protocol, predictor, the Ray
  Serve deployment and launcher of the Graviton endpoint, the DJL adapter of the multi-model endpoint); package_model
  copies into each archive's ``code/`` folder the modules its server runs.
- ``tools``: what operators run (package, publish, invoke, smoke-test, the pre-deploy model check, the endpoint
  environment).
- ``local``: the local Ray Serve server that serves an archive as the Graviton endpoint does.

Part of the product: it imports the serving contract and platform_facts, never the stacks or the proving ground
(whose TorchServe multi-model harness, proving_ground/torchserve_mme/, serves these modules too).
"""
