"""Serving assets of the sentiment model.

- ``container``: what ships inside model.tar.gz and runs in the model server (request protocol, predictor, the Ray
  Serve deployment and launcher, the TorchServe handler, the DJL adapter); package_model copies it into the archive's
  ``code/`` folder.
- ``tools``: what operators run (package, publish, invoke, smoke-test, the endpoint environment).
- ``local``: local harnesses that serve an archive as the endpoints do (Ray Serve; TorchServe for multi-model).
"""
