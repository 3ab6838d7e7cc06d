"""What runs inside the model server. package_model ships this package as ``code/sentiment_serving/`` in
model.tar.gz, plus the two entry files in ``entrypoints/`` (``code/inference.py`` and the DJL ``model.py``).

Modules here import each other relatively only, so the same files work as ``inference_assets.container`` (tests,
local tools) and as ``sentiment_serving`` inside the archive.
"""
