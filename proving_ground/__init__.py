"""The proving ground: what proves and measures the platform without being part of it.

The rehearsal of the README's journey against moto and its shims (``rehearsal/``), the map from templates and
recorded calls to IAM requests (``iam_requests``; the product's ``ops_review.iam_policy`` decides them), the benchmarks
and their results (``benchmarks/``), the validation of the sizing model against measurements (``sizing_validation``)
and the local multi-model harness on TorchServe with the archives it serves and their handler (``torchserve_mme/``).
It may import anything of the product; nothing of the product (app.py, platform_cli.py, scripts/, stacks/, ops_review/,
mme_sizing/, the assets, platform_facts/) imports it (an import-linter contract in pyproject.toml).
"""
