"""Ops review of a synthesized CDK app: ``python -m ops_review cdk.out --out review/`` and
``python -m ops_review --diff old_cdk.out new_cdk.out --out review-diff/``."""
