"""What runs inside the model server. package_model ships the modules a server runs as ``code/sentiment_serving/``
in model.tar.gz (``SHARED_MODULES`` + ``SERVER_MODULES``), plus that server's entry files from ``entrypoints/``: Ray
Serve's ``config.yaml`` + ``deployment.py``, or DJL Serving's ``model.py``.

Modules here import each other relatively only, so the same files work as ``inference_assets.container`` (tests,
local tools) and as ``sentiment_serving`` inside the archive.
"""
